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

An analysis says whether its data identify the fit: `Analysis.caveats` (empty when they do;
`valid`) joins the data's own rule (every length needs MIN_STEPS_PER_LENGTH recorded steps in
the common step range) to the schedule's (`AlphaScheduleFit.caveats`), each naming the
parameters it leaves unidentified; whoever shows the fit shows "not enough data" and the caveats
in place of those parameters (`fit_rows`), and predicted crossovers only for a fit with none.
An observed crossover counts only under CROSSOVER_RULE: after both curves have left their initial
plateau and the first tenth of the time, and beyond the noise of their gap
(`fits.observed_crossover`); `PairCrossover` says why there is none. `LengthLaw` is
loss ≈ A·L^(−α) across lengths at one point: the held-out losses at the end of a launch
(`held_out_law`, from its summary.json) or the training losses at the last matched step
(`law_at_last_step`).

A live run's curves come from its store's named reads (`step_means`) on the run's own step and the
time since its first metric on the coordinator's clock (`Clock.RUN`), counting only the time the run was served
(`served_clock`: the periods the end-of-run summary counts, observe/report.py `served_periods`, so a resumed run's
time between launches is left out of its curves and fits as of its wall time), a single run's as a sweep's: a
worker that moves between runs keeps its counters, and one that restarts or joins late counts from
step 1 again (`Clock.WORKER`, each worker's own step and wall time, is kept for reading those
counters but no view uses it, see `views.presentation`). The run step is
owned here: `run_steps(store, inner_steps)` is the run's counter (config/run_step.py `RunSteps`)
with the steps each closed round recorded, so a row trained from version v at step k within its
round is at Σ_{u<v} steps_u + k + 1, for time-boxed and adaptive rounds too; state dirs read with
`read_state_dirs` (`rcswarm fit RUN_DIR`), the dashboard's curves and the coordinator's fixed
curriculum schedule all count with it. `fit_step_means` turns such rows into curves and a fit
when at least 3 lengths allow one (a length with a single recorded step is left out and named, in every fit:
`fittable_lengths`); `worker_totals` the per-worker reads into totals. This module
holds no SQL: it takes rows and the store's reads.

A fit's work is numpy per length and at most MAX_LENGTHS lengths are fitted, those with the most
recorded steps (`select_lengths`; `Analysis.notes` names the others, and lengths without a measured
seconds per step), so a worker that reports rows at hundreds of lengths cannot make a fit slow. Rows
read from files and state dirs are held column by column (`MetricRows`); a file with a `tokens`
column (the metrics table exported) gives only its training rows (`is_training_row`, the rule of
state/schema.py TRAINING_FILTER), naming how many others it left out.
"""

from __future__ import annotations

import csv
import enum
import json
import math
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rcswarm.config.run_step import RunSteps
from rcswarm.observe.fits import (
    EARLY_FRACTION,
    NOISE_SIGMAS,
    PLATEAU_DROP,
    SCHEDULE_PARAMETERS,
    AlphaPoint,
    AlphaScheduleFit,
    Caveat,
    Crossover,
    PowerLawFit,
    amplitude_from_points,
    counting_start,
    fit_alpha_over_steps,
    fit_alpha_schedule,
    fit_power_law,
    gap_noise,
    observed_crossover,
    plateau_end,
    predicted_crossover,
    seconds_per_step,
    shown,
    smooth_losses,
)
from rcswarm.observe.forecast import MAX_LOSS

DEFAULT_SMOOTH_STEPS = 25
# A fit needs at least this many recorded steps of every length inside the steps all lengths share
# (a DiLoCo round of 10 inner steps records 10): fewer are a handful of rounds, not a curve.
MIN_STEPS_PER_LENGTH = 100
NOT_ENOUGH_DATA = "not enough data"
# A fit takes at most this many lengths, those with the most recorded steps (`select_lengths`): its work grows
# with the lengths (a crossover per neighbouring pair), and a worker that reports rows at many lengths must not
# make every fit of the run slow. A sweep or a curriculum trains a handful.
MAX_LENGTHS = 32
# A length's curve needs this many recorded steps to be fitted (a pace, a step range): one with fewer is left out of
# a fit and named (`fittable_lengths`).
MIN_CURVE_STEPS = 2
# A metrics file's column that, where a file has it (the coordinator's metrics table exported), tells training
# rows from the others (`is_training_row`).
TOKENS_COLUMN = "tokens"

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


@dataclass(frozen=True, eq=False)
class MetricRows(Sequence[Row]):
    """Metric rows held column by column, as `read_metrics` and `read_state_dirs` return them: no Python object
    per row. `run` indexes `names`; the other columns are float64, [n] each. `locate(i)` says where row i was read,
    built only when asked (an error names the row); indexing gives a `Row`."""

    names: tuple[str, ...]
    run: np.ndarray
    step: np.ndarray
    length: np.ndarray
    loss: np.ndarray
    time: np.ndarray
    locate: Callable[[int], str] = field(repr=False)

    def __len__(self) -> int:
        return len(self.step)

    def __getitem__(self, index: int) -> Row:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]  # type: ignore[return-value]
        i = range(len(self))[index]
        return Row(run=self.names[int(self.run[i])], step=float(self.step[i]), length=float(self.length[i]),
                   loss=float(self.loss[i]), time=float(self.time[i]), where=self.locate(i))

    @classmethod
    def of(cls, rows: Sequence[Row]) -> MetricRows:
        """The columns of `rows` (Row objects)."""
        names: dict[str, int] = {}
        run = np.array([names.setdefault(row.run, len(names)) for row in rows], dtype=np.int64)
        columns = [np.array([getattr(row, name) for row in rows], dtype=np.float64)
                   for name in ("step", "length", "loss", "time")]
        return cls(tuple(names), run, *columns, locate=lambda i: rows[i].where)


class _Gathered:
    """Metric rows as they are read, gathered into flat arrays; `rows` makes them a `MetricRows`."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.run = array("q")
        self.columns = [array("d") for _ in range(4)]  # step, length, loss, time

    def add(self, run: str, step: float, length: float, loss: float, time: float) -> None:
        self.run.append(self.names.setdefault(run, len(self.names)))
        for column, value in zip(self.columns, (step, length, loss, time)):
            column.append(value)

    def rows(self, locate: Callable[[int], str]) -> MetricRows:
        return MetricRows(tuple(self.names), np.frombuffer(self.run, dtype=np.int64),
                          *(np.frombuffer(column, dtype=np.float64) for column in self.columns), locate=locate)


