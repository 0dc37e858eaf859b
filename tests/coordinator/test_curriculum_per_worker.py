"""Per-worker lengthening where paces differ (`curriculum.decide_worker_lengthening`, issue #30): a pure rule on a
fake clock: a worker 4× slower reaches Eq. 11's crossover 4× later in wall time, equal paces share the run's rule;
and the tracker applying it to workers fed metrics, across a restart (a real StateStore in a tmp dir)."""

from __future__ import annotations

import json
import math

import pytest

from rcswarm.coordinator import curriculum as curricula
from rcswarm.observe.fits import AlphaScheduleFit
from rcswarm.state.store import StateStore
from tests.helpers.curriculum import LADDER, ROUND_S, Swarm
from tests.helpers.specs import tiny_spec

# A slow law (τ = 1000 steps): the longer length pulls ahead only after many steps.
OPTIONS = curricula.AdaptiveOptions((4, 8, 16), 1e6, curricula.Law(AlphaScheduleFit(0.3, 1000.0, math.nan),
                                                                      lambda step: 0.0, "test law"))
STATE = curricula.CurriculumState(rung=0, started_at=0.0, costs={4: (0.5, 5)})


def pace(worker_id: str, seconds_per_step: float, rung: int = 0) -> curricula.WorkerPace:
    return curricula.WorkerPace(worker_id, rung, {4: (seconds_per_step * 10, 10)})


def crossover(seconds_per_step: float) -> float:
    """The wall time of Eq. 11's crossover for a worker at `seconds_per_step` (from the run-wide rule's reason)."""
    state = curricula.CurriculumState(rung=0, started_at=0.0, costs={4: (seconds_per_step * 10, 10)})
    reason = curricula.decide_lengthening(1.0, state, OPTIONS).reason
    return float(reason.split(" from ")[1].split(" s on")[0])


def test_a_slow_worker_lengthens_later_in_wall_time_than_a_fast_one():
    fast, slow = crossover(0.1), crossover(0.4)
    assert slow == pytest.approx(4 * fast, rel=0.02)
    workers = [pace("fast", 0.1), pace("slow", 0.4)]
    between = curricula.decide_worker_lengthening((fast + slow) / 2, STATE, OPTIONS, workers)
    assert between["fast"].ok and "lengthens L = 4 -> 8" in between["fast"].reason
    assert not between["slow"].ok and "not reached" in between["slow"].reason
    assert all("paces differ up to 4×" in d.reason and "its own costs" in d.reason for d in between.values())
    assert all(d.ok for d in curricula.decide_worker_lengthening(slow * 1.01, STATE, OPTIONS, workers).values())
    assert not any(d.ok for d in curricula.decide_worker_lengthening(fast * 0.99, STATE, OPTIONS, workers).values())


def test_equal_paces_share_the_run_wide_decision_and_a_worker_without_costs_takes_the_runs():
    workers = [pace("a", 0.1), pace("b", 0.11)]
    run_wide = curricula.decide_lengthening(crossover(0.1) * 1.01, STATE, OPTIONS)
    same = curricula.decide_worker_lengthening(crossover(0.1) * 1.01, STATE, OPTIONS, workers)
    assert {d.ok for d in same.values()} == {run_wide.ok}
    assert all("paces within 1.25×" in d.reason and run_wide.reason in d.reason for d in same.values())
    # A newcomer with nothing measured at its rung is decided on the run's costs (0.1 s/step here), and a worker on
    # the last rung stays.
    mixed = [pace("fast", 0.1), pace("slow", 0.4), curricula.WorkerPace("new", 0, {}), pace("top", 0.4, rung=2)]
    decided = curricula.decide_worker_lengthening(crossover(0.1) * 1.01, STATE, OPTIONS, mixed)
    assert decided["new"].ok and "the run's (none of its own at its rung)" in decided["new"].reason
    assert not decided["top"].ok and "last rung" in decided["top"].reason


# The tracker applies the rule (issue #30): a fast worker and one 3× slower, fed metrics on a fake clock (`Swarm`).


def own_crossover(seconds_per_step: float, rung: int) -> float:
    """Eq. 11's crossover from `rung` for a worker alone at `seconds_per_step` at L = 4 (costs ∝ L)."""
    lengths = LADDER["seq_lens"]
    costs = {lengths[r]: (seconds_per_step * lengths[r] / 4 * 10, 10) for r in range(rung + 1)}
    options = curricula.AdaptiveOptions(tuple(lengths), 1e6, curricula.Law(AlphaScheduleFit(0.3, 100.0, math.nan),
                                                                           lambda step: 0.0, "test law"))
    reason = curricula.decide_lengthening(1.0, curricula.CurriculumState(rung=rung, started_at=0.0, costs=costs),
                                          options).reason
    return float(reason.split(" from ")[1].split(" s on")[0])


def first_close_after(seconds: float) -> float:
    return math.ceil(seconds / ROUND_S) * ROUND_S


@pytest.fixture
def store(tmp_path):
    store = StateStore(tmp_path / "state")
    yield store
    store.close()


def tracker_of(store: StateStore) -> curricula.CurriculumTracker:
    return curricula.CurriculumTracker(tiny_spec(curriculum=LADDER), store)


