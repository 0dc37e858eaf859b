"""`rcswarm fit`: fit the sequence-length scaling law to recorded metrics and plot it.

    rcswarm fit RUN_DIR | METRICS.{csv,jsonl} [--out plot.png] [--step-column step --length-column seq_len
                                                    --loss-column loss --time-column wall_time
                                                    --run-column run_id --smooth 25]

Rows come from a CSV file with a header or from one JSON object per line (the coordinator's
metrics table, exported). Rows are grouped by sequence length (each run must keep one length);
a length's loss and wall time at a step are the means over its rows at that step. Printed: per
length its runs, final loss and measured seconds per step; the schedule α(s) = α∞(1 − e^(−s/τ))
of the power law loss(L | s) at matched steps, with the 90% intervals of α∞ and τ, its R² and
per-doubling improvement, or "not enough data" and the caveats when the data do not identify it
(`observe/analysis.py`); and for each pair of neighbouring lengths the observed and the predicted
(Eq. 11) wall-time crossover, under the stated crossover rule. Observed crossovers and the
wall-time plot use each length's losses smoothed by a centred moving average over `--smooth`
steps (1: raw); the fits use the raw losses. The plot (`observe/plots.py`) has four panels: loss
against step with the fit, α(s), loss against wall time with the labelled crossovers, and the
law across lengths: the held-out loss of the final parameters against L when RUN_DIR has the
summary.json of `rcswarm run`, else the training loss at the last matched step; a run there whose length or
held-out loss is not a positive finite number is left out, with a line saying so (`summary_law`).
A malformed file is reported with its name and line number, exit code 2. A file with a `tokens` column (the
metrics table exported) gives its training rows, as a state dir does (`analysis.is_training_row`: tokens > 0 and
a loss); the others (a round's pull row) are left out, with a line saying how many and at which lines. A CSV may
start with a byte order mark (Excel's). In state dirs, a run's training rows at a length the run never assigns
(another run's, reported there by a re-join before issue #33) are left out, with one line per run naming its
table, the rows' workers, versions and lengths. Of more than `analysis.MAX_LENGTHS` lengths the fit takes those
with the most recorded steps and says which it left out. Run ids and paths are printed as text, never as rich
markup.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rcswarm.cli.usage import (
    empty_path_problem,
    new_parser,
    output_file_problem,
    parse_or_status,
    path_arg,
    usage_error,
)
from rcswarm.observe.analysis import (
    CROSSOVER_RULE,
    DEFAULT_SMOOTH_STEPS,
    NOT_ENOUGH_DATA,
    Analysis,
    Columns,
    LengthLaw,
    MetricRows,
    MetricsFileError,
    analyse,
    crossover_rows,
    fit_rows,
    fit_summary,
    held_out_law,
    law_at_last_step,
    length_curves,
    read_metrics,
    read_state_dirs,
    state_dir_lengths,
)
from rcswarm.observe.fits import smooth_losses
from rcswarm.observe.forecast import describe
from rcswarm.state.errors import StoreError

PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # the plot's file types (matplotlib picks it by the suffix)


def report(analysis: Analysis, console: Console) -> None:
    """The fit as tables; the run ids come from the file or the state dirs and are printed as text, never as rich
    markup (`escape`)."""
    lengths = Table(title="runs by sequence length")
    for name in ("L", "runs", "last step", "final loss", "s/step"):
        lengths.add_column(name, justify="right")
    for curve in analysis.curves:
        lengths.add_row(
            f"{curve.length:g}", escape(", ".join(curve.runs)), f"{curve.steps[-1]:g}", f"{curve.losses[-1]:.4f}",
            f"{curve.seconds_per_step:.4g}",
        )
    console.print(lengths)
    summary = fit_summary(analysis)
    last = analysis.points[-1]
    fit = Table(title="loss(L | s) ≈ A(s)·L^(−α(s)),  α(s) = α∞·(1 − e^(−s/τ))")
    fit.add_column("quantity")
    fit.add_column("value", justify="right")
    for quantity, value in fit_rows(summary):
        fit.add_row(quantity, value)
    fit.add_row(f"α at step {last.step:g}", f"{last.alpha:.4f} (A {last.amplitude:.3f}, R² {last.r_squared:.3f})")
    console.print(fit)
    for caveat in analysis.caveats:
        console.print(f"{NOT_ENOUGH_DATA}: {caveat}", style="bold red")
    cross = Table(title="wall-time crossovers: longer L below shorter L from then on")
    for name in ("L short → long", "observed", "predicted (Eq. 11)"):
        cross.add_column(name, justify="right")
    for row in crossover_rows(summary):
        cross.add_row(*row)
    console.print(cross)
    console.print(f"crossovers: {CROSSOVER_RULE.format(smooth=analysis.smooth)}", style="dim")


def plot(analysis: Analysis, out: Path, law: LengthLaw | None = None) -> None:
    """fit.png: loss vs step, α(s), loss vs wall time and the law across lengths (`law`, else the training loss
    at the last matched step; a panel saying why when that law cannot be fitted, `fits.fit_power_law`'s ValueError);
    see `observe/plots.py`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rcswarm.observe.plots import draw_alpha, draw_law, draw_loss_step, draw_loss_time

    figure = Figure(figsize=(14, 10), dpi=100)
    FigureCanvasAgg(figure)
    (by_step, alphas), (by_time, by_length) = figure.subplots(2, 2)
    label = f"{analysis.smooth}-step mean"
    smoother = lambda losses: smooth_losses(losses, analysis.smooth)  # noqa: E731
    draw_loss_step(by_step, analysis.curves, analysis, smoother, label)
    draw_alpha(alphas, analysis)
    draw_loss_time(by_time, analysis.curves, analysis, smoother, label)
    if law is None:
        try:
            law = law_at_last_step(analysis)
        except ValueError as error:
            draw_law(by_length, None, f"no fit across lengths: {error}")
    if law is not None:
        draw_law(by_length, law)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)