def is_training_row(tokens: float | None, loss: float | None) -> bool:
    """A training row: tokens > 0 and a loss (None or NaN is none). The Python form of state/schema.py's
    TRAINING_FILTER ("tokens > 0 AND loss IS NOT NULL", SQLite storing a NaN as NULL), which selects the rows
    `read_state_dirs` reads; `read_metrics` applies it to an exported metrics table's rows (a round's pull row
    has no loss and 0 tokens). tests/observe pins the two to one rule."""
    return tokens is not None and tokens > 0 and loss is not None and not math.isnan(loss)


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
    """A pair of neighbouring lengths: the observed crossover (None with `observed_note` saying why: see
    `fits.observed_crossover`, counted from `counted_from`, the end of both curves' initial plateau) and the
    one Eq. 11 predicts from the fit (`predicted_note`: "" or that it lies beyond the recorded time)."""

    length_short: float
    length_long: float
    observed: float | None
    predicted: Crossover | None
    observed_note: str = ""
    predicted_note: str = ""
    counted_from: float | None = None


@dataclass(frozen=True)
class Analysis:
    curves: list[LengthCurve]
    points: list[AlphaPoint]
    schedule: AlphaScheduleFit
    crossovers: list[PairCrossover]
    smooth: int
    caveats: tuple[Caveat, ...] = ()
    # Lengths the data had and the fit left out, and why (`select_lengths`; no measured seconds per step).
    notes: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        """True when the data identify the fit: no caveats."""
        return not self.caveats

    def identified(self, parameter: str) -> bool:
        """True when no caveat leaves `parameter` (of SCHEDULE_PARAMETERS) unidentified."""
        return not any(parameter in caveat.parameters for caveat in self.caveats)


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each row of a CSV (header on line 1) or JSON-lines file."""
    # utf-8-sig: a CSV saved by Excel starts with a byte order mark, which would else prefix the first column's name.
    with path.open(newline="", encoding="utf-8-sig") as handle:
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


def _optional_number(path: Path, line: int, record: dict[str, Any], column: str) -> float | None:
    """A column's number, NaN allowed; None where it is missing or empty (NULL)."""
    if record.get(column) is None or record[column] == "":
        return None
    value = record[column]
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise MetricsFileError(f"{path}: line {line}: column {column!r} has non-numeric value {value!r}") from None


def _training_record(path: Path, line: int, record: dict[str, Any], columns: Columns) -> bool:
    """Whether a record is a training row: in a file with a `tokens` column (the metrics table exported), by
    `is_training_row`; without one, every row is."""
    if TOKENS_COLUMN not in record:
        return True
    return is_training_row(_optional_number(path, line, record, TOKENS_COLUMN),
                           _optional_number(path, line, record, columns.loss))


