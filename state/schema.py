"""The store's SQL: the schema, what an older state dir is brought up to date with, the aggregate
statements `StateStore.add_metrics` runs in the transaction of the rows it inserts, and the statements
of the named reads that the store's methods do not spell inline.

Only state/ holds SQL (tests/deploy/test_structure.py checks it); state/store.py runs these statements.
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    version INTEGER PRIMARY KEY, opened_at REAL, closed_at REAL, reports INTEGER,
    tokens INTEGER, close_reason TEXT, update_norm REAL, param_sha256 TEXT, checkpoint TEXT,
    clipped INTEGER DEFAULT 0, dropped INTEGER DEFAULT 0, aggregation TEXT DEFAULT '', steps INTEGER DEFAULT 0
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
CREATE INDEX IF NOT EXISTS metrics_by_worker_step ON metrics (worker_id, version, step);
CREATE TABLE IF NOT EXISTS checkpoints (
    version INTEGER PRIMARY KEY, file TEXT NOT NULL, param_sha256 TEXT NOT NULL, committed_at REAL, rest_blake3 TEXT
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
CREATE TABLE IF NOT EXISTS forecasts (
    version INTEGER PRIMARY KEY, made_at REAL, at_seconds REAL, at_round INTEGER, loss REAL, low REAL, high REAL,
    target_loss REAL, target_seconds REAL, target_low_s REAL, target_high_s REAL, note TEXT
);
CREATE TABLE IF NOT EXISTS held_out (
    version INTEGER PRIMARY KEY, loss REAL, seconds REAL, worker_id TEXT, recorded_at REAL
);
CREATE TABLE IF NOT EXISTS held_out_reports (
    version INTEGER, loss REAL, seconds REAL, worker_id TEXT, recorded_at REAL, PRIMARY KEY (version, worker_id)
);
CREATE TABLE IF NOT EXISTS round_reporters (
    version INTEGER, worker_id TEXT, base_version INTEGER, PRIMARY KEY (version, worker_id)
);
CREATE INDEX IF NOT EXISTS round_reporters_by_worker ON round_reporters (worker_id, version);
CREATE TABLE IF NOT EXISTS member_secrets (worker_id TEXT PRIMARY KEY, secret_sha256 TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trained_shapes (seq_len INTEGER, batch INTEGER, PRIMARY KEY (seq_len, batch));
CREATE INDEX IF NOT EXISTS checkpoints_by_file ON checkpoints (file);
"""

# `round_reporters`: the memberships whose update a committed round counted (`version`: the round's, committed as
# version + 1; `base_version`: the newest version an update of that membership in it was trained from), entered in
# the transaction that commits the round (`StateStore.commit_version`), so that a coordinator restarted right after
# a close still knows whose update landed (`StateStore.reported`). A state dir written before it gets the table at
# its next open for writing (CREATE ... IF NOT EXISTS above) and reads as "no update known" for earlier rounds.
# The newest REPORTER_ROUNDS rounds are kept: a re-join comes within a worker's patience of the close it missed.
REPORTER_ROUNDS = 4096
REPORTED = "SELECT version, base_version FROM round_reporters WHERE worker_id = ? ORDER BY version DESC LIMIT 1"

# `member_secrets`: the SHA-256 (hex) of the worker secret each membership got at its join, entered in the join's
# transaction (`StateStore.record_join`; never the secret), so that a coordinator restarted since honours a re-join
# naming that membership only with its secret (`StateStore.joined_digest`, coordinator/service.py `_claimed`). A state
# dir written before it gets the table at its next open for writing, and its earlier memberships read as unknown (a
# re-join naming one takes nothing over). The newest rows are kept (state/store.py MAX_MEMBER_SECRET_ROWS).
JOINED_DIGEST = "SELECT secret_sha256 FROM member_secrets WHERE worker_id = ?"

