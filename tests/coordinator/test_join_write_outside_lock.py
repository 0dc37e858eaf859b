"""A join's store write without the run's lock (the last session's lock-stall review left it under the lock): a
worker's Join wrote its one SQLite transaction (`StateStore.record_join`) while holding the run's `_lock`, so a slow
disk (a 3 s fsync) stalled every Heartbeat and GetStatus of the run for the write's length (heartbeats of 2.7 s), and
the curriculum's saves and events (a round close's decision, the first pull's start) were written under it too.

Now a join is admitted under the lock, writes without it (the joins of a run one at a time, `_join_lock`), then enters
its membership under the lock, or gives back what it reserved when its write failed (`SwarmCoordinator.join`); the
curriculum's writes are posted to the outbox and written once the lock is released (`CurriculumTracker`). A slow
disk is a store whose `record_join` sleeps inside its writer lock, as a slow COMMIT (fsync) would, or before it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from rcswarm.coordinator import curriculum as curricula
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds, deltas_of, previous, pull_all, push
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import in_thread, timed

AUTH = (("authorization", f"Bearer {TOKEN}"),)
# What a call that waits for no write may take while a join's write is slow (the write: 2 s).
PROMPT_S = 0.5
SLOW_S = 2.0
LADDER = {"policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 0.3, "tau": 100.0, "budget_seconds": 1e6}
CLOSING = {"codec": "fp32", "aggregation": "mean", "min_cosine": -1.0, "max_update_norm": 100.0}


class SlowJoinStore(StateStore):
    """A real store whose `record_join` takes `delay` seconds, inside its writer lock (as a slow COMMIT's fsync: the
    store's other writes wait too) or, with `outside` set, before taking it; then, with `fail` set, it fails as on a
    full disk. `writing` is set once a join's write has begun."""

    delay = 0.0
    outside = False
    fail = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writing = threading.Event()

    def record_join(self, *args: Any, **kwargs: Any) -> None:
        self.writing.set()
        if self.delay and self.outside:
            time.sleep(self.delay)
        elif self.delay:
            with self._lock:
                time.sleep(self.delay)
        if self.fail:
            raise StoreError(f"{self.db_path}: cannot write it: database or disk is full", full=True)
        super().record_join(*args, **kwargs)


def answered(call: Callable[[], Any], into: list[Any]) -> Callable[[], None]:
    """`call`, its answer or its error appended to `into` (for a thread)."""
    def run() -> None:
        try:
            into.append(call())
        except Exception as error:  # noqa: BLE001 - the test looks at it
            into.append(error)
    return run


def beats_during_the_write(stub: pb_grpc.CoordinatorStub, member: pb.JoinResponse, store: SlowJoinStore,
                           joiner: threading.Thread) -> tuple[list[float], float]:
    """Seconds of each Heartbeat (over the wire) of `member`, one every 0.2 s while `joiner`'s write is under way,
    and of a GetStatus among them."""
    assert store.writing.wait(5.0), "the join's write never began"
    time.sleep(0.1)

    def beat() -> float:
        return timed(lambda: stub.Heartbeat(pb.HeartbeatRequest(**creds(member)), timeout=10))

    beats = [beat()]
    status_s = timed(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=AUTH))
    while joiner.is_alive() and len(beats) < 20:
        time.sleep(0.2)
        beats.append(beat())
    return beats, status_s


@pytest.fixture
def served(tmp_path):
    """(the run, its slow store, a stub) of an in-process coordinator on 127.0.0.1."""
    store = SlowJoinStore(tmp_path, durable=False)
    running = RunningCoordinator(SwarmCoordinator(tiny_spec(coordinator={"lease_s": 10.0}), store), TOKEN).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield running.group.runs[0], store, pb_grpc.CoordinatorStub(channel)
    finally:
        store.delay = 0.0
        channel.close()
        running.stop(0.5)


def join_call(stub: pb_grpc.CoordinatorStub, name: str, timeout: float = 20.0, **fields: Any) -> Callable[[], Any]:
    return lambda: stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=1, **fields), timeout=timeout,
                             metadata=AUTH)


