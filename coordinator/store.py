"""The coordinator's durable state: SQLite for run state, rounds, events and metrics;
safetensors for the global parameters and the outer optimizer's momentum.

Every SQL statement of the package lives in this module: the writes the coordinator makes,
and the named reads the analysis, the dashboard, the summary and the commands use.
`StateStore.open_read_only(state_dir)` opens an existing state dir for reading only
(`rcswarm status --state-dir`, `rcswarm fit RUN_DIR`, the launcher's summary).

A version is committed in two steps: its checkpoint file is written to a temporary name,
fsynced and renamed into place; then one SQLite transaction records it as current. A
crash between the two leaves the previous version current (the orphan file is removed
at the next start), so a restart always resumes at a complete, persisted version.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

# Optimizer state is stored beside the parameters as "<group>/<parameter name>";
# parameter names never contain "/".
STATE_SEPARATOR = "/"

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    version INTEGER PRIMARY KEY, opened_at REAL, closed_at REAL, reports INTEGER,
    tokens INTEGER, close_reason TEXT, update_norm REAL, param_sha256 TEXT, checkpoint TEXT
);
CREATE TABLE IF NOT EXISTS events (
    time REAL, worker_id TEXT, kind TEXT, reason TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT, worker_id TEXT, version INTEGER, step INTEGER, seq_len INTEGER, batch INTEGER,
    loss REAL, tokens INTEGER, wall_time REAL, compute_seconds REAL, sync_seconds REAL,
    bytes_sent INTEGER, bytes_received INTEGER, param_sha256 TEXT, received_at REAL
);
CREATE INDEX IF NOT EXISTS metrics_by_version ON metrics (version);
"""

METRIC_COLUMNS = (
    "run_id", "worker_id", "version", "step", "seq_len", "batch", "loss", "tokens", "wall_time",
    "compute_seconds", "sync_seconds", "bytes_sent", "bytes_received", "param_sha256", "received_at",
)


# A worker's totals over its metric rows and its newest row, for one run.
WORKER_TOTALS = """
SELECT t.worker_id, t.tokens, t.sent, t.received, t.first_wall, t.last_wall, t.row_count, m.step, m.seq_len, m.loss
FROM (SELECT worker_id, SUM(MAX(tokens, 0)) AS tokens, MAX(bytes_sent) AS sent, MAX(bytes_received) AS received,
             MIN(wall_time) AS first_wall, MAX(wall_time) AS last_wall, COUNT(*) AS row_count, MAX(rowid) AS newest
      FROM metrics WHERE run_id = ? GROUP BY worker_id) AS t
LEFT JOIN metrics AS m ON m.rowid = t.newest ORDER BY t.worker_id
"""

# Training rows on the run's own clock: k is the step within the round (from 0), t the seconds since
# the run's first metric on the coordinator's clock.
TRAINING_ROWS = """
SELECT worker_id, version, step - MIN(step) OVER (PARTITION BY worker_id, version) AS k,
       seq_len, loss, received_at - MIN(received_at) OVER () AS t
FROM metrics WHERE tokens > 0 AND loss IS NOT NULL ORDER BY received_at
"""

# Mean loss and time per (seq_len, run step), run step = version × inner steps + k + 1.
RUN_STEP_MEANS = (
    f"SELECT seq_len, version * ? + k + 1 AS run_step, AVG(loss), AVG(t) FROM ({TRAINING_ROWS}) "
    "WHERE loss > 0 AND seq_len > 0 GROUP BY seq_len, run_step ORDER BY seq_len, run_step"
)

# Mean loss and wall time per (seq_len, worker step) over one run's newest `?` rows.
WORKER_STEP_MEANS = (
    "SELECT seq_len, step, AVG(loss), AVG(wall_time) FROM (SELECT seq_len, step, loss, wall_time FROM metrics "
    "WHERE loss > 0 AND seq_len > 0 AND step > 0 AND run_id = ? ORDER BY rowid DESC LIMIT ?) "
    "GROUP BY seq_len, step ORDER BY seq_len, step"
)

# Per worker: cumulative counters (their maxima are totals), tokens, first and last arrival.
WORKER_USAGE = (
    "SELECT worker_id, MAX(bytes_sent), MAX(bytes_received), MAX(sync_seconds), MAX(compute_seconds), "
    "SUM(tokens), MIN(received_at), MAX(received_at) FROM metrics GROUP BY worker_id"
)

METRIC_PAGE_COLUMNS = ("rowid", *METRIC_COLUMNS)


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


@dataclass(frozen=True)
class RoundsSummary:
    """The closed rounds: how many, the first and last version, the earliest opening time (None: no round)."""

    count: int
    first_version: int
    last_version: int
    first_opened_at: float | None


