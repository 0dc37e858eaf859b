"""`rcswarm status`: a coordinator's run, workers and rounds in the terminal, from GetStatus.

    rcswarm status --coordinator HOST:PORT [--token T | $RCSWARM_TOKEN] [--tls-ca CA.pem [--tls-cert C --tls-key K]]
                   [--timeout 10] [--state-dir DIR | --json]
    rcswarm status --state-dir DIR [--stale-s 60] [--json]       a hivemind swarm that `rcswarm dht` mirrors

The RPC carries the `authorization: Bearer <token>` metadata and a deadline. GetStatus holds
no metrics, so the scaling-law fit (α∞, τ, crossovers) is printed when `--state-dir` names
the coordinator's state directory on this machine: every run GetStatus names (one, or a
sweep's runs in the state dirs below it) is read through its store, opened read-only, and
fitted as its dashboard fits it, and shown in the rows `rcswarm fit` prints (observe/analysis.py
`fit_rows`, `crossover_rows`): "not enough data" and the caveats in place of a number the data do
not identify, and no predicted crossover from such a fit.
With `--coordinator`, `--json` prints GetStatus alone and so takes no `--state-dir`; a `--state-dir` that is not a
directory is refused before anything is called. Without `--coordinator`, `--state-dir` names a state dir
`rcswarm dht --config RUN.toml --state-dir DIR` mirrors a hivemind swarm into: the same tables come from the store, read-only
(observe/mirror_view.py `mirrored_status`: the swarm's version of the run's rounds, each peer a
worker, active while its records advanced within `--stale-s`, else stale), with the fit as above.
Every string GetStatus or the store carries (worker names and devices, run ids, reasons, notes) comes from a
peer: it is printed as text, never read as rich markup (`rich.markup.escape`), so a worker named "[/]" or
"[link=...]" shows as that; one longer than NAME_CHARS (a name, device, run id) or TEXT_CHARS (a reason, note) is
cut with "…", and the report then says that `--json` (unchanged) has it whole.
The tables fit the console's width (REPORT_WIDTH when piped) down to 80 columns: numbers are never wrapped, only
names and free text narrow; a table too wide unwrapped is printed as two with the same first column; sentences
(forecasts, refusals, close reasons) are printed as lines under the tables (docs/ARCHITECTURE.md has a sample).
Exit codes: 0 ok, 1 the coordinator refused or could not be reached, 2 bad arguments (or no mirrored state).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from rcswarm.cli.client_flags import add_client_flags, client_options, client_token
from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.config.runspec import RunSpec
from rcswarm.observe import traffic
from rcswarm.observe.analysis import (
    CROSSOVER_RULE,
    NOT_ENOUGH_DATA,
    FitReport,
    StepMean,
    WorkerTotals,
    crossover_rows,
    fit_rows,
    fit_step_means,
    fit_summary,
    step_means,
    worker_totals,
)
from rcswarm.observe.dashboard.views import message_data
from rcswarm.observe.forecast import describe
from rcswarm.protos.transport import ClientTLS, not_grpc_problem, open_channel
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS
from rcswarm.state.errors import StoreError
from rcswarm.worker.client import TLS_PROBE_S, tls_settings_problem
from rcswarm.worker.options import seconds_problem

# Columns of the tables when the output is not a terminal (a terminal's own width applies there).
REPORT_WIDTH = 100
STATES = {number: name.removeprefix("WORKER_STATE_").lower() for name, number in pb.WorkerState.items()}
RUN_STATES = {number: name.removeprefix("RUN_STATE_").lower() for name, number in pb.RunState.items()}


# A string a peer supplies (a worker's name, device or reason, a run id, a note) is shown cut to at most these many
# characters, its end "…", so that one very long string cannot take over the tables; `--json` has it whole.
NAME_CHARS = 64  # names, devices, run ids: a table cell
TEXT_CHARS = 240  # reasons, notes: a few lines under a table or in a wide cell
# Under a mirrored swarm's workers: what "–" stands for there.
NOT_COUNTED = ("a mirror counts no late, stale, clipped or dropped updates and no traffic per round (a coordinator "
               "does): \"–\"")
CUT_NOTE = ("…: a string cut to {name} characters (a name, device or run id) or {text} (a reason or note); "
            "`rcswarm status --json` has it whole")


def fetch_status(target: str, token: str, tls: ClientTLS | None, timeout_s: float) -> pb.GetStatusResponse:
    with open_channel(target, tls, list(MESSAGE_SIZE_OPTIONS)) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        return stub.GetStatus(pb.GetStatusRequest(), timeout=timeout_s,
                              metadata=(("authorization", f"Bearer {token}"),))


def _num(value: float, spec: str = ".4g") -> str:
    return "–" if not math.isfinite(value) else format(value, spec)


class PeerText:
    """A peer-supplied string as rich text: escaped, never read as markup, and cut to `limit` characters with "…"
    when longer; `cut` says whether any was, for the report's closing note."""

    def __init__(self) -> None:
        self.cut = False

    def __call__(self, text: str, limit: int = TEXT_CHARS) -> str:
        if len(text) > limit:
            self.cut = True
            text = text[: limit - 1] + "…"
        return escape(text)


