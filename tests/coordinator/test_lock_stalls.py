"""A slow disk under the run's lock (concurrency review, F1-F3, F6): a store write made while holding a run's `_lock`
(a Leave's event, a full pull's count, a late push's event) stalled every Heartbeat and GetStatus of the run for the
write's length (a 3 s write: heartbeats of 2.7 s); in a sweep, identifying a caller took every run's lock, so run 0's
slow disk stalled run 1's heartbeats (3.7 s) and, past the lease, got run 1's healthy members evicted; a lock stall
did not count as a coordinator stall, so the ticker that won the lock after a long hold evicted members whose
heartbeats were queued behind it; and the health and liveness threads ended on their first exception.

Now the events and counters are posted under the lock and written once it is released (`SwarmCoordinator.flush`),
routing takes no run lock, a hold of (or wait for) the lock longer than a heartbeat interval gives members the grace
of a stall, and both threads go on after an error. A slow disk is a store whose writes sleep inside its writer
lock, as a slow SQLite COMMIT (fsync) would."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.guards import SERVICE_NAME
from rcswarm.coordinator.liveness import LivenessClock
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import open_group
from rcswarm.observe import traffic
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds, deltas_of, pull_all, push
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import in_thread, timed, wait_for

AUTH = (("authorization", f"Bearer {TOKEN}"),)
# What a call that waits for no write may take while another call's write is slow.
PROMPT_S = 0.3


class SlowStore(StateStore):
    """A real store whose every write (and writer-connection read) sleeps `delay` seconds inside its writer lock
    while `delay` is set."""

    delay = 0.0

    @contextlib.contextmanager
    def _writer(self, failed: str = "cannot write it") -> Iterator[Any]:
        with super()._writer(failed) as db:
            if self.delay:
                time.sleep(self.delay)
            yield db


def member_answers(run: SwarmCoordinator, member: pb.JoinResponse) -> tuple[float, float]:
    """Seconds of `member`'s Heartbeat and of a GetStatus made at the same time, in process."""
    took: dict[str, float] = {}
    status = in_thread(lambda: took.update(status=timed(run.status)))
    took["heartbeat"] = timed(lambda: run.heartbeat(pb.HeartbeatRequest(**creds(member))))
    status.join(10)
    return took["heartbeat"], took["status"]


# F3 ---------------------------------------------------------------------------------------------------------------


def test_a_write_holding_the_run_lock_past_the_lease_evicts_no_member_but_one_that_stopped_is_evicted(tmp_path):
    """A holder keeps the run's lock 3 s with a 2 s lease (it was a join's write, made under the lock until the
    join wrote without it; now whatever else might: a slow read, a starved process); the members' heartbeats would
    have waited behind it. The ticker's next tick evicted both (silent 3 s > 2 s); now the hold counts as a stall of
    the coordinator: nobody is evicted, the stall is an event, and a member that then stays silent is evicted once
    lease + grace from the stall have passed, the one that beats is not."""
    store = SlowStore(tmp_path, durable=False)
    run = SwarmCoordinator(tiny_spec(coordinator={"lease_s": 2.0}), store)
    run.membership = dataclasses.replace(run.membership, stall_grace_s=1.0)

    def hold_the_lock() -> None:
        with run._locked():  # measured, as every holder's hold is
            time.sleep(3.0)

    try:
        beating, stopped = run.join(pb.JoinRequest(worker_name="beating")), run.join(pb.JoinRequest(worker_name="stopped"))
        holder = in_thread(hold_the_lock)
        holder.join(10)
        run.tick()  # the ticker takes the lock first once the holder released it
        assert run.workers[beating.worker_id].active, run.workers[beating.worker_id].reason
        assert run.workers[stopped.worker_id].active, run.workers[stopped.worker_id].reason
        assert any("lock was held" in e.reason for e in store.events("stall"))
        grace_ends = time.monotonic() + 2.0 + 1.0
        while time.monotonic() < grace_ends + 0.5:
            run.heartbeat(pb.HeartbeatRequest(**creds(beating)))
            run.tick()
            time.sleep(0.2)
        assert run.workers[beating.worker_id].active, run.workers[beating.worker_id].reason
        assert not run.workers[stopped.worker_id].active
        assert "since the coordinator resumed from a stall" in run.workers[stopped.worker_id].reason
    finally:
        run.close()


# F1 ---------------------------------------------------------------------------------------------------------------


