"""The coordinator's durable state: SQLite for run state, rounds, events and metrics;
safetensors for the global parameters and the outer optimizer's momentum.

Every SQL statement of the package lives in this module: the writes the coordinator makes,
and the named reads the analysis, the dashboard, the summary and the commands use.
`StateStore.open_read_only(state_dir)` opens an existing state dir for reading only
(`rcswarm status --state-dir`, `rcswarm fit RUN_DIR`, the launcher's summary).

A version is committed in two steps: its checkpoint file is written to a temporary name
(straight from the tensors' memory, over the last pruned checkpoint's file when there is one),
fsynced and renamed into place; then one SQLite transaction records it as current (with
whatever run state and events the caller commits with it: a close's reference norms and flags) and
enters its parameters' SHA-256 (`tensor_stream.params_sha256`, the digest pulls carry) in
the `checkpoints` ledger. A crash between the two leaves the previous version current (the
orphan file is removed at the next start), so a restart always resumes at a complete,
persisted version.

Verified state: `load_current` serves nothing it has not verified. It reads the committed
checkpoint and checks it against the ledger (a readable, complete safetensors file, the
version in its metadata, the run's parameter names, finite values, the digest) and against
`run_state.version`. When that fails it falls back to the newest kept checkpoint that
verifies, logs a WARNING, records an event of kind `fallback` naming each file and what was
wrong, and makes that version current; when none verifies it raises ValueError naming them.

Reads never wait for the writer: the database is in WAL mode and every named read goes
through a second, read-only connection with its own lock, so a slow read (the dashboard,
`rcswarm status`) never holds the lock `commit_version` and `add_event` take. The reads the
dashboard makes per request come from aggregate tables that `add_metrics` updates in the
same transaction as the rows (per-worker totals, loss and time per step on both clocks), so
their cost depends on the number of workers and steps, not on the number of metric rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from rcswarm.sync import tensor_stream

log = logging.getLogger("rcswarm.state.store")

# A pruned checkpoint file kept for the next commit to overwrite in place: writing into a file's cached
# pages is several times faster than allocating new ones (docs/PERFORMANCE.md, the round close at scale).
RECYCLED_CHECKPOINT = ".recycled.safetensors"

# Optimizer state is stored beside the parameters as "<group>/<parameter name>";
# parameter names never contain "/".
STATE_SEPARATOR = "/"

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    version INTEGER PRIMARY KEY, opened_at REAL, closed_at REAL, reports INTEGER,
    tokens INTEGER, close_reason TEXT, update_norm REAL, param_sha256 TEXT, checkpoint TEXT,
    clipped INTEGER DEFAULT 0, dropped INTEGER DEFAULT 0, aggregation TEXT DEFAULT ''
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
CREATE TABLE IF NOT EXISTS checkpoints (
    version INTEGER PRIMARY KEY, file TEXT NOT NULL, param_sha256 TEXT NOT NULL, committed_at REAL
);
CREATE TABLE IF NOT EXISTS worker_totals (
    run_id TEXT, worker_id TEXT, tokens INTEGER, bytes_sent INTEGER, bytes_received INTEGER,
    sync_seconds REAL, compute_seconds REAL, first_wall REAL, last_wall REAL, first_received REAL,
    last_received REAL, row_count INTEGER, newest INTEGER, PRIMARY KEY (run_id, worker_id)
);
CREATE TABLE IF NOT EXISTS worker_step_sums (
    run_id TEXT, seq_len INTEGER, step INTEGER, loss_sum REAL, wall_sum REAL, n INTEGER,
    PRIMARY KEY (run_id, seq_len, step)
);
CREATE TABLE IF NOT EXISTS round_first_steps (
    worker_id TEXT, version INTEGER, first_step INTEGER, first_received REAL, PRIMARY KEY (worker_id, version)
);
CREATE TABLE IF NOT EXISTS run_step_sums (
    seq_len INTEGER, version INTEGER, k INTEGER, loss_sum REAL, t_sum REAL, n INTEGER,
    PRIMARY KEY (seq_len, version, k)
);
"""