def parser() -> argparse.ArgumentParser:
    result = new_parser("rcswarm fit", "fit scaling laws to recorded metrics and plot them")
    result.add_argument("metrics", type=path_arg,
                        help="metrics file (.csv with a header, or .jsonl), a run directory holding state.sqlite "
                             "files (e.g. what `rcswarm run` made), or one state.sqlite")
    result.add_argument("--out", type=path_arg, default=None,
                        help="where to write the plot (.png, .pdf or .svg); default: fit.png in the run directory, or beside the file")
    result.add_argument("--step-column", default="step", help="column holding the training step (files only)")
    result.add_argument("--length-column", default="seq_len", help="column holding the sequence length (files only)")
    result.add_argument("--loss-column", default="loss", help="column holding the training loss (files only)")
    result.add_argument("--time-column", default="wall_time", help="column holding wall time in seconds (files only)")
    result.add_argument("--run-column", default="run_id", help="column naming the run a row belongs to (files only)")
    result.add_argument("--smooth", type=int, default=DEFAULT_SMOOTH_STEPS,
                        help="observed crossovers and the wall-time plot average each length's losses over this "
                             "many steps, centred (1: raw)")
    return result


def read_rows(path: Path, columns: Columns, skipped: list[str] | None = None) -> MetricRows:
    """The metric rows of a metrics file, a state.sqlite, or every state dir below a directory; `skipped` gets a line
    per run whose rows at a length it never assigns were left out (`read_state_dirs`), or for a file's rows that are
    not training rows (`read_metrics`)."""
    if not path.exists():
        raise MetricsFileError(f"{path}: no such file or directory (expected a metrics file or a run directory)")
    if path.is_dir():
        return read_state_dirs(path, skipped)
    if path.name == "state.sqlite":
        return read_state_dirs(path.parent, skipped)
    return read_metrics(path, columns, skipped)


def too_few_lengths(metrics: Path) -> str:
    """What a fit with fewer than 3 lengths needs: a sweep still training (its state dirs name lengths without
    metrics) needs time; anything else runs at more lengths."""
    if metrics.is_dir():
        trained = set(read_state_dirs(metrics).length.tolist())
        idle = sorted(set(state_dir_lengths(metrics)) - trained)
        if idle:
            return (f"{NOT_ENOUGH_DATA}: the runs at L = {', '.join(f'{x:g}' for x in idle)} below {metrics} have no "
                    "training metrics yet (a fit needs 3 lengths with data: let them train)")
    return ("a fit needs runs at several sequence lengths: train a sweep (e.g. `make demo`, or [sweep] seq_lens in "
            "RUN.toml)")


