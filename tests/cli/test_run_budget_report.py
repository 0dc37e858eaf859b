"""`rcswarm run`'s line for a launch its wall-time budget ended is true on a relaunch: the coordinator's budget counts
the time each run was served over every launch on the run dir, so a run may be at its budget when launched, and then
nothing trains (cli/run.py `budget_outcome`, `before_launch`). Before, a relaunch of a run already at its budget said
"stopped at the 5-minute budget after 12 rounds" though nothing trained (a review, 2026-11-29)."""

from __future__ import annotations

import math
from pathlib import Path

from rcswarm.cli import run
from rcswarm.cli.signals import StopSignal
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.sweep import open_group
from rcswarm.observe.forecast import BUDGET_ENDED
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import creds
from tests.helpers.dashboard import Clock
from tests.helpers.forecasts import good_loss, pruning_spec, train_round
from tests.helpers.specs import tiny_spec

AT_ONE_MINUTE = f"{BUDGET_ENDED} of 1 minutes (60 s served since its first round opened)"
PRUNED = "at 50% of the budget (round 8): L=16 pruned: its forecast 2.0 [1.9, 2.1] is above L=8's 1.5 [1.4, 1.6]"


def row(seq_len: int, rounds: int, stopped: str | None) -> dict:
    """A run's summary row as `outcome` reads it: its length, rounds and stop."""
    return {"seq_len": seq_len, "rounds": rounds, "stopped": stopped, "first_round_loss": math.nan}


def ended(rows: list[dict], spec: RunSpec, minutes: float, before: dict[int, run.BeforeLaunch] | None) -> run.Outcome:
    """The outcome of a launch the coordinator's budget ended, every worker done (exit 0)."""
    return run.outcome(rows, spec, stop=StopSignal(), out_of_time=False, minutes=minutes, exit_codes=[0] * len(rows),
                       logs=Path("logs"), before=before)


def test_a_relaunch_of_a_run_already_at_its_budget_says_nothing_trained():
    spec = tiny_spec(run={"rounds": 1000, "minutes": 1.0})
    already = ended([row(8, 12, AT_ONE_MINUTE)], spec, 1.0, {8: run.BeforeLaunch(AT_ONE_MINUTE, 60.0)})
    assert (already.kind, already.status) == ("budget", 0)
    assert already.message.startswith("already at the 1-minute budget when launched: nothing trained, 12 rounds as "
                                      "before"), already.message
    # An earlier launch its launcher's own deadline ended (no stop stored) served it past the budget: the
    # coordinator ends it at its first tick, a new stop, and nothing trains either.
    now_stopped = f"{BUDGET_ENDED} of 1 minutes (61 s served since its first round opened)"
    cut = ended([row(8, 12, now_stopped)], spec, 1.0, {8: run.BeforeLaunch(None, 61.0)})
    assert cut.message.startswith("already at the 1-minute budget when launched: nothing trained")
    # Lifted by a larger budget, then stopped at it: as it always said.
    later = f"{BUDGET_ENDED} of 5 minutes (300 s served since its first round opened)"
    assert ended([row(8, 60, later)], spec, 5.0, {8: run.BeforeLaunch(AT_ONE_MINUTE, 60.0)}).message == (
        "stopped at the 5-minute budget after 60 rounds")
    new_run_dir = ended([row(8, 12, AT_ONE_MINUTE)], spec, 1.0, None)
    assert new_run_dir.message == "stopped at the 1-minute budget after 12 rounds"


def test_a_sweep_names_its_runs_already_at_the_budget_when_others_trained():
    spec = pruning_spec(prune=True, prune_at=[0.5])
    rows = [row(8, 20, f"{BUDGET_ENDED} of 2 minutes (120 s served since its first round opened)"),
            row(16, 8, PRUNED), row(24, 12, AT_ONE_MINUTE)]
    before = {8: run.BeforeLaunch(None, 60.0), 16: run.BeforeLaunch(PRUNED, 40.0),
              24: run.BeforeLaunch(AT_ONE_MINUTE, 125.0)}
    assert ended(rows, spec, 2.0, before).message == (
        "stopped at the 2-minute budget after 20 (L=8), 8 (L=16), 12 (L=24) rounds; L=24 already at it when launched")
    everyone = ended(rows[1:], spec, 2.0, before)
    assert everyone.message.startswith("already at the 2-minute budget when launched: nothing trained")


def test_a_run_as_it_was_before_a_launch_is_read_from_the_run_dirs_state(tmp_path: Path):
    spec = tiny_spec(run={"rounds": 1000, "minutes": 0.1}, sync={"min_reports": 1}, coordinator={"durable": False})
    assert run.before_launch(tmp_path, spec) == {}  # a new run dir
    clock = Clock(1000.0)
    group = open_group(spec, tmp_path / "state", clock)
    member = group.join(pb.JoinRequest(worker_name="a"))
    list(group.pull(pb.PullParametersRequest(**creds(member))))
    while not group.runs[0].finished:
        train_round(group.runs[0], member, good_loss(group.runs[0].version + 1.0), clock)
        group.tick()
    stopped = group.runs[0].stopped
    group.close()
    assert stopped is not None and stopped.startswith(BUDGET_ENDED)
    assert run.before_launch(tmp_path, spec) == {spec.data.seq_len: run.BeforeLaunch(stopped, 6.0)}