# The joins a state dir recorded, for one written before the stored count of joins (state/store.py `JOINS_KEY`,
# `StateStore.joins`): each join's "join" event and `member_secrets` row name its membership `<head><N>-<hex>` (head:
# the run's worker prefix and "w"), N its number and data seed. An older rcswarm numbered every life from 1 again,
# so the joins of its lives hold 1..n of each; pruning (MAX_EVENT_ROWS, MAX_MEMBER_SECRET_ROWS) drops the oldest
# rows. The larger of the rows' count and the largest N they name is at least every number handed out, as far as
# the rows that are left tell. Parameters: :head, :length (of head), :start (length + 1). A full scan of the two
# tables, made once a start of such a state dir (the first join stores the count).
JOINS_RECORDED = """
SELECT MAX(
    (SELECT COUNT(*) FROM events WHERE kind = 'join'), (SELECT COUNT(*) FROM member_secrets),
    COALESCE((SELECT MAX(CAST(substr(worker_id, :start, instr(substr(worker_id, :start), '-') - 1) AS INTEGER))
              FROM (SELECT worker_id FROM events WHERE kind = 'join' UNION ALL SELECT worker_id FROM member_secrets)
              WHERE substr(worker_id, 1, :length) = :head), 0)
)
"""

# PRAGMA user_version of a state dir whose aggregate tables and ledger are complete; an older
# one is brought up to date when a coordinator opens it for writing.
AGGREGATES_VERSION = 1
# PRAGMA user_version a coordinator of this code leaves: raised with every change to the tables that a writer of an
# older rcswarm would get wrong (2: `round_reporters`, the ledger's `rest_blake3`, the held-out reports), so that an
# older writer is refused from the next raise on. A writer refuses a state dir of a higher version (written by a newer
# rcswarm); readers read what the file has.
SCHEMA_VERSION = 2
INT64_MAX = 2**63 - 1
# Columns of `rounds` added after its first release (the aggregation's per-round counts, the steps the
# round trained), with their declarations; a state dir written before them gets them at its next open
# for writing, and reads them as their defaults (0: steps not recorded) until then.
ROUND_COLUMNS_ADDED = {
    "clipped": "INTEGER DEFAULT 0", "dropped": "INTEGER DEFAULT 0", "aggregation": "TEXT DEFAULT ''",
    "steps": "INTEGER DEFAULT 0",
}
# The ledger's digest of everything in a checkpoint file but its parameters' bytes (state/checkpoints.py), added
# after its first release: a state dir written before it gets the column at its next open for writing, NULL
# for the versions committed before (verified over θ only).
LEDGER_COLUMNS_ADDED = {"rest_blake3": "TEXT"}
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

# The (seq_len, batch) shapes the training rows trained (`StateStore.trained_shapes`), kept when `max_metric_rows`
# deletes the rows (a long curriculum's first lengths left the summary of `rcswarm run`). A row's batch is the
# worker's word, so the table stops taking new shapes at MAX_TRAINED_SHAPES (a curriculum has a few; past it, the
# rows that are left still name theirs). Shapes already held are left out before the LIMIT: counted in it, they took
# the last places from new ones. A state dir written before the table gets the shapes of the rows it holds when it
# is next opened for writing (`MISSING_TRAINED_SHAPES`, then this from rowid 0).
MAX_TRAINED_SHAPES = 256
AGGREGATE_TRAINED_SHAPES = f"""
INSERT OR IGNORE INTO trained_shapes
SELECT DISTINCT m.seq_len, m.batch FROM metrics AS m WHERE m.rowid > ? AND m.tokens > 0
AND NOT EXISTS (SELECT 1 FROM trained_shapes AS t WHERE t.seq_len = m.seq_len AND t.batch = m.batch)
LIMIT MAX(0, {MAX_TRAINED_SHAPES} - (SELECT COUNT(*) FROM trained_shapes))
"""
MISSING_TRAINED_SHAPES = ("SELECT NOT EXISTS (SELECT 1 FROM trained_shapes) "
                          "AND EXISTS (SELECT 1 FROM metrics WHERE tokens > 0)")
TRAINED_SHAPES_OF_ROWS = "SELECT DISTINCT seq_len, batch FROM metrics WHERE tokens > 0"
TRAINED_SHAPES = f"SELECT seq_len, batch FROM trained_shapes UNION {TRAINED_SHAPES_OF_ROWS}"

AGGREGATES = (AGGREGATE_WORKER_TOTALS, AGGREGATE_WORKER_STEPS, AGGREGATE_ROUND_FIRST_STEPS, AGGREGATE_RUN_STEPS,
              AGGREGATE_TRAINED_SHAPES)

