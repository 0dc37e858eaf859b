"""A sweep restarted with another `[sweep] prune_at`: the fractions decided are kept by value, and the restarted
sweep decides only its fractions above the largest one decided (coordinator/forecasts.py `fractions_decided`,
coordinator/sweep.py `RunGroup._prune`); an older state dir's count of fractions decided is read as the first that
many of the `prune_at` it starts with. A value of another program (or damaged) refuses the start, naming the state
dir, the key and the value, as an off-ladder curriculum rung does (`sweep.stored_fractions`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import forecasts
from rcswarm.coordinator.sweep import SweepCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.commands import one_error_line, status_of
from tests.helpers.dashboard import Clock
from tests.helpers.forecasts import good_loss, pruned_sweep, pruning_spec, train_round
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

# Four lengths' losses: L = 8 the best, each longer one 0.5 above the one before (all confidently worse).
LOSSES = [lambda x, offset=offset: 1.0 + offset + 2.0 * x ** -0.5 for offset in (0.0, 0.5, 1.0, 1.5)]


def four_lengths(prune_at: list[float]) -> RunSpec:
    """A sweep over L = 8, 16, 24 and 32 of 16 rounds, pruning at `prune_at`, closing a round on one report."""
    base = tiny_spec(run={"rounds": 16}, sync={"min_reports": 1}, coordinator={"durable": False})
    return RunSpec.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16, 24, 32], "prune": True,
                                                          "prune_at": prune_at}})


def test_only_the_fractions_above_the_largest_one_decided_are_decided():
    assert forecasts.fractions_decided((0.25, 0.5), ()) == 0
    assert forecasts.fractions_decided((0.25, 0.5), (0.25,)) == 1
    assert forecasts.fractions_decided((0.25, 0.5), (0.5,)) == 2  # 25% lies before what was decided: not decided late
    assert forecasts.fractions_decided((0.5, 0.75), (0.25,)) == 0
    assert forecasts.fractions_decided((0.75,), (0.5,)) == 0
    assert forecasts.fractions_decided((0.25, 0.5, 0.75), (0.25, 0.5)) == 2


def test_a_restart_that_adds_a_fraction_below_the_one_decided_prunes_no_more(tmp_path: Path):
    """Before: prune_at [0.5] decided at round 8 (2 of 4 runs pruned), then a restart with [0.25, 0.5] read the
    count 1 against the new list and decided 50% again: 3 of 4 runs pruned at 50%."""
    clock = Clock(1000.0)
    sweep = SweepCoordinator(four_lengths([0.5]), tmp_path, clock)
    members = {member.run_id: member for member in (sweep.join(pb.JoinRequest(worker_name=f"w{i}")) for i in range(4))}
    for round_ in range(8):
        for run, loss in zip(sweep.runs, LOSSES):
            train_round(run, members[run.run_id], loss(round_ + 1.0), clock)
        sweep.tick()
    assert [run.stopped is not None for run in sweep.runs] == [False, False, True, True]
    events = [[event.reason for event in run.store.events("prune")] for run in sweep.runs]
    sweep.close()
    restarted = SweepCoordinator(four_lengths([0.25, 0.5]), tmp_path, clock)
    restarted.tick()
    assert [run.stopped is not None for run in restarted.runs] == [False, False, True, True]
    assert [[event.reason for event in run.store.events("prune")] for run in restarted.runs] == events
    assert restarted.prune_decided == (0.5,) and restarted.prune_done == 1
    assert restarted.runs[0].store.get("prune_decided") == "[0.5]"
    restarted.close()


def test_a_restart_with_a_later_fraction_decides_and_applies_it(tmp_path: Path):
    """From prune_at [0.5] (decided) to [0.75]: 75% is decided at round 12 and applied (the run still in gets its
    reason), though it is the new list's first fraction, as 50% was the old one's (a decision is marked by its number,
    not its index). Before, the count 1 of fractions decided ended the new list of one: 75% was never decided."""
    clock = Clock(1000.0)
    sweep, _, _ = pruned_sweep(tmp_path, clock)
    assert sweep.runs[1].stopped is not None
    sweep.close()
    restarted = SweepCoordinator(pruning_spec(prune=True, prune_at=[0.75]), tmp_path, clock)
    good = restarted.join(pb.JoinRequest(worker_name="a"))
    assert good.run_id == restarted.runs[0].run_id
    for round_ in range(8, 11):
        train_round(restarted.runs[0], good, good_loss(round_ + 1.0), clock)
        restarted.tick()
    assert restarted.prune_done == 1  # round 11: 75% of 16 rounds is round 12
    train_round(restarted.runs[0], good, good_loss(12.0), clock)
    restarted.tick()
    kept = [event.reason for event in restarted.runs[0].store.events("prune")]
    assert len(kept) == 2 and kept[1].startswith("at 75% of the budget (round 12)") and "best forecast" in kept[1]
    assert restarted.prune_decided == (0.5, 0.75) and restarted.prune_done == 2
    decision = json.loads(restarted.runs[0].store.get("prune_decision"))
    assert (decision["checkpoint"], decision["fraction"], decision["number"]) == (0, 0.75, 2)
    assert restarted.runs[0].store.get("prune_applied") == "2"  # the pruned run, not in the decision, keeps its "1"
    restarted.close()


@pytest.mark.parametrize(("prune_at", "read_as"), [([0.5], (0.5,)), ([0.25, 0.5], (0.25,))])
def test_an_older_state_dirs_count_is_read_as_the_first_fractions_of_the_spec_it_starts_with(
    tmp_path: Path, prune_at: list[float], read_as: tuple[float, ...],
):
    """A state dir of an older rcswarm keeps the count of fractions decided (`prune_done`) and a decision without
    its number: the count is read against the `prune_at` of the start (right unless that start changed it), the
    decision's number is its index + 1, and the decision applied stays applied."""
    clock = Clock(1000.0)
    sweep, _, _ = pruned_sweep(tmp_path, clock)
    for run in sweep.runs:  # as an older rcswarm wrote them
        older = {key: value for key, value in json.loads(run.store.get("prune_decision")).items()
                 if key not in ("fraction", "number")}
        run.store.set_many({"prune_decision": json.dumps(older)})
        run.store.unset("prune_decided")
    events = [[event.reason for event in run.store.events("prune")] for run in sweep.runs]
    sweep.close()
    restarted = SweepCoordinator(pruning_spec(prune=True, prune_at=prune_at), tmp_path, clock)
    assert restarted.prune_decided == read_as and restarted.prune_done == 1
    restarted._apply_prune()
    assert [[event.reason for event in run.store.events("prune")] for run in restarted.runs] == events
    assert restarted.runs[1].finished and not restarted.runs[0].finished
    restarted.close()


