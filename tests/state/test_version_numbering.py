"""A version number names one θ in a run (review, finding 1): a coordinator that falls back to an older verified
checkpoint serves it under the version after the highest it ever committed, the versions above the verified one are
set aside (run_state, `StateStore.rejected_versions`), and a crash between the two steps renumbers at the next start.
A state dir from before the ledger still at version 0 starts (finding 2)."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from rcswarm.state.store import StateStore
from tests.helpers.state import read_state
from tests.helpers.verified_state import VERSIONS, checkpoint, committed_run, flip_bytes, open_coordinator, state_of


def resumed(state_dir: Path) -> tuple[int, bytes]:
    """(version, θ's digest) a coordinator opened on `state_dir` serves."""
    coordinator = open_coordinator(state_dir)
    try:
        return coordinator.version, coordinator.param_sha256
    finally:
        coordinator.close()


def test_a_fallback_numbers_the_run_past_every_version_committed_before(tmp_path: Path) -> None:
    digests = committed_run(tmp_path)
    flip_bytes(checkpoint(tmp_path, VERSIONS))
    # θ of version 2, served as version 4: version 3 was served once (workers hold it) and names no other θ.
    assert resumed(tmp_path) == (VERSIONS + 1, digests[VERSIONS - 1])
    assert read_state(tmp_path, lambda store: store.rejected_versions()) == [(VERSIONS, VERSIONS)]
    ledger = read_state(tmp_path, lambda store: store.ledger())
    assert [entry.version for entry in ledger][-2:] == [VERSIONS - 1, VERSIONS + 1]
    assert ledger[-1].param_sha256 == digests[VERSIONS - 1].hex() and ledger[-1].rest_blake3 is not None
    [renumbered] = read_state(tmp_path, lambda store: store.events("renumber"))
    assert f"θ of version {VERSIONS - 1}" in renumbered.reason
    assert f"resumes as version {VERSIONS + 1}" in renumbered.reason
    # The next start resumes there, with no second fallback nor renumbering.
    assert resumed(tmp_path) == (VERSIONS + 1, digests[VERSIONS - 1])
    assert len(read_state(tmp_path, lambda store: store.events("fallback", "renumber"))) == 2

    # A second fallback, from a version committed after the first: past both ranges set aside.
    store = StateStore(tmp_path, keep_checkpoints=3, durable=False)
    try:
        loaded = store.load_current()
        params = {name: tensor + 1.0 for name, tensor in loaded.params.items()}
        store.commit_version(store.get("run_id"), VERSIONS + 2, params, state_of(params, VERSIONS + 2), None)
    finally:
        store.close()
    flip_bytes(checkpoint(tmp_path, VERSIONS + 2), "outer_momentum")
    assert resumed(tmp_path) == (VERSIONS + 3, digests[VERSIONS - 1])
    assert read_state(tmp_path, lambda store: store.rejected_versions()) == [(VERSIONS, VERSIONS),
                                                                             (VERSIONS + 2, VERSIONS + 2)]


def test_a_crash_between_the_fallback_and_the_renumbering_renumbers_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    digests = committed_run(tmp_path)
    flip_bytes(checkpoint(tmp_path, VERSIONS))

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt("killed before the renumbered version was committed")

    monkeypatch.setattr(StateStore, "commit_version", crash)
    with pytest.raises(KeyboardInterrupt):
        open_coordinator(tmp_path)
    monkeypatch.undo()
    # The fallback was committed (version 2 is current, version 3 set aside); the renumbering was not.
    assert read_state(tmp_path, lambda store: store.get("version")) == str(VERSIONS - 1)
    assert resumed(tmp_path) == (VERSIONS + 1, digests[VERSIONS - 1])
    assert len(read_state(tmp_path, lambda store: store.events("fallback"))) == 1


def test_a_state_dir_from_before_the_ledger_at_version_0_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """No round produced version 0, so the ledger rebuilt from the rounds had no row for it and the coordinator
    refused to start ("records no digest for it"): the upgrade enters the committed checkpoint, verified over θ."""
    digest = resumed(tmp_path)[1]
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        for table in ("checkpoints", "worker_totals", "worker_step_sums", "round_first_steps", "run_step_sums"):
            connection.execute(f"DROP TABLE {table}")
        connection.execute("PRAGMA user_version = 0")
    with caplog.at_level(logging.INFO, logger="rcswarm.state.store"):
        assert resumed(tmp_path) == (0, digest)
    [entry] = read_state(tmp_path, lambda store: store.ledger())
    assert (entry.version, entry.file, entry.param_sha256, entry.rest_blake3) == (0, "v00000000.safetensors",
                                                                                  digest.hex(), None)
    assert any("verified over its parameters only" in record.getMessage() for record in caplog.records)
    assert read_state(tmp_path, lambda store: store.events("fallback")) == []
    # Verified from now on: a changed θ falls back (none older: it refuses to start).
    path = checkpoint(tmp_path, 0)
    flip_bytes(path)
    with pytest.raises(ValueError, match="no checkpoint verifies"):
        open_coordinator(tmp_path)
