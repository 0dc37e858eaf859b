"""Garbage losses already stored (written straight into real SQLite state dirs, `StateStore.add_metrics`, as a
coordinator stored them before it refused a loss above MAX_LOSS) beside honest rows: every fit answers, never
raises.

A review (2026-11-29): one row with loss 1.7e308 made `fits.fit_power_law` raise OverflowError (`math.exp` of the
fitted log A), which no caller catches (they catch ValueError): the sweep dashboard's /api/status and /metrics
answered 500, `rcswarm fit RUN_DIR` ended in a traceback, and so did every restart. Now the fits raise ValueError
naming the losses (a "no fit" answer), and the step means and a state dir's rows leave a loss above MAX_LOSS out,
as the forecasts do, naming how many. Losses that are each in range but hundreds of orders of magnitude apart (one
length's worker reporting 1e-300) reach the same ValueError.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rcswarm.cli.fit import main as fit_main
from rcswarm.cli.run import fit_law
from rcswarm.config.runspec import RunSpec
from rcswarm.observe.analysis import (
    Columns,
    analyse,
    fit_step_means,
    law_at_last_step,
    length_curves,
    read_metrics,
    read_state_dirs,
)
from rcswarm.observe.fits import PowerLawFit, fit_power_law, gap_noise, per_doubling
from rcswarm.observe.forecast import MAX_LOSS
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import STEPS as STEPS_FED
from tests.helpers.dashboard import SWEEP_T0, get

INNER = 10
STEPS = 300
HUGE = 1.7e308
BEYOND = "beyond a float's range"


def true_loss(step: int, length: int) -> float:
    """α(s) = 0.3·(1 − e^(−s/40)), times a slow decay in s."""
    return 3.0 * step ** -0.2 * length ** -(0.3 * (1 - math.exp(-step / 40)))


def write_run(state_dir: Path, length: int, loss: Any = true_loss, garbage: dict[int, float] | None = None) -> None:
    """A run at `length` whose worker w0 reported STEPS training steps (L/1000 s each, loss `loss(step, length)`),
    and a worker w1 the rows `garbage` (step -> loss) beside them, written straight into the store."""
    store = StateStore(state_dir, durable=False)
    try:
        spec = RunSpec.from_dict({"inner": {"steps": INNER}, "data": {"seq_len": length}})
        store.set_many({"spec_json": spec.to_json(), "run_id": f"r{length}"})

        def row(worker: str, step: int, value: float) -> tuple[Any, ...]:
            return (f"r{length}", worker, (step - 1) // INNER, step, length, 4, value, 4 * length, 0.0, 0.0, 0.0, 0,
                    0, "", 1_000.0 + step * length / 1000.0)

        store.add_metrics([row("w0", step, loss(step, length)) for step in range(1, STEPS + 1)])
        store.add_metrics([row("w1", step, value) for step, value in (garbage or {}).items()])
    finally:
        store.close()


def sweep(run_dir: Path, tiny_at: int | None = None) -> Path:
    """A sweep's run directory at L = 32, 64, 128; the L = 32 run also holds two rows of loss 1.7e308 from another
    worker; with `tiny_at`, that length's worker reported 1e-300 at every step."""
    for length in (32, 64, 128):
        loss = (lambda step, length: 1e-300) if length == tiny_at else true_loss
        write_run(run_dir / f"run-L{length}", length, loss, {7: HUGE, 150: HUGE} if length == 32 else None)
    return run_dir


def test_a_law_beyond_a_floats_range_is_a_value_error_naming_the_losses() -> None:
    with pytest.raises(ValueError, match=rf"losses \[1\.7e\+308, 2, 2\]: the fitted law .* is {BEYOND}"):
        fit_power_law([8, 16, 32], [HUGE, 2.0, 2.0])
    with pytest.raises(ValueError, match=BEYOND):
        fit_power_law([32, 64, 128], [1.0, 1.0, 1e-300])
    with pytest.raises(ValueError, match=r"alpha=-1100: 2\^\(−α\) is beyond a float's range"):
        per_doubling(-1100.0)
    # A law's value beyond a float is inf (the product's own overflow), the noise of huge losses is finite.
    assert PowerLawFit(1.0, -500.0, 1.0, -501.0, -499.0, 3).predict(1e3) == math.inf
    assert 0 < gap_noise([1.0, 1e200, 4e200, 9e200], [1.0, 2.0, 3.0], 1) < math.inf


