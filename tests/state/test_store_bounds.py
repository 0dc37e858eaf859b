"""The state store over long runs and across rcswarm versions (review of the state store, 2026-11-28): the ledger's
lookup by file is indexed (each commit scanned it: 96 ms a commit at 1M versions), a commit's own events count
towards the events table's bound, checkpoint files are pruned in version order past v99999999, and a state dir a
newer rcswarm wrote is refused by this one's writer (its readers still read it)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import torch

from rcswarm.state import store as store_module
from rcswarm.state.errors import StoreError
from rcswarm.state.records import RoundRecord
from rcswarm.state.schema import SCHEMA_VERSION
from rcswarm.state.store import StateStore


def _params(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((8,), float(version))}


def _write_version_zero(state_dir: Path) -> None:
    """A state dir whose coordinator committed version 0 and closed it."""
    store = StateStore(state_dir, durable=False)
    try:
        store.commit_version("run", 0, _params(0), {}, None)
    finally:
        store.close()


def test_the_ledgers_lookup_by_file_uses_an_index(tmp_path: Path) -> None:
    store = StateStore(tmp_path, durable=False)
    try:
        with store._writer() as db:
            plan = db.execute("EXPLAIN QUERY PLAN SELECT file FROM checkpoints WHERE file IN (?, ?)",
                              ("v00000001.safetensors", "v00000002.safetensors")).fetchall()
    finally:
        store.close()
    assert any("USING" in row[-1] and "INDEX" in row[-1] for row in plan), plan


def test_a_commits_own_events_count_towards_the_events_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose only events came with its commits (a flagged update every round) was never pruned: only a single
    `add_event` landing on a multiple of EVENT_PRUNE_EVERY pruned."""
    monkeypatch.setattr(store_module, "MAX_EVENT_ROWS", 20)
    monkeypatch.setattr(store_module, "EVENT_PRUNE_EVERY", 4)
    store = StateStore(tmp_path, durable=False, keep_checkpoints=1)
    try:
        store.commit_version("run", 0, _params(0), {}, None)
        for version in range(1, 40):
            record = RoundRecord(version - 1, 0.0, 1.0, 1, 64, "test", 0.1, "")
            flags = [(f"w{version}", "clipped", "round", 1.0), (f"w{version}", "dropped", "round", 1.0),
                     (f"w{version}", "late", "round", 1.0)]
            store.commit_version("run", version, _params(version), {}, record, events=flags)
        kept = store.events()
    finally:
        store.close()
    assert len(kept) <= 20 + 4 + 3, len(kept)
    assert kept[-1].worker_id == "w39"


def test_checkpoints_are_pruned_in_version_order_past_eight_digits(tmp_path: Path) -> None:
    paths = [Path(f"v{n:08d}.safetensors") for n in (99_999_998, 100_000_000, 99_999_999)]
    assert [p.name for p in sorted(paths, key=store_module._checkpoint_order)] == [
        "v99999998.safetensors", "v99999999.safetensors", "v100000000.safetensors"]


def test_a_state_dir_of_a_newer_rcswarm_is_refused_for_writing_and_still_read(tmp_path: Path) -> None:
    """An older writer took a newer state dir without a word and failed at its first commit, after it had started
    serving (a column count it did not know)."""
    _write_version_zero(tmp_path)
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this rcswarm's "
                                         f"{SCHEMA_VERSION}: the state dir was written by a newer rcswarm"):
        StateStore(tmp_path, durable=False)
    reader = StateStore.open_read_only(tmp_path)
    try:
        assert reader.get("version") == "0" and reader.rounds_summary().count == 0
    finally:
        reader.close()


def test_a_state_dir_of_the_previous_schema_is_brought_up_to_date(tmp_path: Path) -> None:
    _write_version_zero(tmp_path)
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        connection.execute("PRAGMA user_version = 1")
    store = StateStore(tmp_path, durable=False)
    try:
        assert [entry.version for entry in store.ledger()] == [0]  # the ledger as it was, not rebuilt
    finally:
        store.close()
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