# PRAGMA user_version of a state dir whose aggregate tables and ledger are complete; an older
# one is brought up to date when a coordinator opens it for writing.
SCHEMA_VERSION = 1
INT64_MAX = 2**63 - 1
# Columns of `rounds` added after its first release (the aggregation's per-round counts), with their
# declarations; a state dir written before them gets them at its next open for writing.
ROUND_COLUMNS_ADDED = {"clipped": "INTEGER DEFAULT 0", "dropped": "INTEGER DEFAULT 0", "aggregation": "TEXT DEFAULT ''"}
ROUND_COLUMNS = ("version", "opened_at", "closed_at", "reports", "tokens", "close_reason", "update_norm", "param_sha256")


def _keep(function: str, column: str) -> str:
    """An upsert's `column = function(old, new)` that ignores a NULL on either side."""
    return f"{column} = COALESCE({function}({column}, excluded.{column}), {column}, excluded.{column})"


def _saturated_sum(expression: str) -> str:
    """SUM without SQLite's integer-overflow error: a float total clamped to int64."""
    return f"CAST(MIN(TOTAL({expression}), {INT64_MAX}) AS INTEGER)"


# The aggregates over the metric rows with rowid > ?, added to the tables the reads use. Each
# runs in add_metrics' transaction, right after the rows are inserted.
AGGREGATE_WORKER_TOTALS = f"""
INSERT INTO worker_totals
SELECT run_id, worker_id, {_saturated_sum("MAX(tokens, 0)")}, MAX(bytes_sent), MAX(bytes_received),
       MAX(sync_seconds), MAX(compute_seconds), MIN(wall_time), MAX(wall_time), MIN(received_at),
       MAX(received_at), COUNT(*), MAX(rowid)
FROM metrics WHERE rowid > ? GROUP BY run_id, worker_id
ON CONFLICT (run_id, worker_id) DO UPDATE SET
    tokens = CAST(MIN(tokens + excluded.tokens, {INT64_MAX}) AS INTEGER), {_keep("MAX", "bytes_sent")},
    {_keep("MAX", "bytes_received")}, {_keep("MAX", "sync_seconds")}, {_keep("MAX", "compute_seconds")},
    {_keep("MIN", "first_wall")}, {_keep("MAX", "last_wall")}, {_keep("MIN", "first_received")},
    {_keep("MAX", "last_received")}, row_count = row_count + excluded.row_count, newest = excluded.newest
"""

# Loss and wall time per (seq_len, worker step), the workers' clock.
AGGREGATE_WORKER_STEPS = """
INSERT INTO worker_step_sums
SELECT run_id, seq_len, step, TOTAL(loss), TOTAL(wall_time), COUNT(*) FROM metrics
WHERE rowid > ? AND loss > 0 AND seq_len > 0 AND step > 0 AND wall_time IS NOT NULL GROUP BY run_id, seq_len, step
ON CONFLICT (run_id, seq_len, step) DO UPDATE SET
    loss_sum = loss_sum + excluded.loss_sum, wall_sum = wall_sum + excluded.wall_sum, n = n + excluded.n
"""

# A training row (tokens > 0, a loss) counts its step within the round, k, from the smallest
# step its worker reported for that version, and its time from the run's first training row.
TRAINING_FILTER = "tokens > 0 AND loss IS NOT NULL"

AGGREGATE_ROUND_FIRST_STEPS = f"""
INSERT INTO round_first_steps
SELECT worker_id, version, MIN(step), MIN(received_at) FROM metrics
WHERE rowid > ? AND {TRAINING_FILTER} GROUP BY worker_id, version
ON CONFLICT (worker_id, version) DO UPDATE SET {_keep("MIN", "first_step")}, {_keep("MIN", "first_received")}
"""

# Loss and coordinator time per (seq_len, version, k), the run's clock; rows of a round that
# arrive after a row with a smaller step keep the k they were counted with.
AGGREGATE_RUN_STEPS = """
INSERT INTO run_step_sums
SELECT m.seq_len, m.version, m.step - f.first_step AS k, TOTAL(m.loss), TOTAL(m.received_at), COUNT(*)
FROM metrics AS m JOIN round_first_steps AS f ON f.worker_id = m.worker_id AND f.version = m.version
WHERE m.rowid > ? AND m.tokens > 0 AND m.loss > 0 AND m.seq_len > 0
GROUP BY m.seq_len, m.version, k
ON CONFLICT (seq_len, version, k) DO UPDATE SET
    loss_sum = loss_sum + excluded.loss_sum, t_sum = t_sum + excluded.t_sum, n = n + excluded.n
"""