def test_heartbeats_and_status_answer_at_once_while_a_leave_a_full_pull_or_a_late_push_writes_slowly(tmp_path):
    """With 2 s writes: a Leave's event, a full pull's count (behind a ReportMetrics' slow metric rows) and a late
    push's event were written under the run's lock, and a member's Heartbeat and a GetStatus waited for them; now
    they answer at once, and each row is in the store when its call returns."""
    spec = tiny_spec(sync={"codec": "fp32", "aggregation": "mean", "min_cosine": -1.0, "max_update_norm": 100.0,
                           "round_deadline_s": 0.3})
    store = SlowStore(tmp_path, durable=False)
    run = SwarmCoordinator(spec, store)
    try:
        watcher, leaver, puller, late = (run.join(pb.JoinRequest(worker_name=n)) for n in ("w", "l", "p", "late"))

        def during(*calls: Callable[[], Any]) -> tuple[float, float]:
            store.delay = 2.0
            threads = []
            for call in calls:
                threads.append(in_thread(call))
                time.sleep(0.3)  # each call is in its slow write by now
            answers = member_answers(run, watcher)
            for thread in threads:
                thread.join(10)
            store.delay = 0.0
            return answers

        # A Leave: its event row.
        heartbeat_s, status_s = during(lambda: run.leave(pb.LeaveRequest(**creds(leaver), reason="bye")))
        assert heartbeat_s < PROMPT_S and status_s < PROMPT_S, (heartbeat_s, status_s)
        assert [e.worker_id for e in store.events("leave")] == [leaver.worker_id]

        # A ReportMetrics' rows hold the store's writer lock; a full pull then counts itself. (The run's first pull
        # starts the curriculum's clock, a write once per run that stays under the lock: made before.)
        pull_all(run, puller)
        metric = pb.Metric(version=0, step=1, seq_len=32, batch=4, loss=2.0, tokens=128, wall_time=1.0,
                           compute_seconds=0.5)
        heartbeat_s, status_s = during(
            lambda: run.report_metrics(pb.ReportMetricsRequest(**creds(watcher), metrics=[metric])),
            lambda: pull_all(run, puller),
        )
        assert heartbeat_s < PROMPT_S and status_s < PROMPT_S, (heartbeat_s, status_s)
        assert traffic.full_pulls(store.get(traffic.FULL_PULLS_KEY))[1] == 2

        # A late push: round 0 closes at its deadline without it, then it arrives from version 0.
        pull_all(run, late)
        push(run, puller, deltas_of(run, 1e-3), tokens=100)
        time.sleep(0.4)
        run.tick()
        assert run.version == 1
        answer: list[pb.PushUpdateResponse] = []
        heartbeat_s, status_s = during(lambda: answer.append(push(run, late, deltas_of(run, 1e-3), tokens=100,
                                                                  version=0)))
        assert answer and answer[0].staleness == 1
        assert heartbeat_s < PROMPT_S and status_s < PROMPT_S, (heartbeat_s, status_s)
        assert [e.worker_id for e in store.events("late")] == [late.worker_id]
    finally:
        run.close()


# F2 (and F3 over the wire) ----------------------------------------------------------------------------------------


def test_run_0s_slow_disk_neither_stalls_nor_evicts_run_1s_members(tmp_path):
    """A sweep of two runs, lease 2 s: run 0's member leaves while run 0's disk takes 4 s a write. Identifying each
    call took every run's lock, so run 1's member's heartbeats (every 0.6 s, 0.6 s deadlines) waited behind run 0's
    write, and it was evicted (3 of 3 trials of the review); now they answer at once and it stays."""
    base = tiny_spec(coordinator={"lease_s": 2.0, "max_wait_s": 2.0})
    spec = RunSpec.from_dict({**base.to_dict(), "sweep": {"seq_lens": [16, 32]}})
    group = open_group(spec, tmp_path)
    slow = group.runs[0].store
    slow.__class__ = SlowStore
    running = RunningCoordinator(group, TOKEN).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        stub = pb_grpc.CoordinatorStub(channel)
        x, y = (stub.Join(pb.JoinRequest(worker_name=n, device="cpu", pid=1), timeout=10, metadata=AUTH) for n in "xy")
        in0, in1 = (x, y) if group.runs[0].knows(x.worker_id) else (y, x)
        assert group.runs[1].knows(in1.worker_id)
        stop, beats = threading.Event(), []

        def beater() -> None:
            while not stop.is_set():
                try:
                    beats.append(timed(lambda: stub.Heartbeat(pb.HeartbeatRequest(**creds(in1)), timeout=0.6)))
                except grpc.RpcError as error:
                    beats.append(error.code().name)
                stop.wait(0.6)

        beating = in_thread(beater)
        time.sleep(1.0)
        slow.delay = 4.0
        leave = in_thread(lambda: stub.Leave(pb.LeaveRequest(**creds(in0), reason="bye"), timeout=20))
        time.sleep(0.5)
        status_s = timed(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=AUTH))
        leave.join(15)
        slow.delay = 0.0
        time.sleep(2.0)
        stop.set()
        beating.join(3)
        assert all(isinstance(b, float) and b < 0.5 for b in beats), beats
        assert status_s < 0.5, status_s
        assert group.runs[1].workers[in1.worker_id].active, group.runs[1].workers[in1.worker_id].reason
        assert [e.worker_id for e in slow.events("leave")] == [in0.worker_id]
    finally:
        channel.close()
        running.stop(0.5)


