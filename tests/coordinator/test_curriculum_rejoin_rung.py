"""The adaptive curriculum's rungs around a re-join (a review, 2026-11-29): a worker that joins again naming its ended
membership resumes at least at the run's rung when the run lengthened without it, the run-wide path lifts an active
worker below the run's rung at every close (not only at a lengthening), and the per-worker path never lowers the
run's rung. The tracker is driven on a fake clock with a real StateStore in a tmp dir."""

from __future__ import annotations

import pytest

from rcswarm.coordinator import curriculum as curricula
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import previous
from tests.helpers.curriculum import LADDER, Swarm
from tests.helpers.specs import tiny_spec


@pytest.fixture
def store(tmp_path):
    store = StateStore(tmp_path / "state")
    yield store
    store.close()


def tracker_of(store: StateStore, curriculum: dict[str, object] | None = None,
               data: dict[str, object] | None = None) -> curricula.CurriculumTracker:
    """A tracker over LADDER (with `curriculum`'s keys over it) on tiny_spec (with `data`'s)."""
    spec = tiny_spec(curriculum={**LADDER, **(curriculum or {})}, data=data or {})
    return curricula.CurriculumTracker(spec, store)


def stored_tracker(store: StateStore, rung: int, workers: dict[str, curricula.WorkerCurriculum],
                   curriculum: dict[str, object] | None = None,
                   data: dict[str, object] | None = None) -> curricula.CurriculumTracker:
    """A tracker resumed from a stored state at `rung` with these worker entries (started at 0 s, L = 4 measured)."""
    state = curricula.CurriculumState(rung=rung, started_at=0.0, costs={4: (1.0, 10)}, workers=workers)
    store.set_many({curricula.CURRICULUM_KEY: state.to_json()})
    return tracker_of(store, curriculum, data)


def own(rung: int | None, **costs: tuple[float, int]) -> curricula.WorkerCurriculum:
    return curricula.WorkerCurriculum(rung, {int(k.removeprefix("L")): v for k, v in costs.items()}, "its own pace")


def test_a_worker_evicted_on_the_first_rung_rejoins_on_the_runs_last_rung_and_the_run_never_falls_back(store):
    """The review's run: slow (rung 0, decided per worker) is evicted, the run climbs to L = 16 with fast alone;
    slow re-joins naming its membership. It trained L = 4 for good (the run-wide path never lifted it at the last
    rung), and once fast came back the per-worker path lowered the run's rung to L = 8 for newcomers."""
    swarm = Swarm(tracker_of(store), {"fast": 0.1, "slow": 0.3})
    tracker = swarm.tracker
    while swarm.now < 28.0:  # between fast's crossover (13.9 s) and slow's (41.6 s): decided per worker
        swarm.round()
    assert (swarm.length("fast"), swarm.length("slow"), tracker.state.rung) == (8, 4, 0)
    del swarm.paces["slow"]  # evicted
    while tracker.state.rung < 2 and swarm.version < 400:
        swarm.round()
    assert tracker.state.rung == 2 and tracker.state.workers["slow"].rung == 0  # an ended membership keeps its entry
    del swarm.paces["fast"]
    swarm.add("z", 0.1)
    swarm.round()
    saved, lifted = tracker.rejoin("slow-2", "slow")
    assert swarm.length("slow-2") == 16, tracker.state.workers["slow-2"]
    resumed = tracker.state.workers["slow-2"]
    assert resumed.costs == curricula.CurriculumState.from_json(saved[curricula.CURRICULUM_KEY]).workers["slow-2"].costs
    assert "lifted L = 4 -> 16, the run's rung: it joined again (as slow before)" in resumed.reason
    assert lifted == resumed.reason  # the join stores it as its worker's event (`SwarmCoordinator._admit`)
    swarm.add("slow-2", 0.3)
    for _ in range(5):
        swarm.round()
    assert (swarm.length("slow-2"), swarm.length("z"), tracker.state.rung) == (16, 16, 2)
    swarm.add("fast", 0.1)  # paces now differ at a length both measured: the per-worker path
    swarm.round()
    assert tracker.state.reason.startswith("per worker") and tracker.state.rung == 2
    assert tracker.worker_assignment(swarm.version, "newcomer").seq_len == 16


