"""`make demo` is the mission in miniature: `rcswarm run` without a config sweeps sequence lengths, prints
the dashboard's URL and labelled progress, fits the law and plots it; every number says what it is."""

from __future__ import annotations

import dataclasses
import math
import signal
from pathlib import Path

import pytest

from rcswarm.cli import run
from rcswarm.cli.demo import DEMO_MINUTES, demo_spec
from rcswarm.observe.forecast import BUDGET_ENDED


def test_the_demo_is_a_sweep_of_at_least_three_lengths_under_a_budget():
    spec = demo_spec()
    assert spec.is_sweep and len(spec.sweep.seq_lens) >= 3
    assert spec.run.workers == len(spec.sweep.seq_lens)  # one worker per length: equal shares of wall time
    args = run.parse_args([])
    assert run.budget_minutes(args) == DEMO_MINUTES <= 4
    # The coordinator knows the budget too ([run] minutes: its forecasts are of the loss at the budget's end).
    assert run.load_spec(args) == dataclasses.replace(spec, run=dataclasses.replace(spec.run, minutes=DEMO_MINUTES))
    assert run.budget_minutes(run.parse_args(["--minutes", "1.5"])) == 1.5
    assert run.load_spec(run.parse_args(["--minutes", "1.5"])).run.minutes == 1.5
    assert run.budget_minutes(run.parse_args(["examples/run.toml"])) is None
    assert run.load_spec(run.parse_args(["examples/run.toml"])).run.minutes == 0


def test_more_workers_per_run_than_the_coordinator_admits_names_workers(tmp_path: Path):
    config = tmp_path / "run.toml"
    config.write_text(demo_spec().from_dict({**demo_spec().to_dict(), "coordinator": {"max_workers": 2}}).to_toml())
    runs = len(demo_spec().sweep.seq_lens)
    with pytest.raises(ValueError) as refused:  # before: "sync.min_reports = 3 is invalid", a key nobody set
        run.load_spec(run.parse_args([str(config), "--workers", str(3 * runs)]))
    assert str(refused.value) == (f"--workers = {3 * runs}: 3 workers per run is more than coordinator.max_workers = 2 "
                                  f"admits; expected at most {2 * runs} workers")


def _row(rounds: int, first: float = 3.2, last: float = 2.9) -> dict:
    return {"seq_len": 8, "batch_size": 4, "rounds": rounds, "workers": 1, "first_round_loss": first,
            "last_round_loss": last, "val_loss_initial": 5.5, "val_loss_final": 3.0, "tokens": 0,
            "tokens_per_second": 0.0, "bytes_sent_per_round": 0.0, "bytes_received_per_round": 0.0,
            "sync_share": math.nan, "wall_seconds": 0.0, "ratio_up": math.nan, "ratio_down": math.nan}


def _cells(row: dict) -> dict[str, str]:
    return {header.split("\n")[0]: cell(row) for header, cell in run.SUMMARY_COLUMNS}


def test_summary_shows_a_trend_only_where_there_is_one():
    assert _cells(_row(2))["train loss¹"] == "3.200 → 2.900"
    one = _cells(_row(1, first=3.145, last=3.145))
    assert one["train loss¹"] == "3.145 (one round)" and "→" not in one["train loss¹"]
    none = _cells(_row(0, first=math.nan, last=math.nan))
    assert none["train loss¹"] == "— (no round completed)"
    assert none["held-out loss²"] == "5.500 (untrained: no round completed)"
    assert none["sync /"] == "— / —" and not any("nan" in cell for cell in none.values())


def test_progress_labels_its_loss_and_shows_a_dash_until_one_exists():
    assert run.RunProgress("L=8 × 4", 0, math.nan, 0.0, 0).info() == "train loss —  0 tok/s  0 workers"
    assert run.RunProgress("run", 3, 2.5, 1234.4, 1).info() == "train loss 2.500  1,234 tok/s  1 worker"
    assert "mean of the workers' last reported training loss" in run.PROGRESS_LEGEND


