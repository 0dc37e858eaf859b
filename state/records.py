"""What the store's reads and writes carry: a round's record, per-worker aggregates, events, metric rows,
and the sums the run's own step is computed from (state/store.py makes and takes them)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from rcswarm.state.schema import METRIC_COLUMNS


@dataclass(frozen=True)
class ForecastRecord:
    """A forecast made when the run reached `version` (issue #30): the loss at round `at_round` (the budget)
    with its interval, and the seconds from the run's start at which `target_loss` is reached (NaN: no target,
    inf: never); NaN values and a `note` when the rounds did not support one."""

    version: int
    made_at: float
    at_seconds: float
    at_round: int
    loss: float
    low: float
    high: float
    target_loss: float
    target_seconds: float
    target_low_s: float
    target_high_s: float
    note: str
    # What the law was fitted to: "held-out" (the losses measured along the way, [run] eval_every) or "training".
    basis: str = "training"
    # A loss that rises (note NOT_FALLING): its newest level and that level's low end (observe/forecast.NotFalling);
    # NaN otherwise. The sweep prunes such a run on them (coordinator/forecasts.decide_prune).
    level: float = math.nan
    level_low: float = math.nan


@dataclass(frozen=True)
class HeldOutRecord:
    """The held-out loss of θ_`version` measured along the way (issue #30): its `seconds`, who measured it, when;
    as `StateStore.held_out_losses` reads it, the median of `reports` workers' reports (`held_out_median`)."""

    version: int
    loss: float
    seconds: float
    worker_id: str
    recorded_at: float
    reports: int = 1


def held_out_median(reports: Sequence[HeldOutRecord]) -> HeldOutRecord:
    """A version's held-out loss from its workers' reports (one version's, at least one): the median loss (of an
    even count the mean of the middle two), so one wrong report among three moves it no further than the honest
    ones lie apart; the seconds and worker of the middle report (the lower one of an even count), the time of the
    first report (when θ_v was first measured), and the count."""
    ordered = sorted(reports, key=lambda report: (report.loss, report.recorded_at, report.worker_id))
    middle = ordered[(len(ordered) - 1) // 2]
    return replace(middle, loss=statistics.median(report.loss for report in ordered),
                   recorded_at=min(report.recorded_at for report in ordered), reports=len(ordered))


@dataclass(frozen=True)
class WorkerRow:
    """One worker's metric rows of a run, aggregated: totals, wall-time span, and its newest row."""

    worker_id: str
    tokens: int
    bytes_sent: int
    bytes_received: int
    first_wall_time: float
    last_wall_time: float
    rows: int
    last_step: int
    last_seq_len: int
    last_loss: float | None


@dataclass(frozen=True)
class WorkerUsage:
    """One worker's cumulative counters over all its metric rows."""

    worker_id: str
    bytes_sent: int
    bytes_received: int
    sync_seconds: float
    compute_seconds: float
    tokens: int
    first_received_at: float
    last_received_at: float
    # The worker's wall clock (seconds since its trainer started) at its first and last row (issue #29).
    first_wall_time: float = 0.0
    last_wall_time: float = 0.0

    @property
    def utilization(self) -> float:
        """The share of its wall time from its first row (its first pull) to its last spent in inner steps
        (forward, backward, optimizer), NaN without a span; its compute seconds count from its process's start,
        so a membership joined again by a process that trained before reads high (capped at 1)."""
        span = self.last_wall_time - self.first_wall_time
        return min(self.compute_seconds / span, 1.0) if span > 0 else float("nan")


@dataclass(frozen=True)
class RoundsSummary:
    """The closed rounds: how many, the first and last version, the earliest opening time (None: no round), and
    the updates they applied (their reports, together)."""

    count: int
    first_version: int
    last_version: int
    first_opened_at: float | None
    reports: int = 0


@dataclass(frozen=True)
class RoundRecord:
    """One closed round as the `rounds` table records it: from version `version` to version + 1."""

    version: int
    opened_at: float
    closed_at: float
    reports: int
    tokens: int
    close_reason: str
    update_norm: float
    param_sha256: str
    # Updates the aggregation flagged (clipped, or trimmed in most coordinates), updates refused
    # for this round's version (norm or token bound), and what the aggregation did.
    clipped: int = 0
    dropped: int = 0
    aggregation: str = ""
    # The most inner steps among the round's updates trained from its version; 0: not recorded.
    steps: int = 0


class Event(NamedTuple):
    """One row of the `events` table: what happened (kind), to whom (worker_id, "" for the run), why, when."""

    time: float
    worker_id: str
    kind: str
    reason: str


# One metric row as a worker reported it (METRIC_COLUMNS).
MetricRow = NamedTuple("MetricRow", [(name, Any) for name in METRIC_COLUMNS])


@dataclass(frozen=True)
class RunStepSums:
    """Loss and coordinator seconds summed per (seq_len, version, k: the step within the round, from 0), with the
    number of rows each sums, and the coordinator's time of the run's first training row (None: no row yet)."""

    first_received: float | None
    rows: list[tuple[int, int, int, float, float, int]]  # (seq_len, version, k, loss sum, seconds sum, n)
