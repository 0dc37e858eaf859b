"""A Join whose client deadline passes while the coordinator admits and stores it (a review, 2026-11-29).

The call's deadline bounded only the join's lock waits: a join whose store write (`StateStore.record_join`) outlasted
it was seated all the same, a member its worker never learnt of (the client had DEADLINE_EXCEEDED), counted against
coordinator.max_workers and waited for by every round until its lease expired (40 joins with 3-20 ms deadlines left 2
such members). Now a join with less than JOIN_ANSWER_MARGIN_S (10 ms) left before or after its write is undone as a failed write
is (`SwarmCoordinator._unadmit`) and answered DEADLINE_EXCEEDED; its stored rows end with a "leave" event, and a
curriculum entry it moved is stored back. Real gRPC on 127.0.0.1, a real store whose `record_join` is slow.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rcswarm.coordinator import curriculum as curricula
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for
from tests.helpers.wire import Wire

# The write outlasts the Join's deadline (which leaves the admission, before the write, ample time on a loaded machine);
# the lease and the round deadline are far longer than the test.
DEADLINE_S = 1.0
WRITE_S = 1.6
LADDER = {"policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 0.3, "tau": 100.0, "budget_seconds": 1e6}


class SlowJoinStore(StateStore):
    """A real store whose `record_join` sleeps `delay` seconds first (a slow disk), then writes; `written` is set
    once a join's transaction is in."""

    delay = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.written = threading.Event()

    def record_join(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.delay)
        super().record_join(*args, **kwargs)
        self.written.set()


@dataclasses.dataclass
class Served:
    run: SwarmCoordinator
    store: SlowJoinStore
    wire: Wire


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Start an in-process coordinator of `spec` on 127.0.0.1 with a SlowJoinStore; stopped at teardown."""
    started: list[tuple[RunningCoordinator, Wire]] = []

    def start(spec: Any) -> Served:
        store = SlowJoinStore(tmp_path, durable=False)
        running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
        wire = Wire(f"127.0.0.1:{running.port}")
        started.append((running, wire))
        return Served(running.group.runs[0], store, wire)

    yield start
    for running, wire in started:
        wire.close()
        running.stop(0.5)


def late_join(served: Served, name: str, **fields: Any) -> grpc.RpcError:
    """A Join whose write takes WRITE_S under a DEADLINE_S deadline: its error, once the coordinator ended it."""
    served.store.delay = WRITE_S
    served.store.written.clear()
    with pytest.raises(grpc.RpcError) as late:
        served.wire.stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=1, **fields), timeout=DEADLINE_S,
                              metadata=served.wire.metadata)
    wait_for(lambda: served.store.written.is_set() and not served.run._join_lock.locked(), 10,
             "the late join's handler to end")
    served.store.delay = 0.0
    return late.value


def test_a_join_past_its_deadline_leaves_no_member_and_the_round_closes_without_it(serve: Any) -> None:
    served = serve(tiny_spec(coordinator={"lease_s": 60.0}, sync={"round_deadline_s": 120.0}))
    run, store, wire = served.run, served.store, served.wire
    a = wire.join("a")
    header = wire.pull(a)
    assert late_join(served, "ghost").code() == grpc.StatusCode.DEADLINE_EXCEEDED
    status = wire.call("GetStatus", pb.GetStatusRequest())
    assert [w.worker_id for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE] == [a]
    assert list(run.workers) == [a] and run.active_workers() == 1
    ghost = [event.worker_id for event in store.events("join")][-1]
    assert ghost != a and [(e.worker_id, e.reason) for e in store.events("leave")] == [
        (ghost, "join undone: its call's deadline passed before it was answered")]
    # a's push closes the round at once: nobody else trained from version 0 (before: it waited 60 s for the lease).
    started = time.monotonic()
    assert wire.push_zero(a, header).accepted
    wait_for(lambda: wire.call("GetStatus", pb.GetStatusRequest()).version == 1, 5, "round 0 to close")
    assert time.monotonic() - started < 5
    # The next join takes the count the undone one did not.
    b = wire.join("b")
    assert b.startswith("w2-") and run.active_workers() == 2


def test_an_undone_rejoin_gives_back_the_curriculum_entry_it_moved_in_memory_and_in_the_store(
    serve: Any, tmp_path: Path,
) -> None:
    """A re-join naming its ended membership moves that membership's curriculum entry (its own rung) and stores the
    move in its transaction; undone by its deadline, the entry is the ended membership's again in memory and in the
    store (a restart resumes it), and the next re-join takes it over."""
    served = serve(tiny_spec(curriculum=LADDER, coordinator={"lease_s": 60.0}))
    run, wire = served.run, served.wire
    first = wire.join("first")
    own = curricula.WorkerCurriculum(rung=1, costs={4: (1.0, 10)}, reason="its own pace")
    run.tracker.state = dataclasses.replace(run.tracker.state, workers={first: own})
    wire.call("Leave", pb.LeaveRequest(**wire.creds(first), reason="restarting"))
    naming = {"previous_worker_id": first, "previous_worker_secret": wire.secrets[first]}
    assert late_join(served, "first", **naming).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert run.tracker.state.workers == {first: own}
    stored = curricula.CurriculumState.from_json(served.store.get(curricula.CURRICULUM_KEY))
    assert stored.workers == {first: own}, "the undone join's transaction left the entry moved in the store"
    again = wire.call("Join", pb.JoinRequest(worker_name="first", device="cpu", pid=1, **naming))
    assert run.tracker.state.workers == {again.worker_id: own} and again.assignment.seq_len == 8  # its own rung
    stored = read_state(tmp_path, lambda s: curricula.CurriculumState.from_json(s.get(curricula.CURRICULUM_KEY)))
    assert stored.workers == {again.worker_id: own}


def test_a_join_at_the_shortest_deadline_a_worker_gives_is_seated(serve: Any) -> None:
    """A review of the undo: with the locks' 0.1 s margin, every Join of a worker at the --rpc-timeout-s floor
    (0.1 s) was undone (0 of 10 seated on loopback). The undo now needs less than 10 ms left."""
    served = serve(tiny_spec(coordinator={"lease_s": 60.0, "max_workers": 16}))
    seated = []
    for index in range(5):
        answer = served.wire.stub.Join(pb.JoinRequest(worker_name=f"quick{index}", device="cpu", pid=1), timeout=0.1,
                                       metadata=served.wire.metadata)
        seated.append(answer.worker_id)
    assert sorted(served.run.workers) == sorted(seated) and served.store.events("leave") == []