AGGREGATES = (AGGREGATE_WORKER_TOTALS, AGGREGATE_WORKER_STEPS, AGGREGATE_ROUND_FIRST_STEPS, AGGREGATE_RUN_STEPS)

# Ledger rows for state dirs written before the ledger: each round's record names the checkpoint
# of the version it produced and that version's digest.
LEDGER_FROM_ROUNDS = """
INSERT OR IGNORE INTO checkpoints SELECT version + 1, checkpoint, param_sha256, closed_at FROM rounds
WHERE checkpoint IS NOT NULL AND param_sha256 IS NOT NULL
"""

METRIC_COLUMNS = (
    "run_id", "worker_id", "version", "step", "seq_len", "batch", "loss", "tokens", "wall_time",
    "compute_seconds", "sync_seconds", "bytes_sent", "bytes_received", "param_sha256", "received_at",
)


# A worker's totals over its metric rows and its newest row, for one run.
WORKER_TOTALS = """
SELECT t.worker_id, t.tokens, t.bytes_sent, t.bytes_received, t.first_wall, t.last_wall, t.row_count, m.step, m.seq_len, m.loss
FROM worker_totals AS t LEFT JOIN metrics AS m ON m.rowid = t.newest WHERE t.run_id = ? ORDER BY t.worker_id
"""

# Training rows on the run's own clock: k is the step within the round (from 0), t the seconds since
# the run's first metric on the coordinator's clock. A full scan, for commands that read a state dir.
TRAINING_ROWS = f"""
SELECT worker_id, version, step - MIN(step) OVER (PARTITION BY worker_id, version) AS k,
       seq_len, loss, received_at - MIN(received_at) OVER () AS t
FROM metrics WHERE {TRAINING_FILTER} ORDER BY received_at
"""

# Mean loss and time per (seq_len, run step), run step = version × inner steps + k + 1.
RUN_STEP_MEANS = (
    "SELECT seq_len, version * ? + k + 1 AS run_step, TOTAL(loss_sum) / TOTAL(n), TOTAL(t_sum) / TOTAL(n) - "
    "(SELECT MIN(first_received) FROM round_first_steps) FROM run_step_sums GROUP BY seq_len, run_step "
    "ORDER BY seq_len, run_step"
)

# Mean loss and wall time per (seq_len, worker step) of one run.
WORKER_STEP_MEANS = (
    "SELECT seq_len, step, loss_sum / n, wall_sum / n FROM worker_step_sums WHERE run_id = ? ORDER BY seq_len, step"
)

# Per worker: cumulative counters (their maxima are totals), tokens, first and last arrival.
WORKER_USAGE = (
    "SELECT worker_id, MAX(bytes_sent), MAX(bytes_received), MAX(sync_seconds), MAX(compute_seconds), "
    f"{_saturated_sum('tokens')}, MIN(first_received), MAX(last_received) FROM worker_totals GROUP BY worker_id"
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
    """A verified version: its parameters, optimizer state and the digest they were checked against."""

    version: int
    params: dict[str, torch.Tensor]
    # group ("outer_momentum", "broadcast_residual", ...) -> name -> tensor
    state: dict[str, dict[str, torch.Tensor]]
    # params_sha256 of `params` in the run's parameter order (run_state.param_names).
    param_sha256: bytes = b""


@dataclass(frozen=True)
class LedgerEntry:
    """A committed version as the `checkpoints` ledger records it: its file and its parameters' digest (hex)."""

    version: int
    file: str
    param_sha256: str


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
    # Updates the aggregation flagged (clipped, or trimmed in most coordinates), updates refused
    # for this round's version (norm or token bound), and what the aggregation did.
    clipped: int = 0
    dropped: int = 0
    aggregation: str = ""


# safetensors' dtype names of the tensors a checkpoint holds.
SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def _raw_bytes(key: str, tensor: torch.Tensor) -> memoryview:
    """The little-endian bytes of a CPU tensor as safetensors stores them: a view, no copy when contiguous."""
    if tensor.dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"checkpoint tensor {key!r} has dtype {tensor.dtype}: expected one of "
                         f"{', '.join(str(d) for d in SAFETENSORS_DTYPES)}")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _write_all(fd: int, data: memoryview) -> None:
    """os.write until every byte of `data` is written."""
    while data.nbytes:
        data = data[os.write(fd, data):]