# Ledger rows for state dirs written before the ledger: each round's record names the checkpoint
# of the version it produced and that version's digest.
LEDGER_FROM_ROUNDS = """
INSERT OR IGNORE INTO checkpoints (version, file, param_sha256, committed_at)
SELECT version + 1, checkpoint, param_sha256, closed_at FROM rounds WHERE checkpoint IS NOT NULL AND param_sha256 IS NOT NULL
"""

METRIC_COLUMNS = (
    "run_id", "worker_id", "version", "step", "seq_len", "batch", "loss", "tokens", "wall_time",
    "compute_seconds", "sync_seconds", "bytes_sent", "bytes_received", "param_sha256", "received_at",
)

# One metric row (METRIC_COLUMNS, then its tokens, worker_id, version and step again), unless it is a trained step's
# (tokens > 0) whose (worker, version, step) a stored trained step's row already has: a worker's step is trained once
# (its step counter only grows), so such a row is a report sent again (a retry after its answer was lost, or on
# purpose) and, stored, counted that worker's loss twice in its step's mean and its tokens twice in the totals.
# `StateStore.add_new_metrics` (a coordinator's ReportMetrics) inserts with it; `metrics_by_worker_step` (SCHEMA;
# built at a state dir's next open for writing) finds the earlier row.
INSERT_METRIC = (
    f"INSERT INTO metrics SELECT {', '.join('?' * len(METRIC_COLUMNS))} WHERE ? <= 0 OR NOT EXISTS "
    "(SELECT 1 FROM metrics WHERE worker_id = ? AND version = ? AND step = ? AND tokens > 0)"
)


# A worker's totals over its metric rows and its newest row, for one run.
WORKER_TOTALS = """
SELECT t.worker_id, t.tokens, t.bytes_sent, t.bytes_received, t.first_wall, t.last_wall, t.row_count, m.step, m.seq_len, m.loss
FROM worker_totals AS t LEFT JOIN metrics AS m ON m.rowid = t.newest WHERE t.run_id = ? ORDER BY t.worker_id
"""

# The start of the run's clock: the coordinator's time of the run's first training row, from the aggregates
# (round_first_steps), which keep what `max_metric_rows` deleted; a state dir whose aggregates were never filled
# (read-only) counts from its rows. NULL without a training row. An expression, so that the training rows and
# `StateStore.run_clock_start` share it.
RUN_CLOCK_START = (
    "COALESCE((SELECT MIN(first_received) FROM round_first_steps), "
    f"(SELECT MIN(received_at) FROM metrics WHERE {TRAINING_FILTER}))"
)
RUN_CLOCK_START_READ = f"SELECT {RUN_CLOCK_START}"

# Training rows on the run's own clock: k is the step within the round (from 0), t the coordinator's seconds since
# RUN_CLOCK_START, k from the aggregates (round_first_steps) too: from the rows that survive `max_metric_rows`, a
# partly deleted round's k and the whole time axis shifted. t counts every second since the start, the time between
# a resumed run's launches included: observe/analysis.py `ServedClock` takes those out. A full scan, for commands
# that read a state dir.
TRAINING_ROWS = f"""
SELECT m.worker_id, m.version,
       m.step - COALESCE(f.first_step, MIN(m.step) OVER (PARTITION BY m.worker_id, m.version)) AS k, m.seq_len, m.loss,
       m.received_at - {RUN_CLOCK_START} AS t
FROM metrics AS m LEFT JOIN round_first_steps AS f ON f.worker_id = m.worker_id AND f.version = m.version
WHERE {TRAINING_FILTER} ORDER BY m.received_at
"""

# When each closed round opened and closed, by version: what observe/report.py `served_periods` takes of a round,
# without the rest of its record (a long run's tens of thousands of rounds are read on every clock).
ROUND_TIMES = "SELECT opened_at, closed_at FROM rounds ORDER BY version"

# Loss and coordinator time summed per (seq_len, version, k), with the time of the run's first training
# row: what observe/ places on the run's own step (config/run_step.py) and averages.
RUN_STEP_SUMS = (
    "SELECT seq_len, version, k, loss_sum, t_sum, n, (SELECT MIN(first_received) FROM round_first_steps) "
    "FROM run_step_sums ORDER BY seq_len, version, k"
)

# The steps each closed round recorded (0: not recorded, e.g. written before `rounds.steps` existed).
ROUND_STEPS = "SELECT version, steps FROM rounds WHERE steps > 0 ORDER BY version"

