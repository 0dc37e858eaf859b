"""The store's own error (issue #27): a state.sqlite the store cannot use leaves it as a StoreError naming the
file, which the commands turn into their usage error; nothing outside state/ sees sqlite3."""

from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest

from rcswarm.cli.fit import main as fit_main
from rcswarm.cli.status import main as status_main
from rcswarm.observe.analysis import MetricsFileError, read_state_dirs
from rcswarm.state.errors import StoreError
from rcswarm.state.records import ForecastRecord, HeldOutRecord
from rcswarm.state.schema import MAX_TRAINED_SHAPES
from rcswarm.state.store import StateStore
from tests.helpers.state import read_state


def test_a_file_that_is_not_a_database_is_a_store_error_naming_it(tmp_path: Path) -> None:
    database = tmp_path / "state.sqlite"
    database.write_bytes(b"not a database, but long enough to be read as one's header" * 4)
    with pytest.raises(StoreError, match=re.escape(f"{database}: cannot open it for reading: file is not a database")):
        StateStore.open_read_only(tmp_path)
    with pytest.raises(StoreError, match=re.escape(f"{database}: cannot open it for writing: file is not a database")):
        StateStore(tmp_path)
    with pytest.raises(MetricsFileError, match=re.escape(f"{database}: cannot open it for reading")):
        read_state_dirs(tmp_path)


def test_a_database_without_the_stores_tables_is_a_store_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state.sqlite").write_bytes(b"")  # an empty SQLite database: no tables
    store = StateStore.open_read_only(tmp_path / "run")
    try:
        with pytest.raises(StoreError, match="cannot read it: no such table: run_state") as raised:
            store.run_identity()
        assert raised.value.__cause__ is not None and str(tmp_path / "run" / "state.sqlite") in str(raised.value)
    finally:
        store.close()
    assert fit_main([str(tmp_path), "--out", str(tmp_path / "fit.png")]) == 2
    assert "no such table: run_state" in capsys.readouterr().err
    assert status_main(["--state-dir", str(tmp_path / "run")]) == 2
    assert "--state-dir" in capsys.readouterr().err