def held_out_cell(loss: float, version: int) -> str:
    """A run's newest held-out loss measured along the way (issue #30) and the version it was of."""
    return f"{loss:.4g} (θ_{version})"


def forecast_cell(forecast: pb.ForecastStatus, text: Callable[[str], str] = escape) -> str:
    """A run's newest forecast (issue #30) in words, with what it was fitted to when that is the held-out loss."""
    prefix = "held-out: " if forecast.basis == "held-out" and not forecast.note else ""
    return prefix + text(describe(forecast.loss, forecast.low, forecast.high, forecast.at_round, forecast.note,
                                  forecast.stopped, forecast.target_loss, forecast.target_seconds))


def _run_labels(status: pb.GetStatusResponse) -> dict[str, str]:
    """A sweep's run ids by their short label, "L=<seq_len>" (the lengths tell a sweep's runs apart); {} for one run.
    (The labels are numbers: no markup to escape.)"""
    return {r.run_id: f"L={r.seq_len}" for r in status.runs}


# How a column lays out its cells. NUM: a number (or numbers "a / b"), right-aligned and never wrapped, so that no
# value is split across lines; WORD: a short word of ours (a state, a label), left-aligned, never wrapped; TEXT: a
# name or free text, left-aligned, wrapped at spaces and a long word folded (nothing is hidden): the only columns
# that narrow when a table is wider than the console. A header that is wider than its values has its own line breaks.
NUM, WORD, TEXT = "num", "word", "text"
Column = tuple[str, str, dict[str, Any]]


def _col(header: str, kind: str, **options: Any) -> Column:
    return header, kind, options


def _table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], caption: str | None = None) -> Table:
    table = Table(title=title, caption=caption)
    for header, kind, options in columns:
        if kind == TEXT:
            table.add_column(header, justify="left", overflow="fold", **options)
        else:
            table.add_column(header, justify="right" if kind == NUM else "left", no_wrap=True, **options)
    for row in rows:
        table.add_row(*row)
    return table


def _fits(console: Console, table: Table) -> bool:
    """Whether `table` fits the console with no cell wrapped (measured as if the console were unbounded)."""
    return Measurement.get(console, console.options.update_width(1 << 20), table).maximum <= console.width


