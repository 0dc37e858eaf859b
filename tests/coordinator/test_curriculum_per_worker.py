"""Per-worker lengthening where paces differ (`curriculum.decide_worker_lengthening`, issue #30): a pure rule on a
fake clock: a worker 4× slower reaches Eq. 11's crossover 4× later in wall time, equal paces share the run's rule."""

from __future__ import annotations

import math

import pytest

from rcswarm.coordinator import curriculum as curricula
from rcswarm.observe.fits import AlphaScheduleFit

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