def test_a_rejoin_is_lifted_onto_the_runs_rung_and_never_shortened(store):
    tracker = stored_tracker(store, 1, {"behind": own(0, L4=(3.0, 10)), "ahead": own(2, L4=(1.0, 10)),
                                        "undecided": own(None, L4=(2.0, 10))})
    lifted = [tracker.rejoin(f"{previous}-2", previous)[1] for previous in ("behind", "ahead", "undecided")]
    assert lifted[0].startswith("lifted L = 4 -> 8, the run's rung") and lifted[1:] == ["", ""]
    assert {key: value.rung for key, value in tracker.state.workers.items()} == {
        "behind-2": 1, "ahead-2": 2, "undecided-2": None}
    assert [tracker.assignment(3, None, f"{previous}-2").seq_len for previous in ("behind", "ahead", "undecided")] \
        == [8, 16, 8]
    assert tracker.state.workers["behind-2"].costs == {4: (3.0, 10)}
    assert tracker.state.workers["ahead-2"] == own(2, L4=(1.0, 10))  # as it was: reason and all


def test_the_run_wide_path_lifts_an_active_worker_below_the_runs_rung_at_a_close_that_does_not_lengthen(store):
    """A state stored with an active worker below the run's rung (one that re-joined before re-joins were lifted):
    paces measured at different lengths count as equal, so the run-wide rule decides, and the last rung never
    lengthens; the worker is lifted at the first close all the same, and one above the run's rung stays."""
    tracker = stored_tracker(store, 1, {"slow": own(0, L4=(3.0, 10)), "fast": own(2, L16=(4.0, 10)),
                                        "z": own(None, L8=(2.0, 10))})
    tracker.advance(1.0, 7, ["slow", "fast", "z"])
    assert not tracker.state.reason.startswith("per worker") and tracker.state.rung == 1
    assert [tracker.assignment(8, None, worker_id).seq_len for worker_id in ("slow", "fast", "z")] == [8, 16, 8]
    assert "lifted L = 4 -> 8, the run's rung: round 7: no active worker trains below it" \
        in tracker.state.workers["slow"].reason
    at_last = stored_tracker(store, 2, {"slow": own(0, L4=(3.0, 10)), "z": own(None, L16=(4.0, 10))})
    at_last.advance(1000.0, 9, ["slow", "z"])
    assert "the last rung" in at_last.state.reason and at_last.assignment(10, None, "slow").seq_len == 16


def test_the_per_worker_path_never_lowers_the_runs_rung(store):
    """A state stored with a worker below the run's rung, its pace 3× the other's at L = 4: the per-worker rule
    decided it from its own rung and the run's rung fell to it (2 -> 1), so newcomers trained L = 8 in a run that had
    reached L = 16. Now it is lifted onto the run's rung, which stays."""
    tracker = stored_tracker(store, 2, {"fast": own(2, L4=(1.0, 10)), "slow": own(0, L4=(3.0, 10))})
    tracker.advance(100.0, 11, ["fast", "slow"])
    state = tracker.state
    assert state.reason.startswith("per worker, paces differ up to 3×") and state.rung == 2, state.reason
    assert tracker.worker_assignment(12, "newcomer").seq_len == 16
    assert state.workers["slow"].rung == 2 and "lifted L = 8 -> 16, the run's rung" in state.workers["slow"].reason
    assert tracker.status(100.0, 12).rung == 2
    lifted = [event.reason for event in store.events("curriculum") if event.worker_id == "slow"]
    assert len(lifted) == 1 and "lifted L = 8 -> 16" in lifted[0] and "lengthens L = 4 -> 8" in lifted[0]


def test_an_update_trained_before_a_lift_is_within_the_token_bound(store):
    """With constant_tokens the rounding of the batch gives the ladder [5, 7, 11] at batch 3 tokens per step 15, 14
    and 11: the shortest rung has the most. A worker evicted at rung 0 re-joins after the run reached rung 2 and is
    lifted there; the update it trained under its ended membership from the version before (rung 0, 15 tokens a
    step) must stay within the bound, though no rung held now lies within one rung of rung 0."""
    tracker = stored_tracker(store, 2, {"slow": own(0, L5=(3.0, 10)), "fast": own(2, L11=(1.0, 10))},
                             curriculum={"seq_lens": [5, 7, 11], "constant_tokens": True}, data={"batch_size": 3})
    tracker.rejoin("slow-2", "slow")
    assert tracker.assignment(20, None, "slow-2").seq_len == 11
    largest = tracker.largest_assignment(20, since=19)
    assert (largest.seq_len, largest.batch_size) == (5, 3)
    now = tracker.largest_assignment(20)
    assert (now.seq_len, now.batch_size) == (11, 1)