def _print_parts(console: Console, title: str, parts: Sequence[tuple[str, Column, Sequence[str], Sequence[Column],
                                                                      Sequence[Sequence[str]]]]) -> None:
    """One table of the parts' columns side by side (keyed by the first part's key column) when it fits the console
    unwrapped, else one table per part, each with its own title and key column: columns are not squeezed to a few
    characters, and a number is not split across lines."""
    first_key = parts[0][1]
    keys = parts[0][2]
    merged = _table(title, [first_key, *(c for _, _, _, columns, _ in parts for c in columns)],
                    [[key, *(cell for _, _, _, _, rows in parts for cell in rows[i])] for i, key in enumerate(keys)])
    if _fits(console, merged):
        console.print(merged)
        return
    for sub, key, keys, columns, rows in parts:
        console.print(_table(sub, [key, *columns], [[k, *row] for k, row in zip(keys, rows)]))


def _width(markup: str) -> int:
    return Text.from_markup(markup, emoji=False).cell_len


def _labelled(console: Console, label: str, value: str) -> None:
    """"label value" on one line where it fits the console; else the label, and under it the value indented by two
    columns (wrapped at spaces there, a long word folded), so that a value is not broken behind a long label."""
    if _width(label) + 1 + _width(value) <= console.width:
        console.print(console.render_str(f"{label} {value}", overflow="fold"))
        return
    console.print(console.render_str(label, overflow="fold"))
    console.print(Padding(console.render_str(value, overflow="fold"), (0, 0, 0, 2), expand=False))


def _block(console: Console, title: str, rows: Sequence[tuple[str, str]]) -> None:
    """A title, and under it one line per (label, text), the texts aligned after the labels (wrapped there)."""
    if not rows:
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, value)
    console.print(title)
    console.print(Padding(grid, (0, 0, 0, 2), expand=False))


