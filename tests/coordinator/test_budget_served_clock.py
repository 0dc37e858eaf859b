"""The wall-time budget's clock (`[run] minutes`) is the time the run was served since its first round opened, over
every launch on its state dir (coordinator/sweep.py `RunGroup._budget_elapsed`, `served_before`): the time the
coordinator was down counts for nothing, for the budget's end and its lifting at a restart, for pruning at fractions of
`run.minutes` and for the forecasts' pace; a first launch's clock is the seconds since its first round opened, as
before (a review, 2026-11-29: a relaunch with `--minutes 5` of a run ended at a 1-minute budget five minutes earlier
lifted nothing, and its launcher said "stopped at the 5-minute budget" though nothing trained)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.sweep import SERVED_AT_STOP_KEY, RunGroup, SweepCoordinator, open_group
from rcswarm.observe.forecast import BUDGET_ENDED
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import creds
from tests.helpers.dashboard import Clock
from tests.helpers.forecasts import good_loss, pruning_spec, train_round
from tests.helpers.specs import tiny_spec

ROUND_S = 5.0  # a round here: its rows, its update, then the clock moves ROUND_S in all


def with_minutes(spec: RunSpec, minutes: float) -> RunSpec:
    """`spec` with another wall-time budget (`run.minutes`), as `rcswarm run --minutes` on a run directory gives."""
    return dataclasses.replace(spec, run=dataclasses.replace(spec.run, minutes=minutes))


def long_run(minutes: float) -> RunSpec:
    """One run of 1000 rounds (its budget ends it first) under a `minutes` budget, closing a round on one report."""
    return with_minutes(tiny_spec(run={"rounds": 1000}, sync={"min_reports": 1}, coordinator={"durable": False}),
                        minutes)


def train_until_finished(group: RunGroup, clock: Clock, name: str, most: int = 200) -> int:
    """Rounds of one worker `name` in the group's one run, ROUND_S each, the group ticked after each, until the run
    is finished: how many it trained. It pulls θ first, as a worker does, which opens the run's round."""
    run = group.runs[0]
    member = group.join(pb.JoinRequest(worker_name=name))
    list(group.pull(pb.PullParametersRequest(**creds(member))))
    for trained in range(most):
        if run.finished:
            return trained
        train_round(run, member, good_loss(run.version + 1.0), clock)
        clock.now += ROUND_S - 1.0
        group.tick()
    raise AssertionError(f"not finished after {most} rounds: {run.stopped}")


def test_a_relaunch_with_a_larger_budget_trains_on_though_the_coordinator_was_down_longer(tmp_path: Path):
    """The review's case: `--minutes 1`, then five minutes later `--minutes 5`. Before, the clock counted the five
    minutes down: the run stayed ended, nothing trained, and the launcher said "stopped at the 5-minute budget"."""
    clock = Clock(1000.0)
    group = open_group(long_run(1.0), tmp_path, clock)
    assert train_until_finished(group, clock, "a") == 12
    first_stop = group.runs[0].stopped
    group.close()

    clock.now += 300.0
    relaunched = open_group(long_run(5.0), tmp_path, clock)
    run = relaunched.runs[0]
    assert not run.finished, run.stopped
    assert first_stop == f"{BUDGET_ENDED} of 1 minutes (60 s served since its first round opened)"
    assert float(run.store.get(SERVED_AT_STOP_KEY)) == 60.0
    assert run.store.events("budget")[-1].reason.startswith(
        "resumed at a restart: its wall-time budget is now 5 minutes (60 s served since its first round opened)")
    clock.now += 20.0  # waiting for its first worker counts for nothing either
    assert train_until_finished(relaunched, clock, "b") == 48  # 240 s more, at ROUND_S a round
    assert run.version == 60
    assert run.stopped == f"{BUDGET_ENDED} of 5 minutes (300 s served since its first round opened)"
    # The forecasts' pace is of the time served: 60 rounds in 300 s, not in the 620 s since the first round opened.
    newest = run.store.forecasts()[-1]
    assert (newest.version, newest.at_seconds) == (60, 300.0)
    relaunched.close()


