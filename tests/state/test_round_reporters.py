"""Each committed round's reporters (`round_reporters`): entered in the transaction that commits the round, read back
by a restarted coordinator (`StateStore.reported`), kept for the newest REPORTER_ROUNDS rounds, dropped with the
versions a fallback sets aside, and a state dir written before the table opens and gets it."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import torch

from rcswarm.state import store as store_module
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from tests.helpers.state import read_state
from tests.helpers.verified_state import checkpoint, flip_bytes


def _params(version: int) -> dict[str, torch.Tensor]:
    """A tiny θ of `version` (its values differ per version)."""
    return {"w": torch.full((64,), float(version))}


def _commit(store: StateStore, version: int, reporters: dict[str, int] | None) -> None:
    """Commit `version` as the close of round version − 1 with `reporters`."""
    record = RoundRecord(version - 1, 0.0, 1.0, len(reporters or {}), 64, "test", 0.1, "")
    store.commit_version("run", version, _params(version), {"outer_momentum": _params(0)}, record, reporters=reporters)


def test_a_rounds_reporters_are_committed_with_it_and_read_back_after_a_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path, durable=False)
    try:
        store.commit_version("run", 0, _params(0), {"outer_momentum": _params(0)}, None)
        _commit(store, 1, {"w1-a": 0, "w2-b": 0})
        _commit(store, 2, {"w1-a": 1, "w2-b": 0})  # w2-b's update in round 1 was late, trained from version 0
        with pytest.raises(ValueError, match=r"reporters = \['w1-a'\] given for version 3 without a round record"):
            store.commit_version("run", 3, _params(3), {"outer_momentum": _params(0)}, None, reporters={"w1-a": 2})
    finally:
        store.close()
    store = StateStore(tmp_path, durable=False)  # a restarted coordinator
    try:
        assert store.reported("w1-a") == (1, 1) and store.reported("w2-b") == (1, 0)
        assert store.reported("w9-none") is None and store.reported("") is None
        # A re-join taking over w1-a's delivered update is entered among round 1's reporters with its join event.
        store.record_join("w3-c", [("join", "c: admitted")], 5.0, reported=(1, 1))
        assert store.reported("w3-c") == (1, 1)
        assert [(e.worker_id, e.kind) for e in store.events()] == [("w3-c", "join")]
    finally:
        store.close()


def test_only_the_newest_rounds_reporters_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "REPORTER_ROUNDS", 2)
    store = StateStore(tmp_path, durable=False)
    try:
        store.commit_version("run", 0, _params(0), {"outer_momentum": _params(0)}, None)
        _commit(store, 1, {"old": 0})
        _commit(store, 2, {"kept": 1})
        assert store.reported("old") == (0, 0)
        _commit(store, 3, {"new": 2})
        assert store.reported("old") is None and store.reported("kept") == (1, 1) and store.reported("new") == (2, 2)
    finally:
        store.close()


def test_a_fallback_drops_the_reporters_of_the_versions_it_sets_aside(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep_checkpoints=3, durable=False)
    try:
        store.commit_version("run", 0, _params(0), {"outer_momentum": _params(0)}, None)
        store.set_many({"param_names": '["w"]'})
        _commit(store, 1, {"a": 0})
        _commit(store, 2, {"b": 1})
    finally:
        store.close()
    flip_bytes(checkpoint(tmp_path, 2))
    store = StateStore(tmp_path, keep_checkpoints=3, durable=False)
    try:
        loaded = store.load_current()
        # Version 2 is set aside: its θ, which held b's update, no longer exists; round 0's update (in version 1) does.
        assert loaded is not None and loaded.version == 3
        assert store.reported("b") is None and store.reported("a") == (0, 0)
    finally:
        store.close()


def test_a_state_dir_written_before_the_reporters_opens_and_gets_the_table(tmp_path: Path) -> None:
    store = StateStore(tmp_path, durable=False)
    try:
        store.commit_version("run", 0, _params(0), {"outer_momentum": _params(0)}, None)
        _commit(store, 1, {"a": 0})
    finally:
        store.close()
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        connection.execute("DROP TABLE round_reporters")
    assert [r.version for r in read_state(tmp_path, lambda reader: reader.rounds())] == [0]
    store = StateStore(tmp_path, durable=False)
    try:
        assert store.reported("a") is None  # committed before the table: not known
        _commit(store, 2, {"a": 1})
        assert store.reported("a") == (1, 1)
    finally:
        store.close()
