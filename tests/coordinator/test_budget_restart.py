"""A run ended at its wall-time budget (`[run] minutes`) and a restart whose spec raises or unsets the budget: the
run trains on, as one that finished its rounds does after a restart that raises `run.rounds`; a pruned run stays
stopped; a refused join and a move say why the run ended (coordinator/forecasts.py `decide_budget_resume`,
coordinator/sweep.py `RunGroup`, coordinator/service.py `SwarmCoordinator.lift_stop`)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from pathlib import Path

import grpc
import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import forecasts
from rcswarm.coordinator.decisions import MembershipOptions, decide_admission
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.sweep import RunLoad, SweepCoordinator, decide_assignment, decide_move, open_group
from rcswarm.observe.forecast import BUDGET_ENDED
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from tests.helpers.dashboard import Clock
from tests.helpers.forecasts import good_loss, pruned_sweep, pruning_spec, train_round
from tests.helpers.specs import tiny_spec


def with_minutes(spec: RunSpec, minutes: float) -> RunSpec:
    """`spec` with another wall-time budget (`run.minutes`), as `rcswarm run --minutes` on a run directory gives."""
    return dataclasses.replace(spec, run=dataclasses.replace(spec.run, minutes=minutes))


def test_a_budget_stop_is_lifted_only_when_the_restarted_budget_no_longer_ends_the_run():
    ended = forecasts.decide_budget_end(1060.0, 1000.0, 60.0)
    assert ended is not None and ended.startswith(BUDGET_ENDED)
    assert forecasts.decide_budget_resume(1070.0, 1000.0, 5400.0, None) is None  # not stopped
    pruned = "at 50% of the budget (round 8): L=16 pruned: its forecast 2.0 [1.9, 2.1] is above L=8's"
    assert forecasts.decide_budget_resume(1070.0, 1000.0, 5400.0, pruned) is None  # pruned: stays stopped
    assert forecasts.decide_budget_resume(1070.0, 1000.0, 60.0, ended) is None  # the same budget: still used
    assert forecasts.decide_budget_resume(1070.0, 1000.0, 66.0, ended) is None  # raised, but used
    raised = forecasts.decide_budget_resume(1070.0, 1000.0, 5400.0, ended)
    assert raised is not None and "its wall-time budget is now 90 minutes" in raised and "70 s served" in raised
    assert raised.endswith(f"it was {ended}")
    unset = forecasts.decide_budget_resume(1070.0, 1000.0, 0.0, ended)
    assert unset is not None and "it has no wall-time budget now (run.minutes = 0)" in unset


def ended_at_budget(tmp_path: Path, clock: Clock) -> tuple[RunSpec, str]:
    """A single run of a 6-second budget (`run.minutes` 0.1) trained until the budget ended it, its coordinator
    closed: its spec and its stop's reason."""
    spec = tiny_spec(run={"rounds": 0, "minutes": 0.1}, sync={"min_reports": 1}, coordinator={"durable": False})
    group = open_group(spec, tmp_path, clock)
    run = group.runs[0]
    member = group.join(pb.JoinRequest(worker_name="a"))
    for round_ in range(6):
        train_round(run, member, good_loss(round_ + 1.0), clock)
        group.tick()
    assert run.stopped is not None and run.stopped.startswith(BUDGET_ENDED)
    group.close()
    return spec, run.stopped


def test_a_lift_whose_write_fails_leaves_the_run_stopped_without_a_word_of_a_resume(tmp_path: Path):
    """Before, the lift wrote its "budget" event, then removed the stop in a second write: when that failed (here a
    trigger aborts it, as a full disk would), a start with the old budget found the run still stopped beside an event
    saying it had resumed. Now both are one transaction (`StateStore.record_run_state`)."""
    clock = Clock(1000.0)
    spec, ended = ended_at_budget(tmp_path, clock)
    with contextlib.closing(sqlite3.connect(tmp_path / "state.sqlite")) as db, db:
        db.execute("CREATE TRIGGER keep_stopped BEFORE DELETE ON run_state WHEN old.key = 'stopped' "
                   "BEGIN SELECT RAISE(ABORT, 'database or disk is full (the test)'); END")
    with pytest.raises(StoreError, match="disk is full"):
        open_group(with_minutes(spec, 1.0), tmp_path, clock)
    with contextlib.closing(sqlite3.connect(tmp_path / "state.sqlite")) as db, db:
        db.execute("DROP TRIGGER keep_stopped")
    again = open_group(spec, tmp_path, clock)
    try:
        run = again.runs[0]
        assert run.finished and run.stopped == ended
        assert [event.reason for event in run.store.events("budget")] == [ended]
    finally:
        again.close()
    lifted = open_group(with_minutes(spec, 1.0), tmp_path, clock)  # the write succeeds now: lifted, and said once
    try:
        assert not lifted.runs[0].finished
        reasons = [event.reason for event in lifted.runs[0].store.events("budget")]
        assert len(reasons) == 2 and reasons[1].startswith("resumed at a restart")
    finally:
        lifted.close()


