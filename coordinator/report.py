"""End-of-run summary computed from a run's SQLite store (rounds and metrics tables)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rcswarm.coordinator.store import StateStore


@dataclass(frozen=True)
class RunSummary:
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


def _mean_loss(store: StateStore, version: int) -> float:
    rows = store.query("SELECT AVG(loss) FROM metrics WHERE version = ? AND tokens > 0", (version,))
    value = rows[0][0] if rows else None
    return math.nan if value is None else float(value)


def summarize(store: StateStore) -> RunSummary:
    """Totals over all workers; per-worker counters are cumulative, so their maxima are totals."""
    closed = store.query("SELECT COUNT(*), MIN(version), MAX(version) FROM rounds")[0]
    rounds, first, last = closed[0] or 0, closed[1] or 0, closed[2] or 0
    per_worker = store.query(
        "SELECT worker_id, MAX(bytes_sent), MAX(bytes_received), MAX(sync_seconds), MAX(compute_seconds), "
        "SUM(tokens), MIN(received_at), MAX(received_at) FROM metrics GROUP BY worker_id"
    )
    tokens = sum(row[5] or 0 for row in per_worker)
    started = min((row[6] for row in per_worker), default=0.0)
    ended = max((row[7] for row in per_worker), default=0.0)
    busy = [(row[3] or 0.0, row[4] or 0.0) for row in per_worker]
    shares = [sync / (sync + compute) for sync, compute in busy if sync + compute > 0]
    first_report = store.query("SELECT MIN(opened_at) FROM rounds")[0][0]
    wall = ended - min(started, first_report or started)
    return RunSummary(
        rounds=rounds,
        workers=len(per_worker),
        first_round_loss=_mean_loss(store, first),
        last_round_loss=_mean_loss(store, last),
        tokens=tokens,
        tokens_per_second=tokens / wall if wall > 0 else 0.0,
        bytes_sent_per_round=sum(row[1] or 0 for row in per_worker) / max(rounds, 1),
        bytes_received_per_round=sum(row[2] or 0 for row in per_worker) / max(rounds, 1),
        sync_share=sum(shares) / len(shares) if shares else math.nan,
        wall_seconds=wall,
    )