def write_checkpoint(
    path: Path, params: Mapping[str, torch.Tensor], state: Mapping[str, Mapping[str, torch.Tensor]],
    metadata: Mapping[str, str], digest: bool,
) -> bytes | None:
    """Write a safetensors file of `params` then each state group's tensors ("<group>/<name>") straight from
    the tensors' memory: a header, then each tensor's bytes by one write each, no intermediate copy (not
    fsynced: the caller does). An existing file at `path` is overwritten in place and cut to size, so the
    pages it has in the page cache are reused instead of allocated afresh. With `digest`, returns `tensor_stream.params_sha256(params)` computed over
    the same bytes in the same pass (params must be float32), else None.
    """
    if sys.byteorder != "little":
        raise RuntimeError("safetensors files are little-endian; this host is big-endian")
    parts = [(key, _raw_bytes(key, tensor), tensor) for key, tensor in params.items()]
    for group, named in state.items():
        parts.extend((f"{group}{STATE_SEPARATOR}{k}", _raw_bytes(f"{group}/{k}", v), v) for k, v in named.items())
    entries: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for key, data, tensor in parts:
        entries[key] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)
    sha = hashlib.sha256() if digest else None
    if sha is not None and any(tensor.dtype != torch.float32 for tensor in params.values()):
        raise ValueError(f"checkpoint parameters must be float32 to be digested, got {sorted({str(t.dtype) for t in params.values()})}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        _write_all(fd, memoryview(struct.pack("<Q", len(header)) + header))
        for index, (key, data, _) in enumerate(parts):
            if sha is not None and index < len(params):
                sha.update(key.encode("utf-8"))
                sha.update(b"\0")
                sha.update(data)
            _write_all(fd, data)
        os.ftruncate(fd, 8 + len(header) + offset)
    finally:
        os.close(fd)
    return None if sha is None else sha.digest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateStore:
    """One run's state dir: state.sqlite plus checkpoints/v<version>.safetensors.

    Threads and locks. `_lock` guards the writer connection: `get`, `set_many`,
    `commit_version` (its SQLite transaction; the file is written before the lock is taken),
    `load_current`, `add_event`, `add_metrics` and `close` take it. `_read_lock` guards the
    read-only connection that every named read uses (`recent_rounds`, `run_identity`,
    `newest_metric_rowid`, `metrics_since`, `worker_rows`, `worker_usage`, `worker_step_means`,
    `run_step_means`, `training_rows`, `rounds_summary`, `mean_training_loss`,
    `round_durations`), so a read never waits for a write, nor a write for a read. Any thread
    may call any method; the two locks are never held together, except by `close`.
    """

    def __init__(self, state_dir: str | Path, keep_checkpoints: int = 2, durable: bool = True) -> None:
        self._paths(state_dir, keep_checkpoints, durable)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._db.executescript(SCHEMA)
        self._upgrade()
        self._add_round_columns()
        self._schema_version = SCHEMA_VERSION
        self._reader = self._connect_read_only(timeout_s=5.0)
        self._read_lock = threading.Lock()

    def _paths(self, state_dir: str | Path, keep_checkpoints: int, durable: bool) -> None:
        self.state_dir = Path(state_dir)
        self.checkpoint_dir = self.state_dir / "checkpoints"
        self.keep_checkpoints = keep_checkpoints
        self.durable = durable
        self.db_path = self.state_dir / "state.sqlite"
        self._lock = threading.Lock()
        # Seconds of the last commit_version's pieces (its thread replaces the dict; readers get a snapshot).
        self.last_commit_seconds: dict[str, float] = {}

    def _connect_read_only(self, timeout_s: float) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.db_path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s,
                               check_same_thread=False, isolation_level=None)

    def _upgrade(self) -> None:
        """Constructor only: build the ledger and the aggregates of a state dir written before they existed."""
        if self._db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute(LEDGER_FROM_ROUNDS)
        for statement in AGGREGATES:
            self._db.execute(statement, (0,))
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._db.execute("COMMIT")

    def _add_round_columns(self) -> None:
        """Constructor only: add the `rounds` columns of ROUND_COLUMNS_ADDED a state dir lacks."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(rounds)")}
        for column, declaration in ROUND_COLUMNS_ADDED.items():
            if column not in present:
                self._db.execute(f"ALTER TABLE rounds ADD COLUMN {column} {declaration}")

    def _round_select(self) -> str:
        """The columns of a RoundRecord as this state dir can give them (an old one read-only: defaults);
        read once per store."""
        if getattr(self, "_round_columns", None) is None:
            present = {row[1] for row in self._read("PRAGMA table_info(rounds)")}
            added = [c if c in present else ("''" if c == "aggregation" else "0") for c in ROUND_COLUMNS_ADDED]
            self._round_columns = ", ".join((*ROUND_COLUMNS, *added))
        return self._round_columns

    @classmethod
    def open_read_only(cls, state_dir: str | Path, timeout_s: float = 5.0) -> StateStore:
        """An existing state dir, opened for reads only (a live coordinator may keep writing it).

        Raises FileNotFoundError naming the path when the directory holds no state.sqlite. A state
        dir a coordinator older than the aggregate tables wrote last opens, but the reads that need
        them raise ValueError saying so.
        """
        store = cls.__new__(cls)
        store._paths(state_dir, keep_checkpoints=0, durable=False)
        if not store.db_path.is_file():
            raise FileNotFoundError(f"{store.db_path}: no such file; expected a coordinator state dir holding state.sqlite")
        store._db = store._reader = store._connect_read_only(timeout_s)
        store._read_lock = store._lock
        store._schema_version = store._db.execute("PRAGMA user_version").fetchone()[0]
        return store

    def _read_aggregates(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A read of the aggregate tables; ValueError for a state dir whose tables predate them."""
        if self._schema_version < SCHEMA_VERSION:
            raise ValueError(f"{self.db_path}: schema version {self._schema_version}, expected {SCHEMA_VERSION}: written "
                             "by an older coordinator; start the coordinator on this state dir once to bring it up to date")
        return self._read(sql, params)

    def close(self) -> None:
        with self._lock:
            if self._reader is not self._db:
                with self._read_lock:
                    self._reader.close()
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
        param_sha256: bytes | None = None,
        *,
        run_state: Mapping[str, str] | None = None,
        events: Sequence[tuple[str, str, str, float]] = (),
    ) -> None:
        """Persist a version atomically: checkpoint file first, then the SQLite commit point.

        `params` are in the order pulls serve them; their digest is `param_sha256`, else the
        round record's, else computed here while the file is written (`write_checkpoint`: one pass
        over the tensors' memory, no copies, one fsync), and the round record gets it. It enters the
        ledger `load_current` verifies against (`committed_digest`). `run_state` (key -> value) and `events`
        ((worker_id, kind, reason, time) each, as `add_event`) enter the same SQLite transaction: one commit
        point and one fsync for all of the close's rows.
        """
        name = f"v{version:08d}.safetensors"
        final = self.checkpoint_dir / name
        partial = self.checkpoint_dir / f".{name}.partial"
        given = (param_sha256.hex() if param_sha256 is not None
                 else round_record.param_sha256 if round_record is not None and round_record.param_sha256 else None)
        started = time.perf_counter()
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.checkpoint_dir / RECYCLED_CHECKPOINT, partial)
        computed = write_checkpoint(partial, params, state, {"run_id": run_id, "version": str(version)},
                                    digest=given is None)
        digest = given if computed is None else computed.hex()
        if round_record is not None:
            round_record = dataclasses.replace(round_record, param_sha256=digest)
        written = time.perf_counter()
        if self.durable:
            with open(partial, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(partial, final)
        if self.durable:
            _fsync_dir(self.checkpoint_dir)
        synced = time.perf_counter()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "INSERT OR REPLACE INTO run_state VALUES (?, ?)",
                [*(run_state or {}).items(), ("version", str(version)), ("checkpoint", name), ("run_id", run_id)],
            )
            self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                                 [(now, worker_id, kind, reason) for worker_id, kind, reason, now in events])
            self._db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)", (version, name, digest, time.time()))
            if round_record is not None:
                r = round_record
                self._db.execute(
                    f"INSERT OR REPLACE INTO rounds ({', '.join(ROUND_COLUMNS)}, checkpoint, "
                    f"{', '.join(ROUND_COLUMNS_ADDED)}) VALUES ({', '.join('?' * (len(ROUND_COLUMNS) + 4))})",
                    (r.version, r.opened_at, r.closed_at, r.reports, r.tokens, r.close_reason,
                     r.update_norm, r.param_sha256, name, r.clipped, r.dropped, r.aggregation),
                )
            self._db.execute("COMMIT")
        self._prune_checkpoints(keep=name)
        self.last_commit_seconds = {"write + digest" if computed is not None else "write": written - started,
                                    "fsync": synced - written, "sqlite": time.perf_counter() - synced}

    def committed_digest(self, version: int) -> bytes:
        """The parameters' SHA-256 the ledger recorded when `version` was committed (takes `_lock`);
        ValueError naming the version when none was."""
        with self._lock:
            row = self._db.execute("SELECT param_sha256 FROM checkpoints WHERE version = ?", (version,)).fetchone()
        if row is None:
            raise ValueError(f"version {version} was never committed: the checkpoints ledger has no digest for it")
        return bytes.fromhex(row[0])

    def _prune_checkpoints(self, keep: str) -> None:
        """Remove files no commit recorded (orphans of a crash) and all but the newest `keep_checkpoints`
        besides `keep` (takes `_lock` for the ledger). The first of them becomes RECYCLED_CHECKPOINT, which the
        next commit overwrites."""
        present = sorted(p for p in self.checkpoint_dir.glob("v*.safetensors") if p.name != keep)
        marks = ", ".join("?" * len(present))
        with self._lock:
            recorded = {row[0] for row in self._db.execute(
                f"SELECT file FROM checkpoints WHERE file IN ({marks})", [p.name for p in present])}
        files = [p for p in present if p.name in recorded]
        stale = files[: max(0, len(files) - self.keep_checkpoints)]
        orphans = [p for p in present if p.name not in recorded]
        doomed = stale + orphans + list(self.checkpoint_dir.glob(".*.partial"))
        if doomed:
            os.replace(doomed.pop(0), self.checkpoint_dir / RECYCLED_CHECKPOINT)
        for path in doomed:
            path.unlink(missing_ok=True)

    def load_current(self) -> Checkpoint | None:
        """The committed version, verified; None for a new state dir.

        When the committed checkpoint or `run_state.version` fails verification, falls back to
        the newest kept checkpoint that verifies: logs a WARNING, adds a `fallback` event, makes
        that version current and sets the files that failed aside as `<name>.rejected`. Raises
        ValueError naming every file and what is wrong with it when none verifies.
        """
        name = self.get("checkpoint")
        if name is None:
            return None
        claimed = self.get("version")
        run_id = self.get("run_id") or ""
        names = json.loads(self.get("param_names") or "[]")
        with self._lock:
            entries = [LedgerEntry(*row) for row in
                       self._db.execute("SELECT version, file, param_sha256 FROM checkpoints ORDER BY version DESC")]
        problems: list[str] = []
        if name not in {entry.file for entry in entries}:
            problems.append(f"{self.checkpoint_dir / name}: run_state names it but the checkpoints ledger records no digest for it")
        for entry in entries:
            path = self.checkpoint_dir / entry.file
            if not path.exists():
                if entry.file == name:
                    problems.append(f"{path}: the committed checkpoint is missing")
                continue
            checkpoint, wrong = self._verified(entry, names, run_id)
            if checkpoint is None:
                problems.append(f"{path}: {wrong}")
                continue
            if (entry.file, str(entry.version)) != (name, claimed):
                problems.append(f"run_state.version = {claimed!r}, checkpoint = {name!r}, but the newest checkpoint that "
                                f"verifies is {entry.file} (version {entry.version})")
            if problems:
                self._fall_back(entry, problems)
            self._prune_checkpoints(keep=entry.file)
            return checkpoint
        raise ValueError(f"state dir {self.state_dir}: no checkpoint verifies, refusing to serve unverified parameters: "
                         + "; ".join(problems or [f"the checkpoints ledger is empty though run_state names {name}"]))

    def _verified(self, entry: LedgerEntry, names: list[str], run_id: str) -> tuple[Checkpoint | None, str]:
        """The checkpoint of `entry` when its file verifies against it, else None and what is wrong."""
        path = self.checkpoint_dir / entry.file
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        except (OSError, SafetensorError) as error:
            return None, f"unreadable or truncated safetensors file ({error})"
        if metadata.get("version") != str(entry.version) or metadata.get("run_id", run_id) != run_id:
            return None, (f"its metadata says run {metadata.get('run_id')!r} version {metadata.get('version')!r}, "
                          f"the ledger run {run_id!r} version {entry.version}")
        params, state = split_checkpoint(tensors)
        if sorted(params) != sorted(names):
            return None, f"holds parameters {sorted(params)}, expected the run's {sorted(names)}"
        bad = [key for key, tensor in tensors.items() if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
        if bad:
            return None, f"non-finite values (NaN or Inf) in {', '.join(sorted(bad))}"
        ordered = {key: params[key] for key in names}
        digest = tensor_stream.params_sha256(ordered)
        if digest.hex() != entry.param_sha256:
            return None, f"parameters' SHA-256 {digest.hex()} differs from the {entry.param_sha256} recorded at commit"
        return Checkpoint(version=entry.version, params=ordered, state=state, param_sha256=digest), ""

    def _fall_back(self, entry: LedgerEntry, problems: list[str]) -> None:
        """Make the verified `entry` current, set the newer files aside and say why (log, events)."""
        reason = f"resuming at version {entry.version} from {entry.file}: " + "; ".join(problems)
        log.warning("state dir %s: %s", self.state_dir, reason)
        with self._lock:
            newer = [row[0] for row in self._db.execute("SELECT file FROM checkpoints WHERE version > ?", (entry.version,))]
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR REPLACE INTO run_state VALUES (?, ?)",
                                 [("version", str(entry.version)), ("checkpoint", entry.file)])
            self._db.execute("DELETE FROM checkpoints WHERE version > ?", (entry.version,))
            self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (time.time(), "", "fallback", reason))
            self._db.execute("COMMIT")
        for file in newer:
            path = self.checkpoint_dir / file
            if path.exists():
                os.replace(path, path.with_name(f"{file}.rejected"))

    def checkpoint_path(self) -> Path | None:
        name = self.get("checkpoint")
        return None if name is None else self.checkpoint_dir / name

    def add_event(self, worker_id: str, kind: str, reason: str, now: float | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?)", (time.time() if now is None else now, worker_id, kind, reason)
            )

    def add_metrics(self, rows: Iterable[tuple[Any, ...]]) -> int:
        """Insert metric rows (METRIC_COLUMNS each) and fold them into the aggregate tables, in one transaction."""
        rows = list(rows)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                before = self._db.execute("SELECT COALESCE(MAX(rowid), 0) FROM metrics").fetchone()[0]
                self._db.executemany(f"INSERT INTO metrics VALUES ({', '.join('?' * len(METRIC_COLUMNS))})", rows)
                for statement in AGGREGATES:
                    self._db.execute(statement, (before,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return len(rows)

    def recent_rounds(self, limit: int) -> list[RoundRecord]:
        """The newest `limit` closed rounds, oldest first, with the aggregation's counts."""
        rows = self._read(f"SELECT {self._round_select()} FROM rounds ORDER BY version DESC LIMIT ?", (limit,))
        return [RoundRecord(*row) for row in reversed(rows)]

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return self._reader.execute(sql, params).fetchall()

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
            in self._read_aggregates(WORKER_TOTALS, (run_id,))
        ]

    def worker_usage(self) -> list[WorkerUsage]:
        """Per worker over all metric rows: the maxima of its cumulative counters, its tokens, first and last arrival."""
        return [
            WorkerUsage(worker_id, sent or 0, received or 0, sync or 0.0, compute or 0.0, tokens or 0, first, last)
            for worker_id, sent, received, sync, compute, tokens, first, last in self._read_aggregates(WORKER_USAGE)
        ]

    def worker_step_means(self, run_id: str) -> list[tuple[Any, ...]]:
        """(seq_len, step, mean loss, mean wall_time) of `run_id` on the workers' own counters and clocks."""
        return self._read_aggregates(WORKER_STEP_MEANS, (run_id,))

    def run_step_means(self, inner_steps: int) -> list[tuple[float, float, float, float]]:
        """(seq_len, run step, mean loss, mean seconds since the run's first metric) on the run's own clock.

        A run step is version × inner_steps + the step within the round + 1, so workers that moved
        here from another run (with their own step counters and clocks) do not mix runs.
        """
        if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
            raise ValueError(f"inner_steps={inner_steps!r}: expected a positive integer")
        return [
            (float(length), float(step), float(loss), float(t))
            for length, step, loss, t in self._read_aggregates(RUN_STEP_MEANS, (inner_steps,))
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
