"""Bounded concurrency on a real coordinator over loopback: stalled streams, long-poll floods, capped
calls, and a health service that answers through all of it and says NOT_SERVING when rounds cannot close."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.coordinator import (
    DEFAULT_MAX_CALLS,
    CallLimits,
    RunningCoordinator,
    SwarmCoordinator,
    decisions,
    parse_max_calls,
)
from rcswarm.coordinator.guards import KIND_OF_METHOD, SERVICE_NAME, Caller, RpcKind, SlotsHeld, decide_slot
from rcswarm.coordinator.server import TickRecord, decide_health
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import LocalCoordinator
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.wire import push, small_deltas

AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def channel(start_coordinator) -> Iterator[tuple]:
    """A raw channel factory to a coordinator: yields `open(local)`; every channel is closed at teardown."""
    opened: list[grpc.Channel] = []

    def open_channel(local) -> grpc.Channel:
        opened.append(grpc.insecure_channel(local.target))
        return opened[-1]

    yield open_channel
    for ch in opened:
        ch.close()


def health_status(ch: grpc.Channel, timeout: float = 2.0) -> int:
    """The Coordinator service's health, from a Check with `timeout`."""
    request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    return health_pb2_grpc.HealthStub(ch).Check(request, timeout=timeout).status


def assert_membership_answers(stub: pb_grpc.CoordinatorStub, ch: grpc.Channel, member: pb.JoinResponse) -> None:
    """A heartbeat, a join, a status and a health check each answer within 2 s."""
    beat = pb.HeartbeatRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
    assert stub.Heartbeat(beat, timeout=2, metadata=AUTH).version == 0
    assert stub.Join(pb.JoinRequest(worker_name="late", device="cpu", pid=1), timeout=2, metadata=AUTH).worker_id
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=2, metadata=AUTH).version == 0
    assert health_status(ch) == SERVING


def outcomes(calls: list, timeout: float) -> list[grpc.RpcError | object]:
    """Each call's exception or result, all within `timeout` seconds from now."""
    deadline = time.monotonic() + timeout
    results = []
    for call in calls:
        error = call.exception(timeout=max(deadline - time.monotonic(), 0.01))
        results.append(error if error is not None else call.result(timeout=0.01))
    return results


