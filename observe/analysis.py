"""Scaling-law analysis of recorded metrics: curves per sequence length, fits and crossovers.

Rows come from a CSV file with a header, from one JSON object per line (the coordinator's
metrics table, exported), or from the state dirs below a run directory. Rows are grouped by
sequence length (each run must keep one length); a length's loss and wall time at a step are
the means over its rows at that step. `analyse` fits the power law loss(L | s) at matched
steps and the schedule α(s) = α∞(1 − e^(−s/τ)), and finds for each pair of neighbouring
lengths the observed and the predicted (Eq. 11) wall-time crossover; observed crossovers use
each length's losses smoothed by a centred moving average over `smooth` steps (1: raw), the
fits the raw losses. `observe/fits.py` holds the math; the curriculum, the dashboard and
the `rcswarm fit` and `rcswarm status` commands call this module.

A live run's curves come from its store's named reads (`step_means`) on one of two clocks:
each worker's own step and wall time (`Clock.WORKER`, a single run's, where workers never
move), or the run's own step and the time since its first metric on the coordinator's clock
(`Clock.RUN`, a sweep's: a worker that moves between runs keeps its counters). The run step is
owned here: `run_steps(store, inner_steps)` is the run's counter (config/run_step.py `RunSteps`)
with the steps each closed round recorded, so a row trained from version v at step k within its
round is at Σ_{u<v} steps_u + k + 1, for time-boxed and adaptive rounds too; state dirs read with
`read_state_dirs` (`rcswarm fit RUN_DIR`), the sweep's curves and the coordinator's fixed
curriculum schedule all count with it. `fit_step_means` turns such rows into curves and a fit
when at least 3 lengths allow one; `worker_totals` the per-worker reads into totals. This module
holds no SQL: it takes rows and the store's reads.
"""

from __future__ import annotations

import csv
import enum
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from rcswarm.config.run_step import RunSteps
from rcswarm.observe.fits import (
    AlphaPoint,
    AlphaScheduleFit,
    Crossover,
    amplitude_from_points,
    fit_alpha_over_steps,
    fit_alpha_schedule,
    observed_crossover,
    predicted_crossover,
    seconds_per_step,
    smooth_losses,
)

DEFAULT_SMOOTH_STEPS = 25

# (seq_len, step, mean loss, mean seconds) of one length at one step.
StepMean = tuple[float, float, float, float]