# Mean loss and wall time per (seq_len, worker step) of one run.
WORKER_STEP_MEANS = (
    "SELECT seq_len, step, loss_sum / n, wall_sum / n FROM worker_step_sums WHERE run_id = ? ORDER BY seq_len, step"
)

# Per worker: cumulative counters (their maxima are totals), tokens, first and last arrival.
WORKER_USAGE = (
    "SELECT worker_id, MAX(bytes_sent), MAX(bytes_received), MAX(sync_seconds), MAX(compute_seconds), "
    f"{_saturated_sum('tokens')}, MIN(first_received), MAX(last_received), MIN(first_wall), MAX(last_wall) "
    "FROM worker_totals GROUP BY worker_id"
)

METRIC_PAGE_COLUMNS = ("rowid", *METRIC_COLUMNS)

# Issue #30: the forecasts made as rounds closed (one per version the run had reached), and the mean training
# loss of the steps trained from each version, what they are fitted to.
FORECAST_COLUMNS = (
    "version", "made_at", "at_seconds", "at_round", "loss", "low", "high", "target_loss", "target_seconds",
    "target_low_s", "target_high_s", "note",
)
# Added after the forecasts' first release: what the law was fitted to ("held-out" or "training"); a rising loss's
# newest level and its low end (NULL: none, read as NaN).
FORECAST_COLUMNS_ADDED = {"basis": "TEXT DEFAULT 'training'", "level": "REAL", "level_low": "REAL"}
# What a state dir written before a column of FORECAST_COLUMNS_ADDED reads for it (opened read-only).
FORECAST_COLUMNS_ADDED_READ = {"basis": "'training'", "level": "NULL", "level_low": "NULL"}
ROUND_LOSSES = "SELECT version, loss_sum / n FROM (SELECT version, TOTAL(loss_sum) AS loss_sum, SUM(n) AS n " \
    "FROM run_step_sums GROUP BY version) WHERE n > 0 ORDER BY version"
ROUND_LOSSES_AT = "SELECT version, loss_sum / n FROM (SELECT version, TOTAL(loss_sum) AS loss_sum, SUM(n) AS n " \
    "FROM run_step_sums WHERE seq_len = ? GROUP BY version) WHERE n > 0 ORDER BY version"
HAS_FORECASTS = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'forecasts'"
# Issue #30: the held-out loss of θ_v measured along the way ([run] eval_every). `held_out_reports` keeps each
# worker's first report of a version, the first few of them (StateStore.add_metrics); `held_out` one row per
# version, their median (records.held_out_median), rewritten in the transaction that adds a report, what the reads
# use. A state dir written before the reports were kept holds the first report in `held_out` alone: it is copied
# into `held_out_reports` at the next open for writing (HELD_OUT_REPORTS_FROM_FIRST) and reads as 1 report until then.
HELD_OUT_COLUMNS = ("version", "loss", "seconds", "worker_id", "recorded_at")
# Added with the reports: how many the row's median is of.
HELD_OUT_COLUMNS_ADDED = {"reports": "INTEGER DEFAULT 1"}
HAS_HELD_OUT = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'held_out'"
# A worker's report of a version, unless it reported that version already or the version has `?` reports.
ADD_HELD_OUT_REPORT = (
    f"INSERT OR IGNORE INTO held_out_reports ({', '.join(HELD_OUT_COLUMNS)}) SELECT ?, ?, ?, ?, ? "
    "WHERE (SELECT COUNT(*) FROM held_out_reports WHERE version = ?) < ?"
)
HELD_OUT_REPORTS_OF = f"SELECT {', '.join(HELD_OUT_COLUMNS)} FROM held_out_reports WHERE version = ?"
MISSING_HELD_OUT_REPORTS = (
    "SELECT EXISTS (SELECT 1 FROM held_out AS h "
    "WHERE NOT EXISTS (SELECT 1 FROM held_out_reports AS r WHERE r.version = h.version))"
)
HELD_OUT_REPORTS_FROM_FIRST = (
    f"INSERT OR IGNORE INTO held_out_reports ({', '.join(HELD_OUT_COLUMNS)}) "
    f"SELECT {', '.join(HELD_OUT_COLUMNS)} FROM held_out AS h "
    "WHERE NOT EXISTS (SELECT 1 FROM held_out_reports AS r WHERE r.version = h.version)"
)
