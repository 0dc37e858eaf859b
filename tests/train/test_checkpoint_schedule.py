"""Checkpoint schedules: every kind obeys the chain rules, the binomial one is optimal, plans follow budgets."""

from __future__ import annotations

import itertools
import math

import pytest

from rcswarm.train.bptt.schedule import (
    ADVANCE,
    RESTORE,
    STORE,
    TURN,
    Schedule,
    binomial,
    binomial_advances,
    naive_min_advances,
    plan_schedule,
    simulate,
    store_all,
    uniform,
)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 21, 34])
@pytest.mark.parametrize("slots", [0, 1, 2, 3, 5])
def test_binomial_schedule_is_optimal_and_obeys_the_rules(n: int, slots: int) -> None:
    schedule = binomial(n, slots)
    count = simulate(schedule.actions(), n)
    best = naive_min_advances(n, slots)
    assert count.advances == schedule.advances == binomial_advances(n, slots) == best
    assert count.turns == n
    assert count.stored_states == schedule.stored_states <= slots


def test_closed_form_matches_the_dynamic_program_where_splits_are_many() -> None:
    for n, slots in itertools.product(range(1, 90), range(1, 5)):
        assert binomial_advances(n, slots) == naive_min_advances(n, slots), (n, slots)


@pytest.mark.parametrize("n", [1, 2, 7, 16, 50, 101])
def test_uniform_and_store_all_obey_the_rules_and_their_counts(n: int) -> None:
    for interval in sorted({1, 2, 3, max(1, round(math.sqrt(n))), n, n + 3}):
        schedule = uniform(n, interval)
        count = simulate(schedule.actions(), n)
        assert (count.advances, count.stored_states, count.turns) == (schedule.advances, schedule.stored_states, n)
    everything = store_all(n)
    count = simulate(everything.actions(), n)
    assert count.advances == n - 1 and count.stored_states == max(n - 2, 0)


def test_uniform_keeps_order_sqrt_n_states_at_one_extra_forward_sweep() -> None:
    n = 10_000
    schedule = uniform(n)
    assert schedule.interval == 100
    assert schedule.stored_states <= 2 * math.isqrt(n)
    assert schedule.advances < 2 * n
    assert simulate(schedule.actions(), n).stored_states == schedule.stored_states


def test_binomial_reaches_log_n_states_at_n_log_n_advances() -> None:
    for n in (1_000, 12_500):
        schedule = binomial(n)  # ceil(log2 n) slots
        assert schedule.slots == math.ceil(math.log2(n))
        count = simulate(schedule.actions(), n)
        assert count.stored_states <= schedule.slots
        assert count.advances <= n * math.log2(n)
        assert count.advances > 2 * n  # a real trade: fewer states than uniform, more recomputation


def test_actions_are_generated_lazily() -> None:
    first = list(itertools.islice(binomial(10**9, 30).actions(), 5))
    assert first == [(ADVANCE, 0), (ADVANCE, 1), (ADVANCE, 2), (ADVANCE, 3), (ADVANCE, 4)]
    first_uniform = list(itertools.islice(uniform(10**9).actions(), 3))
    assert first_uniform == [(ADVANCE, 0), (ADVANCE, 1), (ADVANCE, 2)]


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ([(TURN, 0), (TURN, 1)], "turn 0 at boundary 0: expected turn 1"),
        ([(ADVANCE, 1)], "advance 1 from boundary 0"),
        ([(RESTORE, 1)], "restore 1: boundary 1 is not stored"),
        ([(ADVANCE, 0), (STORE, 1), (STORE, 1)], "store 1 at boundary 1"),
        ([(ADVANCE, 0), (TURN, 1)], "ended with turn 0 next"),
        ([("jump", 0)], "action 'jump'"),
    ],
)
def test_simulate_rejects_schedules_that_break_a_rule(actions: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulate(actions, 2)


def test_plan_follows_the_budget_of_stored_states() -> None:
    assert plan_schedule(100, None) == store_all(100)
    assert plan_schedule(100, 98) == store_all(100)
    tight = plan_schedule(100, 7)
    assert (tight.kind, tight.slots) == ("binomial", 7)
    assert plan_schedule(100, 3, "binomial").slots == 3  # ceil(log2 100) = 7 do not fit
    assert plan_schedule(100, 50, "binomial").slots == 7
    assert plan_schedule(100, 20, "uniform").interval == 10
    with pytest.raises(ValueError, match="uniform schedule of 100 segments keeps 17 core states: expected at most 10"):
        plan_schedule(100, 10, "uniform")
    with pytest.raises(ValueError, match="no core state fits the memory budget for 100 segments"):
        plan_schedule(100, 0)
    with pytest.raises(ValueError, match="schedule kind='revolve'"):
        plan_schedule(100, 10, "revolve")


def test_schedule_fields_are_validated() -> None:
    with pytest.raises(ValueError, match=r"Schedule\.kind='random'"):
        Schedule("random", 4)
    with pytest.raises(ValueError, match=r"Schedule\.n_segments=0: expected an int >= 1"):
        Schedule("all", 0)
    with pytest.raises(ValueError, match=r"Schedule\.slots=-1"):
        Schedule("binomial", 4, slots=-1)
    assert "binomial with 3 slots: 10 segments, at most 3 stored core states" in binomial(10, 3).describe()