def test_named_reads_of_a_new_state_dir(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    try:
        store.add_event("w1", "join", "a: admitted", now=5.0)
        store.add_event("", "curriculum", "round 0: stays", now=6.0)
        assert [(e.kind, e.worker_id) for e in store.events()] == [("join", "w1"), ("curriculum", "")]
        assert [e.reason for e in store.events("curriculum")] == ["round 0: stays"] and store.events("x") == []
        assert store.rounds() == [] and store.round_steps() == {} and store.ledger() == [] and store.metric_rows() == []
        sums = store.run_step_sums()
        assert (sums.first_received, sums.rows) == (None, [])
    finally:
        store.close()


def test_openers_of_a_fresh_state_dir_at_once_all_open_it(tmp_path: Path) -> None:
    """A coordinator creating its state dir while `rcswarm status` (or a test) opens it: every opener gets the
    store, none "duplicate column name" (both adding a column) or "database is locked" (the switch to WAL).
    Seen in the default suite (test_ctrl_c_stops_every_process); here 6 openers at once on 20 fresh dirs."""
    for trial in range(20):
        state_dir = tmp_path / f"state{trial}"
        barrier, failed = threading.Barrier(6), []

        def open_it() -> None:
            barrier.wait(timeout=30)
            try:
                StateStore(state_dir).close()
            except StoreError as error:
                failed.append(str(error))

        threads = [threading.Thread(target=open_it) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failed, failed
    store = StateStore(tmp_path / "state0")
    assert store.forecasts() == [] and store.rounds() == []
    store.close()


def test_a_state_dir_written_before_the_held_out_reports_reads_as_before_and_takes_later_reports_into_the_median(
    tmp_path: Path,
) -> None:
    """A state dir written when `held_out` kept a version's first report alone (no `held_out_reports`, no `reports`
    column) reads the same, read-only; opened for writing, each version's first report joins its reports, so a
    later one takes the median with it, not in its place."""
    store = StateStore(tmp_path)
    try:
        store.add_metrics([], held_out=[(0, 5.0, 0.5, "a", 10.0), (2, 4.0, 0.5, "a", 20.0)])
    finally:
        store.close()
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        connection.execute("DROP TABLE held_out_reports")
        connection.execute("ALTER TABLE held_out DROP COLUMN reports")
    first = [HeldOutRecord(0, 5.0, 0.5, "a", 10.0, 1), HeldOutRecord(2, 4.0, 0.5, "a", 20.0, 1)]
    assert read_state(tmp_path, lambda reader: reader.held_out_losses()) == first
    assert read_state(tmp_path, lambda reader: reader.held_out_losses(newest_only=True)) == first[1:]
    store = StateStore(tmp_path)
    try:
        assert store.held_out_losses() == first
        store.add_metrics([], held_out=[(2, 4.2, 0.25, "b", 30.0), (2, 0.1, 0.25, "liar", 31.0)])
        assert store.held_out_losses() == [first[0], HeldOutRecord(2, 4.0, 0.5, "a", 20.0, 3)]
    finally:
        store.close()
    store = StateStore(tmp_path)  # opened again: nothing copied twice
    try:
        store.add_metrics([], held_out=[(2, 4.1, 0.25, "c", 40.0)])
        assert store.held_out_losses()[1] == HeldOutRecord(2, pytest.approx(4.05), 0.5, "a", 20.0, 4)
    finally:
        store.close()


def test_trained_shapes_are_the_lengths_and_batches_of_the_training_rows(tmp_path):
    """`rcswarm run`'s summary names the shapes a run trained (an adaptive curriculum's L = 32 × 8, not the
    config's data.seq_len 256): the (seq_len, batch) of the rows with tokens, by length."""
    store = StateStore(tmp_path / "state")
    try:
        def row(version: int, seq_len: int, batch: int, tokens: int) -> tuple:
            return ("run", "w", version, 1, seq_len, batch, 2.0, tokens, 1.0, 1.0, 0.0, 0, 0, "", 100.0)

        store.add_metrics([row(0, 256, 1, 0), row(0, 32, 8, 256), row(1, 64, 4, 256), row(1, 32, 8, 256)])
        assert store.trained_shapes() == [(32, 8), (64, 4)]
        # The metric cap deletes the oldest rows: the shapes they trained stay (they left the summary before).
        store.add_metrics([row(2, 128, 2, 256)], keep_rows=1)
        assert store.trained_shapes() == [(32, 8), (64, 4), (128, 2)]
        # A worker's rows name their batch: past MAX_TRAINED_SHAPES the table takes no new shape, the rows still do.
        store.add_metrics([row(3, 32, batch, 32) for batch in range(100, 100 + MAX_TRAINED_SHAPES)], keep_rows=1)
        shapes = store.trained_shapes()
        assert len(shapes) == MAX_TRAINED_SHAPES + 1 and {(32, 8), (64, 4), (128, 2)} <= set(shapes)
    finally:
        store.close()


def test_a_shape_already_held_takes_no_place_from_a_new_one_near_the_cap(tmp_path):
    """The LIMIT counted the shapes already held: with one place left, rows of a known shape and a new one kept
    only the known one (review, 2026-11-28)."""
    def row(version: int, seq_len: int, batch: int) -> tuple:
        return ("run", "w", version, 1, seq_len, batch, 2.0, seq_len * batch, 1.0, 1.0, 0.0, 0, 0, "", 100.0)

    store = StateStore(tmp_path / "state")
    try:
        store.add_metrics([row(0, 32, batch) for batch in range(1, MAX_TRAINED_SHAPES)])
        store.add_metrics([row(1, 32, 1), row(1, 4096, 7), row(1, 32, 2)], keep_rows=1)
        assert (4096, 7) in store.trained_shapes()
    finally:
        store.close()


def test_a_state_dir_from_before_the_shapes_table_gets_the_shapes_of_its_rows(tmp_path):
    """Opened for writing, its `trained_shapes` was created empty: the rows the metric cap deleted later took their
    shapes with them."""
    import sqlite3

    store = StateStore(tmp_path / "state")
    store.add_metrics([("run", "w", 0, 1, 64, 4, 2.0, 256, 1.0, 1.0, 0.0, 0, 0, "", 100.0)])
    store.close()
    with sqlite3.connect(tmp_path / "state" / "state.sqlite") as db:
        db.execute("DROP TABLE trained_shapes")
    store = StateStore(tmp_path / "state")
    try:
        store.add_metrics([("run", "w", 1, 1, 32, 8, 2.0, 256, 1.0, 1.0, 0.0, 0, 0, "", 100.0)], keep_rows=1)
        assert store.trained_shapes() == [(32, 8), (64, 4)]
    finally:
        store.close()


def test_a_rising_runs_level_is_stored_and_a_dir_from_before_the_levels_reads_them_as_nan(tmp_path: Path) -> None:
    """The forecasts' `level` and `level_low` (a rising loss's newest level, pruned on by the sweep) round-trip; a
    state dir written before those columns (and `basis`) reads NaN (and "training") read-only, and gets the columns at
    its next open for writing with its rows kept."""
    rising = ForecastRecord(12, 5.0, 60.0, 40, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan,
                            "the loss is not falling", "held-out", 1.47, 1.41)
    store = StateStore(tmp_path)
    store.add_forecast(rising)
    store.close()
    reader = StateStore.open_read_only(tmp_path)
    assert repr(reader.forecasts()) == repr([rising])
    reader.close()
    with closing(sqlite3.connect(tmp_path / "state.sqlite")) as db:
        for column in ("level_low", "level", "basis"):
            db.execute(f"ALTER TABLE forecasts DROP COLUMN {column}")
        db.commit()
    old = dataclasses.replace(rising, basis="training", level=math.nan, level_low=math.nan)
    reader = StateStore.open_read_only(tmp_path)
    assert repr(reader.forecasts()) == repr([old])
    reader.close()
    writer = StateStore(tmp_path)
    assert repr(writer.forecasts(newest_only=True)) == repr([old])
    writer.add_forecast(dataclasses.replace(rising, version=13))
    assert [f.level for f in writer.forecasts()][1:] == [1.47]
    writer.close()
