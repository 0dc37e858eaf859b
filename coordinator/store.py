"""The coordinator's durable state: SQLite for run state, rounds, events and metrics;
safetensors for the global parameters and the outer optimizer's momentum.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

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
        self.state_dir = Path(state_dir)
        self.checkpoint_dir = self.state_dir / "checkpoints"
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.keep_checkpoints = keep_checkpoints
        self.durable = durable
        self.db_path = self.state_dir / "state.sqlite"
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._db.executescript(SCHEMA)

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

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()
