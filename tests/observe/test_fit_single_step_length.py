"""A length with a single recorded step is left out of a fit and named; the rest are fitted.

`rcswarm fit` and the end-of-sweep fit (`cli/run.py` `fit_law`) went through `analysis.length_curves`, which refused
the whole fit ("length 256: expected at least 2 distinct steps, found 1") when one run of a sweep had reported a
single step (a run just started, or one stopped after its first row), while the dashboard's `fit_step_means`
skipped that length and fitted the others. Real SQLite state dirs, as a sweep leaves them, and a metrics file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from rcswarm.cli.fit import main as fit_main
from rcswarm.cli.run import fit_law
from rcswarm.config.runspec import RunSpec
from rcswarm.observe.analysis import analyse, fit_step_means, length_curves, read_state_dirs
from rcswarm.state.store import StateStore

INNER = 10
NOTE = "L = [256] left out: fewer than 2 recorded steps, no curve to fit yet"


def true_loss(step: int, length: int) -> float:
    """α(s) = 0.3·(1 − e^(−s/40)), times a slow decay in s."""
    return 3.0 * step ** -0.2 * length ** -(0.3 * (1 - math.exp(-step / 40)))


def write_run(state_dir: Path, length: int, steps: int) -> None:
    """A run at `length` that reported its first `steps` training steps (L/1000 s each) from one worker."""
    store = StateStore(state_dir, durable=False)
    try:
        spec = RunSpec.from_dict({"inner": {"steps": INNER}, "data": {"seq_len": length}})
        store.set_many({"spec_json": spec.to_json(), "run_id": f"r{length}"})
        store.add_metrics([(f"r{length}", "w0", (step - 1) // INNER, step, length, 4, true_loss(step, length),
                            4 * length, 0.0, 0.0, 0.0, 0, 0, "", 1_000.0 + step * length / 1000.0)
                           for step in range(1, steps + 1)])
    finally:
        store.close()


def sweep(run_dir: Path, lengths: tuple[int, ...]) -> Path:
    """A sweep's run directory: 300 steps at each of `lengths`, and the L = 256 run's single step."""
    for length in lengths:
        write_run(run_dir / f"run-L{length}", length, 300)
    write_run(run_dir / "run-L256", 256, 1)
    return run_dir


def test_a_run_directory_with_a_single_step_length_is_fitted_without_it(tmp_path: Path) -> None:
    run_dir = sweep(tmp_path / "run", (32, 64, 128))
    curves = length_curves(run_dir, read_state_dirs(run_dir))
    single = next(curve for curve in curves if curve.length == 256)
    assert len(single.steps) == 1 and math.isnan(single.seconds_per_step)
    analysis = analyse(curves)
    assert [curve.length for curve in analysis.curves] == [32.0, 64.0, 128.0]
    assert analysis.notes == (NOTE,)
    assert analysis.schedule.alpha_inf == pytest.approx(0.3, abs=0.01)


def test_rcswarm_fit_names_the_length_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = sweep(tmp_path / "run", (32, 64, 128))
    assert fit_main([str(run_dir), "--out", str(tmp_path / "fit.png")]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "lengths left out" in printed and "L = [256] left out" in printed, printed
    assert (tmp_path / "fit.png").stat().st_size > 1000


def test_the_end_of_sweep_fit_takes_the_other_lengths(tmp_path: Path) -> None:
    run_dir = sweep(tmp_path / "run", (32, 64, 128))
    console = Console(width=200, record=True, emoji=False)
    summary = fit_law(console, run_dir)
    assert summary is not None, console.export_text()
    assert summary["fit"]["notes"] == [NOTE]
    assert len(summary["fit"]["crossovers"]) == 2  # 32 → 64, 64 → 128


def test_a_metrics_file_with_a_single_step_length_is_fitted_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The reviewer's file: three lengths of 300 steps and L = 256 with one."""
    rows = [{"run_id": f"r{length}", "step": step, "seq_len": length, "loss": true_loss(step, length),
             "wall_time": step * length / 1000} for length in (32, 64, 128) for step in range(1, 301)]
    rows.append({"run_id": "r256", "step": 1, "seq_len": 256, "loss": 3.0, "wall_time": 0.256})
    metrics = tmp_path / "single.jsonl"
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert fit_main([str(metrics), "--out", str(tmp_path / "fit.png")]) == 0, capsys.readouterr().err
    assert "L = [256] left out" in capsys.readouterr().out


def test_too_few_lengths_with_more_than_one_step_is_not_enough_data_naming_the_one_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = sweep(tmp_path / "run", (32, 64))
    assert fit_main([str(run_dir), "--out", str(tmp_path / "fit.png")]) == 2
    error = capsys.readouterr().err
    assert "runs with lengths [32, 64]: expected at least 3 distinct lengths" in error and NOTE in error, error
    with pytest.raises(ValueError, match=r"at least 3 distinct lengths \(L = \[256\] left out"):
        analyse(length_curves(run_dir, read_state_dirs(run_dir)))


def test_the_dashboards_fit_names_a_single_step_length_too() -> None:
    """`fit_step_means` already skipped it; with a fit its notes now name it as `rcswarm fit` does."""
    means = [(float(length), float(step), true_loss(step, length), step * length / 1000.0)
             for length in (32, 64, 128) for step in range(1, 301)]
    report = fit_step_means([*means, (256.0, 1.0, 3.0, 0.256)])
    assert report.analysis is not None, report.message
    assert [curve.length for curve in report.curves] == [32.0, 64.0, 128.0]
    assert report.analysis.notes == (NOTE,)