def _break_list(text: str, width: int) -> str:
    """`text` with a line break after a ", " or "; " where the next item would not fit `width` columns, so that the
    items of a list ("L=2: 1 / 100, L=4: ...") stay whole; unchanged when an item alone is wider than that."""
    pieces = re.split(r"(?<=[,;]) ", text)
    if width <= 0 or _width(text) <= width or max(_width(piece) for piece in pieces) > width:
        return text  # fits, or prose with a clause longer than the column: wrapped at its spaces
    lines: list[str] = []
    for piece in pieces:
        if lines and _width(lines[-1]) + 1 + _width(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return "\n".join(lines)


def _fields(console: Console, title: str, rows: Sequence[tuple[str, str]]) -> Table:
    """A field / value table: the fields never wrapped, the values left-aligned, a list in one broken between its
    items where it would not fit the value column."""
    table = Table(title=title)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    value_width = console.width - 7 - max((_width(field) for field, _ in rows), default=0)  # 7: borders and padding
    for field, value in rows:
        table.add_row(field, _break_list(value, value_width))
    return table


def report(status: pb.GetStatusResponse, console: Console, fits: FitReport | None = None,
           totals: dict[str, WorkerTotals] | None = None, mirrored: bool = False) -> None:
    """The status as tables that fit the console's width (100 columns when not a terminal): the run (or the
    sweep, with one row per run), its workers, what happened to their updates, its recent rounds, the fit.
    `mirrored`: a hivemind swarm `rcswarm dht` mirrors, whose late, stale, clipped and dropped updates and traffic
    no one counts (a coordinator does): shown as "–", with a line saying why, not as zeros.
    Numbers are never wrapped; long free text (forecasts, refusals, close reasons) is printed in lines under a
    table; a peer's string is escaped and, when very long, cut with "…" (`--json` has it whole)."""
    text = PeerText()
    labels = _run_labels(status)
    active = sum(1 for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE)
    rows = [("state", RUN_STATES.get(status.run_state, "unknown"))]
    if status.runs:
        versions = (f"{labels[r.run_id]}: {r.version} / {r.target_rounds or '∞'}" for r in status.runs)
        rows.append(("versions", ", ".join(versions)))
    else:
        rows.append(("version", f"{status.version} / {status.target_rounds or '∞'}"))
    rows.append(("workers active", f"{active} of {len(status.workers)}"))
    if status.waiting_for_place:
        rows.append(("waiting for a place", str(status.waiting_for_place)))
    rows += [("latest loss", _num(status.latest_loss)), ("tokens trained", str(status.total_tokens)),
             ("tokens applied", str(status.applied_tokens))]
    if status.pace:
        rows.append(("pace", text(status.pace)))
    rows.append(("tokens/s", _num(status.tokens_per_second)))
    if status.fp32_bytes:
        rows.append(("traffic per worker per round", traffic.describe(
            status.fp32_bytes, status.bytes_up_per_round, status.bytes_down_per_round)))
    if status.param_sha256:
        rows.append(("θ sha256", escape(status.param_sha256[:16]) + "…"))
    if status.HasField("curriculum"):
        rows += _curriculum_rows(status.curriculum, text)
    if status.val_loss > 0:
        rows.append(("held-out loss (along the way)", held_out_cell(status.val_loss, status.val_version)))
    console.print(_fields(console, f"{'sweep' if status.runs else 'run'} {text(status.run_id, NAME_CHARS)}", rows))
    if status.HasField("forecast"):  # a sentence: under the table, whole, not folded into a cell
        _labelled(console, f"forecast of the final {status.forecast.basis or 'training'} loss (90%):",
                  forecast_cell(status.forecast, text))

    if status.runs:
        _sweep(status, console, labels, text)
    _workers(status, console, labels, totals, text, mirrored)
    _rounds(status, console, labels, text)
    newest = next((r for r in reversed(status.rounds) if r.closed_at > 0 and r.aggregation), None)
    if newest is not None:
        _labelled(console, f"aggregation of round {newest.version}:", text(newest.aggregation))
    if fits is not None:
        _fit(console, fits)
    if text.cut:
        console.print(CUT_NOTE.format(name=NAME_CHARS, text=TEXT_CHARS), style="dim")


def _sweep(status: pb.GetStatusResponse, console: Console, labels: dict[str, str], text: PeerText) -> None:
    """The sweep's runs, one row each (two tables when one does not fit), then each run's forecast and, for a run
    its workers cannot train, who refused it and why, in lines under the tables."""
    ids = [text(r.run_id, NAME_CHARS) for r in status.runs]
    run = _col("run", TEXT, min_width=min(18, max(len(i) for i in ids)))  # an id is not squeezed to a few characters
    state = [[f"{r.seq_len} × {r.batch_size}", RUN_STATES.get(r.run_state, "unknown"),
              f"{r.version} / {r.target_rounds or '∞'}", str(r.active_workers),
              str(r.refused_by) if r.refused_by else "–"] for r in status.runs]
    progress = [[_num(r.latest_loss), held_out_cell(r.val_loss, r.val_version) if r.val_loss > 0 else "–",
                 str(r.total_tokens), _num(r.tokens_per_second)] for r in status.runs]
    _print_parts(console, "runs of the sweep", [
        ("runs of the sweep", run, ids, [_col("L × batch", NUM), _col("state", WORD), _col("version", NUM),
                                         _col("active\nworkers", NUM), _col("refused\nby", NUM)], state),
        ("runs of the sweep: losses and throughput", run, ids,
         [_col("loss", NUM), _col("held-out", NUM), _col("tokens", NUM), _col("tokens/s", NUM)], progress)])
    _block(console, "forecasts of each run's final loss (90%):",
           [(labels[r.run_id], forecast_cell(r.forecast, text)) for r in status.runs if r.HasField("forecast")])
    for r in status.runs:  # a run its workers cannot train waits for one that can: said, with why
        if r.refused_by:
            _labelled(console, f"{labels[r.run_id]}: refused by {r.refused_by} worker"
                               f"{'s' if r.refused_by != 1 else ''}, the last:", text(r.last_refusal))


def _fit(console: Console, fits: FitReport) -> None:
    """The rows `rcswarm fit` prints (observe/analysis.py `fit_rows`, `crossover_rows`): where a caveat leaves a
    number unidentified, "not enough data" stands in its place, and no crossover is predicted from such a fit."""
    if fits.analysis is None:
        _labelled(console, "fit:", escape(fits.message))
        return
    summary = fit_summary(fits.analysis)
    fit = Table(title="loss(L | s) ≈ A(s)·L^(−α(s)),  α(s) = α∞·(1 − e^(−s/τ))")
    fit.add_column("quantity", no_wrap=True)
    fit.add_column("value", justify="right", overflow="fold")
    fit.add_row("lengths", ", ".join(f"{c.length:g}" for c in fits.curves))
    for quantity, value in fit_rows(summary):
        fit.add_row(quantity, escape(value))
    console.print(fit)
    for caveat in fits.analysis.caveats:
        console.print(f"{NOT_ENOUGH_DATA}: {escape(str(caveat))}", style="bold red")
    cross = Table(title="wall-time crossovers: longer L below shorter L from then on")
    for name in ("L short → long", "observed", "predicted (Eq. 11)"):
        short = name == "L short → long"  # the others can be a sentence ("none: ...", "not enough data (...)")
        cross.add_column(name, justify="right" if short else "left", no_wrap=short, overflow="fold")
    for row in crossover_rows(summary):
        cross.add_row(*(escape(text) for text in row))
    console.print(cross)
    console.print(f"crossovers: {CROSSOVER_RULE.format(smooth=fits.analysis.smooth)}", style="dim")


def _workers(status: pb.GetStatusResponse, console: Console, labels: dict[str, str],
             totals: dict[str, WorkerTotals] | None, text: PeerText, mirrored: bool = False) -> None:
    """The workers (a run column for a sweep) and their training, with tokens/s and loss from the store when
    `totals` is given: one table when it fits, else two. Then what each worker's updates became (every worker when
    `totals` is given; else only those with a late, stale, clipped or dropped update or an ended or flagged
    membership)."""
    if not status.workers:
        console.print(_table("workers", [_col("worker", TEXT), _col("state", WORD), _col("device", TEXT)], [],
                             caption="no workers have joined"))
        return
    names = [text(w.name, NAME_CHARS) + "\n" + text(w.worker_id, NAME_CHARS) for w in status.workers]
    ids = [text(w.worker_id, NAME_CHARS) for w in status.workers]
    who = [[*([labels.get(w.run_id, "–")] if labels else []), STATES.get(w.state, "unknown"),
            text(w.device, NAME_CHARS),
            f"{w.assignment.seq_len} × {w.assignment.batch_size}" if w.HasField("assignment") else "–",
            str(w.base_version), f"{w.seconds_since_heartbeat:.1f}"] for w in status.workers]
    work = []
    for w in status.workers:
        measured = []
        if totals is not None:
            t = totals.get(w.worker_id)
            measured = ["–", "–"] if t is None else [_num(t.tokens_per_second), _num(t.last_loss)]
        work.append([*measured, f"{w.trained_tokens} /\n{w.applied_tokens}",
                     (_num(w.step_seconds) if w.step_seconds else "–") + "\n"
                     + (f"{w.utilization:.0%}" if w.utilization else "–"),
                     "–" if mirrored else f"{traffic.size(w.round_bytes_up)} / {traffic.size(w.round_bytes_down)}"])
    # A long name folds in its column (never narrower than an id, r0w12-0123abcd).
    worker = _col("worker", TEXT, min_width=14)
    _print_parts(console, "workers", [
        ("workers", worker, names,
         [*([_col("run", WORD)] if labels else []), _col("state", WORD), _col("device", TEXT, min_width=10),
          _col("L × B", NUM), _col("base v", NUM), _col("seen\n(s)", NUM)], who),
        ("workers' training", _col("worker", TEXT, min_width=14), ids,
         [*([_col("tokens/s", NUM), _col("loss", NUM)] if totals is not None else []),
          _col("tokens\ntrained /\napplied", NUM), _col("s/step\nutil", NUM), _col("last up / down", NUM)], work)])
    noted = [w for w in status.workers if totals is not None or _worker_reason(w) or w.late_updates
             or w.stale_updates or w.clipped_updates or w.dropped_updates]
    if noted:
        console.print(_table("workers' updates and memberships", [
            _col("worker", TEXT, min_width=14), _col("late / stale /\nclipped / dropped", NUM),
            _col("reason", TEXT, min_width=20)], [
            [text(w.worker_id, NAME_CHARS),
             "–" if mirrored else f"{w.late_updates} / {w.stale_updates} / {w.clipped_updates} / {w.dropped_updates}",
             text(_worker_reason(w))] for w in noted]))
    if mirrored:
        console.print(NOT_COUNTED, style="dim")


def _rounds(status: pb.GetStatusResponse, console: Console, labels: dict[str, str], text: PeerText) -> None:
    """The recent rounds (each run's for a sweep, with a run column), newest last; their close reasons in a column
    when the table fits so, else in lines under it."""
    columns = [*([_col("run", WORD)] if labels else []), _col("version", NUM), _col("state", NUM),
               _col("reports", NUM), _col("tokens", NUM), _col("seconds", NUM), _col("update\nnorm", NUM),
               _col("clipped /\ndropped", NUM)]
    rows = []
    for r in status.rounds:
        closed = r.closed_at > 0
        rows.append([*([labels.get(r.run_id, "–")] if labels else []), str(r.version), "closed" if closed else "open",
                     str(r.reports), str(r.tokens), f"{r.closed_at - r.opened_at:.3g}" if closed else "–",
                     _num(r.update_norm) if closed else "–", f"{r.clipped if closed else '–'} / {r.dropped}"])
    reasons = [text(r.close_reason) for r in status.rounds]
    whole = _table("rounds (newest last)", [*columns, _col("close reason", TEXT)],
                   [[*row, reason] for row, reason in zip(rows, reasons)])
    if _fits(console, whole):
        console.print(whole)
        return
    console.print(_table("rounds (newest last)", columns, rows))
    _block(console, "close reasons (newest last):",
           [(f"{labels[r.run_id]}, round {r.version}" if r.run_id in labels else f"round {r.version}", reason)
            for r, reason in zip(status.rounds, reasons) if reason])


def _worker_reason(worker: pb.WorkerStatus) -> str:
    """Why the membership ended, and the latest outlier flag with the rounds flagged among the recent ones."""
    flagged = f"flagged in {worker.outlier_rounds} recent rounds; latest {worker.outlier}" if worker.outlier else ""
    return "; ".join(part for part in (worker.reason, flagged) if part)


def _curriculum_rows(curriculum: pb.CurriculumStatus, text: PeerText) -> list[tuple[str, str]]:
    """The run's curriculum: policy, current L and batch, and for the adaptive ladder its state."""
    assigned = "per worker" if curriculum.seq_len == 0 else f"{curriculum.seq_len} × {curriculum.batch_size}"
    rows = [("curriculum", text(curriculum.policy, NAME_CHARS)), ("L × batch", assigned)]
    if curriculum.ladder:
        measured = ", ".join(f"L={length}: {seconds:.3g}" for length, seconds in sorted(curriculum.seconds_per_step.items()))
        rows += [("ladder (rung)", f"{list(curriculum.ladder)} ({curriculum.rung})"),
                 ("s/step measured", measured or "–"),
                 ("budget used", f"{curriculum.elapsed_seconds:.0f} of {curriculum.budget_seconds:.0f} s"),
                 ("law", text(curriculum.law))]
    if curriculum.reason:
        rows.append(("last decision", text(curriculum.reason)))
    return rows


def _stores(state_dir: Path) -> list[Path]:
    """The state dirs at `state_dir`: itself when it holds state.sqlite, and those one level below (a sweep's runs)."""
    return sorted(db.parent for db in [state_dir / "state.sqlite", *state_dir.glob("*/state.sqlite")] if db.is_file())


def read_fits(state_dir: Path, status: pb.GetStatusResponse,
              mirrored: bool = False) -> tuple[FitReport, dict[str, WorkerTotals]]:
    """The fit over the runs GetStatus names and every run's per-worker totals, as the dashboard shows them.

    Each run's state dir (the coordinator's, or one below a sweep's, coordinator/sweep.py
    `run_state_dir`) is the one whose state.sqlite stores its run id; it is opened read-only. `mirrored`: a hivemind
    swarm `rcswarm dht` mirrors, whose curves count its peers' own steps (`views.presentation`).
    """
    from rcswarm.observe.dashboard.views import presentation
    from rcswarm.state.store import StateStore

    wanted = [run.run_id for run in status.runs] or [status.run_id]
    _, clock = presentation(wanted != [status.run_id], mirrored)
    means: list[StepMean] = []
    totals: dict[str, WorkerTotals] = {}
    found: set[str] = set()
    for path in _stores(state_dir):
        store = StateStore.open_read_only(path)
        try:
            identity = store.run_identity()
            if identity is None or identity[0] not in wanted:
                continue
            run_id, spec_json = identity
            means.extend(step_means(store, clock, run_id, RunSpec.from_json(spec_json).inner.steps))
            totals.update(worker_totals(store.worker_rows(run_id)))
            found.add(run_id)
        finally:
            store.close()
    missing = [run_id for run_id in wanted if run_id not in found]
    if missing:
        raise FileNotFoundError(f"{state_dir}: no state dir below it holds run(s) {', '.join(missing)} "
                                "(is --state-dir the coordinator's state directory?)")
    return fit_step_means(means), totals


def parser() -> argparse.ArgumentParser:
    result = new_parser("rcswarm status", "print a coordinator's run, workers, rounds and fits")
    add_client_flags(result, "HOST:PORT of the coordinator's gRPC server (without it: --state-dir of a mirrored swarm)")
    result.add_argument("--timeout", type=float, default=10.0, help="deadline of the call in seconds")
    result.add_argument("--state-dir", type=Path, default=None,
                        help="the coordinator's state directory on this machine: also print the scaling-law fit; "
                             "without --coordinator, the state dir `rcswarm dht` mirrors a hivemind swarm into")
    result.add_argument("--stale-s", type=float, default=None,
                        help="without --coordinator: a peer whose records did not advance for this long (or 3 × its "
                             "last gap, if longer) is stale (default 60)")
    result.add_argument("--json", action="store_true", help="print GetStatus as JSON instead of tables (numbers as numbers, null for a missing one)")
    return result


def mirrored(state_dir: Path, stale_s: float) -> tuple[pb.GetStatusResponse, float]:
    """GetStatus of the swarm mirrored into `state_dir` and the seconds since the mirror's last poll."""
    import time

    from rcswarm.observe.mirror_view import mirrored_status, open_mirror, read_view

    store = open_mirror(state_dir)
    try:
        now = time.time()
        return mirrored_status(store, now, stale_s), now - read_view(store)[2].polled_at
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    problem = state_dir_problem(args.state_dir) or json_problem(args)
    if problem is not None:
        return usage_error("rcswarm status", problem)
    if args.coordinator is None:
        return main_mirrored(args)
    if args.stale_s is not None:
        return usage_error("rcswarm status", "--stale-s is for a mirrored swarm: give --state-dir without --coordinator")
    try:
        token = client_token(args)
    except ValueError as error:
        return usage_error("rcswarm status", str(error))
    timeout_problem = seconds_problem("--timeout", args.timeout)  # a huge deadline overflows gRPC's: fails at once
    if timeout_problem is not None:
        return usage_error("rcswarm status", timeout_problem)
    try:
        client = client_options(args)
        status = fetch_status(client.coordinator, token, client.tls(), args.timeout)
    except ValueError as error:
        return usage_error("rcswarm status", str(error))
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        name = code.name if code is not None else "ERROR"
        found = not_grpc_problem(args.coordinator, code, details or "") or tls_settings_problem(
            args.coordinator, args.tls_ca, code, details or "", min(TLS_PROBE_S, args.timeout),
            tls_cert=args.tls_cert, tls_key=args.tls_key)
        print(f"rcswarm status: {found or f'{args.coordinator}: {name}: {details}'}", file=sys.stderr)
        return 1
    return show(args, status)


def state_dir_problem(state_dir: Path | None) -> str | None:
    """`--state-dir DIR` naming no directory, or None: refused before anything else is read or called, where a
    missing one was "no state dir below it holds run(s)" after the RPC, or ignored beside --json."""
    try:
        if state_dir is None or state_dir.is_dir():
            return None
        what = "not a directory" if state_dir.exists() else "no such directory"
    except OSError as error:  # a name too long, a parent that cannot be searched
        what = error.strerror or str(error)
    return f"--state-dir {state_dir}: {what} (expected the coordinator's state directory, or a mirrored swarm's)"


def json_problem(args: argparse.Namespace) -> str | None:
    """--json with both --coordinator and --state-dir, or None: the JSON is GetStatus alone, and --state-dir there
    only adds the fit to the tables, so it would be silently ignored (without --coordinator it is the JSON's source)."""
    if args.json and args.coordinator is not None and args.state_dir is not None:
        return ("--json prints GetStatus alone, without the fit that --state-dir adds to the tables: give --json or "
                "--state-dir with --coordinator, not both")
    return None


def main_mirrored(args: argparse.Namespace) -> int:
    """`rcswarm status --state-dir DIR` without a coordinator: the mirrored swarm, read from its store."""
    from rcswarm.observe.mirror_view import STALE_S

    if args.state_dir is None:
        return usage_error("rcswarm status", "expected --coordinator HOST:PORT, or --state-dir DIR of a hivemind swarm "
                                             "that `rcswarm dht --config RUN.toml --state-dir DIR` mirrors")
    stale_s = STALE_S if args.stale_s is None else args.stale_s
    if not (stale_s > 0 and math.isfinite(stale_s)):
        return usage_error("rcswarm status", f"--stale-s {args.stale_s}: expected a positive number of seconds")
    try:
        status, polled = mirrored(args.state_dir, stale_s)
    except (OSError, StoreError, ValueError) as error:
        return usage_error("rcswarm status", f"--state-dir {args.state_dir}: {error}")
    return show(args, status, f"mirrored by `rcswarm dht` (no coordinator); its last poll {polled:.0f} s ago; "
                              f"a peer is active while its records advanced within {stale_s:g} s")


def show(args: argparse.Namespace, status: pb.GetStatusResponse, note: str = "") -> int:
    """Print `status` as JSON, or as tables with the fit when --state-dir is given."""
    if args.json:
        print(json.dumps(message_data(status), indent=1, allow_nan=False))
        return 0
    fits, totals = None, None
    if args.state_dir is not None:
        try:
            fits, totals = read_fits(args.state_dir, status, mirrored=args.coordinator is None)
        except (OSError, StoreError, ValueError) as error:
            return usage_error("rcswarm status", f"--state-dir {args.state_dir}: {error}")
    # emoji=False: names, devices and run ids come from peers, and ":skull:" in one is text, not an emoji.
    console = Console(emoji=False)
    if not console.is_terminal:
        console = Console(width=REPORT_WIDTH, emoji=False)  # piped or captured: the width tables are laid out for
    report(status, console, fits, totals, mirrored=args.coordinator is None)
    if note:
        console.print(escape(note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
