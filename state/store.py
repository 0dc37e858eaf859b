"""The coordinator's durable state: SQLite for run state, rounds, events and metrics;
safetensors for the global parameters and the outer optimizer's momentum.

Every SQL statement of the package lives in state/: the writes the coordinator makes, and the
named reads the analysis, the dashboard, the summary, the commands and the tests use (this module
runs them; state/schema.py holds the schema, the aggregates and the longer statements;
state/checkpoints.py the checkpoint files). `StateStore.open_read_only(state_dir)` opens an
existing state dir for reading only (`rcswarm status --state-dir`, `rcswarm fit RUN_DIR`, the
launcher's summary). A sqlite3 failure a caller can meet (a state.sqlite that cannot be opened,
is not a database, is another program's, or is locked) leaves the store as a `StoreError` naming
the file; no caller outside state/ needs sqlite3.

A version is committed in two steps: its checkpoint file is written to a temporary name
(straight from the tensors' memory, over the last pruned checkpoint's file when there is one),
fsynced and renamed into place; then one SQLite transaction records it as current (with
whatever run state and events the caller commits with it: a close's reference norms and flags) and
enters its parameters' SHA-256 (`tensor_stream.params_sha256`, the digest pulls carry) in
the `checkpoints` ledger. A crash between the two leaves the previous version current (the
orphan file is removed at the next start: pruning deletes a file the ledger does not record only when its metadata
names the run and a version above the committed one, and leaves any other in place with a WARNING), so a restart
always resumes at a complete, persisted version. The round's record keeps, besides its counts, the steps it trained (the most
inner steps among its updates trained from its version), which the run step counts with
(config/run_step.py). The same transaction enters the round's reporters, the memberships whose update it counted
(`round_reporters`, `reported`): a coordinator restarted after the commit, before a reporter heard its answer, still
answers that reporter's re-push "already delivered" (coordinator/service.py, `join`), to a re-join that carries the
reporter's worker secret: each join's transaction stores the SHA-256 of its membership's secret (`member_secrets`,
`joined_digest`), never the secret.

Verified state: `load_current` serves nothing it has not verified. It reads the committed
checkpoint and checks it against the ledger (`checkpoints.verify_checkpoint`: the parameters'
digest and `rest_blake3`, the digest of the header and every optimizer state tensor, so every
byte the outer step loads) and against `run_state.version`. A version committed before the
ledger recorded `rest_blake3` (an older state dir) is checked over θ only, and logged as such. When that fails it falls back to the newest kept checkpoint that
verifies, logs a WARNING, records an event of kind `fallback` naming each file and what was
wrong, and makes that version current; when none verifies it raises ValueError naming them.

A version number is never reused within a run. The versions above the verified one were committed, so served:
workers hold them, trained from them, and their metric, held-out and forecast rows are keyed by them. A fallback
records them in `run_state` (`REJECTED_VERSIONS_KEY`, the ranges set aside) in its transaction, and the verified
θ and optimizer state are then committed again as the version after the highest ever committed (`_renumber`, an
event of kind `renumber`): the run goes on at that number, so no version names two θs, an update trained from a set
aside θ is never taken as on time (the coordinator refuses it, `UpdateIntake.check_meta`), and nothing keyed by
version mixes the two. A crash between the two steps renumbers at the next start (the ranges are kept).

A join number (a membership's data seed and the N of its id `<prefix>w<N>-…`) is never handed out twice in a run
either: each join's transaction stores the run's count of joins (`JOINS_KEY`, in `run_state`), which a restarted
coordinator resumes from (`joins`); a state dir of an older rcswarm, without it, resumes from the joins it recorded.

The metrics table is bounded: `add_metrics(rows, keep_rows)` deletes the oldest rows beyond the newest
`keep_rows` (`coordinator.max_metric_rows`) in the transaction that inserts. Row ids only grow, so
"the newest" is a rowid range and the delete touches only the rows it removes.

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
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from rcswarm.state.checkpoints import (
    RECYCLED_CHECKPOINT,
    Checkpoint,
    LedgerEntry,
    checkpoint_metadata,
    verify_checkpoint,
    write_checkpoint,
)
from rcswarm.state.errors import StoreError
from rcswarm.state.records import (
    Event,
    ForecastRecord,
    HeldOutRecord,
    MetricRow,
    RoundRecord,
    RoundsSummary,
    RunStepSums,
    WorkerRow,
    WorkerUsage,
    held_out_median,
)
from rcswarm.state.schema import (
    ADD_HELD_OUT_REPORT,
    AGGREGATE_TRAINED_SHAPES,
    AGGREGATES,
    AGGREGATES_VERSION,
    FORECAST_COLUMNS,
    FORECAST_COLUMNS_ADDED,
    FORECAST_COLUMNS_ADDED_READ,
    HAS_FORECASTS,
    HAS_HELD_OUT,
    HELD_OUT_COLUMNS,
    HELD_OUT_COLUMNS_ADDED,
    HELD_OUT_REPORTS_FROM_FIRST,
    HELD_OUT_REPORTS_OF,
    INSERT_METRIC,
    INT64_MAX,
    JOINED_DIGEST,
    JOINS_RECORDED,
    LEDGER_COLUMNS_ADDED,
    LEDGER_FROM_ROUNDS,
    METRIC_COLUMNS,
    METRIC_PAGE_COLUMNS,
    MISSING_HELD_OUT_REPORTS,
    MISSING_TRAINED_SHAPES,
    REPORTED,
    REPORTER_ROUNDS,
    ROUND_COLUMNS,
    ROUND_COLUMNS_ADDED,
    ROUND_LOSSES,
    ROUND_LOSSES_AT,
    ROUND_STEPS,
    ROUND_TIMES,
    RUN_CLOCK_START_READ,
    RUN_STEP_SUMS,
    SCHEMA,
    SCHEMA_VERSION,
    TRAINED_SHAPES,
    TRAINED_SHAPES_OF_ROWS,
    TRAINING_ROWS,
    WORKER_STEP_MEANS,
    WORKER_TOTALS,
    WORKER_USAGE,
)
from rcswarm.sync import tensor_stream
from rcswarm.sync.files import fsync_dir

log = logging.getLogger("rcswarm.state.store")

# The run_state key of the run's count of joins, a decimal integer: the number (data seed) of its newest join, written
# in that join's transaction (`record_join`'s `run_state`, coordinator/service.py `_store_join`), read at a start
# (`joins`), so that a restarted coordinator numbers on where the last one stopped.
JOINS_KEY = "joins"

# The run_state key of the versions a fallback set aside (JSON, [[first, last], ...] in the order they were): versions
# committed and served once, whose θ no longer exists in this run; never numbered again (`load_current`).
REJECTED_VERSIONS_KEY = "rejected_versions"

# A version's held-out loss is the median of its workers' first reports, of the first this many (`add_metrics`):
# every worker measures the same θ_v on the same held-out batches, so honest reports agree, and the median of up to
# 5 outvotes up to 2 wrong ones; a bound, since every worker of a large swarm may measure every kth version.
MAX_HELD_OUT_REPORTS = 5
# The event rows kept: once a write passes the newest MAX_EVENT_ROWS by EVENT_PRUNE_EVERY rows, that write deletes the
# oldest beyond MAX_EVENT_ROWS (a few hundred bytes a row: ~200 MB at most). A run's own events (joins, leaves, round
# decisions) stay far below it; a join token's holder joining and leaving in a loop (~800 a second on 2 cores)
# grew the table without bound.
MAX_EVENT_ROWS = 1_000_000
EVENT_PRUNE_EVERY = 4096
# The member_secrets rows kept (one a join, ~100 bytes: ~10 MB at most), pruned as the events are: a re-join names
# a membership within its worker's patience of losing it, far fewer joins back than this.
MAX_MEMBER_SECRET_ROWS = 100_000


# The tables `row_counts` counts: what a run records as it goes (a new run's state dir holds none of their rows).
ROW_COUNTED_TABLES = frozenset({"metrics", "events", "rounds", "forecasts", "held_out"})


def _checkpoint_order(path: Path) -> tuple[int, str]:
    """A checkpoint file's place in version order: v<version>.safetensors by the number (v100000000 after
    v99999999, where names compare the other way), other names after them."""
    digits = path.name.removeprefix("v").removesuffix(".safetensors")
    return (int(digits), path.name) if digits.isdigit() else (INT64_MAX, path.name)


def _orphan_of(metadata: Mapping[str, Any], run_id: str, committed: int) -> bool:
    """Whether a checkpoint file of `metadata` is what a crash mid-commit of run `run_id` leaves when `committed` is
    its committed version: its run (no run_id counts as the run's, as `verify_checkpoint` reads it), a version above."""
    version = str(metadata.get("version", ""))
    return metadata.get("run_id", run_id) == run_id and version.isdigit() and int(version) > committed


def _set_aside(metadata: Mapping[str, Any], run_id: str, rejected: Sequence[tuple[int, int]]) -> bool:
    """Whether a checkpoint file of `metadata` is of run `run_id` (no run_id counts as the run's) and of a version in
    one of the `rejected` ranges (first, last) a fallback set aside."""
    version = str(metadata.get("version", ""))
    return (metadata.get("run_id", run_id) == run_id and version.isdigit()
            and any(first <= int(version) <= last for first, last in rejected))


class StateStore:
    """One run's state dir: state.sqlite plus checkpoints/v<version>.safetensors.

    Threads and locks. `_lock` guards the writer connection: `get`, `joins`, `set_many`,
    `commit_version` (its SQLite transaction; the file is written before the lock is taken),
    `row_counts`, `committed_digest`, `reported`, `load_current` (but for its read of the ledger), `add_event`,
    `record_join`, `add_metrics`, `add_forecast` and `close` take it. `_read_lock` guards the read-only connection that every named read uses
    (`recent_rounds`, `rounds`, `round_steps`, `events`, `ledger`, `run_identity`, `joined_digest`,
    `newest_metric_rowid`, `metrics_since`, `metric_rows`, `worker_rows`, `worker_usage`,
    `worker_step_means`, `run_step_sums`, `training_rows`, `run_clock_start`, `round_times`, `rounds_summary`,
    `mean_training_loss`, `round_durations`, `round_duration_histogram`, `round_losses`, `forecasts`,
    `held_out_losses`), so a read never waits for a write, nor a write for a read. Any thread may call any method;
    the two locks are never held together, except by `close`.
    """

    def __init__(self, state_dir: str | Path, keep_checkpoints: int = 2, durable: bool = True) -> None:
        self._paths(state_dir, keep_checkpoints, durable)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        with self._errors("cannot open it for writing"):
            self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
            try:
                self._refuse_newer_schema()
                self._set_wal()
                self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                self._db.executescript(SCHEMA)
                self._add_columns("checkpoints", LEDGER_COLUMNS_ADDED)
                self._upgrade()
                self._add_columns("rounds", ROUND_COLUMNS_ADDED)
                self._add_columns("forecasts", FORECAST_COLUMNS_ADDED)
                self._add_columns("held_out", HELD_OUT_COLUMNS_ADDED)
                self._keep_first_held_out_reports()
                self._enter_trained_shapes()
                self._reader = self._connect_read_only(timeout_s=5.0)
            except BaseException:
                self._db.close()
                raise
        self._schema_version = SCHEMA_VERSION
        self._read_lock = threading.Lock()

    def _paths(self, state_dir: str | Path, keep_checkpoints: int, durable: bool) -> None:
        self.state_dir = Path(state_dir)
        self.checkpoint_dir = self.state_dir / "checkpoints"
        self.keep_checkpoints = keep_checkpoints
        self.durable = durable
        self.db_path = self.state_dir / "state.sqlite"
        self._lock = threading.Lock()
        # The columns each table read so far has in this state dir, read once a table (`_present`).
        self._columns: dict[str, frozenset[str]] = {}
        # Seconds of the last commit_version's pieces (its thread replaces the dict; readers get a snapshot).
        self.last_commit_seconds: dict[str, float] = {}
        # Checkpoint files the ledger does not record that pruning left in place, each warned about once.
        self._kept_unrecorded: set[str] = set()

    @contextlib.contextmanager
    def _errors(self, failed: str) -> Iterator[None]:
        """Raise a sqlite3 error inside as a StoreError naming the database and what `failed`."""
        try:
            yield
        except sqlite3.Error as error:
            full = getattr(error, "sqlite_errorname", "") == "SQLITE_FULL"
            raise StoreError(f"{self.db_path}: {failed}: {error}", full=full) from error

    def _connect_read_only(self, timeout_s: float) -> sqlite3.Connection:
        """A read-only connection. A WAL database whose `-shm` file is gone (its last writer exited cleanly) needs to
        create it even to read; in a state dir this process cannot write (a read-only mount, an archived run) that
        fails, and no writer can be running there, so it is read as immutable instead (a log line says so)."""
        uri = self.db_path.resolve().as_uri()

        def connect(query: str) -> sqlite3.Connection:
            return sqlite3.connect(f"{uri}?{query}", uri=True, timeout=timeout_s, check_same_thread=False,
                                   isolation_level=None)

        db = connect("mode=ro")
        try:
            db.execute("PRAGMA user_version").fetchone()  # opens the file (and its -shm) now
            return db
        except sqlite3.OperationalError:
            db.close()
            if os.access(self.state_dir, os.W_OK):
                raise
        log.info("state dir %s cannot be written here: read as immutable (no coordinator can be serving it)",
                 self.state_dir)
        return connect("mode=ro&immutable=1")

    def _set_wal(self, timeout_s: float = 10.0) -> None:
        """Constructor only: WAL journaling. Switching a new database to WAL needs it alone; another process opening
        the same fresh state dir at that moment gets "database is locked" at once (no busy wait), so ask again
        until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _refuse_newer_schema(self) -> None:
        """Constructor only, before anything is written: StoreError for a state dir a newer rcswarm wrote (its
        PRAGMA user_version above SCHEMA_VERSION), whose tables this code would write wrong."""
        found = self._db.execute("PRAGMA user_version").fetchone()[0]
        if found > SCHEMA_VERSION:
            raise StoreError(f"{self.db_path}: schema version {found}, newer than this rcswarm's {SCHEMA_VERSION}: the "
                             "state dir was written by a newer rcswarm; serve it with that version (`rcswarm status` "
                             "and `rcswarm fit` of this one can still read it)")

    def _upgrade(self) -> None:
        """Constructor only: build the ledger and the aggregates of a state dir written before they existed, and
        mark it SCHEMA_VERSION (once, whoever opens the state dir first: the version is read again inside the write
        transaction)."""
        if self._db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        self._db.execute("BEGIN IMMEDIATE")
        found = self._db.execute("PRAGMA user_version").fetchone()[0]
        if found >= SCHEMA_VERSION:
            self._db.execute("COMMIT")
            return
        if found < AGGREGATES_VERSION:
            self._db.execute(LEDGER_FROM_ROUNDS)
            self._enter_committed()
            for statement in AGGREGATES:
                self._db.execute(statement, (0,))
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._db.execute("COMMIT")

    def _enter_committed(self) -> None:
        """Constructor only, in `_upgrade`'s transaction: a state dir from before the ledger whose committed checkpoint
        got no ledger row from its rounds (one still at version 0: no round produced it) gets one, with the digest of
        the parameters the file holds now (no digest was recorded for it; `rest_blake3` NULL, so it is verified over
        θ, its metadata and finite values, as every version committed before the ledger). A file that cannot be read
        gets none, and `load_current` names it."""
        stored = dict(self._db.execute(
            "SELECT key, value FROM run_state WHERE key IN ('checkpoint', 'version', 'param_names')").fetchall())
        name, claimed = stored.get("checkpoint"), stored.get("version")
        if name is None or claimed is None or not claimed.isdigit():
            return
        if self._db.execute("SELECT 1 FROM checkpoints WHERE version = ?", (int(claimed),)).fetchone() is not None:
            return
        path = self.checkpoint_dir / name
        names = json.loads(stored.get("param_names") or "[]")
        try:
            with safe_open(str(path), framework="pt") as handle:
                version = (handle.metadata() or {}).get("version")
                params = {key: handle.get_tensor(key) for key in names} if version == claimed and names else None
        except (OSError, SafetensorError, ValueError, KeyError, RuntimeError) as error:
            log.warning("state dir %s: %s, committed before the ledger, cannot be read to enter it (%s)",
                        self.state_dir, path, error)
            return
        if params is None:
            return
        self._db.execute("INSERT INTO checkpoints (version, file, param_sha256, committed_at) VALUES (?, ?, ?, NULL)",
                         (int(claimed), name, tensor_stream.params_sha256(params).hex()))
        log.info("state dir %s: %s (version %s), committed before the ledger with no round that recorded its digest, "
                 "is entered in the ledger with the digest of its parameters as they are now", self.state_dir, name,
                 claimed)

    def _add_columns(self, table: str, added: Mapping[str, str]) -> None:
        """Constructor only: add the columns of `added` (name -> declaration) that `table` lacks in this state dir.
        The columns present are read inside the write transaction, so two processes opening a fresh state dir at
        once (a coordinator starting, `rcswarm status` beside it) do not both add a column."""
        if set(added) <= {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            present = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for column, declaration in added.items():
                if column not in present:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _keep_first_held_out_reports(self) -> None:
        """Constructor only: a state dir written before each worker's held-out report was kept holds a version's
        first report in `held_out` alone; enter it among the version's reports (read again inside the write
        transaction, like `_add_columns`), so later reports of that version take their median with it."""
        if not self._db.execute(MISSING_HELD_OUT_REPORTS).fetchone()[0]:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(HELD_OUT_REPORTS_FROM_FIRST)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _enter_trained_shapes(self) -> None:
        """Constructor only: a state dir written before `trained_shapes` existed gets the shapes of the training rows
        it holds (read again inside the write transaction), or the rows `max_metric_rows` deletes later take their
        shapes with them."""
        if not self._db.execute(MISSING_TRAINED_SHAPES).fetchone()[0]:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._db.execute(MISSING_TRAINED_SHAPES).fetchone()[0]:
                self._db.execute(AGGREGATE_TRAINED_SHAPES, (0,))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _present(self, table: str) -> frozenset[str]:
        """The columns of `table` in this state dir (an old one opened read-only may lack the added ones)."""
        if table not in self._columns:
            self._columns[table] = frozenset(row[1] for row in self._read(f"PRAGMA table_info({table})"))
        return self._columns[table]

    def _round_select(self) -> str:
        """The columns of a RoundRecord as this state dir can give them (an old one read-only: defaults)."""
        present = self._present("rounds")
        added = [c if c in present else ("''" if c == "aggregation" else "0") for c in ROUND_COLUMNS_ADDED]
        return ", ".join((*ROUND_COLUMNS, *added))

    @classmethod
    def open_read_only(cls, state_dir: str | Path, timeout_s: float = 5.0) -> StateStore:
        """An existing state dir, opened for reads only (a live coordinator may keep writing it).

        Raises FileNotFoundError naming the path when the directory holds no state.sqlite, and
        StoreError when it is not a database. A state dir a coordinator older than the aggregate
        tables wrote last opens, but the reads that need them raise ValueError saying so.
        """
        store = cls.__new__(cls)
        store._paths(state_dir, keep_checkpoints=0, durable=False)
        if not store.db_path.is_file():
            raise FileNotFoundError(f"{store.db_path}: no such file; expected a coordinator state dir holding state.sqlite")
        with store._errors("cannot open it for reading"):
            store._db = store._reader = store._connect_read_only(timeout_s)
            try:
                store._schema_version = store._db.execute("PRAGMA user_version").fetchone()[0]
            except BaseException:
                store._db.close()
                raise
        store._read_lock = store._lock
        return store

    def _read_aggregates(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A read of the aggregate tables; ValueError for a state dir whose tables predate them."""
        if self._schema_version < AGGREGATES_VERSION:
            raise ValueError(f"{self.db_path}: schema version {self._schema_version}, expected {AGGREGATES_VERSION} or "
                             "later: written by an older coordinator; start the coordinator on this state dir once to "
                             "bring it up to date")
        return self._read(sql, params)

    @contextlib.contextmanager
    def _writer(self, failed: str = "cannot write it") -> Iterator[sqlite3.Connection]:
        """The writer connection under `_lock`; its sqlite3 errors leave as StoreError saying what `failed`. A
        transaction an error left open is rolled back (SQLite itself rolls back some, e.g. on a full disk), so
        nothing is half-applied and the next write starts clean."""
        with self._lock, self._errors(failed):
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._reader is not self._db:
                with self._read_lock:
                    self._reader.close()
            self._db.close()

    def get(self, key: str) -> str | None:
        """The run_state value of `key` (None when unset), through the writer connection: what this store last wrote."""
        with self._writer("cannot read it") as db:
            row = db.execute("SELECT value FROM run_state WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def joins(self, worker_prefix: str = "") -> int:
        """The run's count of joins: the largest join number handed out so far, which the next join's exceeds (takes
        `_lock`; a coordinator's start). The larger of `JOINS_KEY` and what the joins recorded say (`JOINS_RECORDED`:
        the join rows' count or the largest number their ids of `worker_prefix` name, whichever is larger; 0 for
        none): a state dir of an older rcswarm has no key, and one an older rcswarm served after this one has a key
        behind its joins (a review found seeds handed out twice that way). A stored value that is not a count is
        logged (WARNING) and read as absent."""
        head = f"{worker_prefix}w"
        with self._writer("cannot read it") as db:
            row = db.execute("SELECT value FROM run_state WHERE key = ?", (JOINS_KEY,)).fetchone()
            recorded = db.execute(JOINS_RECORDED, {"head": head, "length": len(head), "start": len(head) + 1}).fetchone()
        recorded_count = max(int(recorded[0] or 0), 0)
        if row is not None and str(row[0]).isascii() and str(row[0]).isdigit():
            # Both: an older rcswarm that served the state dir meanwhile numbered its joins without the key.
            return max(int(row[0]), recorded_count)
        if row is not None:
            log.warning("%s: run_state %s = %r is not a count of joins: resuming from the joins recorded (%d)",
                        self.db_path, JOINS_KEY, row[0], recorded_count)
        return recorded_count

    def row_counts(self, *tables: str) -> dict[str, int]:
        """The number of rows in each of `tables` (of ROW_COUNTED_TABLES), through the writer connection; ValueError
        for another table."""
        unknown = sorted(set(tables) - ROW_COUNTED_TABLES)
        if unknown:
            raise ValueError(f"row_counts of tables {unknown}: expected some of {sorted(ROW_COUNTED_TABLES)}")
        with self._writer("cannot read it") as db:
            return {table: int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]) for table in tables}

    def set_many(self, values: Mapping[str, str]) -> None:
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO run_state VALUES (?, ?)", list(values.items()))
            db.execute("COMMIT")

    def unset(self, *keys: str) -> None:
        """Remove `keys` from run_state in one transaction (a key not set is no error): `get` reads None again."""
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("DELETE FROM run_state WHERE key = ?", [(key,) for key in keys])
            db.execute("COMMIT")

    def record_run_state(self, kind: str, reason: str, now: float, values: Mapping[str, str] | None = None,
                         unset: Sequence[str] = ()) -> None:
        """A change of the run's state with the run-wide event row that says why, in one transaction, so that a
        failed write (a full disk) leaves neither: the `values` set (`set_many`'s), the keys of `unset` removed
        (`unset`'s) and the event (`kind`, `reason`) at `now` (`add_event`'s; a run's stop, or its stop lifted)."""
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            if values:
                db.executemany("INSERT OR REPLACE INTO run_state VALUES (?, ?)", list(values.items()))
            db.executemany("DELETE FROM run_state WHERE key = ?", [(key,) for key in unset])
            self._insert_event(db, "", kind, reason, now)
            db.execute("COMMIT")

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
        reporters: Mapping[str, int] | None = None,
    ) -> None:
        """Persist a version atomically: checkpoint file first, then the SQLite commit point.

        `params` are in the order pulls serve them; their digest is `param_sha256`, else the
        round record's, else computed here while the file is written (`write_checkpoint`: one pass
        over the tensors' memory, no copies, one fsync), and the round record gets it. It enters the
        ledger `load_current` verifies against (`committed_digest`). `run_state` (key -> value) and `events`
        ((worker_id, kind, reason, time) each, as `add_event`) enter the same SQLite transaction: one commit
        point and one fsync for all of the close's rows. So do `reporters` (worker_id -> the newest base version of
        its updates the round counted; with a round record only), the memberships whose update landed in the round
        (`reported`), and the reporters of rounds older than the newest REPORTER_ROUNDS are deleted there.
        """
        if reporters and round_record is None:
            raise ValueError(f"reporters = {sorted(reporters)} given for version {version} without a round record: "
                             "they name the round whose updates counted")
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
        digest = given if computed.params is None else computed.params.hex()
        if round_record is not None:
            round_record = dataclasses.replace(round_record, param_sha256=digest)
        written = time.perf_counter()
        if self.durable:
            with open(partial, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(partial, final)
        if self.durable:
            fsync_dir(self.checkpoint_dir)
        synced = time.perf_counter()
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT OR REPLACE INTO run_state VALUES (?, ?)",
                [*(run_state or {}).items(), ("version", str(version)), ("checkpoint", name), ("run_id", run_id)],
            )
            db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                           [(now, worker_id, kind, reason) for worker_id, kind, reason, now in events])
            self._prune_events(db, len(events))
            db.execute("INSERT OR REPLACE INTO checkpoints (version, file, param_sha256, committed_at, rest_blake3) "
                       "VALUES (?, ?, ?, ?, ?)", (version, name, digest, time.time(), computed.rest.hex()))
            if round_record is not None:
                r = round_record
                marks = ", ".join("?" * (len(ROUND_COLUMNS) + 1 + len(ROUND_COLUMNS_ADDED)))
                db.execute(
                    f"INSERT OR REPLACE INTO rounds ({', '.join(ROUND_COLUMNS)}, checkpoint, "
                    f"{', '.join(ROUND_COLUMNS_ADDED)}) VALUES ({marks})",
                    (r.version, r.opened_at, r.closed_at, r.reports, r.tokens, r.close_reason,
                     r.update_norm, r.param_sha256, name, r.clipped, r.dropped, r.aggregation, r.steps),
                )
                if reporters:
                    db.executemany("INSERT OR REPLACE INTO round_reporters VALUES (?, ?, ?)",
                                   [(r.version, worker_id, base) for worker_id, base in sorted(reporters.items())])
                    db.execute("DELETE FROM round_reporters WHERE version <= ?", (r.version - REPORTER_ROUNDS,))
            db.execute("COMMIT")
        self._prune_checkpoints(keep=name)
        self.last_commit_seconds = {"write + digest" if computed.params is not None else "write": written - started,
                                    "fsync": synced - written, "sqlite": time.perf_counter() - synced}

    def committed_digest(self, version: int) -> bytes:
        """The parameters' SHA-256 the ledger recorded when `version` was committed (takes `_lock`);
        ValueError naming the version when none was."""
        with self._writer("cannot read it") as db:
            row = db.execute("SELECT param_sha256 FROM checkpoints WHERE version = ?", (version,)).fetchone()
        if row is None:
            raise ValueError(f"version {version} was never committed: the checkpoints ledger has no digest for it")
        return bytes.fromhex(row[0])

    def reported(self, worker_id: str) -> tuple[int, int] | None:
        """(round version, base version) of the newest committed round that counted an update of membership
        `worker_id` (its newest base version there), or None when none of the kept rounds did (takes `_lock`: what
        this store committed). A restarted coordinator asks it for the membership a re-join names, whose update may
        have landed in the last round closed before the restart though its answer never reached the worker."""
        if not worker_id:
            return None
        with self._writer("cannot read it") as db:
            row = db.execute(REPORTED, (worker_id,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def joined_digest(self, worker_id: str) -> bytes | None:
        """The SHA-256 of the worker secret membership `worker_id` got at its join (`record_join`), or None when this
        store has none (an id of another run or none, a membership of an older rcswarm, one pruned) (takes
        `_read_lock`: the read connection, which sees every committed join and never waits for a commit under way,
        so that a slow disk's commit in one run of a sweep does not hold up a re-join placed in another). A
        coordinator honours a re-join naming a membership no longer in its memory only with the secret of this digest
        (coordinator/service.py `_claimed`)."""
        if not worker_id:
            return None
        rows = self._read(JOINED_DIGEST, (worker_id,))
        return bytes.fromhex(rows[0][0]) if rows else None

    def _prune_checkpoints(self, keep: str) -> None:
        """Remove the orphans of a crash mid-commit (`_crash_orphans`) and all but the newest `keep_checkpoints`
        recorded files besides `keep`, the committed one (takes `_lock` for the ledger). The first of them becomes
        RECYCLED_CHECKPOINT, which the next commit overwrites. A file the ledger does not record that is no such
        orphan stays where it is, with one WARNING."""
        present = sorted((p for p in self.checkpoint_dir.glob("v*.safetensors") if p.name != keep),
                         key=_checkpoint_order)
        marks = ", ".join("?" * len(present))
        with self._writer() as db:
            recorded = {row[0] for row in db.execute(
                f"SELECT file FROM checkpoints WHERE file IN ({marks})", [p.name for p in present])}
        files = [p for p in present if p.name in recorded]
        stale = files[: max(0, len(files) - self.keep_checkpoints)]
        orphans = self._crash_orphans([p for p in present if p.name not in recorded], keep)
        doomed = stale + orphans + list(self.checkpoint_dir.glob(".*.partial"))
        if doomed:
            os.replace(doomed.pop(0), self.checkpoint_dir / RECYCLED_CHECKPOINT)
        for path in doomed:
            path.unlink(missing_ok=True)

    def _crash_orphans(self, unrecorded: list[Path], keep: str) -> list[Path]:
        """Of the checkpoint files the ledger does not record, those a crash between a commit's rename and its
        SQLite transaction left: their metadata names this run (or no run, as files from before it was recorded)
        and a version above `keep`'s, the committed one. A file of this run of a version a fallback set aside
        (`rejected_versions`), left by a fallback killed between its commit and its renames, is set aside now as
        `<name>.rejected`, as the fallback would have. The others (another run's files, older versions of this run
        whose ledger was lost, unreadable files) are kept, each named once in a WARNING per store."""
        if not unrecorded:
            return []
        run_id = self.get("run_id") or ""
        committed = _checkpoint_order(Path(keep))[0]
        rejected = self.rejected_versions()
        orphans, kept = [], []
        for path in unrecorded:
            metadata, unreadable = checkpoint_metadata(path)
            if metadata is not None and _orphan_of(metadata, run_id, committed):
                orphans.append(path)
            elif metadata is not None and _set_aside(metadata, run_id, rejected):
                os.replace(path, path.with_name(f"{path.name}.rejected"))  # a fallback killed before its renames
            elif path.name not in self._kept_unrecorded:
                self._kept_unrecorded.add(path.name)
                found = unreadable or f"run {metadata.get('run_id')!r} version {metadata.get('version')!r}"
                kept.append(f"{path.name} ({found})")
        if kept:
            log.warning("state dir %s: checkpoint files the ledger does not record are left in place, not being a "
                        "crash's orphan of run %r above version %d: %s", self.state_dir, run_id, committed,
                        ", ".join(kept))
        return orphans

    def load_current(self) -> Checkpoint | None:
        """The committed version, verified; None for a new state dir.

        When the committed checkpoint or `run_state.version` fails verification, falls back to
        the newest kept checkpoint that verifies: logs a WARNING, adds a `fallback` event, makes
        that version current and sets the files that failed aside as `<name>.rejected`. Raises
        ValueError naming every file and what is wrong with it when none verifies. When versions above
        the verified one were committed (and so served), they are set aside (`rejected_versions`) and the
        verified θ and state are committed again as the version after the highest ever committed
        (`_renumber`): the checkpoint returned carries that version.
        """
        if self.get("checkpoint") is None:
            return None
        entry, checkpoint, problems = self.newest_verified()
        if entry.rest_blake3 is None:
            log.info("state dir %s: %s was committed before the ledger recorded the digest of its optimizer state: "
                     "verified over its parameters only (every commit from now on records both)", self.state_dir,
                     entry.file)
        if problems:
            self._fall_back(entry, problems)
        highest = max((last for _, last in self.rejected_versions()), default=-1)
        if entry.version < highest:
            return self._renumber(entry, checkpoint, highest)
        self._prune_checkpoints(keep=entry.file)
        return checkpoint

    def rejected_versions(self) -> list[tuple[int, int]]:
        """The ranges of versions (first, last) a fallback set aside in this run, in the order it did: committed and
        served once, their θ failed verification or followed one that did; no version in them is current again."""
        stored = self.get(REJECTED_VERSIONS_KEY)
        return [(int(first), int(last)) for first, last in json.loads(stored)] if stored else []

    def newest_verified(self) -> tuple[LedgerEntry, Checkpoint, list[str]]:
        """The newest kept checkpoint that verifies against the ledger, its entry, and what is wrong with the committed
        one where it is not that (empty when the committed version verifies); reads only. ValueError naming every
        file and what is wrong with it when none verifies, or when the state dir holds no run."""
        name = self.get("checkpoint")
        if name is None:
            raise ValueError(f"state dir {self.state_dir} holds no committed checkpoint")
        claimed = self.get("version")
        run_id = self.get("run_id") or ""
        names = json.loads(self.get("param_names") or "[]")
        entries = self.ledger()[::-1]
        problems: list[str] = []
        if name not in {entry.file for entry in entries}:
            problems.append(f"{self.checkpoint_dir / name}: run_state names it but the checkpoints ledger records no digest for it")
        for entry in entries:
            path = self.checkpoint_dir / entry.file
            if not path.exists():
                if entry.file == name:
                    problems.append(f"{path}: the committed checkpoint is missing")
                continue
            checkpoint, wrong = verify_checkpoint(path, entry, names, run_id)
            if checkpoint is None:
                problems.append(f"{path}: {wrong}")
                continue
            if (entry.file, str(entry.version)) != (name, claimed):
                problems.append(f"run_state.version = {claimed!r}, checkpoint = {name!r}, but the newest checkpoint that "
                                f"verifies is {entry.file} (version {entry.version})")
            return entry, checkpoint, problems
        raise ValueError(f"state dir {self.state_dir}: no checkpoint verifies, refusing to serve unverified parameters: "
                         + "; ".join(problems or [f"the checkpoints ledger is empty though run_state names {name}"]))

    def _fall_back(self, entry: LedgerEntry, problems: list[str]) -> None:
        """Make the verified `entry` current, set the newer files aside and say why (log, events). The versions
        above it the ledger records were committed and served: their range joins `rejected_versions` in the same
        transaction, so that `load_current` numbers the run past them even after a crash that follows."""
        with self._writer() as db:
            rows = db.execute("SELECT version, file FROM checkpoints WHERE version > ? ORDER BY version",
                              (entry.version,)).fetchall()
        newer = [file for _, file in rows]
        rejected = self.rejected_versions()
        if rows:
            rejected.append((entry.version + 1, rows[-1][0]))
        highest = max((last for _, last in rejected), default=-1)
        reason = f"resuming at version {entry.version} from {entry.file}"
        if entry.version < highest:
            reason += (f" as version {highest + 1} (versions {', '.join(f'{a}..{b}' for a, b in rejected)} set aside: "
                       "committed and served before, never numbered again)")
        reason += ": " + "; ".join(problems)
        log.warning("state dir %s: %s", self.state_dir, reason)
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO run_state VALUES (?, ?)",
                           [("version", str(entry.version)), ("checkpoint", entry.file),
                            (REJECTED_VERSIONS_KEY, json.dumps(rejected))])
            db.execute("DELETE FROM checkpoints WHERE version > ?", (entry.version,))
            # The updates of the rounds that produced the versions set aside were in a θ this run no longer has.
            db.execute("DELETE FROM round_reporters WHERE version >= ?", (entry.version,))
            self._insert_event(db, "", "fallback", reason, time.time())
            db.execute("COMMIT")
        for file in newer:
            path = self.checkpoint_dir / file
            if path.exists():
                os.replace(path, path.with_name(f"{file}.rejected"))

    def _renumber(self, entry: LedgerEntry, checkpoint: Checkpoint, highest: int) -> Checkpoint:
        """Commit the verified `checkpoint` (of `entry`) again as version `highest` + 1, the version after the highest
        this run ever committed, with an event of kind `renumber`; that checkpoint. Its θ and optimizer state are the
        verified tensors unchanged (the parameters' digest is the ledger's; the file's metadata names the new version),
        so pulls serve the same θ under a number no worker holds another θ for."""
        version = highest + 1
        reason = (f"θ of version {entry.version} ({entry.file}) resumes as version {version}: versions "
                  f"{', '.join(f'{a}..{b}' for a, b in self.rejected_versions())} were set aside by a fallback and "
                  "are not reused")
        log.warning("state dir %s: %s", self.state_dir, reason)
        self.commit_version(self.get("run_id") or "", version, checkpoint.params, checkpoint.state, None,
                            param_sha256=bytes.fromhex(entry.param_sha256),
                            events=[("", "renumber", reason, time.time())])
        return dataclasses.replace(checkpoint, version=version)

    def add_event(self, worker_id: str, kind: str, reason: str, now: float | None = None) -> None:
        """Record an event row (`now`: time.time() when None); past MAX_EVENT_ROWS the oldest rows go
        (`_prune_events`)."""
        with self._writer() as db:
            self._insert_event(db, worker_id, kind, reason, time.time() if now is None else now)

    @classmethod
    def _insert_event(cls, db: sqlite3.Connection, worker_id: str, kind: str, reason: str, now: float) -> None:
        """One event row, on the writer connection (its caller's transaction, if any), then `_prune_events`."""
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (now, worker_id, kind, reason))
        cls._prune_events(db, 1)

    @classmethod
    def _prune_events(cls, db: sqlite3.Connection, written: int) -> None:
        """After `written` event rows were inserted: keep the newest MAX_EVENT_ROWS (`_prune_rows`)."""
        cls._prune_rows(db, "events", MAX_EVENT_ROWS, written)

    @staticmethod
    def _prune_rows(db: sqlite3.Connection, table: str, keep: int, written: int) -> None:
        """After `written` rows were inserted into `table` (the newest rowids): each time the newest rowid passes a
        multiple of EVENT_PRUNE_EVERY beyond `keep`, delete the rows older than the newest `keep` (rowids only grow:
        nothing deletes the newest row)."""
        if written <= 0:
            return
        row = db.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0
        if row > keep and row // EVENT_PRUNE_EVERY != (row - written) // EVENT_PRUNE_EVERY:
            db.execute(f"DELETE FROM {table} WHERE rowid <= ?", (row - keep,))

    def record_join(self, worker_id: str, events: Sequence[tuple[str, str]], now: float,
                    reported: tuple[int, int] | None = None, run_state: Mapping[str, str] | None = None,
                    secret_sha256: bytes = b"") -> None:
        """What a join of membership `worker_id` stores, in one transaction, so that a failed write (a full disk)
        leaves none of it: its `events` ((kind, reason) rows at `now`); the SHA-256 of its worker secret
        (`secret_sha256`, never the secret; `joined_digest`), when given; with `reported` = (round version, base
        version) of an update a committed round counted, which `worker_id` takes over (a re-join naming the membership
        that delivered it, `reported`), `worker_id` entered among that round's reporters, so that a coordinator
        restarted later knows `worker_id` delivered it too; and the `run_state` values the join changed
        (`set_many`'s)."""
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            for kind, reason in events:
                self._insert_event(db, worker_id, kind, reason, now)
            if secret_sha256:
                db.execute("INSERT OR REPLACE INTO member_secrets VALUES (?, ?)", (worker_id, secret_sha256.hex()))
                self._prune_rows(db, "member_secrets", MAX_MEMBER_SECRET_ROWS, 1)
            if reported is not None:
                round_version, base_version = reported
                db.execute("INSERT OR REPLACE INTO round_reporters VALUES (?, ?, ?)",
                           (round_version, worker_id, base_version))
            if run_state:
                db.executemany("INSERT OR REPLACE INTO run_state VALUES (?, ?)", list(run_state.items()))
            db.execute("COMMIT")

    def add_metrics(self, rows: Iterable[tuple[Any, ...]], keep_rows: int = 0,
                    held_out: Iterable[tuple[Any, ...]] = ()) -> int:
        """Insert metric rows (METRIC_COLUMNS each), every one of them, and fold them into the aggregate tables, in
        one transaction (`_insert_metrics`); how many were stored."""
        return sum(self._insert_metrics(rows, keep_rows, held_out, once_per_step=False))

    def add_new_metrics(self, rows: Iterable[tuple[Any, ...]], keep_rows: int = 0,
                        held_out: Iterable[tuple[Any, ...]] = ()) -> list[bool]:
        """`add_metrics` for a coordinator's ReportMetrics, and whether each row was stored: a trained step's row
        (tokens > 0) whose (worker, version, step) a stored row, or an earlier one of `rows`, already has is not
        (`INSERT_METRIC`: a report sent again, whose loss would count twice in its step's mean)."""
        return self._insert_metrics(rows, keep_rows, held_out, once_per_step=True)

    def _insert_metrics(self, rows: Iterable[tuple[Any, ...]], keep_rows: int, held_out: Iterable[tuple[Any, ...]],
                        once_per_step: bool) -> list[bool]:
        """Insert metric rows (METRIC_COLUMNS each) and fold them into the aggregate tables, in one transaction, and
        whether each row was stored (with `once_per_step`, a repeated trained step's is not: `add_new_metrics`); with
        `keep_rows` > 0 the same transaction deletes the oldest rows beyond the newest `keep_rows` (the
        aggregates keep what they counted; SQLite reuses the freed pages, so the file stops growing). `held_out`:
        the held-out losses the rows carried (HELD_OUT_COLUMNS each), in the same one: each worker's first report of
        a version is kept, up to MAX_HELD_OUT_REPORTS of a version, and the version's row in `held_out` becomes their
        median (`records.held_out_median`)."""
        rows = list(rows)
        held_out = list(held_out)
        key = [METRIC_COLUMNS.index(name) for name in ("tokens", "worker_id", "version", "step")]
        with self._writer() as db:
            db.execute("BEGIN IMMEDIATE")
            before = db.execute("SELECT COALESCE(MAX(rowid), 0) FROM metrics").fetchone()[0]
            if once_per_step:
                stored = [db.execute(INSERT_METRIC, (*row, *(row[i] for i in key))).rowcount > 0 for row in rows]
            else:
                db.executemany(f"INSERT INTO metrics VALUES ({', '.join('?' * len(METRIC_COLUMNS))})", rows)
                stored = [True] * len(rows)
            reported = {report[0] for report in held_out
                        if db.execute(ADD_HELD_OUT_REPORT, (*report, report[0], MAX_HELD_OUT_REPORTS)).rowcount > 0}
            columns = (*HELD_OUT_COLUMNS, *HELD_OUT_COLUMNS_ADDED)
            for version in sorted(reported):
                median = held_out_median([HeldOutRecord(*row) for row in db.execute(HELD_OUT_REPORTS_OF, (version,))])
                db.execute(f"INSERT OR REPLACE INTO held_out ({', '.join(columns)}) VALUES "
                           f"({', '.join('?' * len(columns))})", dataclasses.astuple(median))
            for statement in AGGREGATES:
                db.execute(statement, (before,))
            newest = before + sum(stored)
            if keep_rows > 0 and newest > keep_rows:
                db.execute("DELETE FROM metrics WHERE rowid <= ?", (newest - keep_rows,))
            db.execute("COMMIT")
        return stored

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock, self._errors("cannot read it"):
            return self._reader.execute(sql, params).fetchall()

    def recent_rounds(self, limit: int) -> list[RoundRecord]:
        """The newest `limit` closed rounds, oldest first, with the aggregation's counts."""
        rows = self._read(f"SELECT {self._round_select()} FROM rounds ORDER BY version DESC LIMIT ?", (limit,))
        return [RoundRecord(*row) for row in reversed(rows)]

    def rounds(self) -> list[RoundRecord]:
        """Every closed round, oldest first."""
        return [RoundRecord(*row) for row in self._read(f"SELECT {self._round_select()} FROM rounds ORDER BY version")]

    def round_steps(self) -> dict[int, int]:
        """version -> the steps its closed round trained, for the rounds that recorded them (none before
        `rounds.steps` existed, nor in a hivemind swarm's state dir, which has no rounds)."""
        if "steps" not in self._present("rounds"):
            return {}
        return dict(self._read(ROUND_STEPS))

    def events(self, *kinds: str) -> list[Event]:
        """The events of the given kinds (every event when none is given), in the order they were recorded."""
        where = f" WHERE kind IN ({', '.join('?' * len(kinds))})" if kinds else ""
        rows = self._read(f"SELECT time, worker_id, kind, reason FROM events{where} ORDER BY rowid", kinds)
        return [Event(*row) for row in rows]

    def ledger(self) -> list[LedgerEntry]:
        """The committed versions the `checkpoints` ledger records, oldest first (`rest_blake3` None where it
        was not recorded, or where an older state dir opened read-only lacks the column)."""
        present = {row[1] for row in self._read("PRAGMA table_info(checkpoints)")}
        rest = "rest_blake3" if "rest_blake3" in present else "NULL"
        rows = self._read(f"SELECT version, file, param_sha256, {rest} FROM checkpoints ORDER BY version")
        return [LedgerEntry(*row) for row in rows]

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

    def metric_rows(self) -> list[MetricRow]:
        """Every metric row in the order it arrived (a full scan: for commands and tests, not per request)."""
        rows = self._read(f"SELECT {', '.join(METRIC_COLUMNS)} FROM metrics ORDER BY rowid")
        return [MetricRow(*row) for row in rows]

    def worker_rows(self, run_id: str) -> list[WorkerRow]:
        """Per worker of `run_id`: tokens, cumulative bytes, wall-time span, row count and its newest row."""
        return [
            WorkerRow(worker_id, int(tokens or 0), int(sent or 0), int(received or 0), first or 0.0, last or 0.0,
                      int(count), int(step or 0), int(seq_len or 0), loss)
            for worker_id, tokens, sent, received, first, last, count, step, seq_len, loss
            in self._read_aggregates(WORKER_TOTALS, (run_id,))
        ]

    def worker_usage(self) -> list[WorkerUsage]:
        """Per worker over all metric rows: the maxima of its cumulative counters, its tokens, first and last arrival,
        the first and last of its own wall clock."""
        return [
            WorkerUsage(worker_id, sent or 0, received or 0, sync or 0.0, compute or 0.0, tokens or 0, first, last,
                        first_wall or 0.0, last_wall or 0.0)
            for worker_id, sent, received, sync, compute, tokens, first, last, first_wall, last_wall
            in self._read_aggregates(WORKER_USAGE)
        ]

    def worker_step_means(self, run_id: str) -> list[tuple[Any, ...]]:
        """(seq_len, step, mean loss, mean wall_time) of `run_id` on the workers' own counters and clocks."""
        return self._read_aggregates(WORKER_STEP_MEANS, (run_id,))

    def run_step_sums(self) -> RunStepSums:
        """The training rows' loss and coordinator seconds summed per (seq_len, version, step within the round),
        for observe/ to place on the run's own step (workers that moved here from another run keep their own
        step counters and clocks, which these ignore)."""
        rows = self._read_aggregates(RUN_STEP_SUMS)
        first = rows[0][6] if rows else None
        return RunStepSums(first, [row[:6] for row in rows])

    def training_rows(self) -> list[tuple[str, int, int, int, float, float]]:
        """(worker_id, version, step within the round from 0, seq_len, loss, seconds since `run_clock_start`), in
        arrival order; the seconds count the time between a resumed run's launches too (observe/ takes it out)."""
        return self._read(TRAINING_ROWS)

    def run_clock_start(self) -> float | None:
        """The coordinator's time of the run's first training row, where the run's clock (`training_rows`) starts;
        None without a training row."""
        return self._read(RUN_CLOCK_START_READ)[0][0]

    def round_times(self) -> list[tuple[float | None, float | None]]:
        """(opened_at, closed_at) of every closed round, oldest first: the rounds' part of when the run was served."""
        return self._read(ROUND_TIMES)

    def trained_shapes(self) -> list[tuple[int, int]]:
        """The (seq_len, batch) pairs the training rows (tokens > 0) trained, by length: one for a run of one shape,
        several under a curriculum; from the aggregate (`trained_shapes`, which keeps what `max_metric_rows` deletes)
        and the rows (a state dir written before it, opened read-only, has the rows only)."""
        shapes = TRAINED_SHAPES if self._present("trained_shapes") else TRAINED_SHAPES_OF_ROWS
        return [(int(length), int(batch)) for length, batch in self._read(f"{shapes} ORDER BY seq_len, batch")]

    def round_opened_at(self, version: int) -> float | None:
        """When the round of `version` opened, once it closed (None before, or without a recorded opening)."""
        rows = self._read("SELECT opened_at FROM rounds WHERE version = ?", (version,))
        return rows[0][0] if rows else None

    def rounds_summary(self) -> RoundsSummary:
        count, first, last, opened, reports = self._read(
            "SELECT COUNT(*), MIN(version), MAX(version), MIN(opened_at), SUM(reports) FROM rounds")[0]
        return RoundsSummary(count or 0, first or 0, last or 0, opened, reports or 0)

    def mean_training_loss(self, version: int) -> float | None:
        """The mean loss of the training steps (tokens > 0) trained from `version`; None without any."""
        value = self._read("SELECT AVG(loss) FROM metrics WHERE version = ? AND tokens > 0", (version,))[0][0]
        return None if value is None else float(value)

    def round_durations(self) -> list[float]:
        """Seconds from opening to close of every closed round, oldest first."""
        rows = self._read("SELECT closed_at - opened_at FROM rounds WHERE closed_at IS NOT NULL AND opened_at IS NOT NULL "
                          "ORDER BY version")
        return [row[0] for row in rows if row[0] is not None]

    def round_duration_histogram(self, edges: Sequence[float],
                                 after: int = 0) -> tuple[int, int, float, tuple[int, ...], float | None]:
        """The finite durations (seconds from opening to close) of the closed rounds of versions after `after` as a
        histogram, read by one aggregate query: (the newest version of all rounds, 0 without any; how many
        durations; their sum; how many are <= each of `edges`; the newest round's, None without any). SQLite reads
        the rows, so a read returns O(len(edges)) values however many rounds there are, and one after a version
        reads only the rounds after it (the version is the table's key)."""
        infinity = float("inf")
        bounds = tuple(float(edge) for edge in edges)
        if not all(abs(edge) < infinity for edge in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram edges {tuple(edges)!r}: expected finite seconds in increasing order")
        # d: a closed round's duration; ?2 < d < ?3 drops NULL (an opening or close unknown, or NaN) and ±inf.
        durations = ("SELECT version, d FROM (SELECT version, closed_at - opened_at AS d FROM rounds "
                     "WHERE version > ?1 AND closed_at IS NOT NULL AND opened_at IS NOT NULL) WHERE d > ?2 AND d < ?3")
        below = "".join(f", SUM(d <= ?{index + 4})" for index in range(len(bounds)))
        newest = f"(SELECT d FROM ({durations}) ORDER BY version DESC LIMIT 1)"
        through, count, total, *counts, last = self._read(
            f"SELECT (SELECT MAX(version) FROM rounds), COUNT(d), TOTAL(d){below}, {newest} FROM ({durations})",
            (after, -infinity, infinity, *bounds))[0]
        return int(through or 0), int(count), float(total), tuple(int(n or 0) for n in counts), last

    def add_forecast(self, record: ForecastRecord) -> None:
        """Store the forecast made at `record.version` (replacing one made at the same version)."""
        with self._writer() as db:
            columns = (*FORECAST_COLUMNS, *FORECAST_COLUMNS_ADDED)
            marks = ", ".join("?" * len(columns))
            db.execute(f"INSERT OR REPLACE INTO forecasts ({', '.join(columns)}) VALUES ({marks})",
                       dataclasses.astuple(record))

    def forecasts(self, newest_only: bool = False) -> list[ForecastRecord]:
        """Every stored forecast, oldest first, or the newest alone (none for a state dir written before issue #30,
        opened read-only)."""
        if not self._read(HAS_FORECASTS)[0][0]:
            return []
        order = "version DESC LIMIT 1" if newest_only else "version"
        present = {row[1] for row in self._read("PRAGMA table_info(forecasts)")}
        added = [c if c in present else FORECAST_COLUMNS_ADDED_READ[c] for c in FORECAST_COLUMNS_ADDED]  # an old dir
        rows = self._read(f"SELECT {', '.join((*FORECAST_COLUMNS, *added))} FROM forecasts ORDER BY {order}")
        return [ForecastRecord(*(float("nan") if value is None else value for value in row)) for row in rows]

    def held_out_losses(self, newest_only: bool = False) -> list[HeldOutRecord]:
        """The held-out losses measured along the way (`[run] eval_every`, issue #30), one per version (the median of
        its workers' reports, kept so by `add_metrics`), oldest first, or the newest alone (none for a state dir
        written before them, opened read-only; one written before the reports were kept reads as 1 report each)."""
        if not self._read(HAS_HELD_OUT)[0][0]:
            return []
        order = "version DESC LIMIT 1" if newest_only else "version"
        present = self._present("held_out")
        added = [c if c in present else "1" for c in HELD_OUT_COLUMNS_ADDED]  # an old dir, read-only
        rows = self._read(f"SELECT {', '.join((*HELD_OUT_COLUMNS, *added))} FROM held_out ORDER BY {order}")
        return [HeldOutRecord(*row) for row in rows]

    def round_losses(self, seq_len: int | None = None) -> list[tuple[int, float]]:
        """(version, mean loss of the training steps trained from it) of every version with training rows (only
        the rows at `seq_len` when given)."""
        rows = self._read_aggregates(ROUND_LOSSES) if seq_len is None else self._read_aggregates(ROUND_LOSSES_AT,
                                                                                                 (seq_len,))
        return [(int(version), float(loss)) for version, loss in rows]