def test_a_join_to_a_sweep_whose_runs_all_ended_says_why_each_ended():
    """Before: "every run of the sweep has finished", whether its runs were pruned, ended at their budget or done."""
    pruned = ("at 50% of the budget (round 8): L=16 pruned: its forecast 2.0 [1.9, 2.1] is above L=8's 1.5 [1.4, 1.6] "
              "at 90% confidence")
    budget = f"{BUDGET_ENDED} of 1 minutes (61 s served since its first round opened)"
    loads = [RunLoad(0, "L8", 0, True, stopped=budget), RunLoad(1, "L16", 0, True, stopped=pruned),
             RunLoad(2, "L24", 0, True)]
    index, reason = decide_assignment(loads)
    assert index is None and reason == ("every run of the sweep has ended: L8 ended at its wall-time budget of 1 "
                                        "minutes, L16 pruned at 50% of the budget (round 8), L24 finished its rounds")
    many = [RunLoad(i, f"L{8 * (i + 1)}", 0, True, stopped="x" * 500) for i in range(20)]
    index, reason = decide_assignment(many)
    assert index is None and reason.endswith(", and 12 more") and len(reason) < 1000


def test_a_refused_join_and_a_move_say_why_the_run_ended():
    options = MembershipOptions(lease_s=10.0, max_workers=2)
    assert decide_admission(0.0, [], True, options).reason == "the run has finished its rounds"
    ended = f"the run was stopped: {BUDGET_ENDED} of 1 minutes"
    stopped = decide_admission(0.0, [], True, options, ended)
    assert not stopped.ok and stopped.reason == ended
    budget = f"{BUDGET_ENDED} of 1 minutes (61 s served since its first round opened)"
    move, reason = decide_move([RunLoad(0, "L8", 1, True, stopped=budget), RunLoad(1, "L16", 0, False)], 0)
    assert move and reason == f"L8 was stopped ({budget}); moving toward L16" and "rounds" not in reason
    move, reason = decide_move([RunLoad(0, "L8", 1, True), RunLoad(1, "L16", 0, False)], 0)
    assert move and reason == "L8 finished its rounds; moving toward L16"


def test_a_run_ended_at_its_budget_trains_on_after_a_restart_that_raises_run_minutes(tmp_path: Path):
    clock = Clock(1000.0)
    spec, ended = ended_at_budget(tmp_path, clock)  # 6 s; a round takes 1 s here

    clock.now += 30.0  # the coordinator down for 30 s: the budget's clock, the time served, leaves it out
    restarted = open_group(with_minutes(spec, 1.0), tmp_path, clock)
    run = restarted.runs[0]
    assert not run.finished and run.stopped is None and run.store.get("stopped") is None
    assert restarted.status().run_state == pb.RUN_STATE_RUNNING
    lifted = [event.reason for event in run.store.events("budget")]
    assert lifted[0] == ended and lifted[1].startswith("resumed at a restart: its wall-time budget is now 1 minutes")
    assert "(6 s served since its first round opened)" in lifted[1]
    member = restarted.join(pb.JoinRequest(worker_name="b"))
    train_round(run, member, good_loss(7.0), clock)
    restarted.tick()
    assert run.version == 7 and not run.finished
    clock.now += 30.0  # 6 s served before, 31 s since this launch's first round opened
    restarted.tick()
    assert not run.finished
    clock.now += 23.0  # 60 s served: the new budget is used
    restarted.tick()
    assert run.finished and run.stopped.startswith(f"{BUDGET_ENDED} of 1 minutes")
    with pytest.raises(Refusal) as refused:  # it says why the run ended: not "the run has finished its rounds"
        restarted.join(pb.JoinRequest(worker_name="c"))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(refused.value) == f"join refused: the run was stopped: {run.stopped}"
    restarted.close()

    again = open_group(with_minutes(spec, 1.0), tmp_path, clock)  # the same budget: it stays ended
    assert again.runs[0].finished and again.runs[0].stopped == run.stopped
    again.close()
    unset = open_group(with_minutes(spec, 0.0), tmp_path, clock)  # no budget: it trains on
    assert not unset.runs[0].finished and unset.runs[0].stopped is None
    unset.close()


def test_a_join_to_a_sweep_pruned_and_ended_at_its_budget_says_so(tmp_path: Path):
    clock = Clock(1000.0)
    sweep, _, _ = pruned_sweep(tmp_path, clock)
    assert sweep.runs[1].stopped is not None and "pruned" in sweep.runs[1].stopped
    sweep.runs[0].stop(f"{BUDGET_ENDED} of 1 minutes (61 s served since its first round opened)", kind="budget")
    with pytest.raises(Refusal) as refused:
        sweep.join(pb.JoinRequest(worker_name="late"))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(refused.value) == ("join refused: every run of the sweep has ended: test-L8 ended at its wall-time "
                                  "budget of 1 minutes, test-L16 pruned at 50% of the budget (round 8)")
    sweep.close()


def test_a_pruned_run_stays_stopped_after_a_restart_that_sets_run_minutes(tmp_path: Path):
    clock = Clock(1000.0)
    sweep, _, _ = pruned_sweep(tmp_path, clock)
    pruned = sweep.runs[1].stopped
    assert pruned is not None and "pruned" in pruned
    sweep.close()
    restarted = SweepCoordinator(with_minutes(pruning_spec(prune=True, prune_at=[0.5]), 60.0), tmp_path, clock)
    assert restarted.runs[1].finished and restarted.runs[1].stopped == pruned
    assert not restarted.runs[1].store.events("budget") and not restarted.runs[0].finished
    restarted.close()
