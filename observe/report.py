"""End-of-run summary of one run, computed from its store's named reads (rounds and per-worker usage).

The train losses are the mean loss of the training steps of the first and of the last closed
round (NaN when no round closed, so nothing pretends a trend); tokens and bytes are totals over
every worker membership (a membership's byte counters count what it moved in this run, cumulative:
worker/worker.py `RunCounters`, so their maxima add up); tokens/s divides the tokens by the wall time
the run was served: from the first round's opening (or first metric) to the last metric of each
period the run was served (`served_periods`), summed. A run launched again on its state dir (a
resume) was served in one period per launch: the time between launches is left out and said
(`resumed`, `idle_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rcswarm.observe import traffic
from rcswarm.state.records import ForecastRecord, WorkerUsage
from rcswarm.state.store import StateStore


def loss_kind(record: ForecastRecord) -> str:
    """What a forecast forecasts (issue #30): "held-out" when the law was fitted to the held-out losses measured along
    the way (`[run] eval_every`), else "train" (the mean training loss of a round's steps)."""
    return "held-out" if record.basis == "held-out" else "train"


@dataclass(frozen=True)
class RunSummary:
    """One run's totals; see the module docstring for what each number is."""

    rounds: int
    workers: int
    first_round_loss: float
    last_round_loss: float
    tokens: int
    tokens_per_second: float
    bytes_sent_per_round: float
    bytes_received_per_round: float
    sync_share: float
    wall_seconds: float
    # Issue #28: the bytes one worker sent per update the rounds applied, and received per pull of a round's step
    # (`traffic.downlink_per_pull`): per worker per round, the steady state. The full pulls of θ (a worker's first,
    # one after a missed round; float32 whatever the codec) are left out of it and counted here: total bytes and pulls.
    bytes_up_per_worker_round: float = 0.0
    bytes_down_per_worker_round: float = 0.0
    full_pull_bytes: int = 0
    full_pulls: int = 0
    # Issue #29: the workers' mean compute utilization (`WorkerUsage.utilization`), NaN without one.
    utilization: float = math.nan
    # The periods the run was served (`served_periods`): 1 for a run served without a break, one per launch for a
    # run resumed on its state dir (`resumed`: more than one; also a run a sweep left without any worker for a while);
    # the seconds between them, which `wall_seconds` and `tokens_per_second` leave out.
    served_periods: int = 0
    resumed: bool = False
    idle_seconds: float = 0.0


def _round_loss(losses: dict[int, float], store: StateStore, version: int) -> float:
    """The mean training loss of the steps trained from `version`: from the aggregates (`round_losses`, kept when
    `coordinator.max_metric_rows` deleted the rows they sum), or from the rows of a state dir older than them."""
    if losses:
        return losses.get(version, math.nan)
    value = store.mean_training_loss(version)
    return math.nan if value is None else value


def _round_losses(store: StateStore) -> dict[int, float]:
    """Every version's mean training loss from the aggregates; empty for a state dir written before them."""
    try:
        return dict(store.round_losses())
    except ValueError:
        return {}


class RoundSpan(Protocol):
    """What `served_periods` reads of a round: when it opened and closed (a `RoundRecord` is one)."""

    @property
    def opened_at(self) -> float | None: ...

    @property
    def closed_at(self) -> float | None: ...


def first_joins(store: StateStore) -> dict[str, float]:
    """Each worker id's first join, on the coordinator's clock (`served_periods`' `joined`)."""
    joined: dict[str, float] = {}
    for event in store.events("join"):
        joined.setdefault(event.worker_id, event.time)
    return joined


def served_periods(usage: list[WorkerUsage], joined: dict[str, float],
                   rounds: Sequence[RoundSpan]) -> list[tuple[float, float]]:
    """The periods the run was served, oldest first, each (start, end) on the coordinator's clock (pure).

    A membership holds the run from its join (`joined`, by worker id; its first metric row without one) to its last
    row, a closed round from its opening to its close: where these overlap the run was served without a break, and a
    launch on the same state dir (a resume) starts a new period, its workers joining after the previous launch's
    last row. A period is measured as the summary measured a whole run before: from its first round's opening or
    its first metric row, whichever came first, to its last metric row; a period without a metric row (rounds only)
    counts nothing."""
    spans = [(min(joined.get(w.worker_id, w.first_received_at), w.first_received_at), w.last_received_at,
              w.first_received_at, w.last_received_at) for w in usage]
    spans += [(r.opened_at, r.closed_at if r.closed_at is not None else r.opened_at, r.opened_at, None)
              for r in rounds if r.opened_at is not None]
    periods: list[list] = []  # [reach start, reach end, start, end (None: no metric row yet)]
    for reach_start, reach_end, start, end in sorted(spans, key=lambda span: span[0]):
        if periods and reach_start <= periods[-1][1]:
            period = periods[-1]
            period[1], period[2] = max(period[1], reach_end), min(period[2], start)
            if end is not None:
                period[3] = end if period[3] is None else max(period[3], end)
        else:
            periods.append([reach_start, reach_end, start, end])
    return [(start, end) for _, _, start, end in periods if end is not None]


def served_note(periods: int, idle_seconds: float) -> str:
    """The summary's line for a run served in several periods (a resume), "" for one."""
    if periods <= 1:
        return ""
    return (f"resumed: served in {periods} periods (one per launch, or a time without workers); the "
            f"{idle_seconds:,.0f} s between them are left out of its wall time and tokens/s")


def summarize(store: StateStore) -> RunSummary:
    """Totals over all workers: each membership's byte counters are cumulative over its rows, so their maxima add up
    to the run's totals; the wall time is the time the run was served (`served_periods`)."""
    rounds = store.rounds_summary()
    per_worker = store.worker_usage()
    tokens = sum(w.tokens for w in per_worker)
    shares = [w.sync_seconds / (w.sync_seconds + w.compute_seconds) for w in per_worker
              if w.sync_seconds + w.compute_seconds > 0]
    periods = served_periods(per_worker, first_joins(store), store.rounds() if rounds.count else [])
    wall = sum(end - start for start, end in periods)
    idle = (periods[-1][1] - periods[0][0]) - wall if periods else 0.0
    utilizations = [w.utilization for w in per_worker if math.isfinite(w.utilization)]
    losses = _round_losses(store) if rounds.count else {}
    full_bytes, full_count = traffic.full_pulls(store.get(traffic.FULL_PULLS_KEY))
    step_bytes, step_count = traffic.step_pulls(store.get(traffic.STEP_PULLS_KEY))
    received = sum(w.bytes_received for w in per_worker)
    return RunSummary(
        rounds=rounds.count,
        workers=len(per_worker),
        first_round_loss=_round_loss(losses, store, rounds.first_version) if rounds.count else math.nan,
        last_round_loss=_round_loss(losses, store, rounds.last_version) if rounds.count else math.nan,
        tokens=tokens,
        tokens_per_second=tokens / wall if wall > 0 else 0.0,
        bytes_sent_per_round=sum(w.bytes_sent for w in per_worker) / max(rounds.count, 1),
        bytes_received_per_round=sum(w.bytes_received for w in per_worker) / max(rounds.count, 1),
        sync_share=sum(shares) / len(shares) if shares else math.nan,
        wall_seconds=wall,
        bytes_up_per_worker_round=sum(w.bytes_sent for w in per_worker) / max(rounds.reports, 1),
        bytes_down_per_worker_round=traffic.downlink_per_pull(step_bytes, step_count, received, full_bytes,
                                                              rounds.reports),
        full_pull_bytes=full_bytes,
        full_pulls=full_count,
        utilization=sum(utilizations) / len(utilizations) if utilizations else math.nan,
        served_periods=len(periods),
        resumed=len(periods) > 1,
        idle_seconds=idle,
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def forecast_rows(store: StateStore) -> list[dict]:
    """The run's forecasts as summary.json lists them (issue #30): when each was made (`at_seconds` from the run's
    first round), the loss forecast for the end of the budget (`predicted_val_loss`, the held-out or the training loss:
    `loss_kind`) with its interval, or the note saying why there was none; non-finite numbers as null."""
    return [
        {"at_seconds": _finite(r.at_seconds), "made_at_version": r.version, "at_round": r.at_round,
         "predicted_val_loss": _finite(r.loss), "low": _finite(r.low), "high": _finite(r.high),
         "loss_kind": loss_kind(r), "target_loss": _finite(r.target_loss),
         "target_seconds": _finite(r.target_seconds), "note": r.note}
        for r in store.forecasts()
    ]


def held_out_rows(store: StateStore) -> list[dict]:
    """The held-out losses measured along the way as summary.json lists them (`val_losses`, issue #30): the version
    whose θ was measured, the loss, the seconds it took, seconds from the run's first round (null before it)."""
    first = store.rounds_summary().first_opened_at
    return [{"version": r.version, "val_loss": r.loss, "seconds": r.seconds,
             "at_seconds": _finite(r.recorded_at - first) if first is not None else None}
            for r in store.held_out_losses()]


def prune_rows(store: StateStore) -> list[dict]:
    """Every pruning decision about the run with its reason, oldest first (issue #30)."""
    return [{"time": event.time, "reason": event.reason} for event in store.events("prune")]