def read_metrics(path: Path, columns: Columns, skipped: list[str] | None = None) -> MetricRows:
    """Parse every training row of a metrics file; raises MetricsFileError naming the file and line. In a file
    with a `tokens` column rows that are not training rows (`is_training_row`: tokens 0 or no loss) are left out,
    and `skipped` gets a line saying how many and which."""
    if path.suffix.lower() not in (".csv", ".jsonl", ".json"):
        raise MetricsFileError(f"{path}: expected a .csv or .jsonl file, found suffix {path.suffix!r}")
    gathered, lines, other = _Gathered(), array("q"), array("q")
    try:
        for line, record in _records(path):
            if not _training_record(path, line, record, columns):
                other.append(line)
                continue
            if columns.run not in record or record[columns.run] in (None, ""):
                raise MetricsFileError(f"{path}: line {line}: missing column {columns.run!r}")
            gathered.add(str(record[columns.run]), _number(path, line, record, columns.step),
                         _number(path, line, record, columns.length), _number(path, line, record, columns.loss),
                         _number(path, line, record, columns.time))
            lines.append(line)
    except OSError as error:
        raise MetricsFileError(f"{path}: cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise MetricsFileError(f"{path}: not UTF-8 text: {error.reason}") from None
    if other and skipped is not None:
        skipped.append(f"{path}: skipped {len(other)} rows that are not training rows ({TOKENS_COLUMN} 0 or no "
                       f"{columns.loss!r}, as a state dir's training rows are chosen: e.g. a round's pull row) "
                       f"at lines {shown(other)}")
    if not lines:
        found = f"none, and {len(other)} rows that are not" if other else "none"
        raise MetricsFileError(f"{path}: expected at least one training row, found {found}")
    return gathered.rows(lambda i: f"line {lines[i]}")


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


def garbage_note(run_id: str, database: Path, losses: np.ndarray) -> str:
    """What was skipped of run `run_id`'s metrics table: its training rows with a loss above MAX_LOSS (`losses`,
    [n]), stored before the coordinator refused them (pure)."""
    return (f"run {run_id!r} ({database}, table metrics): skipped {len(losses)} training rows with a loss above "
            f"{MAX_LOSS:g} (largest {float(losses.max()):g}): garbage metrics, left out as the forecasts leave "
            "them out")


def read_state_dirs(path: Path, skipped: list[str] | None = None) -> MetricRows:
    """Rows from every coordinator state dir (state.sqlite) below `path`, e.g. a `rcswarm run` directory.

    A row's step is the run's own (`run_steps`): the steps its rounds trained before its version
    plus its step within the round; its time counts the seconds the run was served since its first training row,
    on the coordinator's clock (`served_clock`: a resumed run's time between launches is left out). Rows at a
    length the run never assigns (`run_lengths`) were trained for another run: they are left out, and `skipped`
    gets one line per run naming them (`stray_note`). Rows with a loss above MAX_LOSS (garbage metrics, which the
    coordinator now refuses: a state dir may hold some from before) are left out too (`garbage_note`), as the
    forecasts leave them out. The rows are kept column by column (`MetricRows`); where a row was read is spelled
    out only for an error.
    """
    from rcswarm.config.runspec import RunSpec
    from rcswarm.state.errors import StoreError
    from rcswarm.state.store import StateStore

    databases = sorted(path.rglob("state.sqlite"))
    if not databases:
        raise MetricsFileError(f"{path}: no state.sqlite below this directory")
    names: dict[str, int] = {}
    columns: list[list[np.ndarray]] = [[], [], [], [], []]  # run, step, length, loss, time; one array per state dir
    sources: list[tuple[Path, list[str], np.ndarray]] = []  # per state dir: where its kept rows were read
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
            workers, table = _training_columns(store.training_rows())
            start = store.run_clock_start()
            clock = served_clock(store)  # read after the rows: each of them lies in a period it knows
        except StoreError as error:
            raise MetricsFileError(str(error)) from None
        finally:
            store.close()
        assigned = (np.ones(len(table["seq_len"]), dtype=bool) if lengths is None
                    else np.isin(table["seq_len"], sorted(lengths)))
        if not assigned.all() and skipped is not None:
            strays = [(workers[w], int(v), int(n)) for w, v, n in zip(
                table["worker"][~assigned], table["version"][~assigned], table["seq_len"][~assigned])]
            skipped.append(stray_note(run_id, database, strays))
        sane = table["loss"] <= MAX_LOSS  # [n]
        if not sane.all() and skipped is not None:
            skipped.append(garbage_note(run_id, database, table["loss"][~sane]))
        kept = assigned & sane
        table = {name: column[kept] for name, column in table.items()}
        if start is not None:  # t: seconds since the clock's start, the time between launches included
            table["t"] = clock.seconds_since(start, start + table["t"])
        versions, inverse = np.unique(table["version"], return_inverse=True)
        # run_step(v, k) = run_step(v, 0) + k: the counter's rule, asked once per version.
        firsts = np.array([steps.run_step(int(v), 0) for v in versions], dtype=np.float64)
        run = np.full(len(table["k"]), names.setdefault(run_id, len(names)), dtype=np.int64)
        for into, values in zip(columns, (run, firsts[inverse.reshape(-1)] + table["k"], table["seq_len"],
                                          table["loss"], table["t"])):
            into.append(values.astype(np.int64 if into is columns[0] else np.float64))
        sources.append((database, workers, np.stack([table["number"], table["worker"], table["version"]], axis=1)))
    if not sum(len(run) for run in columns[0]):
        raise MetricsFileError(f"{path}: the state dirs below it hold no training metrics")
    starts = np.cumsum([0, *(len(run) for run in columns[0])])  # [dirs + 1]: each state dir's first row

    def locate(i: int) -> str:
        index = int(np.searchsorted(starts, i, side="right")) - 1
        database, workers, where = sources[index]
        number, worker, version = (int(value) for value in where[i - starts[index]])
        return f"{database} table metrics, training row {number} (worker {workers[worker]}, version {version})"

    return MetricRows(tuple(names), *(np.concatenate(parts) for parts in columns), locate=locate)


def _training_columns(rows: Sequence[tuple[Any, ...]]) -> tuple[list[str], dict[str, np.ndarray]]:
    """A store's `training_rows` (worker, version, k, seq_len, loss, t) as columns: the workers' names, and arrays
    of each row's worker (an index into them), version, k, seq_len, loss, t and its number among the rows (from 1)."""
    workers: dict[str, int] = {}
    count = len(rows)
    table = {
        "worker": np.fromiter((workers.setdefault(row[0], len(workers)) for row in rows), np.int64, count),
        "version": np.fromiter((row[1] for row in rows), np.int64, count),
        "k": np.fromiter((row[2] for row in rows), np.float64, count),
        "seq_len": np.fromiter((row[3] for row in rows), np.int64, count),
        "loss": np.fromiter((row[4] for row in rows), np.float64, count),
        "t": np.fromiter((row[5] for row in rows), np.float64, count),
        "number": np.arange(1, count + 1, dtype=np.int64),
    }
    return list(workers), table


def state_dir_lengths(path: Path) -> list[float]:
    """The sequence length each coordinator state dir below `path` trains (its spec's), metrics or not: a
    sweep's lengths, to name those still without data."""
    from rcswarm.config.runspec import RunSpec
    from rcswarm.state.errors import StoreError
    from rcswarm.state.store import StateStore

    lengths = []
    for database in sorted(path.rglob("state.sqlite")):
        try:
            store = StateStore.open_read_only(database.parent)
        except StoreError:
            continue
        try:
            identity = store.run_identity()
            if identity is not None:
                lengths.append(float(RunSpec.from_json(identity[1]).data.seq_len))
        except (StoreError, ValueError):
            continue
        finally:
            store.close()
    return lengths


def length_curves(path: Path, rows: Sequence[Row]) -> list[LengthCurve]:
    """Group rows (a `MetricRows`, or Row objects) by sequence length (a run must keep one), averaging loss and time
    per step (`_merge_step_means`); a length's wall time must increase with step (`fits.seconds_per_step`). A
    length with a single recorded step has no pace yet: its curve has that one point and seconds_per_step NaN,
    and `analyse` leaves it out of the fit, naming it."""
    rows = rows if isinstance(rows, MetricRows) else MetricRows.of(rows)
    if not len(rows):
        return []
    _, first, run_index = np.unique(rows.run, return_index=True, return_inverse=True)
    first_of_row = first[run_index.reshape(-1)]  # [n]: the first row of each row's run
    moved = np.flatnonzero(rows.length != rows.length[first_of_row])
    bad_loss = np.flatnonzero(~(rows.loss > 0))
    if len(moved) and (not len(bad_loss) or moved[0] <= bad_loss[0]):
        i, j = int(moved[0]), int(first_of_row[moved[0]])
        raise MetricsFileError(
            f"{path}: {rows.locate(i)}: run {rows.names[int(rows.run[i])]!r} has length {rows.length[i]:g}, "
            f"expected {rows.length[j]:g} as at {rows.locate(j)}"
        )
    if len(bad_loss):
        i = int(bad_loss[0])
        raise MetricsFileError(f"{path}: {rows.locate(i)}: loss {float(rows.loss[i])!r}: expected a positive value")
    runs_at = np.unique(np.stack([rows.length, rows.run.astype(np.float64)], axis=1), axis=0)  # [m, 2]
    merged = _merge_step_means(np.stack([rows.length, rows.step, rows.loss, rows.time], axis=1))
    curves = []
    for length, (steps, losses, times) in merged.items():
        rate = math.nan  # a single step: no pace (`analyse` leaves the length out)
        if len(steps) >= MIN_CURVE_STEPS:
            try:
                rate = seconds_per_step(steps, times)
            except ValueError as error:
                raise ValueError(f"length {length:g}: {error}") from None
        runs = sorted(rows.names[int(index)] for index in runs_at[runs_at[:, 0] == length, 1])
        curves.append(LengthCurve(length=length, runs=tuple(runs), steps=steps, losses=losses, times=times,
                                  seconds_per_step=rate))
    return curves


def fittable_lengths(curves: Sequence[LengthCurve]) -> tuple[list[LengthCurve], str]:
    """The curves a fit can take: those with at least MIN_CURVE_STEPS recorded steps, in their order, and a note
    naming the lengths left out ("" when none is)."""
    kept = [curve for curve in curves if len(curve.steps) >= MIN_CURVE_STEPS]
    left = sorted(curve.length for curve in curves if len(curve.steps) < MIN_CURVE_STEPS)
    if not left:
        return kept, ""
    return kept, f"L = {shown(left)} left out: fewer than {MIN_CURVE_STEPS} recorded steps, no curve to fit yet"


def select_lengths(curves: Sequence[LengthCurve]) -> tuple[list[LengthCurve], str]:
    """At most MAX_LENGTHS of `curves`: those with the most recorded steps (the shorter length first among equals),
    in length order, and a note naming the lengths left out ("" when none is)."""
    if len(curves) <= MAX_LENGTHS:
        return list(curves), ""
    ranked = sorted(curves, key=lambda curve: (-len(curve.steps), curve.length))
    kept = sorted(ranked[:MAX_LENGTHS], key=lambda curve: curve.length)
    left = sorted(curve.length for curve in ranked[MAX_LENGTHS:])
    return kept, (f"{len(left)} of {len(curves)} lengths left out, L = {shown(left)}: a fit takes at most "
                  f"{MAX_LENGTHS}, those with the most recorded steps")


def data_caveats(curves: Sequence[LengthCurve]) -> list[Caveat]:
    """The data's own rule: each length's recorded steps inside the step range all lengths share, at least
    MIN_STEPS_PER_LENGTH."""
    first = max(float(c.steps[0]) for c in curves)
    last = min(float(c.steps[-1]) for c in curves)
    short = [(c.length, int(np.count_nonzero((c.steps >= first) & (c.steps <= last)))) for c in curves]
    short = [(length, count) for length, count in short if count < MIN_STEPS_PER_LENGTH]
    if not short:
        return []
    counts = ", ".join(f"L={length:g}: {count}" for length, count in short)
    return [Caveat(f"too few recorded steps in the steps all lengths share [{first:g}, {last:g}] ({counts}; "
                   f"{MIN_STEPS_PER_LENGTH} needed)", SCHEDULE_PARAMETERS)]


def pair_crossover(short: LengthCurve, long: LengthCurve, smooth: int, predicted: Crossover | None) -> PairCrossover:
    """The observed crossover of two neighbouring lengths under the crossover rule (`fits.plateau_end`,
    `fits.counting_start`, `fits.gap_noise`) on losses smoothed over `smooth` steps, beside the predicted one."""
    smoothed_short, smoothed_long = smooth_losses(short.losses, smooth), smooth_losses(long.losses, smooth)
    ends = {curve.length: plateau_end(curve.times, smoothed)
            for curve, smoothed in ((short, smoothed_short), (long, smoothed_long))}
    first = max(float(short.times[0]), float(long.times[0]))
    recorded = min(float(short.times[-1]), float(long.times[-1]))
    predicted_note = ("" if predicted is None or predicted.time <= recorded
                      else f"beyond the {recorded:.3g} s recorded")
    waiting = [length for length, end in ends.items() if end is None]
    if waiting:
        note = (f"L={', '.join(f'{length:g}' for length in waiting)} has not left its initial plateau "
                f"(not yet {PLATEAU_DROP:.0%} below its start)")
        return PairCrossover(short.length, long.length, None, predicted, note, predicted_note)
    counted_from = counting_start([end for end in ends.values() if end is not None], first, recorded)
    observed = observed_crossover(short.times, smoothed_short, long.times, smoothed_long, counted_from=counted_from,
                                  noise=gap_noise(short.losses, long.losses, smooth))
    return PairCrossover(short.length, long.length, observed.time, predicted, observed.note, predicted_note,
                         counted_from)


def analyse(curves: Sequence[LengthCurve], smooth: int = DEFAULT_SMOOTH_STEPS) -> Analysis:
    """Power law at matched steps, the α(s) schedule, neighbouring-length crossovers, and the caveats.

    Crossovers are observed on the losses smoothed over `smooth` steps (see `smooth_losses`) under
    the crossover rule (`pair_crossover`). Lengths with fewer than MIN_CURVE_STEPS recorded steps are left out
    (`fittable_lengths`); of more than MAX_LENGTHS lengths those with the most recorded steps are fitted
    (`select_lengths`); `notes` names the lengths left out. ValueError when fewer than 3 lengths remain (naming
    those left out, if any).
    """
    curves, short = fittable_lengths(curves)
    if short and len(curves) < 3:
        raise ValueError(f"runs with lengths {shown([curve.length for curve in curves])}: expected at least 3 distinct "
                         f"lengths ({short})")
    curves, capped = select_lengths(curves)
    points = fit_alpha_over_steps({curve.length: (curve.steps, curve.losses) for curve in curves})
    schedule = fit_alpha_schedule([p.step for p in points], [p.alpha for p in points])
    log_amplitude = amplitude_from_points(points)
    crossovers = [
        pair_crossover(short, long, smooth, predicted_crossover(
            schedule, short.length, short.seconds_per_step, long.length, long.seconds_per_step,
            log_amplitude=log_amplitude,
        ))
        for short, long in pairwise(curves)
    ]
    caveats = (*data_caveats(curves), *schedule.caveats())
    return Analysis(curves=list(curves), points=points, schedule=schedule, crossovers=crossovers, smooth=smooth,
                    caveats=caveats, notes=tuple(note for note in (short, capped) if note))


@dataclass(frozen=True)
class LengthLaw:
    """loss ≈ A·L^(−α) across the lengths at one point of training: `what` the losses are, and the fit."""

    what: str
    lengths: tuple[float, ...]
    losses: tuple[float, ...]
    fit: PowerLawFit


def length_law(what: str, lengths: Sequence[float], losses: Sequence[float]) -> LengthLaw:
    """Fit loss ≈ A·L^(−α) to one loss per length (ValueError with fewer than 3 lengths)."""
    return LengthLaw(what, tuple(map(float, lengths)), tuple(map(float, losses)), fit_power_law(lengths, losses))


def held_out_law(run_dir: Path, skipped: list[str] | None = None) -> LengthLaw | None:
    """The held-out loss of each run's final parameters against L, from a launch's summary.json (`rcswarm run`
    writes it); None without one, or with fewer than 3 trained runs. A trained run whose length or held-out loss is
    a number but not a positive finite one (summary.json edited, or another tool's) is left out: `skipped` gets a
    line naming it, and the law's `what` says how many were."""
    try:
        document = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    runs = document.get("runs") if isinstance(document, dict) else None
    if not isinstance(runs, list):
        return None
    pairs = [(r.get("seq_len"), r.get("val_loss_final")) for r in runs if isinstance(r, dict) and r.get("rounds")]
    pairs = [(length, loss) for length, loss in pairs if _is_number(length) and _is_number(loss)]
    kept = [(float(length), float(loss)) for length, loss in pairs if _positive_finite(length, loss)]
    left_out = [(length, loss) for length, loss in pairs if not _positive_finite(length, loss)]
    if skipped is not None:
        skipped.extend(f"{run_dir / 'summary.json'}: the run at seq_len {length!r} with held-out loss {loss!r} is "
                       "left out of the law across lengths (expected a positive finite length and loss)"
                       for length, loss in left_out)
    if len({length for length, _ in kept}) < 3:
        return None
    what = "held-out loss of the final parameters"
    if left_out:
        what += f" ({len(left_out)} run(s) left out: length or loss not positive and finite)"
    return length_law(what, *zip(*kept))


def _is_number(value: object) -> bool:
    """A JSON number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_finite(*values: float) -> bool:
    """Every value is a number above 0 and no larger than the largest float (NaN is neither; a JSON integer beyond
    that is not, where float() would raise OverflowError)."""
    return all(0 < value <= sys.float_info.max for value in values)


def law_at_last_step(analysis: Analysis) -> LengthLaw:
    """Each length's training loss (smoothed over the analysis's `smooth` steps) at the last matched step."""
    step = analysis.points[-1].step
    losses = [math.exp(float(np.interp(step, c.steps, np.log(smooth_losses(c.losses, analysis.smooth)))))
              for c in analysis.curves]
    return length_law(f"training loss at step {step:.0f} ({analysis.smooth}-step mean)",
                      [c.length for c in analysis.curves], losses)


class Clock(enum.Enum):
    """Whose step counter and clock place a live run's metric on its length's curve."""

    # Each worker's own step and wall_time: valid only while no worker moves, restarts or joins late (its counters
    # start over); no view uses it (`views.presentation`).
    WORKER = "worker"
    RUN = "run"  # the run's own step (`run_steps`), coordinator seconds served since its first metric (`served_clock`)


def run_steps(store: Any, inner_steps: int) -> RunSteps:
    """The run step of the run a store holds: its `inner_steps` and the steps each closed round recorded
    (`StateStore.round_steps`); a round that recorded none counts `inner_steps` (config/run_step.py)."""
    counter = RunSteps(inner_steps)  # ValueError for a bad inner_steps before the store is read
    return replace(counter, recorded=store.round_steps())


@dataclass(frozen=True)
class ServedClock:
    """The run's clock with the time it was not served left out: the periods observe/report.py `served_periods`
    finds (one per launch of a resumed run, or a time without workers), the summary's wall time, laid end to end.
    A time inside a gap between two periods counts as the end of the period before it; the newest period has no
    end (rows may still arrive after it was read). Without periods (a store without the aggregates' reads) every
    second counts, as before resumes were known."""

    starts: np.ndarray  # [p]: each period's start on the coordinator's clock, oldest first
    ends: np.ndarray  # [p]: each period's end (its last metric row); the newest +inf
    served_before: np.ndarray  # [p]: the seconds served in the periods before each one

    @classmethod
    def of(cls, periods: Sequence[tuple[float, float]]) -> ServedClock:
        """The clock of `periods`, (start, end) each, oldest first and disjoint (`served_periods`'s; ValueError
        for periods out of order)."""
        bounds = np.array(periods, dtype=np.float64).reshape(-1, 2)  # [p, 2]: start, end
        if np.any(bounds[:, 1] < bounds[:, 0]) or np.any(bounds[1:, 0] < bounds[:-1, 1]):
            raise ValueError(f"served periods {list(periods)}: expected disjoint (start, end) pairs, oldest first")
        lengths = bounds[:, 1] - bounds[:, 0]  # [p]
        ends = bounds[:, 1].copy()
        ends[-1:] = np.inf
        return cls(bounds[:, 0].copy(), ends, np.concatenate([[0.0], np.cumsum(lengths[:-1])]))

    def served(self, times: np.ndarray) -> np.ndarray:
        """The seconds served from the first period's start to each of `times` ([n], the coordinator's clock); a
        time before it counts back from it, and without periods every second counts from 0."""
        times = np.asarray(times, dtype=np.float64)
        if not len(self.starts):
            return times.copy()
        period = np.maximum(np.searchsorted(self.starts, times, side="right") - 1, 0)  # [n]
        return self.served_before[period] + np.minimum(times, self.ends[period]) - self.starts[period]

    def seconds_since(self, start: float, times: np.ndarray) -> np.ndarray:
        """The seconds served from `start` to each of `times` ([n], the coordinator's clock): the run clock's
        seconds of rows received at `times`, the clock starting at `start` (the run's first training row)."""
        return self.served(times) - float(self.served(np.array([start]))[0])


class _RoundTimes(NamedTuple):
    """A round as `served_periods` reads one (`report.RoundSpan`), without building the whole record of each of a
    long run's tens of thousands of rounds."""

    opened_at: float | None
    closed_at: float | None


def _rounds_outside(rounds: Sequence[tuple[float | None, float | None]],
                    periods: Sequence[tuple[float, float]]) -> list[_RoundTimes]:
    """The rounds of `rounds` ((opened_at, closed_at) each, None where not recorded) that do not lie inside one of
    `periods`, those the memberships alone were served in (`served_periods` without rounds), as `served_periods`
    reads a round. A round that opens and closes inside such a period changes none of the periods `served_periods`
    finds: it lies within its memberships' reach, so whatever it overlaps they overlap, and it opens after the
    period's first row. What rounds add is kept: a launch's first round, opened before any row, and one that bridges
    two memberships. A long run's tens of thousands of rounds become a handful of objects."""
    if not rounds:
        return []
    times = np.array(rounds, dtype=np.float64).reshape(-1, 2)  # [r, 2]: opened_at, closed_at (NaN: None)
    closed = np.where(np.isnan(times[:, 1]), times[:, 0], times[:, 1])  # [r]: a round not closed reaches its opening
    inside = np.zeros(len(times), dtype=bool)  # [r]
    if periods:
        bounds = np.array(periods, dtype=np.float64).reshape(-1, 2)  # [p, 2]: start, end
        period = np.searchsorted(bounds[:, 0], times[:, 0], side="right") - 1  # [r]: the last period started by then
        inside = (period >= 0) & (closed <= bounds[np.maximum(period, 0), 1])  # NaN (no opening) is never inside
    return [_RoundTimes(*rounds[index]) for index in np.flatnonzero(~inside).tolist()]


def served_clock(store: Any) -> ServedClock:
    """The served clock (`ServedClock`) of the run a store holds: observe/report.py `served_periods` over the reads
    the end-of-run summary (`summarize`) takes its periods from, per-worker usage, each worker's first join and the
    rounds' times (of the rounds, those that can change a period: `_rounds_outside`); without periods for a state
    dir whose aggregates predate those reads (ValueError from the store)."""
    from rcswarm.observe.report import first_joins, served_periods  # report loads the store (and torch)

    try:
        usage = store.worker_usage()
    except ValueError:
        return ServedClock.of([])
    joined = first_joins(store)
    rounds = _rounds_outside(store.round_times(), served_periods(usage, joined, []))
    return ServedClock.of(served_periods(usage, joined, rounds))


def run_step_means(store: Any, inner_steps: int) -> list[StepMean]:
    """(seq_len, run step, mean loss, mean seconds) on the run's own clock, from the store's sums per (seq_len,
    version, step within the round); sums that land on one run step are averaged together. The seconds are those
    the run was served since its first training row (`served_clock`): a resumed run's time between launches is
    left out, as the summary's wall time leaves it out. A sum whose rows straddle such a gap (a round trained on
    both sides of a restart) is placed at its mean time, which counts as the end of the period before the gap."""
    steps = run_steps(store, inner_steps)
    sums = store.run_step_sums()
    if sums.first_received is None or not sums.rows:
        return []
    clock = served_clock(store)  # read after the sums: each of their rows lies in a period it knows
    table = np.array(sums.rows, dtype=np.float64).reshape(-1, 6)  # [n, 6]: seq_len, version, k, loss, seconds, n
    versions, inverse = np.unique(table[:, 1].astype(np.int64), return_inverse=True)
    # run_step(v, k) = run_step(v, 0) + k: the counter's rule, asked once per version.
    firsts = np.array([steps.run_step(int(v), 0) for v in versions], dtype=np.float64)
    keys = np.stack([table[:, 0], firsts[inverse.reshape(-1)] + table[:, 2]], axis=1)  # [n, 2]: seq_len, run step
    if _strictly_increasing(keys):  # the usual order of the sums (by seq_len, version, k): one row per run step
        pairs, loss, seconds, n = keys, table[:, 3], table[:, 4], table[:, 5]
    else:
        pairs, where = np.unique(keys, axis=0, return_inverse=True)  # [m, 2] sorted; [n]
        loss, seconds, n = (np.bincount(where.reshape(-1), weights=table[:, c], minlength=len(pairs))
                            for c in (3, 4, 5))
    return list(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), (loss / n).tolist(),
                    clock.seconds_since(sums.first_received, seconds / n).tolist()))