@dataclass(frozen=True)
class Checkpoint:
    version: int
    params: dict[str, torch.Tensor]
    # group ("outer_momentum", "broadcast_residual", ...) -> name -> tensor
    state: dict[str, dict[str, torch.Tensor]]


def split_checkpoint(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Separate a checkpoint's parameters from its optimizer state groups."""
    params: dict[str, torch.Tensor] = {}
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        group, sep, name = key.partition(STATE_SEPARATOR)
        if sep:
            state.setdefault(group, {})[name] = tensor
        else:
            params[key] = tensor
    return params, state


@dataclass(frozen=True)
class RoundRecord:
    version: int
    opened_at: float
    closed_at: float
    reports: int
    tokens: int
    close_reason: str
    update_norm: float
    param_sha256: str


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateStore:
    """One run's state dir: state.sqlite plus checkpoints/v<version>.safetensors."""

    def __init__(self, state_dir: str | Path, keep_checkpoints: int = 2, durable: bool = True) -> None:
        self._paths(state_dir, keep_checkpoints, durable)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._db.executescript(SCHEMA)

    def _paths(self, state_dir: str | Path, keep_checkpoints: int, durable: bool) -> None:
        self.state_dir = Path(state_dir)
        self.checkpoint_dir = self.state_dir / "checkpoints"
        self.keep_checkpoints = keep_checkpoints
        self.durable = durable
        self.db_path = self.state_dir / "state.sqlite"
        self._lock = threading.Lock()

    @classmethod
    def open_read_only(cls, state_dir: str | Path, timeout_s: float = 5.0) -> StateStore:
        """An existing state dir, opened for reads only (a live coordinator may keep writing it).

        Raises FileNotFoundError naming the path when the directory holds no state.sqlite.
        """
        store = cls.__new__(cls)
        store._paths(state_dir, keep_checkpoints=0, durable=False)
        if not store.db_path.is_file():
            raise FileNotFoundError(f"{store.db_path}: no such file; expected a coordinator state dir holding state.sqlite")
        store._db = sqlite3.connect(f"{store.db_path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s,
                                    check_same_thread=False, isolation_level=None)
        return store

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM run_state WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_many(self, values: Mapping[str, str]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR REPLACE INTO run_state VALUES (?, ?)", list(values.items()))
            self._db.execute("COMMIT")

    def commit_version(
        self,
        run_id: str,
        version: int,
        params: Mapping[str, torch.Tensor],
        state: Mapping[str, Mapping[str, torch.Tensor]],
        round_record: RoundRecord | None,
    ) -> None:
        """Persist a version atomically: checkpoint file first, then the SQLite commit point."""
        name = f"v{version:08d}.safetensors"
        final = self.checkpoint_dir / name
        partial = self.checkpoint_dir / f".{name}.partial"
        tensors = {k: v.contiguous() for k, v in params.items()}
        for group, named in state.items():
            tensors.update({f"{group}{STATE_SEPARATOR}{k}": v.contiguous() for k, v in named.items()})
        save_file(tensors, str(partial), metadata={"run_id": run_id, "version": str(version)})
        if self.durable:
            with open(partial, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(partial, final)
        if self.durable:
            _fsync_dir(self.checkpoint_dir)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "INSERT OR REPLACE INTO run_state VALUES (?, ?)",
                [("version", str(version)), ("checkpoint", name), ("run_id", run_id)],
            )
            if round_record is not None:
                r = round_record
                self._db.execute(
                    "INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (r.version, r.opened_at, r.closed_at, r.reports, r.tokens, r.close_reason,
                     r.update_norm, r.param_sha256, name),
                )
            self._db.execute("COMMIT")
        self._prune_checkpoints(keep=name)

    def _prune_checkpoints(self, keep: str) -> None:
        files = sorted(p for p in self.checkpoint_dir.glob("v*.safetensors") if p.name != keep)
        stale = files[: max(0, len(files) - self.keep_checkpoints)]
        for path in stale + list(self.checkpoint_dir.glob(".*.partial")):
            path.unlink(missing_ok=True)

    def load_current(self) -> Checkpoint | None:
        """The committed version, or None for a new state dir."""
        name = self.get("checkpoint")
        if name is None:
            return None
        path = self.checkpoint_dir / name
        if not path.exists():
            raise RuntimeError(f"state dir {self.state_dir} records checkpoint {name} but the file is missing")
        params, state = split_checkpoint(load_file(str(path)))
        version = int(self.get("version") or 0)
        self._prune_checkpoints(keep=name)
        return Checkpoint(version=version, params=params, state=state)

    def checkpoint_path(self) -> Path | None:
        name = self.get("checkpoint")
        return None if name is None else self.checkpoint_dir / name

    def add_event(self, worker_id: str, kind: str, reason: str, now: float | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?)", (time.time() if now is None else now, worker_id, kind, reason)
            )

    def add_metrics(self, rows: Iterable[tuple[Any, ...]]) -> int:
        rows = list(rows)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(f"INSERT INTO metrics VALUES ({', '.join('?' * len(METRIC_COLUMNS))})", rows)
            self._db.execute("COMMIT")
        return len(rows)

    def recent_rounds(self, limit: int) -> list[RoundRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT version, opened_at, closed_at, reports, tokens, close_reason, update_norm, param_sha256 "
                "FROM rounds ORDER BY version DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [RoundRecord(*row) for row in reversed(rows)]

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def run_identity(self) -> tuple[str, str] | None:
        """(run_id, spec_json) of the run this state dir holds, or None when either is missing."""
        stored = dict(self._read("SELECT key, value FROM run_state WHERE key IN ('run_id', 'spec_json')"))
        if "run_id" not in stored or "spec_json" not in stored:
            return None
        return stored["run_id"], stored["spec_json"]

    def newest_metric_rowid(self) -> int:
        """The rowid of the newest metric row (0 when there is none): it changes whenever metrics arrive."""
        return int(self._read("SELECT MAX(rowid) FROM metrics")[0][0] or 0)

    def metrics_since(self, since: int, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` metric rows with rowid > since, oldest first, each a dict of METRIC_PAGE_COLUMNS."""
        rows = self._read(f"SELECT {', '.join(METRIC_PAGE_COLUMNS)} FROM metrics WHERE rowid > ? ORDER BY rowid LIMIT ?",
                          (since, limit))
        return [dict(zip(METRIC_PAGE_COLUMNS, row)) for row in rows]

    def worker_rows(self, run_id: str) -> list[WorkerRow]:
        """Per worker of `run_id`: tokens, cumulative bytes, wall-time span, row count and its newest row."""
        return [
            WorkerRow(worker_id, int(tokens or 0), int(sent or 0), int(received or 0), first or 0.0, last or 0.0,
                      int(count), int(step or 0), int(seq_len or 0), loss)
            for worker_id, tokens, sent, received, first, last, count, step, seq_len, loss
            in self._read(WORKER_TOTALS, (run_id,))
        ]

    def worker_usage(self) -> list[WorkerUsage]:
        """Per worker over all metric rows: the maxima of its cumulative counters, its tokens, first and last arrival."""
        return [
            WorkerUsage(worker_id, sent or 0, received or 0, sync or 0.0, compute or 0.0, tokens or 0, first, last)
            for worker_id, sent, received, sync, compute, tokens, first, last in self._read(WORKER_USAGE)
        ]

    def worker_step_means(self, run_id: str, max_rows: int) -> list[tuple[Any, ...]]:
        """(seq_len, step, mean loss, mean wall_time) of `run_id` on the workers' own counters and clocks,
        over its newest `max_rows` rows."""
        return self._read(WORKER_STEP_MEANS, (run_id, max_rows))

    def run_step_means(self, inner_steps: int) -> list[tuple[float, float, float, float]]:
        """(seq_len, run step, mean loss, mean seconds since the run's first metric) on the run's own clock.

        A run step is version × inner_steps + the step within the round + 1, so workers that moved
        here from another run (with their own step counters and clocks) do not mix runs.
        """
        if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
            raise ValueError(f"inner_steps={inner_steps!r}: expected a positive integer")
        return [
            (float(length), float(step), float(loss), float(t))
            for length, step, loss, t in self._read(RUN_STEP_MEANS, (inner_steps,))
            if loss is not None and t is not None
        ]

    def training_rows(self) -> list[tuple[str, int, int, int, float, float]]:
        """(worker_id, version, step within the round from 0, seq_len, loss, seconds since the first metric), in arrival order."""
        return self._read(TRAINING_ROWS)

    def rounds_summary(self) -> RoundsSummary:
        count, first, last, opened = self._read("SELECT COUNT(*), MIN(version), MAX(version), MIN(opened_at) FROM rounds")[0]
        return RoundsSummary(count or 0, first or 0, last or 0, opened)

    def mean_training_loss(self, version: int) -> float | None:
        """The mean loss of the training steps (tokens > 0) trained from `version`; None without any."""
        value = self._read("SELECT AVG(loss) FROM metrics WHERE version = ? AND tokens > 0", (version,))[0][0]
        return None if value is None else float(value)

    def round_durations(self) -> list[float]:
        """Seconds from opening to close of every closed round, oldest first."""
        rows = self._read("SELECT closed_at - opened_at FROM rounds WHERE closed_at IS NOT NULL AND opened_at IS NOT NULL "
                          "ORDER BY version")
        return [row[0] for row in rows if row[0] is not None]