def test_a_fast_and_a_three_times_slower_worker_each_lengthen_at_their_own_crossover(store):
    swarm = Swarm(tracker_of(store), {"fast": 0.1, "slow": 0.3})
    swarm.run_until(20.0)
    # The fast worker lengthened at its own crossover; the slow one, not there yet, still trains L = 4, which is the
    # run's rung (the lowest a worker trains: where a newcomer starts) and what GetStatus reports.
    assert swarm.lengthened["fast"] == [first_close_after(own_crossover(0.1, 0))]
    assert (swarm.length("fast"), swarm.length("slow")) == (8, 4)
    status = swarm.tracker.status(swarm.now, swarm.version)
    assert (status.rung, status.seq_len) == (0, 4) and "per worker, paces differ up to 3×" in status.reason
    assert "this worker's own pace" in swarm.tracker.assignment(swarm.version, None, "fast").reason
    # Updates may claim the tokens of the largest rung a worker trains.
    assert swarm.tracker.largest_assignment(swarm.version).seq_len == 8
    swarm.run_until(140.0)
    fast, slow = swarm.lengthened["fast"], swarm.lengthened["slow"]
    assert fast == [first_close_after(own_crossover(0.1, 0)), first_close_after(own_crossover(0.1, 1))]
    assert slow == [first_close_after(own_crossover(0.3, 0)), first_close_after(own_crossover(0.3, 1))]
    assert [s / f for s, f in zip(slow, fast, strict=True)] == [pytest.approx(3.0, rel=0.1)] * 2
    assert (swarm.length("fast"), swarm.length("slow")) == (16, 16)
    # At the last rung a worker stays, with the reason.
    swarm.round()
    assert swarm.length("fast") == 16 and "the last rung" in swarm.tracker.state.workers["fast"].reason
    # Each lengthening is one event of its worker; the rounds are one run-wide event each (no per-worker "stays").
    events = store.events("curriculum")
    own = [(event.worker_id, event.reason.split(": ")[0]) for event in events if event.worker_id]
    assert [worker_id for worker_id, _ in own] == ["fast", "slow", "fast", "slow"]
    assert all("lengthens" in event.reason for event in events if event.worker_id)
    assert sum(1 for event in events if not event.worker_id) == swarm.version


def test_a_worker_joining_mid_run_starts_at_the_runs_rung_and_climbs_at_its_own_pace(store):
    swarm = Swarm(tracker_of(store), {"fast": 0.1, "slow": 0.3})
    swarm.run_until(20.0)
    swarm.add("late", 0.1)
    assert swarm.length("late") == 4  # the run's rung: the slow worker's
    swarm.round()
    # Its own crossover (13.9 s at 0.1 s/step) has passed: it lengthens at its first decision, one rung per round.
    assert swarm.length("late") == 8 and swarm.lengthened["late"] == [22.0]


def test_equal_paces_keep_one_run_wide_rung(store):
    swarm = Swarm(tracker_of(store), {"a": 0.1, "b": 0.11})
    swarm.run_until(16.0)
    state = swarm.tracker.state
    assert state.rung == 1 and all(own.rung is None for own in state.workers.values())
    assert swarm.length("a") == swarm.length("b") == 8
    assert not [event for event in store.events("curriculum") if event.worker_id]


def test_a_restart_resumes_each_workers_rung_and_a_rejoin_keeps_it(tmp_path):
    store = StateStore(tmp_path / "state")
    try:
        swarm = Swarm(tracker_of(store), {"fast": 0.1, "slow": 0.3})
        swarm.run_until(20.0)
        before = swarm.tracker.state
    finally:
        store.close()
    store = StateStore(tmp_path / "state")
    try:
        restarted = tracker_of(store)
        assert restarted.state == before and restarted.state.workers["fast"].rung == 1
        assert (restarted.assignment(10, None, "fast").seq_len, restarted.assignment(10, None, "slow").seq_len) == (8, 4)
        # After the restart the workers join again under new ids, naming their previous memberships.
        restarted.rejoin("fast-2", "fast")
        assert restarted.assignment(10, None, "fast-2").seq_len == 8 and "fast" not in restarted.state.workers
        assert restarted.assignment(10, None, "stranger").seq_len == 4
    finally:
        store.close()


def test_a_state_stored_before_per_worker_rungs_still_loads(store):
    old = json.dumps({"rung": 1, "started_at": 3.0, "reason": "why", "decided_version": 7, "rung_version": 5,
                      "costs": {"4": [1.0, 10]}})
    store.set_many({curricula.CURRICULUM_KEY: old})
    tracker = tracker_of(store)
    assert tracker.state == curricula.CurriculumState(rung=1, started_at=3.0, costs={4: (1.0, 10)}, reason="why",
                                                      decided_version=7, rung_version=5)
    assert tracker.assignment(8, None, "w1").seq_len == 8
    assert curricula.CurriculumState.from_json(tracker.state.to_json()) == tracker.state


def test_beyond_the_cap_the_oldest_ended_memberships_are_forgotten(store, monkeypatch):
    monkeypatch.setattr(curricula, "MAX_REMEMBERED_WORKERS", 2)
    swarm = Swarm(tracker_of(store), {"gone": 0.3, "fast": 0.1, "slow": 0.3})
    swarm.round()
    assert list(swarm.tracker.state.workers) == ["gone", "fast", "slow"]  # all three active: none dropped
    del swarm.paces["gone"]
    swarm.round()
    assert list(swarm.tracker.state.workers) == ["fast", "slow"]


def test_a_stored_worker_rung_off_the_ladder_is_refused(store):
    stored = curricula.CurriculumState(workers={"w1": curricula.WorkerCurriculum(rung=5, costs={4: (1.0, 10)})})
    store.set_many({curricula.CURRICULUM_KEY: stored.to_json()})
    with pytest.raises(RuntimeError, match=r"workers' curriculum rungs \{'w1': 5\} are off the ladder \[4, 8, 16\]"):
        tracker_of(store)