def _strictly_increasing(keys: np.ndarray) -> bool:
    """Whether the rows of [n, 2] `keys` increase strictly in lexicographic order (so they are sorted and distinct)."""
    first, second = keys[1:, 0] - keys[:-1, 0], keys[1:, 1] - keys[:-1, 1]
    return bool(np.all((first > 0) | ((first == 0) & (second > 0))))


def step_means(store: Any, clock: Clock, run_id: str, inner_steps: int) -> list[StepMean]:
    """One run's (seq_len, step, mean loss, mean seconds) from its store's reads, on `clock`."""
    if clock is Clock.RUN:
        return run_step_means(store, inner_steps)
    return [
        (float(length), float(step), float(loss), float(wall))
        for length, step, loss, wall in store.worker_step_means(run_id)
        if loss is not None and wall is not None
    ]


def fit_summary(analysis: Analysis) -> dict[str, Any]:
    """The fit as plain data (the dashboard's JSON, summary.json's `law`). `valid` is False when the data do
    not identify it and `caveats` says why: show "not enough data" then, not the numbers (`fit_rows`)."""
    s = analysis.schedule
    return {
        "valid": analysis.valid, "caveats": [caveat.text for caveat in analysis.caveats],
        "alpha_inf_identified": analysis.identified("alpha_inf"), "tau_identified": analysis.identified("tau"),
        "alpha_inf": s.alpha_inf, "alpha_inf_low": s.alpha_inf_low, "alpha_inf_high": s.alpha_inf_high,
        "tau": s.tau, "tau_low": s.tau_low, "tau_high": s.tau_high, "r_squared": s.r_squared,
        "per_doubling": s.per_doubling, "first_step": s.first_step, "last_step": s.last_step,
        "smooth": analysis.smooth, "notes": list(analysis.notes),
        "points": [{"step": p.step, "alpha": p.alpha, "amplitude": p.amplitude, "r_squared": p.r_squared}
                   for p in analysis.points],
        "crossovers": [
            {"length_short": c.length_short, "length_long": c.length_long, "observed_s": c.observed,
             "observed_note": c.observed_note, "counted_from_s": c.counted_from,
             "predicted_s": None if c.predicted is None else c.predicted.time,
             "predicted_step_short": None if c.predicted is None else c.predicted.step_short,
             "predicted_step_long": None if c.predicted is None else c.predicted.step_long,
             "predicted_note": c.predicted_note}
            for c in analysis.crossovers
        ],
    }