def test_a_relaunch_with_the_same_budget_stays_ended_though_its_last_row_came_before_the_stop(tmp_path: Path):
    """A launch's served period ends at its last metric row, 5 s before the stop here (55 s of rows): the budget's
    clock at the stop, stored with it, is the least the run was served, so the same budget (or a lower one) still
    ends it."""
    clock = Clock(1000.0)
    group = open_group(long_run(1.0), tmp_path, clock)
    train_until_finished(group, clock, "a")
    ended = group.runs[0].stopped
    group.close()
    clock.now += 3600.0
    for minutes in (1.0, 0.5):
        again = open_group(long_run(minutes), tmp_path, clock)
        assert again.runs[0].finished and again.runs[0].stopped == ended
        assert [event.reason for event in again.runs[0].store.events("budget")] == [ended]
        again.close()


def test_an_older_state_dirs_budget_stop_keeps_its_clock_from_its_reason(tmp_path: Path):
    """A state dir an older rcswarm stopped at its budget holds no stored clock, only the reason it wrote ("(60 s
    since its first round opened)"): a relaunch with the same budget keeps it ended, a larger one lifts it. Before,
    the periods (55 s, to the last metric row) read less than the budget and the same budget lifted the stop (a
    review, 2026-11-29)."""
    clock = Clock(1000.0)
    group = open_group(long_run(1.0), tmp_path, clock)
    train_until_finished(group, clock, "a")
    store = group.runs[0].store
    older = f"{BUDGET_ENDED} of 1 minutes (60 s since its first round opened)"
    store.set_many({"stopped": older})
    store.unset(SERVED_AT_STOP_KEY)
    group.close()
    clock.now += 3600.0
    again = open_group(long_run(1.0), tmp_path, clock)
    assert again.runs[0].finished and again.runs[0].stopped == older
    again.close()
    raised = open_group(long_run(2.0), tmp_path, clock)
    assert not raised.runs[0].finished, raised.runs[0].stopped
    assert "(60 s served since its first round opened)" in raised.runs[0].store.events("budget")[-1].reason
    raised.close()


def test_the_first_launchs_clock_is_the_seconds_since_its_first_round_opened(tmp_path: Path):
    clock = Clock(1000.0)
    group = open_group(long_run(1.0), tmp_path, clock)
    clock.now += 50.0  # before its first round opens (its first pull): no clock
    train_until_finished(group, clock, "a")
    run = group.runs[0]
    first = run.store.rounds_summary().first_opened_at
    stop = run.store.events("budget")[0]
    assert stop.time - first == 60.0 and run.stopped.endswith("(60 s served since its first round opened)")
    assert all(record.at_seconds == record.made_at - first for record in run.store.forecasts())
    group.close()


def test_pruning_at_a_fraction_of_run_minutes_waits_for_the_time_served(tmp_path: Path):
    """Before, the fraction's seconds counted the time the coordinator was down: a sweep restarted after 100 s down
    decided its 50 % of a 1-minute budget at once, after 10 s trained."""
    clock = Clock(1000.0)
    spec = with_minutes(pruning_spec(prune=True, prune_at=[0.5]), 1.0)
    sweep = SweepCoordinator(spec, tmp_path, clock)
    members = [sweep.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b")]
    for round_ in range(2):
        for run, member in zip(sweep.runs, members, strict=True):
            train_round(run, member, good_loss(round_ + 1.0), clock)
        clock.now += 3.0
        sweep.tick()
    assert sweep.prune_done == 0
    sweep.close()
    clock.now += 100.0
    restarted = SweepCoordinator(spec, tmp_path, clock)
    restarted.tick()
    assert restarted.prune_done == 0 and not restarted.runs[0].store.events("prune")
    members = [restarted.join(pb.JoinRequest(worker_name=name)) for name in ("c", "d")]
    for round_ in range(2, 7):
        for run, member in zip(restarted.runs, members, strict=True):
            train_round(run, member, good_loss(round_ + 1.0), clock)
        clock.now += 3.0
        restarted.tick()
        if restarted.prune_done:
            break
    assert restarted.prune_done == 1
    reason = restarted.runs[0].store.events("prune")[0].reason
    assert reason.startswith("at 50% of the budget (30 s)"), reason
    restarted.close()