def default_plot_path(metrics: Path) -> Path:
    """fit.png in a run directory, or beside a metrics file."""
    return metrics / "fit.png" if metrics.is_dir() else metrics.with_name(f"{metrics.stem}.fit.png")


def _print_skipped(skipped: list[str]) -> None:
    for note in skipped:
        print(f"rcswarm fit: {note}", file=sys.stderr)


def forecast_report(path: Path, console: Console) -> None:
    """Issue #30: per run state dir in `path` (a run directory, a state dir or a state.sqlite), the newest forecast
    of its final loss the coordinator stored (held-out or training: `loss_kind`), with its interval, or why there is
    none."""
    if path.name == "state.sqlite":
        path = path.parent
    databases = sorted(path.rglob("state.sqlite")) if path.is_dir() else []
    if not databases:
        return
    from rcswarm.observe.report import loss_kind  # state/ and torch with it: only for state dirs
    from rcswarm.state.store import StateStore

    table = Table(title="forecasts of each run's final loss: L = E + A·round^(−β), 90% block-bootstrap interval")
    table.add_column("state dir")
    table.add_column("forecast made at round", justify="right")
    table.add_column("of the loss")
    table.add_column("forecast")
    for database in databases:
        store = StateStore.open_read_only(database.parent)
        try:
            newest, stopped = store.forecasts(newest_only=True), store.get("stopped") or ""
        finally:
            store.close()
        if newest:
            r = newest[0]
            table.add_row(escape(str(database.parent.relative_to(path))), str(r.version), loss_kind(r),
                          escape(describe(r.loss, r.low, r.high, r.at_round, r.note, stopped, r.target_loss,
                                          r.target_seconds)))
    if table.row_count:
        console.print(table)


def summary_law(metrics: Path) -> LengthLaw | None:
    """The held-out law of a run directory's summary.json (`held_out_law`), or None (the plot's law panel then
    shows the training loss at the last matched step); a line on stderr for each run left out of it, and when its
    held-out losses fit no law (`fits.fit_power_law`'s ValueError)."""
    if not metrics.is_dir():
        return None
    skipped: list[str] = []
    try:
        law = held_out_law(metrics, skipped)
    except ValueError as error:
        skipped.append(f"{metrics / 'summary.json'}: no law across lengths of its held-out losses: {error}")
        law = None
    if law is None and skipped:
        skipped.append(f"{metrics / 'summary.json'}: the law panel shows the training loss at the last matched step "
                       "instead of the held-out loss")
    _print_skipped(skipped)
    return law


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    problem = empty_path_problem("METRICS", args.metrics)
    if problem is None and args.out is not None:
        problem = output_file_problem("--out", args.out, PLOT_SUFFIXES)
    if problem is None and args.smooth < 1:
        problem = f"--smooth {args.smooth}: expected a positive number of steps (1: raw)"
    if problem is not None:
        return usage_error("rcswarm fit", problem)
    columns = Columns(step=args.step_column, length=args.length_column, loss=args.loss_column,
                      time=args.time_column, run=args.run_column)
    skipped: list[str] = []
    try:
        forecast_report(args.metrics, Console(emoji=False))
    except (StoreError, ValueError) as error:
        print(f"rcswarm fit: no forecasts: {error}", file=sys.stderr)
    try:
        rows = read_rows(args.metrics, columns, skipped)
        curves = length_curves(args.metrics, rows)
        analysis = analyse(curves, args.smooth)
    except ValueError as error:
        message = str(error) if isinstance(error, MetricsFileError) else f"{args.metrics}: {error}"
        if "at least 3 distinct" in message:
            message += "; " + too_few_lengths(args.metrics)
        if "missing column" in message:
            message += ("; --run-column, --step-column, --length-column, --loss-column and --time-column name a "
                        "file's columns")
        _print_skipped(skipped)
        return usage_error("rcswarm fit", message)
    _print_skipped(skipped)
    report(analysis, Console(emoji=False))
    out = args.out or default_plot_path(args.metrics)
    try:
        plot(analysis, out, summary_law(args.metrics))
    except OSError as error:
        return usage_error("rcswarm fit", f"{out}: cannot write the plot: {error.strerror}")
    print(f"plot written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