def test_heartbeats_and_status_answer_at_once_while_a_join_writes_slowly(served):
    """A join's 2 s write: a member's Heartbeats (over the wire) and a GetStatus waited behind it for up to 2 s; now
    they answer at once, and the join's rows are stored before its answer arrives."""
    run, store, stub = served
    member = join_call(stub, "member")()
    store.delay = SLOW_S
    joined: list[Any] = []
    started = time.monotonic()
    joiner = in_thread(answered(join_call(stub, "slow"), joined))
    beats, status_s = beats_during_the_write(stub, member, store, joiner)
    joiner.join(15)
    join_s = time.monotonic() - started
    print(f"join {join_s:.2f} s; heartbeats during it: max {max(beats):.3f} s of {len(beats)}; "
          f"GetStatus {status_s:.3f} s")
    assert max(beats) < PROMPT_S and status_s < PROMPT_S, (beats, status_s)
    assert len(beats) >= 3, beats
    assert join_s >= SLOW_S
    slow = joined[0]
    assert isinstance(slow, pb.JoinResponse), slow
    assert run.owns_credential(slow.worker_id, slow.worker_secret) and slow.data_seed == 2
    assert [event.worker_id for event in store.events("join")] == [member.worker_id, slow.worker_id]
    assert not [event for event in store.events("stall")], "a join's write held the run's lock"