def test_stalled_push_streams_are_cancelled_while_membership_is_answered(start_coordinator, channel):
    idle_s = 1.5
    local = start_coordinator(tiny_spec(), limits=CallLimits(stream_idle_s=idle_s))
    ch = channel(local)
    stub = pb_grpc.CoordinatorStub(ch)
    member = stub.Join(pb.JoinRequest(worker_name="a", device="cpu", pid=1), timeout=5, metadata=AUTH)
    release = threading.Event()

    def silent() -> Iterator[pb.PushUpdateRequest]:
        release.wait(30.0)
        yield from ()

    started = time.monotonic()
    try:
        calls = [stub.PushUpdate.future(silent(), timeout=30, metadata=AUTH) for _ in range(200)]
        time.sleep(0.3)
        assert_membership_answers(stub, ch, member)
        errors = outcomes(calls, timeout=idle_s + 5.0)
        elapsed = time.monotonic() - started
    finally:
        release.set()
    codes = Counter(e.code() for e in errors)
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}, codes
    assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] >= 150 and codes[grpc.StatusCode.DEADLINE_EXCEEDED] >= 1, codes
    refused = next(e for e in errors if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED)
    # Token-only streams count against the peer host they come from: at most half of the 16 push slots.
    assert "peer 127.0.0.1 already has 8 push calls running" in refused.details()
    assert "coordinator.max_calls_per_peer = 8" in refused.details()
    idle = next(e for e in errors if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
    assert "stream_idle_s" in idle.details()
    assert elapsed < idle_s + 4.0
    # The cancelled streams gave their threads and slots back: a real push goes through.
    client = local.client()
    client.pull(member, member.run_id)
    assert push(client, member, small_deltas(local)).accepted
    client.close()


def test_a_long_poll_flood_leaves_heartbeats_status_and_health_answered(start_coordinator, channel):
    max_wait_s = 4.0
    local = start_coordinator(tiny_spec(coordinator={"lease_s": 30.0, "max_wait_s": max_wait_s}))
    ch = channel(local)
    stub = pb_grpc.CoordinatorStub(ch)
    member = stub.Join(pb.JoinRequest(worker_name="a", device="cpu", pid=1), timeout=5, metadata=AUTH)
    poll = pb.AwaitVersionRequest(worker_id=member.worker_id, worker_secret=member.worker_secret, min_version=1, wait_ms=60_000)
    calls = [stub.AwaitVersion.future(poll, timeout=60, metadata=AUTH) for _ in range(300)]
    time.sleep(0.3)
    assert_membership_answers(stub, ch, member)
    results = outcomes(calls, timeout=max_wait_s + 5.0)
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    assert {e.code() for e in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    # One worker runs at most 2 long polls at once (coordinator.max_calls_per_worker).
    assert f"worker {member.worker_id} already has 2 long_poll calls running" in refused[0].details()
    answered = [r for r in results if not isinstance(r, grpc.RpcError)]
    assert 2 <= len(answered) <= 2 + 10 and all(r.version == 0 for r in answered)


def test_a_pull_whose_client_stops_reading_is_cancelled(start_coordinator, channel):
    # base10m: 39 MB of fp32, far beyond what flow control lets the server send to a client that reads nothing.
    local = start_coordinator(tiny_spec(model={"preset": "base10m"}, coordinator={"durable": False}),
                              limits=CallLimits(stream_idle_s=1.0))
    ch = channel(local)
    stub = pb_grpc.CoordinatorStub(ch)
    member = stub.Join(pb.JoinRequest(worker_name="a", device="cpu", pid=1), timeout=5, metadata=AUTH)
    request = pb.PullParametersRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
    responses = stub.PullParameters(request, timeout=30, metadata=AUTH)
    assert next(responses).HasField("header")
    time.sleep(2.5)
    with pytest.raises(grpc.RpcError) as excinfo:
        for _ in responses:
            pass
    assert excinfo.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "PullParameters: the client read no message for 1 s (stream_idle_s)" in excinfo.value.details()
    assert_membership_answers(stub, ch, member)


def test_the_server_never_waits_past_a_calls_cap(start_coordinator, channel, monkeypatch):
    cap_s = 1.0
    for name in ("AwaitVersion", "PushUpdate"):
        kind = KIND_OF_METHOD[name]
        monkeypatch.setitem(KIND_OF_METHOD, name, RpcKind(kind.name, kind.methods, cap_s))
    local = start_coordinator(tiny_spec(coordinator={"lease_s": 60.0, "max_wait_s": 30.0}),
                              limits=CallLimits(stream_idle_s=20.0))
    ch = channel(local)
    stub = pb_grpc.CoordinatorStub(ch)
    member = stub.Join(pb.JoinRequest(worker_name="a", device="cpu", pid=1), timeout=5, metadata=AUTH)
    # A long poll with a 364-day deadline returns at the cap, not at max_wait_s.
    started = time.monotonic()
    poll = pb.AwaitVersionRequest(worker_id=member.worker_id, worker_secret=member.worker_secret, min_version=1, wait_ms=60_000)
    assert stub.AwaitVersion(poll, timeout=364 * 86_400, metadata=AUTH).version == 0
    assert time.monotonic() - started < cap_s + 1.0
    # Beyond 365 days (NO_DEADLINE_S) the coordinator counts a deadline as none and refuses the call.
    with pytest.raises(grpc.RpcError) as refused:
        stub.AwaitVersion(poll, timeout=366 * 86_400, metadata=AUTH)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "calls to the coordinator must set a deadline"
    # A push that sends its meta and then nothing (but for less than stream_idle_s) is cut at the cap.
    release = threading.Event()

    def meta_then_pause() -> Iterator[pb.PushUpdateRequest]:
        meta = pb.UpdateMeta(worker_id=member.worker_id, worker_secret=member.worker_secret, base_version=0, tokens=1)
        yield pb.PushUpdateRequest(meta=meta)
        release.wait(10.0)

    started = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as excinfo:
            stub.PushUpdate(meta_then_pause(), timeout=10, metadata=AUTH)
    finally:
        release.set()
    assert excinfo.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "longest the coordinator serves one push call" in excinfo.value.details()
    assert time.monotonic() - started < cap_s + 2.0


class FailingStore(StateStore):
    """A real store whose commits fail (disk full) while `failing` is set."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.failing = threading.Event()

    def commit_version(self, *args, **kwargs):
        if self.failing.is_set():
            raise OSError(28, "No space left on device")
        return super().commit_version(*args, **kwargs)


def test_health_says_not_serving_while_rounds_cannot_close(tmp_path, channel):
    spec = tiny_spec(sync={"round_deadline_s": 0.5, "max_update_norm": 100.0})
    store = FailingStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    try:
        local = LocalCoordinator(running, tmp_path / "state")
        ch = channel(local)
        client = local.client()
        a = client.join("a", "cpu", 1)
        client.join("b", "cpu", 1)
        client.pull(a, a.run_id)
        assert health_status(ch) == SERVING
        store.failing.set()
        push(client, a, small_deltas(local))
        wait_for(lambda: health_status(ch) == NOT_SERVING, 5.0, "NOT_SERVING once the round's close fails")
        assert client.status().version == 0
        store.failing.clear()
        wait_for(lambda: health_status(ch) == SERVING, 5.0, "SERVING once the round closed")
        assert client.status().version == 1
        client.close()
    finally:
        store.failing.clear()
        running.stop(grace=0.5)


class StalledEventStore(StateStore):
    """A real store whose event writes hang (a stalled volume) while `hanging` is set, until `release`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hanging, self.release = threading.Event(), threading.Event()

    def _stall(self) -> None:
        if self.hanging.is_set():
            self.release.wait(60)

    def add_event(self, *args, **kwargs) -> None:
        self._stall()
        super().add_event(*args, **kwargs)

    def record_join(self, *args, **kwargs) -> None:  # a join's event rows (written without the run's lock)
        self._stall()
        super().record_join(*args, **kwargs)


def test_health_says_not_serving_when_a_holder_of_the_run_lock_hangs_and_not_for_a_hanging_join(tmp_path, channel):
    """A Join whose event write hung held the run's lock: the ticker stopped on it, and so did the health thread,
    which then answered SERVING for good (Kubernetes never restarted the wedged pod). The health thread now never
    waits long for the lock, so a stalled ticker shows: NOT_SERVING within the stall limit, SERVING after. A Join
    now writes without the run's lock (`SwarmCoordinator.join`), so its hanging write stalls neither the ticker nor
    health; a holder of the lock that hangs (what a write under it was) still turns health NOT_SERVING."""
    spec = tiny_spec()
    store = StalledEventStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN, health_stall_s=2.0).start()
    run = running.group.runs[0]
    joiner = holder = None
    unstuck = threading.Event()

    def stuck_holder() -> None:
        with run._lock:
            unstuck.wait(60)

    try:
        local = LocalCoordinator(running, tmp_path / "state")
        ch = channel(local)
        assert health_status(ch) == SERVING
        store.hanging.set()
        client = local.client()
        joiner = threading.Thread(target=lambda: client.join("w", "cpu", 1), daemon=True)
        joiner.start()
        ends = time.monotonic() + 3.0  # past the 2 s stall limit: the ticker goes on while the join's write hangs
        while time.monotonic() < ends:
            assert health_status(ch) == SERVING, running.health_reason
            time.sleep(0.2)
        holder = threading.Thread(target=stuck_holder, daemon=True)
        holder.start()
        wait_for(lambda: health_status(ch) == NOT_SERVING, 10.0, "NOT_SERVING while the run's lock is held")
        assert "no tick" in running.health_reason
        unstuck.set()
        store.hanging.clear()
        store.release.set()
        joiner.join(10)
        holder.join(10)
        wait_for(lambda: health_status(ch) == SERVING, 10.0, "SERVING once the holder released the lock")
        client.close()
    finally:
        unstuck.set()
        store.release.set()
        running.stop(grace=0.5)


def test_decide_health():
    assert decide_health(10.0, TickRecord(9.8), stall_s=60.0) == (True, "ticks complete")
    serving, reason = decide_health(10.0, TickRecord(9.8, "OSError: disk full"), stall_s=60.0)
    assert not serving and "OSError: disk full" in reason
    serving, reason = decide_health(100.0, TickRecord(30.0), stall_s=60.0)
    assert not serving and "70.0 s" in reason and "60 s" in reason


def test_call_limits_come_from_the_run_spec_and_the_command_line_overrides_them():
    spec = tiny_spec(coordinator={"max_calls": {"push": 2, "long_poll": 100}, "stream_idle_s": 4.0, "health_stall_s": 30.0})
    base = ["--config", "RUN.toml", "--state-dir", "state"]
    limits, stall_s = coordinator_cli.serving_limits(coordinator_cli.parse_args(base), spec)
    assert limits.max_calls == {**DEFAULT_MAX_CALLS, "push": 2, "long_poll": 100}
    assert (limits.stream_idle_s, stall_s) == (4.0, 30.0)
    args = coordinator_cli.parse_args([*base, "--max-calls", "push=5", "--stream-idle-s", "2", "--health-stall-s", "9"])
    limits, stall_s = coordinator_cli.serving_limits(args, spec)
    assert (limits.max_calls["push"], limits.max_calls["long_poll"], limits.stream_idle_s, stall_s) == (5, 100, 2.0, 9.0)
    with pytest.raises(ValueError, match="'polls'.*unknown RPC kind"):
        coordinator_cli.serving_limits(coordinator_cli.parse_args([*base, "--max-calls", "polls=3"]), spec)
    # --health-stall-s has the spec key's floor: 0.001 s read NOT_SERVING between two ticks of a healthy coordinator.
    for stall in ("0.001", "nan", "inf", "-1.0"):
        with pytest.raises(ValueError, match=rf"^--health-stall-s {stall}: expected a number of seconds in \[1, "):
            coordinator_cli.serving_limits(coordinator_cli.parse_args([*base, "--health-stall-s", stall]), spec)
    with pytest.raises(ValueError, match=r"coordinator.max_calls = \{'polls': 3\} is invalid: expected a kind of call"):
        tiny_spec(coordinator={"max_calls": {"polls": 3}})
    with pytest.raises(ValueError, match="coordinator.max_calls.push = 0"):
        tiny_spec(coordinator={"max_calls": {"push": 0}})


def test_call_limits_validate_themselves():
    limits = CallLimits(parse_max_calls(["long_poll=8", "push = 2"]), stream_idle_s=3.0)
    assert limits.max_calls["long_poll"] == 8 and limits.max_calls["push"] == 2
    assert limits.threads == sum(limits.max_calls.values()) + 5 * limits.reserve + limits.headroom
    with pytest.raises(ValueError, match="'polls'.*unknown RPC kind.*long_poll"):
        CallLimits(parse_max_calls(["polls=3"]))
    with pytest.raises(ValueError, match="expected KIND=N"):
        parse_max_calls(["push"])
    with pytest.raises(ValueError, match=r"max_calls\['pull'\] = 0: expected an integer in \[1, 4096\]"):
        CallLimits(parse_max_calls(["pull=0"]))
    # Each limit sizes the RPC thread pool: --max-calls pull=10**12 made it unbounded.
    with pytest.raises(ValueError, match=r"max_calls\['pull'\] = 1000000000000: expected an integer in \[1, 4096\]"):
        CallLimits(parse_max_calls(["pull=1000000000000"]))
    # --stream-idle-s 0.001 cancelled every pull at once.
    with pytest.raises(ValueError, match=r"stream_idle_s = 0.001: expected a number of seconds in \[1, "):
        CallLimits(stream_idle_s=0.001)
    with pytest.raises(ValueError, match="lacks query"):
        CallLimits({k: v for k, v in DEFAULT_MAX_CALLS.items() if k != "query"})
    with pytest.raises(ValueError, match="stream_idle_s = nan"):
        CallLimits(stream_idle_s=math.nan)
    with pytest.raises(ValueError, match="headroom = 0"):
        CallLimits(headroom=0)


def test_decide_slot_caps_each_caller_and_keeps_a_members_own_slot() -> None:
    limits = CallLimits(parse_max_calls(["push=4"]), per_worker=2, reserve=3)
    member, peer = Caller("w1-ab", True), Caller("10.0.0.7", False)
    assert decide_slot("push", member, SlotsHeld(0, 0, 0), limits)[0] == "shared"
    slot, reason = decide_slot("push", member, SlotsHeld(3, 0, 2), limits)
    assert slot is None and "worker w1-ab already has 2 push calls running" in reason
    assert "coordinator.max_calls_per_worker = 2" in reason
    # A peer host (anonymous calls) gets at most half of the kind's limit.
    slot, reason = decide_slot("push", peer, SlotsHeld(2, 0, 2), limits)
    assert slot is None and "peer 10.0.0.7 already has 2 push calls" in reason and "max_calls_per_peer = 2" in reason
    # The kind is full: a member with no call of it gets its own from the reserve; a second call, a peer, or a
    # full reserve do not.
    assert decide_slot("push", member, SlotsHeld(4, 0, 0), limits)[0] == "reserved"
    for caller, held in ((member, SlotsHeld(4, 0, 1)), (peer, SlotsHeld(4, 0, 0)), (member, SlotsHeld(7, 3, 0))):
        slot, reason = decide_slot("push", caller, held, limits)
        assert slot is None and "coordinator busy: 4 push calls (PushUpdate) already running" in reason, (caller, held)
    assert CallLimits(per_peer={"query": 3}).peer_limit("query") == 3 and CallLimits().peer_limit("membership") == 16
    with pytest.raises(ValueError, match=r"per_peer\['pulls'\]: unknown RPC kind"):
        CallLimits(per_peer={"pulls": 1})
    with pytest.raises(ValueError, match="per_worker = 0: expected an integer >= 1"):
        CallLimits(per_worker=0)


def test_decide_progress_says_not_serving_when_updates_wait_past_the_deadlines() -> None:
    idle = decisions.RoundProgress("r", open_s=500.0, deadline_s=5.0, reports=0, multiple=3.0)
    young = decisions.RoundProgress("r", open_s=14.0, deadline_s=5.0, reports=2, multiple=3.0)
    assert decisions.decide_progress([idle, young]) == decisions.Decision(True, "rounds close")
    stuck = decisions.RoundProgress("r2", open_s=16.0, deadline_s=5.0, reports=2, multiple=3.0)
    decision = decisions.decide_progress([idle, stuck])
    assert not decision.ok and decision.reason == (
        "run r2: 2 updates waiting in a round open for 16.0 s, more than coordinator.health_round_deadlines = 3 × "
        "its deadline 5 s: no round closes")


class HangingStore(StateStore):
    """A real store whose commits block (a hung disk) while `hanging` is set: no error, no tick fails."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hanging = threading.Event()
        self.released = threading.Event()

    def commit_version(self, *args, **kwargs):
        if self.hanging.is_set():
            self.released.wait(30.0)
        return super().commit_version(*args, **kwargs)


def test_health_says_not_serving_with_its_reason_while_updates_wait_and_no_round_closes(tmp_path, channel):
    spec = tiny_spec(sync={"round_deadline_s": 0.5, "max_update_norm": 100.0},
                     coordinator={"health_round_deadlines": 3.0})
    store = HangingStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    pushed = None
    try:
        local = LocalCoordinator(running, tmp_path / "state")
        ch = channel(local)
        client = local.client()
        a = client.join("a", "cpu", 1)
        client.pull(a, a.run_id)
        store.hanging.set()
        # The push's close hangs in its commit on the push's own thread; the ticker goes on ticking.
        pushed = threading.Thread(target=push, args=(client, a, small_deltas(local)), daemon=True)
        pushed.start()
        wait_for(lambda: health_status(ch) == NOT_SERVING, 10.0, "NOT_SERVING while the update waits")
        assert "1 update waiting in a round open for" in running.health_reason
        assert "coordinator.health_round_deadlines = 3 × its deadline 0.5 s" in running.health_reason
        store.released.set()
        wait_for(lambda: client.status().version == 1 and health_status(ch) == SERVING, 10.0,
                 "SERVING once the round closed")
        client.close()
    finally:
        store.released.set()
        running.stop(grace=0.5)
        if pushed is not None:
            pushed.join(timeout=10)
