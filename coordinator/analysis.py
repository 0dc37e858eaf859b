"""Scaling-law analysis of recorded metrics: curves per sequence length, fits and crossovers.

Rows come from a CSV file with a header, from one JSON object per line (the coordinator's
metrics table, exported), or from the state dirs below a run directory. Rows are grouped by
sequence length (each run must keep one length); a length's loss and wall time at a step are
the means over its rows at that step. `analyse` fits the power law loss(L | s) at matched
steps and the schedule α(s) = α∞(1 − e^(−s/τ)), and finds for each pair of neighbouring
lengths the observed and the predicted (Eq. 11) wall-time crossover; observed crossovers use
each length's losses smoothed by a centred moving average over `smooth` steps (1: raw), the
fits the raw losses. `coordinator/fits.py` holds the math; the curriculum, the dashboard and
the `rcswarm fit` and `rcswarm status` commands call this module.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from rcswarm.coordinator.fits import (
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
    run: str
    step: float
    length: float
    loss: float
    time: float
    line: int


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
                line=line,
            ))
    except OSError as error:
        raise MetricsFileError(f"{path}: cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise MetricsFileError(f"{path}: not UTF-8 text: {error.reason}") from None
    if not rows:
        raise MetricsFileError(f"{path}: expected at least one row, found none")
    return rows


STATE_QUERY = """
SELECT worker_id, version, step - MIN(step) OVER (PARTITION BY worker_id, version) AS k,
       seq_len, loss, received_at - MIN(received_at) OVER () AS t
FROM metrics WHERE tokens > 0 AND loss IS NOT NULL ORDER BY received_at
"""


def read_state_dirs(path: Path) -> list[Row]:
    """Rows from every coordinator state dir (state.sqlite) below `path`, e.g. a `rcswarm run` directory.

    A row's step is the run's own: version × inner.steps + the step within the round; its
    time counts from the run's first metric, on the coordinator's clock.
    """
    import sqlite3

    from rcswarm.config.runspec import RunSpec

    databases = sorted(path.rglob("state.sqlite"))
    if not databases:
        raise MetricsFileError(f"{path}: no state.sqlite below this directory")
    rows = []
    for database in databases:
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            spec_json = connection.execute("SELECT value FROM run_state WHERE key = 'spec_json'").fetchone()
            run_id = connection.execute("SELECT value FROM run_state WHERE key = 'run_id'").fetchone()
            if spec_json is None or run_id is None:
                raise MetricsFileError(f"{database}: not a coordinator state (no spec_json or run_id)")
            steps = RunSpec.from_json(spec_json[0]).inner.steps
            for line, (_, version, k, seq_len, loss, t) in enumerate(connection.execute(STATE_QUERY), start=1):
                rows.append(Row(run=run_id[0], step=float(version * steps + k + 1), length=float(seq_len),
                                loss=float(loss), time=float(t), line=line))
        except sqlite3.Error as error:
            raise MetricsFileError(f"{database}: {error}") from None
        finally:
            connection.close()
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
                f"{path}: line {row.line}: run {row.run!r} has length {row.length:g}, "
                f"expected {first.length:g} as on line {first.line}"
            )
        if row.loss <= 0:
            raise MetricsFileError(f"{path}: line {row.line}: loss {row.loss!r}: expected a positive value")
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