def test_the_outcome_says_what_really_happened(tmp_path: Path):
    spec = demo_spec()
    rows = [{**_row(rounds), "seq_len": length} for rounds, length in zip((12, 9, 5, 3), spec.sweep.seq_lens)]
    logs = tmp_path / "logs"

    def ended(**flags):
        return run.outcome(rows, spec, minutes=flags.pop("minutes", None), logs=logs, **flags)

    def stopped_by(*signums: int) -> run.StopSignal:
        stop = run.StopSignal()
        for signum in signums:
            stop.handle(signum, None)
        return stop

    stopped = ended(stop=stopped_by(signal.SIGINT), out_of_time=False, exit_codes=[-15] * 4)
    assert stopped.status == 130 and stopped.kind == "interrupted"
    assert (f"stopped by SIGINT: interrupted after 12 (L=2), 9 (L=4), 5 (L=8), 3 (L=16) of {spec.run.rounds:,} rounds"
            in stopped.message)
    # A supervisor's SIGTERM (then a Ctrl-C while stopping): 143, as a shell reports a process SIGTERM ended.
    terminated = ended(stop=stopped_by(signal.SIGTERM, signal.SIGINT), out_of_time=False, exit_codes=[-15] * 4)
    assert terminated.status == 143 and "stopped by SIGTERM" in terminated.message
    not_stopped = run.StopSignal()
    budget = ended(stop=not_stopped, out_of_time=True, exit_codes=[-15] * 4, minutes=3.0)
    assert (budget.kind, budget.status) == ("budget", 0) and "3-minute budget" in budget.message
    failed = ended(stop=not_stopped, out_of_time=False, exit_codes=[0, 1, 0, 0])
    assert (failed.kind, failed.status) == ("failed", 1) and "[0, 1, 0, 0]" in failed.message
    single = run.outcome([_row(1)], spec, stop=stopped_by(signal.SIGHUP), out_of_time=False, minutes=None,
                         exit_codes=[0], logs=logs)
    assert f"interrupted after 1 of {spec.run.rounds:,} rounds" in single.message
    # Issue #30: lengths the sweep pruned ended before the budget by design; the rest completed it.
    full = spec.run.rounds
    pruned_rows = [{**row, "rounds": full if i >= 2 else 5, "stopped": "pruned" if i < 2 else None}
                   for i, row in enumerate(rows)]
    pruned = run.outcome(pruned_rows, spec, stop=not_stopped, out_of_time=False, minutes=None, exit_codes=[0] * 4,
                         logs=logs)
    assert (pruned.kind, pruned.status) == ("completed", 0) and "pruned: L=2 after 5, L=4 after 5" in pruned.message
    short = [{**row, "stopped": None} for row in pruned_rows]
    assert run.outcome(short, spec, stop=not_stopped, out_of_time=False, minutes=None, exit_codes=[0] * 4,
                       logs=logs).kind == "failed"
    # The coordinator ended the runs at [run] minutes before the launcher's deadline: the budget, not a failure.
    at_budget = [{**row, "stopped": f"{BUDGET_ENDED} of 3 minutes (181 s since its first round opened)"} for row in rows]
    timed = run.outcome(at_budget, spec, stop=not_stopped, out_of_time=False, minutes=3.0, exit_codes=[0] * 4,
                        logs=logs)
    assert (timed.kind, timed.status) == ("budget", 0) and "3-minute budget after 12 (L=2)" in timed.message
    # The coordinator ended before the launcher stopped it: failed, whatever the workers did after.
    crashed = ended(stop=not_stopped, out_of_time=False, exit_codes=[-15] * 4, coordinator_code=1)
    assert (crashed.kind, crashed.status) == ("failed", 1)
    assert "the coordinator exited with status 1 after 12 (L=2)" in crashed.message and "coordinator.log" in crashed.message


def test_a_run_without_a_closed_round_reports_no_train_loss(tmp_path: Path):
    """Steps were trained from version 0 but no round closed: no "3.145 → 3.145" from those steps."""
    from rcswarm.observe.report import summarize
    from rcswarm.state.store import StateStore

    store = StateStore(tmp_path / "state")
    try:
        store.add_metrics([("run", "w", 0, step, 8, 4, 3.145, 32, 0.1 * step, 0.1, 0.0, 0, 0, "", 100.0 + step)
                           for step in range(1, 6)])
        summary = summarize(store)
    finally:
        store.close()
    assert summary.rounds == 0 and summary.tokens == 160
    assert math.isnan(summary.first_round_loss) and math.isnan(summary.last_round_loss)


def test_the_summary_says_when_the_held_out_law_is_not_identified(tmp_path: Path):
    """Held-out losses that barely fall with L: the law is printed with its caveats, and summary.json keeps them."""
    import json

    from rich.console import Console

    spec = demo_spec()
    rows = [{**_row(5), "seq_len": length, "val_loss_final": loss}
            for length, loss in zip(spec.sweep.seq_lens, (2.40, 2.41, 2.38, 2.40))]
    console = Console(record=True, width=200)
    ended = run.Outcome("budget", "stopped at the 3-minute budget", 0)
    run.print_summary(console, tmp_path, spec, rows, ended)
    text = console.export_text()
    assert "held-out loss of the final parameters ≈" in text
    assert "not enough data for α of the held-out loss: α's 90% interval" in text
    assert "no fit of α(s) and the crossovers" in text  # the state dirs hold no metrics
    fit = json.loads((tmp_path / "summary.json").read_text())["fit"]
    assert fit["caveats"][0].startswith("α's 90% interval") and fit["caveats"][1].startswith("R² = ")