CROSSOVER_RULE = (f"observed on {{smooth}}-step means, counted once both curves are {PLATEAU_DROP:.0%} below their "
                  f"start and after the first {EARLY_FRACTION:.0%} of the common time, and only when the longer L "
                  f"ends below by more than {NOISE_SIGMAS:g}σ of the gap's noise; predicted by Eq. 11 from the fit, "
                  "shown only when the fit has no caveats")


def _interval(value: float, low: float, high: float, spec: str) -> str:
    return f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"


def fit_rows(fit: dict[str, Any]) -> list[tuple[str, str]]:
    """(quantity, text) rows of a `fit_summary`: α∞ and τ with their intervals, R², the improvement per
    doubling, the steps fitted; where a caveat leaves a parameter unidentified "not enough data" stands
    where its number would, the fitted value following in parentheses, marked as such; then the lengths the fit
    left out, if any (`Analysis.notes`)."""
    alpha_inf = _interval(fit["alpha_inf"], fit["alpha_inf_low"], fit["alpha_inf_high"], ".4f")
    tau = _interval(fit["tau"], fit["tau_low"], fit["tau_high"], ".4g")
    doubling = fit["per_doubling"]
    if fit["alpha_inf_identified"]:
        rows = [("α∞ [90% interval]", alpha_inf),
                ("per doubling at α∞", f"×{doubling:.4f} ({1 - doubling:.1%} lower loss)")]
    else:
        rows = [("α∞ [90% interval]", f"{NOT_ENOUGH_DATA} (fitted {alpha_inf})"),
                ("per doubling at α∞", NOT_ENOUGH_DATA)]
    rows.insert(1, ("τ (steps) [90% interval]", tau if fit["tau_identified"] else f"{NOT_ENOUGH_DATA} (fitted {tau})"))
    notes = [("lengths left out", note) for note in fit.get("notes", ())]
    return [*rows, ("R² of α(s) fit", f"{fit['r_squared']:.4f}"),
            ("steps fitted", f"{fit['first_step']:.4g} to {fit['last_step']:.4g}"), *notes]