FOREIGN = ["garbage", "0.5", '"0.5"', "[null]", "[NaN]", "[]", "[-1]", "[1.0]", '{"0.5": 1}', "[0.5, true]"]


def foreign_prune_decided(state_dir: Path, stored: str) -> list[Path]:
    """The pruned sweep of `pruned_sweep` in `state_dir`, closed, with `stored` as every run's `prune_decided`: its
    runs' state dirs."""
    sweep, _, _ = pruned_sweep(state_dir, Clock(1000.0))
    for run in sweep.runs:
        run.store.set_many({"prune_decided": stored})
    dirs = [run.store.state_dir for run in sweep.runs]
    sweep.close()
    return dirs


@pytest.mark.parametrize("stored", FOREIGN)
def test_a_foreign_prune_decided_refuses_the_start_naming_the_state_dir_the_key_and_the_value(
    tmp_path: Path, stored: str,
):
    """Before: a JSONDecodeError or TypeError traceback ('garbage', '0.5', '[null]'), or a start that read none
    decided ('[]', '[NaN]', '[-1]') or a dict's keys ('{"0.5": 1}') and decided a fraction again."""
    dirs = foreign_prune_decided(tmp_path, stored)
    with pytest.raises(RuntimeError) as refused:
        SweepCoordinator(pruning_spec(prune=True, prune_at=[0.25, 0.5]), tmp_path, Clock(1000.0))
    assert str(refused.value) == (f"state dir {dirs[0]}: run_state prune_decided = {stored!r} is not the fractions of "
                                  "the budget the sweep's pruning decided: expected a JSON list of numbers in (0, 1)")


def test_rcswarm_coordinator_says_so_in_one_line_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dirs = foreign_prune_decided(tmp_path / "state", "garbage")
    config = write_spec(pruning_spec(prune=True, prune_at=[0.5]), tmp_path / "run.toml")
    argv = ["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0", "--token", TOKEN]
    assert status_of(coordinator_cli.main, argv) == 1
    err = capsys.readouterr().err
    line = one_error_line("\n".join(line for line in err.splitlines() if " coordinator INFO " not in line))
    assert line == (f"rcswarm coordinator: state dir {dirs[0]}: run_state prune_decided = 'garbage' is not the "
                    "fractions of the budget the sweep's pruning decided: expected a JSON list of numbers in (0, 1)")