def worker_events(store: StateStore, worker_id: str) -> list[str]:
    """The reasons of `worker_id`'s "curriculum" events, oldest first."""
    return [event.reason for event in store.events("curriculum") if event.worker_id == worker_id]


def test_a_per_worker_lift_of_a_worker_whose_own_rule_says_stays_is_its_event_and_the_round_counts_it(store):
    """The review's case: slow, below the run's rung (L = 4 under L = 16), is decided per worker at 1 s, before its
    own crossover: its rule says it stays, the lift moves it to L = 16. Before, it had no event row, and the round's
    row said "0 of 2 lengthened" though a worker moved L = 4 -> 16."""
    tracker = stored_tracker(store, 2, {"fast": own(2, L4=(1.0, 10)), "slow": own(0, L4=(3.0, 10))})
    tracker.advance(1.0, 11, ["fast", "slow"])
    assert tracker.state.workers["slow"].rung == 2
    lifted = worker_events(store, "slow")
    assert len(lifted) == 1 and lifted[0].startswith("round 11: lifted L = 4 -> 16, the run's rung: round 11: ")
    assert "stays" in lifted[0] and not worker_events(store, "fast")
    run = worker_events(store, "")
    assert len(run) == 1 and "0 of 2 lengthened, 1 lifted onto the run's rung L = 16, workers by L {16: 2}" in run[0]


def test_a_run_wide_lift_is_its_workers_event_and_the_round_counts_it(store):
    tracker = stored_tracker(store, 1, {"slow": own(0, L4=(3.0, 10)), "fast": own(2, L16=(4.0, 10)),
                                        "z": own(None, L8=(2.0, 10))})
    tracker.advance(1.0, 7, ["slow", "fast", "z"])
    assert worker_events(store, "slow") == [f"round 7: {tracker.state.workers['slow'].reason}"]
    assert not worker_events(store, "fast") and not worker_events(store, "z")  # above, or on no rung of its own
    run = worker_events(store, "")
    assert len(run) == 1 and run[0].endswith("; 1 lifted onto the run's rung L = 8")


class InsertRefusingStore(StateStore):
    """A real store whose database refuses rows of `table` while `refusing` is set: a SQLite trigger aborts the
    insert, as a full disk aborts a transaction midway, and the store rolls the transaction back."""

    def refuse(self, table: str) -> None:
        with self._writer() as db:
            db.execute(f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
                       "BEGIN SELECT RAISE(ABORT, 'database or disk is full (the test)'); END")

    def allow(self, table: str) -> None:
        with self._writer() as db:
            db.execute(f"DROP TRIGGER refuse_{table}")


def test_a_rejoins_lift_is_stored_with_the_join_and_not_without_it(tmp_path):
    """A worker that joins again naming its membership, below the run's rung (a restart after the run lengthened
    without it), is lifted onto the run's rung: before, no event said so. The lift's event is one of the join's rows,
    in its transaction: a join whose write fails leaves neither, and the entry stays the ended membership's."""
    spec = tiny_spec(curriculum=LADDER)
    first = SwarmCoordinator(spec, StateStore(tmp_path / "state"))
    try:
        slow = first.join(pb.JoinRequest(worker_name="slow"))
    finally:
        first.close()
    state = curricula.CurriculumState(rung=2, started_at=0.0, costs={4: (1.0, 10)},
                                      workers={slow.worker_id: own(0, L4=(3.0, 10))})
    store = InsertRefusingStore(tmp_path / "state")
    store.set_many({curricula.CURRICULUM_KEY: state.to_json()})
    restarted = SwarmCoordinator(spec, store)
    try:
        joins = store.events("join")
        store.refuse("member_secrets")
        with pytest.raises(StoreError, match="disk is full"):
            restarted.join(pb.JoinRequest(worker_name="slow", **previous(slow)))
        assert not store.events("curriculum") and store.events("join") == joins
        assert restarted.tracker.state.workers[slow.worker_id].rung == 0
        store.allow("member_secrets")
        back = restarted.join(pb.JoinRequest(worker_name="slow", **previous(slow)))
        assert back.assignment.seq_len == 16
        lifted = [(event.worker_id, event.reason) for event in store.events("curriculum")]
        assert lifted == [(back.worker_id, f"lifted L = 4 -> 16, the run's rung: it joined again (as {slow.worker_id} "
                                            "before) after the run lengthened without it")]
        joined = [event for event in store.events("join") if event.worker_id == back.worker_id]
        assert len(joined) == 1 and joined[0].time == store.events("curriculum")[0].time  # one transaction's rows
    finally:
        restarted.close()