def test_a_join_whose_write_fails_leaves_no_member_and_the_worker_joins_again(served):
    """A join's write fails (a full disk) after 1 s: the worker gets RESOURCE_EXHAUSTED (retried), the run has no
    membership, count or row of it, a member's Heartbeats answered at once meanwhile, and the next join succeeds
    under the count the failed one would have taken."""
    run, store, stub = served
    member = join_call(stub, "member")()
    store.delay, store.fail = 1.0, True
    failed: list[Any] = []
    joiner = in_thread(answered(join_call(stub, "unlucky"), failed))
    beats, _ = beats_during_the_write(stub, member, store, joiner)
    joiner.join(15)
    assert max(beats) < PROMPT_S, beats
    assert isinstance(failed[0], grpc.RpcError) and failed[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failed
    assert list(run.workers) == [member.worker_id] and list(run._active) == [member.worker_id]
    assert run._joins == 1 and run.active_workers() == 1
    assert [event.worker_id for event in store.events("join")] == [member.worker_id]
    store.delay, store.fail = 0.0, False
    again = join_call(stub, "unlucky")()
    assert again.worker_id.split("-")[0] == "w2" and again.data_seed == 2
    assert run.owns_credential(again.worker_id, again.worker_secret)
    assert [event.worker_id for event in store.events("join")] == [member.worker_id, again.worker_id]


def test_a_second_join_waits_for_the_one_writing_no_longer_than_its_deadline(served):
    """Joins of a run are written one at a time: a second Join with a 1 s deadline while the first writes for 3 s
    is refused by its deadline (UNAVAILABLE, which workers retry), and joins once the first is in."""
    run, store, stub = served
    store.delay = 3.0
    first: list[Any] = []
    joiner = in_thread(answered(join_call(stub, "first"), first))
    assert store.writing.wait(5.0)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        join_call(stub, "second", timeout=1.0)()
    waited_s = time.monotonic() - started
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert waited_s < 1.5, waited_s
    joiner.join(15)
    store.delay = 0.0
    assert isinstance(first[0], pb.JoinResponse), first
    second = join_call(stub, "second")()
    assert run.active_workers() == 2 and second.data_seed == 2


def test_a_round_that_closes_while_a_rejoin_writes_counts_it_and_its_answer_names_the_new_version(tmp_path):
    """b pushes to round 0, leaves, and joins again naming itself (taking its place over) with a 2 s write; a's
    push closes round 0 meanwhile (before, it waited for the join's write). The join's answer names version 1, the
    new membership reports to round 1, carries b's delivered round over, and the store counts it among round 0's
    reporters (a restarted coordinator answers its re-push ALREADY_EXISTS)."""
    store = SlowJoinStore(tmp_path, durable=False)
    run = SwarmCoordinator(tiny_spec(sync=CLOSING, coordinator={"max_workers": 2}), store)
    try:
        a, b = run.join(pb.JoinRequest(worker_name="a")), run.join(pb.JoinRequest(worker_name="b"))
        pull_all(run, a)
        pull_all(run, b)
        push(run, b, deltas_of(run, 1e-3), tokens=100)
        run.leave(pb.LeaveRequest(**creds(b), reason="crashed"))
        assert run.version == 0
        store.delay, store.outside = SLOW_S, True
        joined: list[Any] = []
        joiner = in_thread(answered(lambda: run.join(pb.JoinRequest(worker_name="b", **previous(b))),
                                    joined))
        assert store.writing.wait(5.0)
        push_s = timed(lambda: push(run, a, deltas_of(run, 1e-3), tokens=100))
        assert run.version == 1 and joiner.is_alive(), "round 0 closed while the join wrote"
        joiner.join(10)
        again = joined[0]
        assert isinstance(again, pb.JoinResponse), again
        assert push_s < PROMPT_S + 1.0, push_s
        assert again.version == 1 and again.assignment.version == 1
        worker = run.workers[again.worker_id]
        assert worker.active and worker.base_version == 1 and worker.accepted_version == 0
        assert store.reported(again.worker_id) == (0, 0)
        assert run.load(())[1] == 2  # the places taken
    finally:
        run.close()


@pytest.mark.parametrize("fail", [False, True])
def test_a_curriculum_save_made_while_a_rejoin_writes_is_not_lost(tmp_path, fail):
    """A re-join moves its ended membership's curriculum entry and stores it in its transaction; a round close
    decides (and saves) the curriculum while that write is under way. The join's older copy written after the
    close's save would have lost the decision: the join saves the state again, so the store holds both the decision
    and the moved entry. When the join's write fails, the entry goes back to the ended membership, in memory and in
    the store, and the decision stays."""
    store = SlowJoinStore(tmp_path, durable=False)
    run = SwarmCoordinator(tiny_spec(sync=CLOSING, curriculum=LADDER), store)
    own = curricula.WorkerCurriculum(rung=1, costs={4: (1.0, 10)}, reason="its own pace")
    try:
        a, first = run.join(pb.JoinRequest(worker_name="a")), run.join(pb.JoinRequest(worker_name="first"))
        run.tracker.state = dataclasses.replace(run.tracker.state, workers={first.worker_id: own})
        run.leave(pb.LeaveRequest(**creds(first), reason="evicted, say"))
        pull_all(run, a)
        assert run.tracker.state.decided_version == -1
        store.delay, store.outside, store.fail = SLOW_S, True, fail
        joined: list[Any] = []
        joiner = in_thread(answered(lambda: run.join(pb.JoinRequest(worker_name="first",
                                                                     **previous(first))), joined))
        assert store.writing.wait(5.0)
        push(run, a, deltas_of(run, 1e-3), tokens=50)  # closes round 0: the curriculum decides and saves
        assert run.version == 1 and run.tracker.state.decided_version == 0 and joiner.is_alive()
        joiner.join(10)
        stored = curricula.CurriculumState.from_json(store.get(curricula.CURRICULUM_KEY))
        assert stored.decided_version == 0, "the join's older copy overwrote the close's decision"
        if fail:
            assert isinstance(joined[0], StoreError), joined
            assert run.tracker.state.workers == {first.worker_id: own} and stored.workers == {first.worker_id: own}
            assert list(run._active) == [a.worker_id]
        else:
            again = joined[0]
            assert isinstance(again, pb.JoinResponse), joined
            assert run.tracker.state.workers == {again.worker_id: own} and stored.workers == {again.worker_id: own}
            assert again.assignment.seq_len == 8  # its own rung
    finally:
        run.close()
    stored = read_state(tmp_path, lambda s: curricula.CurriculumState.from_json(s.get(curricula.CURRICULUM_KEY)))
    assert stored.decided_version == 0


def test_a_round_close_saves_the_curriculum_without_the_run_lock(tmp_path):
    """A close's curriculum step saved the state and wrote its event under the run's lock; now both are posted and
    written once the lock is released, before the closing call returns."""
    store = StateStore(tmp_path, durable=False)
    run = SwarmCoordinator(tiny_spec(sync=CLOSING, curriculum=LADDER), store)
    held: list[bool] = []
    real_set_many = store.set_many

    def set_many(values):
        if curricula.CURRICULUM_KEY in values:
            held.append(run._lock.locked())
        real_set_many(values)

    store.set_many = set_many
    try:
        a = run.join(pb.JoinRequest(worker_name="a"))
        pull_all(run, a)  # the first pull posts the curriculum's start
        push(run, a, deltas_of(run, 1e-3), tokens=50)
        assert run.version == 1
        stored = curricula.CurriculumState.from_json(store.get(curricula.CURRICULUM_KEY))
        assert stored.decided_version == 0 and stored.started_at is not None
        assert [event.kind for event in store.events("curriculum")] == ["curriculum"]
        assert held == [False, False], held  # the start's save, then the close's: neither under the run's lock
    finally:
        run.close()