def test_a_state_dirs_rows_above_max_loss_are_left_out_and_named(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = sweep(tmp_path / "run")
    skipped: list[str] = []
    rows = read_state_dirs(run_dir, skipped)
    assert len(rows) == 3 * STEPS and max(rows.loss) <= MAX_LOSS
    assert len(skipped) == 1 and "skipped 2 training rows with a loss above 10000 (largest 1.7e+308)" in skipped[0]
    analysis = analyse(length_curves(run_dir, rows))
    assert analysis.schedule.alpha_inf == pytest.approx(0.3, abs=0.01)
    assert fit_main([str(run_dir), "--out", str(tmp_path / "fit.png")]) == 0
    assert "skipped 2 training rows with a loss above 10000" in capsys.readouterr().err
    assert fit_law(Console(width=200, emoji=False), run_dir) is not None


def test_losses_apart_beyond_a_float_are_no_fit_not_a_traceback(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """L = 128's worker reported 1e-300 (in range) at every step: the law's log A is ~1,800, past `math.exp`."""
    run_dir = sweep(tmp_path / "run", tiny_at=128)
    with pytest.raises(ValueError, match=BEYOND):
        analyse(length_curves(run_dir, read_state_dirs(run_dir)))
    assert fit_main([str(run_dir), "--out", str(tmp_path / "fit.png")]) == 2
    error = capsys.readouterr().err
    assert BEYOND in error and "Traceback" not in error, error
    console = Console(width=400, record=True, emoji=False)
    assert fit_law(console, run_dir) is None
    printed = console.export_text()
    assert "no fit of α(s) and the crossovers" in printed and BEYOND in printed, printed


def test_the_step_means_leave_a_mean_above_max_loss_out_and_a_law_beyond_a_float_is_no_fit() -> None:
    means = [(float(length), float(step), true_loss(step, length), step * length / 1000.0)
             for length in (32, 64, 128) for step in range(1, STEPS + 1)]
    report = fit_step_means([*means, (32.0, 7.0, HUGE, 0.224), (32.0, 150.0, HUGE / 2, 4.8)])
    assert report.analysis is not None, report.message
    assert "2 step means with a loss above 10000 left out (largest 1.7e+308)" in " ".join(report.analysis.notes)
    assert max(max(curve.losses) for curve in report.curves) < 10
    tiny = [(length, step, 1e-300 if length == 128.0 else loss, t) for length, step, loss, t in means]
    report = fit_step_means(tiny)
    assert report.analysis is None and report.message.startswith("no fit: ") and BEYOND in report.message
    assert json.dumps(report.summary(), allow_nan=False)


def test_a_metrics_file_whose_smoothed_law_is_beyond_a_float_still_plots(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A file's rows are not bounded (another tool's losses): one huge loss a few steps before the end of the shortest
    length leaves every matched step's fit in range but the smoothed law at the last one beyond a float; the law's
    panel says so and the rest is plotted."""
    metrics = tmp_path / "metrics.csv"
    with metrics.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run_id", "step", "seq_len", "loss", "wall_time"])
        for length in (32, 64, 128):
            for step in range(1, STEPS + 1):
                loss = HUGE if (length, step) == (32, STEPS - 3) else true_loss(step, length)
                writer.writerow([f"r{length}", step, length, loss, step * length / 1000.0])
    columns = Columns(step="step", length="seq_len", loss="loss", time="wall_time", run="run_id")
    with pytest.raises(ValueError, match=BEYOND):
        law_at_last_step(analyse(length_curves(metrics, read_metrics(metrics, columns))))
    out = tmp_path / "fit.png"
    assert fit_main([str(metrics), "--out", str(out)]) == 0, capsys.readouterr().err
    assert out.stat().st_size > 10_000


def test_the_dashboard_answers_with_garbage_rows_in_its_store(swarm: Any) -> None:
    """The dashboard's coordinator (one worker per length, every step reported over time) with a 1.7e308 row in
    its store: its step mean is left out and the fit made; then a fifth length of 1e-300 losses: no fit, the
    message says why. /api/status and /metrics answer 200 every time (they answered 500)."""
    service, base = swarm.service, swarm.base

    def row(worker: str, length: int, step: int, loss: float) -> tuple[Any, ...]:
        return (service.run_id, worker, 0, step, length, 4, loss, 4 * length, 0.0, 0.0, 0.0, 0, 0, "",
                SWEEP_T0 + step * length / 1000.0)

    service.store.add_metrics([row("garbage", 64, 1, HUGE)])
    status, _, body = get(base + "api/status")
    assert status == 200, body[:300]
    fit = json.loads(body)["fits"]["fit"]
    assert fit is not None and any("step means with a loss above 10000 left out" in n for n in fit["notes"]), fit
    assert get(base + "metrics")[0] == 200
    service.store.add_metrics([row("tiny", 512, step, 1e-300) for step in STEPS_FED])
    status, _, body = get(base + "api/status")
    assert status == 200, body[:300]
    fits = json.loads(body)["fits"]
    assert fits["fit"] is None and BEYOND in fits["message"], fits
    assert get(base + "metrics")[0] == 200
