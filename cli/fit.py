"""`rcswarm fit`: fit the sequence-length scaling law to recorded metrics and plot it.

    rcswarm fit RUN_DIR | METRICS.{csv,jsonl} [--out plot.png] [--step-column step --length-column seq_len
                                                    --loss-column loss --time-column wall_time
                                                    --run-column run_id --smooth 25]

Rows come from a CSV file with a header or from one JSON object per line (the coordinator's
metrics table, exported). Rows are grouped by sequence length (each run must keep one length);
a length's loss and wall time at a step are the means over its rows at that step. Printed: per
length its runs, final loss and measured seconds per step; the power law loss(L | s) at matched
steps, the schedule α(s) = α∞(1 − e^(−s/τ)) with its R² and per-doubling improvement; and for
each pair of neighbouring lengths the observed and the predicted (Eq. 11) wall-time crossover.
Observed crossovers and the wall-time plot use each length's losses smoothed by a centred
moving average over `--smooth` steps (1: raw); the fits use the raw losses.
A malformed file is reported with its name and line number, exit code 2. In state dirs, a run's training rows
at a length the run never assigns (another run's, reported there by a re-join before issue #33) are left out,
with one line per run naming its table, the rows' workers, versions and lengths.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.observe.analysis import (
    DEFAULT_SMOOTH_STEPS,
    Analysis,
    Columns,
    MetricsFileError,
    analyse,
    length_curves,
    read_metrics,
    read_state_dirs,
)
from rcswarm.observe.fits import amplitude_from_points, per_doubling, smooth_losses


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g} s"


def report(analysis: Analysis, console: Console) -> None:
    lengths = Table(title="runs by sequence length")
    for name in ("L", "runs", "last step", "final loss", "s/step"):
        lengths.add_column(name, justify="right")
    for curve in analysis.curves:
        lengths.add_row(
            f"{curve.length:g}", ", ".join(curve.runs), f"{curve.steps[-1]:g}", f"{curve.losses[-1]:.4f}",
            f"{curve.seconds_per_step:.4g}",
        )
    console.print(lengths)
    schedule = analysis.schedule
    last = analysis.points[-1]
    fit = Table(title="loss(L | s) ≈ A(s)·L^(−α(s)),  α(s) = α∞·(1 − e^(−s/τ))")
    fit.add_column("quantity")
    fit.add_column("value", justify="right")
    fit.add_row("α∞", f"{schedule.alpha_inf:.4f}")
    fit.add_row("τ (steps)", f"{schedule.tau:.1f}")
    fit.add_row("R² of α(s) fit", f"{schedule.r_squared:.4f}")
    fit.add_row("per doubling at α∞", f"{schedule.per_doubling:.4f} ({1 - schedule.per_doubling:.1%} lower loss)")
    fit.add_row(f"α at step {last.step:g}", f"{last.alpha:.4f} (A {last.amplitude:.3f}, R² {last.r_squared:.3f})")
    fit.add_row(f"per doubling at step {last.step:g}", f"{per_doubling(last.alpha):.4f}")
    console.print(fit)
    cross = Table(title=f"wall-time crossover: longer L below shorter L from then on ({analysis.smooth}-step mean)")
    for name in ("L short → long", "observed", "predicted (Eq. 11)", "predicted steps short / long"):
        cross.add_column(name, justify="right")
    for pair in analysis.crossovers:
        predicted = pair.predicted
        cross.add_row(
            f"{pair.length_short:g} → {pair.length_long:g}", _seconds(pair.observed),
            _seconds(None if predicted is None else predicted.time),
            "-" if predicted is None else f"{predicted.step_short:.0f} / {predicted.step_long:.0f}",
        )
    console.print(cross)


def plot(analysis: Analysis, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedule = analysis.schedule
    log_amplitude = amplitude_from_points(analysis.points)
    figure, (by_step, alphas, by_time) = plt.subplots(1, 3, figsize=(16, 4.8))
    matched = np.array([p.step for p in analysis.points])
    for curve in analysis.curves:
        line, = by_step.plot(curve.steps, curve.losses, alpha=0.6, label=f"L={curve.length:g}")
        fitted = [math.exp(log_amplitude(s) - schedule.alpha(s) * math.log(curve.length)) for s in matched]
        by_step.plot(matched, fitted, "--", color=line.get_color())
        by_time.plot(curve.times, curve.losses, color=line.get_color(), alpha=0.2, linewidth=0.5)
        by_time.plot(curve.times, smooth_losses(curve.losses, analysis.smooth), color=line.get_color(),
                     label=f"L={curve.length:g}")
    by_step.set(xscale="log", yscale="log", xlabel="step", ylabel="loss", title="loss vs step (dashed: fit)")
    by_step.legend()
    alphas.plot(matched, [p.alpha for p in analysis.points], "o", label="α(s) at matched steps")
    grid = np.linspace(0.0, matched.max(), 200)
    alphas.plot(grid, [schedule.alpha(s) for s in grid], "-",
                label=f"α∞={schedule.alpha_inf:.3f}, τ={schedule.tau:.0f}")
    alphas.set(xlabel="step", ylabel="α(s)", title="scaling exponent")
    alphas.legend()
    for pair in analysis.crossovers:
        if pair.observed is not None:
            by_time.axvline(pair.observed, color="grey", linestyle=":", linewidth=1)
    by_time.set(xscale="log", yscale="log", xlabel="wall time (s)", ylabel="loss",
                title=f"loss vs wall time ({analysis.smooth}-step mean; dotted: crossovers)")
    by_time.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def parser() -> argparse.ArgumentParser:
    result = new_parser("rcswarm fit", "fit scaling laws to recorded metrics and plot them")
    result.add_argument("metrics", type=Path,
                        help="metrics file (.csv with a header, or .jsonl), a run directory holding state.sqlite "
                             "files (e.g. what `rcswarm run` made), or one state.sqlite")
    result.add_argument("--out", type=Path, default=None,
                        help="where to write the plot (PNG); default: fit.png in the run directory, or beside the file")
    result.add_argument("--step-column", default="step", help="column holding the training step (files only)")
    result.add_argument("--length-column", default="seq_len", help="column holding the sequence length (files only)")
    result.add_argument("--loss-column", default="loss", help="column holding the training loss (files only)")
    result.add_argument("--time-column", default="wall_time", help="column holding wall time in seconds (files only)")
    result.add_argument("--run-column", default="run_id", help="column naming the run a row belongs to (files only)")
    result.add_argument("--smooth", type=int, default=DEFAULT_SMOOTH_STEPS,
                        help="observed crossovers and the wall-time plot average each length's losses over this "
                             "many steps, centred (1: raw)")
    return result


def read_rows(path: Path, columns: Columns, skipped: list[str] | None = None) -> list:
    """The metric rows of a metrics file, a state.sqlite, or every state dir below a directory; `skipped` gets a line
    per run whose rows at a length it never assigns were left out (`read_state_dirs`)."""
    if not path.exists():
        raise MetricsFileError(f"{path}: no such file or directory (expected a metrics file or a run directory)")
    if path.is_dir():
        return read_state_dirs(path, skipped)
    if path.name == "state.sqlite":
        return read_state_dirs(path.parent, skipped)
    return read_metrics(path, columns)


def default_plot_path(metrics: Path) -> Path:
    """fit.png in a run directory, or beside a metrics file."""
    return metrics / "fit.png" if metrics.is_dir() else metrics.with_name(f"{metrics.stem}.fit.png")


def _print_skipped(skipped: list[str]) -> None:
    for note in skipped:
        print(f"rcswarm fit: {note}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    columns = Columns(step=args.step_column, length=args.length_column, loss=args.loss_column,
                      time=args.time_column, run=args.run_column)
    skipped: list[str] = []
    try:
        rows = read_rows(args.metrics, columns, skipped)
        curves = length_curves(args.metrics, rows)
        analysis = analyse(curves, args.smooth)
    except ValueError as error:
        message = str(error) if isinstance(error, MetricsFileError) else f"{args.metrics}: {error}"
        if "at least 3 distinct" in message:
            message += "; a fit needs runs at several sequence lengths: train a sweep (e.g. `make demo`, or [sweep] seq_lens in RUN.toml)"
        _print_skipped(skipped)
        return usage_error("rcswarm fit", message)
    _print_skipped(skipped)
    report(analysis, Console())
    out = args.out or default_plot_path(args.metrics)
    try:
        plot(analysis, out)
    except OSError as error:
        return usage_error("rcswarm fit", f"{out}: cannot write the plot: {error.strerror}")
    print(f"plot written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