# F6 ---------------------------------------------------------------------------------------------------------------


def test_the_liveness_thread_goes_on_after_a_beat_raises(caplog: pytest.LogCaptureFixture):
    """A beat that raised ended the beat thread, and the clock froze 2 s past its last beat for good."""
    clock = LivenessClock(stall_s=1.0, beat_s=0.02)
    real_beat, failures = clock.beat, [3]

    def flaky_beat():
        if failures[0] > 0:
            failures[0] -= 1
            raise RuntimeError("a beat that fails")
        return real_beat()

    clock.beat = flaky_beat
    with caplog.at_level(logging.ERROR, logger="rcswarm.coordinator"):
        clock.start()
        try:
            wait_for(lambda: failures[0] == 0 and time.monotonic() - clock.stalls.at < 0.2, 5.0, "beats again")
            assert clock._thread is not None and clock._thread.is_alive()
        finally:
            clock.stop()
    logged = [r for r in caplog.records if "beat failed" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]


def test_health_says_not_serving_while_its_check_raises_and_serving_after(tmp_path, caplog):
    """A health pass that raised ended the health thread, and health said SERVING for good."""
    spec = tiny_spec()
    running = RunningCoordinator(SwarmCoordinator(spec, StateStore(tmp_path, durable=False)), TOKEN).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")

    def health() -> int:
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=2).status

    run = running.group.runs[0]
    try:
        assert health() == health_pb2.HealthCheckResponse.SERVING
        with caplog.at_level(logging.ERROR, logger="rcswarm.coordinator"):
            run.round_progress = lambda: (_ for _ in ()).throw(RuntimeError("a check that fails"))
            wait_for(lambda: health() == health_pb2.HealthCheckResponse.NOT_SERVING, 5.0, "NOT_SERVING")
            assert "a check that fails" in running.health_reason
            time.sleep(0.5)  # several failing passes: one line
            del run.round_progress
        wait_for(lambda: health() == health_pb2.HealthCheckResponse.SERVING, 5.0, "SERVING again")
        assert len([r for r in caplog.records if "health check failed" in r.getMessage()]) == 1
    finally:
        channel.close()
        running.stop(0.5)


# F4 ---------------------------------------------------------------------------------------------------------------


def test_a_handler_waits_for_the_run_lock_no_longer_than_its_calls_deadline(tmp_path):
    """A holder keeps the run's lock 3 s (it was a join's write, until the join wrote without it); a Heartbeat with
    a 1 s deadline waited the whole 3 s on its handler thread after its caller had given up (DEADLINE_EXCEEDED),
    holding a thread of the pool. Now the handler gives up by the deadline: UNAVAILABLE, which workers retry
    (worker/client.py `classify`)."""
    spec = tiny_spec()
    store = SlowStore(tmp_path, durable=False)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    group = running.group
    ended: list[float] = []
    real_heartbeat = group.heartbeat

    def heartbeat(request):
        try:
            return real_heartbeat(request)
        finally:
            ended.append(time.monotonic())

    group.heartbeat = heartbeat
    try:
        stub = pb_grpc.CoordinatorStub(channel)
        member = stub.Join(pb.JoinRequest(worker_name="a", device="cpu", pid=1), timeout=10, metadata=AUTH)
        run = group.runs[0]

        def hold_the_lock() -> None:
            with run._lock:
                time.sleep(3.0)

        holder = in_thread(hold_the_lock)
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            stub.Heartbeat(pb.HeartbeatRequest(**creds(member)), timeout=1.0)
        wait_for(lambda: ended, 5.0, "the heartbeat's handler to end")
        handler_s = ended[0] - started
        holder.join(10)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert handler_s < 1.5, f"the handler ended {handler_s:.2f} s after the call, its deadline 1 s"
        assert stub.Heartbeat(pb.HeartbeatRequest(**creds(member)), timeout=5).lease_seconds > 0
    finally:
        store.delay = 0.0
        channel.close()
        running.stop(0.5)