class MetricsFileError(ValueError):
    """A metrics file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class Columns:
    step: str
    length: str
    loss: str
    time: str
    run: str


@dataclass(frozen=True)
class Row:
    """One metric row; `where` says where it was read ("line 12" of a file, a training row of a state dir's table)."""

    run: str
    step: float
    length: float
    loss: float
    time: float
    where: str


@dataclass(frozen=True)
class LengthCurve:
    """One sequence length's runs, averaged per step."""

    length: float
    runs: tuple[str, ...]
    steps: np.ndarray
    losses: np.ndarray
    times: np.ndarray
    seconds_per_step: float


@dataclass(frozen=True)
class PairCrossover:
    length_short: float
    length_long: float
    observed: float | None
    predicted: Crossover | None


@dataclass(frozen=True)
class Analysis:
    curves: list[LengthCurve]
    points: list[AlphaPoint]
    schedule: AlphaScheduleFit
    crossovers: list[PairCrossover]
    smooth: int


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each row of a CSV (header on line 1) or JSON-lines file."""
    with path.open(newline="", encoding="utf-8") as handle:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(handle)
            if reader.fieldnames is None:
                raise MetricsFileError(f"{path}: line 1: expected a header row, found an empty file")
            for record in reader:
                if None in record:
                    raise MetricsFileError(f"{path}: line {reader.line_num}: more fields than the header's {len(reader.fieldnames)}")
                yield reader.line_num, record
            return
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise MetricsFileError(f"{path}: line {number}: bad JSON: {error.msg}") from None
            if not isinstance(record, dict):
                raise MetricsFileError(f"{path}: line {number}: expected a JSON object, found {type(record).__name__}")
            yield number, record


def _number(path: Path, line: int, record: dict[str, Any], column: str) -> float:
    if column not in record or record[column] is None or record[column] == "":
        raise MetricsFileError(f"{path}: line {line}: missing column {column!r}")
    value = record[column]
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise MetricsFileError(f"{path}: line {line}: column {column!r} has non-numeric value {value!r}") from None
    if not math.isfinite(number):
        raise MetricsFileError(f"{path}: line {line}: column {column!r} has non-finite value {value!r}")
    return number


def read_metrics(path: Path, columns: Columns) -> list[Row]:
    """Parse every row of a metrics file; raises MetricsFileError naming the file and line."""
    if path.suffix.lower() not in (".csv", ".jsonl", ".json"):
        raise MetricsFileError(f"{path}: expected a .csv or .jsonl file, found suffix {path.suffix!r}")
    rows = []
    try:
        for line, record in _records(path):
            if columns.run not in record or record[columns.run] in (None, ""):
                raise MetricsFileError(f"{path}: line {line}: missing column {columns.run!r}")
            rows.append(Row(
                run=str(record[columns.run]),
                step=_number(path, line, record, columns.step),
                length=_number(path, line, record, columns.length),
                loss=_number(path, line, record, columns.loss),
                time=_number(path, line, record, columns.time),
                where=f"line {line}",
            ))
    except OSError as error:
        raise MetricsFileError(f"{path}: cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise MetricsFileError(f"{path}: not UTF-8 text: {error.reason}") from None
    if not rows:
        raise MetricsFileError(f"{path}: expected at least one row, found none")
    return rows


def run_lengths(spec: Any) -> set[int] | None:
    """The sequence lengths run `spec` (a RunSpec) ever assigns: data.seq_len, the fixed schedule's, the
    per-worker ones and the adaptive ladder; None when a diagnostic task sets its own lengths."""
    if spec.data.source == "diag":
        return None
    curriculum = spec.curriculum
    schedule = (row[1] for row in curriculum.schedule)
    return {spec.data.seq_len, *schedule, *curriculum.worker_seq_lens, *curriculum.seq_lens}


def stray_note(run_id: str, database: Path, strays: Sequence[tuple[str, int, int]]) -> str:
    """What was skipped of run `run_id`'s metrics table: its (worker, version, seq_len) training rows at lengths
    the run never assigns (pure)."""
    lengths = ", ".join(str(length) for length in sorted({length for _, _, length in strays}))
    workers = ", ".join(sorted({worker for worker, _, _ in strays}))
    versions = sorted({version for _, version, _ in strays})
    span = f"version {versions[0]}" if len(versions) == 1 else f"versions {versions[0]}–{versions[-1]}"
    return (f"run {run_id!r} ({database}, table metrics): skipped {len(strays)} training rows at seq_len {lengths}, "
            f"a length this run never assigns (worker {workers}, {span}): trained for another run, left out")


def read_state_dirs(path: Path, skipped: list[str] | None = None) -> list[Row]:
    """Rows from every coordinator state dir (state.sqlite) below `path`, e.g. a `rcswarm run` directory.

    A row's step is the run's own (`run_steps`): the steps its rounds trained before its version
    plus its step within the round; its time counts from the run's first metric, on the
    coordinator's clock. Rows at a length the run never assigns (`run_lengths`) were trained for another
    run: they are left out, and `skipped` gets one line per run naming them (`stray_note`).
    """
    from rcswarm.config.runspec import RunSpec
    from rcswarm.state.errors import StoreError
    from rcswarm.state.store import StateStore

    databases = sorted(path.rglob("state.sqlite"))
    if not databases:
        raise MetricsFileError(f"{path}: no state.sqlite below this directory")
    rows = []
    for database in databases:
        try:
            store = StateStore.open_read_only(database.parent)
        except StoreError as error:
            raise MetricsFileError(str(error)) from None
        try:
            identity = store.run_identity()
            if identity is None:
                raise MetricsFileError(f"{database}: not a coordinator state (no spec_json or run_id)")
            run_id, spec_json = identity
            spec = RunSpec.from_json(spec_json)
            steps, lengths = run_steps(store, spec.inner.steps), run_lengths(spec)
            strays = []
            for number, (worker, version, k, seq_len, loss, t) in enumerate(store.training_rows(), start=1):
                if lengths is not None and seq_len not in lengths:
                    strays.append((worker, version, seq_len))
                    continue
                where = f"{database} table metrics, training row {number} (worker {worker}, version {version})"
                rows.append(Row(run=run_id, step=float(steps.run_step(version, k)), length=float(seq_len),
                                loss=float(loss), time=float(t), where=where))
            if strays and skipped is not None:
                skipped.append(stray_note(run_id, database, strays))
        except StoreError as error:
            raise MetricsFileError(str(error)) from None
        finally:
            store.close()
    if not rows:
        raise MetricsFileError(f"{path}: the state dirs below it hold no training metrics")
    return rows


def length_curves(path: Path, rows: Sequence[Row]) -> list[LengthCurve]:
    """Group rows by sequence length (a run must keep one), averaging loss and time per step."""
    run_length: dict[str, Row] = {}
    for row in rows:
        first = run_length.setdefault(row.run, row)
        if first.length != row.length:
            raise MetricsFileError(
                f"{path}: {row.where}: run {row.run!r} has length {row.length:g}, "
                f"expected {first.length:g} as at {first.where}"
            )
        if row.loss <= 0:
            raise MetricsFileError(f"{path}: {row.where}: loss {row.loss!r}: expected a positive value")
    curves = []
    for length in sorted({row.length for row in rows}):
        chosen = [row for row in rows if row.length == length]
        steps = np.array([row.step for row in chosen])
        unique, inverse = np.unique(steps, return_inverse=True)
        counts = np.bincount(inverse)
        losses = np.bincount(inverse, weights=[row.loss for row in chosen]) / counts
        times = np.bincount(inverse, weights=[row.time for row in chosen]) / counts
        if len(unique) < 2:
            raise ValueError(f"length {length:g}: expected at least 2 distinct steps, found {len(unique)}")
        curves.append(LengthCurve(
            length=length, runs=tuple(sorted({row.run for row in chosen})), steps=unique, losses=losses,
            times=times, seconds_per_step=seconds_per_step(unique, times),
        ))
    return curves


def analyse(curves: Sequence[LengthCurve], smooth: int = DEFAULT_SMOOTH_STEPS) -> Analysis:
    """Power law at matched steps, the α(s) schedule, and neighbouring-length crossovers.

    Crossovers are observed on the losses smoothed over `smooth` steps (see `smooth_losses`).
    """
    points = fit_alpha_over_steps({curve.length: (curve.steps, curve.losses) for curve in curves})
    schedule = fit_alpha_schedule([p.step for p in points], [p.alpha for p in points])
    log_amplitude = amplitude_from_points(points)
    crossovers = []
    for short, long in pairwise(curves):
        crossovers.append(PairCrossover(
            length_short=short.length, length_long=long.length,
            observed=observed_crossover(short.times, smooth_losses(short.losses, smooth),
                                        long.times, smooth_losses(long.losses, smooth)),
            predicted=predicted_crossover(
                schedule, short.length, short.seconds_per_step, long.length, long.seconds_per_step,
                log_amplitude=log_amplitude,
            ),
        ))
    return Analysis(curves=list(curves), points=points, schedule=schedule, crossovers=crossovers, smooth=smooth)


class Clock(enum.Enum):
    """Whose step counter and clock place a live run's metric on its length's curve."""

    WORKER = "worker"  # each worker's own step and wall_time: valid while workers never move between runs
    RUN = "run"  # the run's own step (`run_steps`), coordinator seconds since its first metric


def run_steps(store: Any, inner_steps: int) -> RunSteps:
    """The run step of the run a store holds: its `inner_steps` and the steps each closed round recorded
    (`StateStore.round_steps`); a round that recorded none counts `inner_steps` (config/run_step.py)."""
    counter = RunSteps(inner_steps)  # ValueError for a bad inner_steps before the store is read
    return replace(counter, recorded=store.round_steps())


def run_step_means(store: Any, inner_steps: int) -> list[StepMean]:
    """(seq_len, run step, mean loss, mean seconds since the run's first training row) on the run's own clock,
    from the store's sums per (seq_len, version, step within the round); sums that land on one run step
    are averaged together."""
    steps = run_steps(store, inner_steps)
    sums = store.run_step_sums()
    if sums.first_received is None:
        return []
    merged: dict[tuple[int, int], list[float]] = {}
    for length, version, k, loss_sum, seconds_sum, n in sums.rows:
        total = merged.setdefault((length, steps.run_step(version, k)), [0.0, 0.0, 0])
        total[0] += loss_sum
        total[1] += seconds_sum
        total[2] += n
    return [(float(length), float(step), loss / n, seconds / n - sums.first_received)
            for (length, step), (loss, seconds, n) in sorted(merged.items())]


def step_means(store: Any, clock: Clock, run_id: str, inner_steps: int) -> list[StepMean]:
    """One run's (seq_len, step, mean loss, mean seconds) from its store's reads, on `clock`."""
    if clock is Clock.RUN:
        return run_step_means(store, inner_steps)
    return [
        (float(length), float(step), float(loss), float(wall))
        for length, step, loss, wall in store.worker_step_means(run_id)
        if loss is not None and wall is not None
    ]


@dataclass(frozen=True)
class FitReport:
    """The curves per seq_len and, when at least 3 lengths allow it, the fitted schedule."""

    curves: list[LengthCurve]
    analysis: Analysis | None
    message: str  # why there is no fit ("" when there is one)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "lengths": [c.length for c in self.curves],
            "fit": None,
            "message": self.message,
        }
        if self.analysis is not None:
            s = self.analysis.schedule
            out["fit"] = {
                "alpha_inf": s.alpha_inf, "tau": s.tau, "r_squared": s.r_squared,
                "per_doubling": s.per_doubling,
                "points": [{"step": p.step, "alpha": p.alpha, "amplitude": p.amplitude, "r_squared": p.r_squared}
                           for p in self.analysis.points],
                "crossovers": [
                    {"length_short": c.length_short, "length_long": c.length_long, "observed_s": c.observed,
                     "predicted_s": None if c.predicted is None else c.predicted.time,
                     "predicted_step_short": None if c.predicted is None else c.predicted.step_short,
                     "predicted_step_long": None if c.predicted is None else c.predicted.step_long}
                    for c in self.analysis.crossovers
                ],
            }
        return out


def _merge_step_means(rows: Iterable[Sequence[Any]]) -> dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """length -> (steps, losses, seconds) sorted by step; rows of several runs at one (seq_len, step) are averaged."""
    values = np.array([row[:4] for row in rows if row[2] is not None and row[3] is not None],
                      dtype=np.float64).reshape(-1, 4)  # [n, 4]: seq_len, step, loss, seconds
    values = values[np.isfinite(values[:, 2]) & np.isfinite(values[:, 3])]
    pairs, inverse = np.unique(values[:, :2], axis=0, return_inverse=True)  # [m, 2] sorted by (seq_len, step); [n]
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(pairs))  # [m]
    losses = np.bincount(inverse, weights=values[:, 2], minlength=len(pairs)) / np.maximum(counts, 1)  # [m]
    seconds = np.bincount(inverse, weights=values[:, 3], minlength=len(pairs)) / np.maximum(counts, 1)  # [m]
    by_length = {}
    for length in np.unique(pairs[:, 0]):
        chosen = pairs[:, 0] == length  # [m]
        by_length[float(length)] = (pairs[chosen, 1], losses[chosen], seconds[chosen])
    return by_length


def fit_step_means(rows: Iterable[Sequence[Any]]) -> FitReport:
    """Curves per seq_len from (seq_len, step, mean loss, mean seconds) rows, and the fit when possible.

    Rows from several runs may repeat a (seq_len, step): those are averaged.
    """
    curves, skipped = [], []
    for length, (steps, losses, times) in _merge_step_means(rows).items():
        try:
            rate = seconds_per_step(steps, times)
        except ValueError:
            if len(steps) < 2:
                skipped.append(f"L={length:g} has fewer than 2 steps")
                continue
            rate = math.nan
        curves.append(LengthCurve(length=length, runs=(), steps=steps, losses=losses, times=times, seconds_per_step=rate))
    lengths = len(curves)
    if lengths < 3:
        note = f" ({'; '.join(skipped)})" if skipped else ""
        return FitReport(curves, None, f"not enough lengths for a fit: {lengths} distinct seq_len with 2+ steps, "
                                       f"need at least 3{note}")
    # The crossovers need each length's measured seconds per step: lengths without one are left out.
    curves_for_fit = [c for c in curves if c.seconds_per_step > 0]
    if len(curves_for_fit) < 3:
        return FitReport(curves, None, "not enough lengths for a fit: wall time does not increase with step "
                                       f"for {lengths - len(curves_for_fit)} of {lengths} lengths")
    try:
        analysis = analyse(curves_for_fit)
    except ValueError as error:
        return FitReport(curves, None, f"no fit: {error}")
    return FitReport(curves, analysis, "")


@dataclass(frozen=True)
class WorkerTotals:
    worker_id: str
    tokens: int
    bytes_sent: int
    bytes_received: int
    tokens_per_second: float
    last_step: int
    last_seq_len: int
    last_loss: float
    rows: int


def worker_totals(rows: Iterable[Any]) -> dict[str, WorkerTotals]:
    """Per worker, from the store's `worker_rows`: tokens, bytes, tokens per second of its wall time, its newest row."""
    out = {}
    for row in rows:
        span = row.last_wall_time - row.first_wall_time
        out[row.worker_id] = WorkerTotals(
            worker_id=row.worker_id, tokens=row.tokens, bytes_sent=row.bytes_sent, bytes_received=row.bytes_received,
            tokens_per_second=row.tokens / span if span > 0 else 0.0, last_step=row.last_step,
            last_seq_len=row.last_seq_len, last_loss=float(row.last_loss) if row.last_loss is not None else math.nan,
            rows=row.rows,
        )
    return out