def crossover_rows(fit: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(pair, observed, predicted) text of each crossover of a `fit_summary`: a time, or why there is none."""
    rows = []
    for c in fit["crossovers"]:
        observed = f"{c['observed_s']:.3g} s" if c["observed_s"] is not None else f"none: {c['observed_note']}"
        if not fit["valid"]:
            predicted = f"{NOT_ENOUGH_DATA} (the fit has caveats)"
        elif c["predicted_s"] is None:
            predicted = "none predicted"
        else:
            note = f"; {c['predicted_note']}" if c["predicted_note"] else ""
            predicted = (f"{c['predicted_s']:.3g} s (steps {c['predicted_step_short']:.0f} / "
                         f"{c['predicted_step_long']:.0f}){note}")
        rows.append((f"{c['length_short']:g} → {c['length_long']:g}", observed, predicted))
    return rows


@dataclass(frozen=True)
class FitReport:
    """The curves per seq_len and, when at least 3 lengths allow it, the fitted schedule."""

    curves: list[LengthCurve]
    analysis: Analysis | None
    message: str  # why there is no fit ("" when there is one)

    def summary(self) -> dict[str, Any]:
        """The lengths with curves, the fit (`fit_summary`, None without one) and the message saying why not."""
        return {"lengths": [c.length for c in self.curves],
                "fit": None if self.analysis is None else fit_summary(self.analysis), "message": self.message}


def _step_mean_table(rows: Iterable[Sequence[Any]]) -> np.ndarray:
    """[n, 4] (seq_len, step, loss, seconds) of the rows that have a loss and seconds."""
    return np.array([row[:4] for row in rows if row[2] is not None and row[3] is not None],
                    dtype=np.float64).reshape(-1, 4)


def _merge_step_means(
    rows: Iterable[Sequence[Any]] | np.ndarray,
) -> dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """length -> (steps, losses, seconds) sorted by step, from (seq_len, step, loss, seconds) rows (or their [n, 4]
    array); rows at one (seq_len, step), of several runs or workers, are averaged."""
    if not isinstance(rows, np.ndarray):
        rows = _step_mean_table(rows)
    values = rows.reshape(-1, 4)  # [n, 4]: seq_len, step, loss, seconds
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


def fit_step_means(rows: Iterable[Sequence[Any]], lengths: Sequence[float] = ()) -> FitReport:
    """Curves per seq_len from (seq_len, step, mean loss, mean seconds) rows, and the fit when possible.

    Rows from several runs may repeat a (seq_len, step): those are averaged. `lengths` are a sweep's
    lengths: without a fit the message then names those that have no curve yet (a sweep still training
    needs time, not a new sweep). Lengths with a single step have no curve (`fittable_lengths`); of more than
    MAX_LENGTHS lengths the curves and the fit keep those with the most recorded steps (`select_lengths`); the
    fit's notes name the lengths left out, as they name those whose wall time does not increase with step. A mean
    loss above MAX_LOSS (a garbage metric stored before the coordinator refused them) is left out, as the forecasts
    leave it out, and the fit's notes count those. A fit the data make impossible (a law beyond a float's range:
    `fits.fit_power_law`) is no fit, its message saying why.
    """
    table = _step_mean_table(rows)  # [n, 4]
    garbage = table[:, 2] > MAX_LOSS  # [n]
    every = []
    for length, (steps, losses, times) in _merge_step_means(table[~garbage]).items():
        try:
            rate = seconds_per_step(steps, times) if len(steps) >= MIN_CURVE_STEPS else math.nan
        except ValueError:
            rate = math.nan
        every.append(LengthCurve(length=length, runs=(), steps=steps, losses=losses, times=times,
                                 seconds_per_step=rate))
    curves, short = fittable_lengths(every)
    single = sorted({curve.length for curve in every} - {curve.length for curve in curves})
    curves, capped = select_lengths(curves)
    count = len(curves)
    if count < 3:
        swept = sorted(set(map(float, lengths)))
        idle = [length for length in swept if length not in {c.length for c in curves}]
        if 0 < len(swept) < 3:
            return FitReport(curves, None, f"not enough lengths for a fit: the sweep trains {len(swept)} "
                                           f"(L = {', '.join(f'{x:g}' for x in swept)}), a fit needs at least 3")
        if idle:
            names = ", ".join(f"{x:g}" for x in idle)
            return FitReport(curves, None, f"{NOT_ENOUGH_DATA} yet: the sweep's L = {names} "
                                           f"{'has' if len(idle) == 1 else 'have'} fewer than 2 steps of metrics, "
                                           "and a fit needs 3 lengths with data")
        note = ""
        if single:
            note = (f" (L={single[0]:g} has fewer than 2 steps)" if len(single) == 1
                    else f" (L = {shown(single)} have fewer than 2 steps)")
        return FitReport(curves, None, f"not enough lengths for a fit: {count} distinct seq_len with 2+ steps, "
                                       f"need at least 3{note}")
    # The crossovers need each length's measured seconds per step: lengths without one are left out, and named.
    curves_for_fit = [c for c in curves if c.seconds_per_step > 0]
    unpaced = [c.length for c in curves if not c.seconds_per_step > 0]
    if len(curves_for_fit) < 3:
        return FitReport(curves, None, "not enough lengths for a fit: wall time does not increase with step "
                                       f"for {len(unpaced)} of {count} lengths (L = {shown(unpaced)})")
    try:
        analysis = analyse(curves_for_fit)
    except ValueError as error:
        return FitReport(curves, None, f"no fit: {error}")
    notes = [note for note in (short, capped) if note]
    if garbage.any():
        notes.append(f"{int(np.count_nonzero(garbage))} step means with a loss above {MAX_LOSS:g} left out (largest "
                     f"{float(table[garbage, 2].max()):g}): garbage metrics, as the forecasts leave them out")
    if unpaced:
        notes.append(f"L = {shown(unpaced)} left out: wall time does not increase with step, so there are no "
                     "seconds per step for the crossovers")
    return FitReport(curves, replace(analysis, notes=(*notes, *analysis.notes)), "")


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
