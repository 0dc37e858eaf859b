"""The state dir review of 2026-11-29: what a coordinator's start takes over, and what pruning deletes.

A coordinator without a committed checkpoint started a new run in whatever state dir it was given: a hivemind
mirror's (whose 100 metric rows `rcswarm fit` then counted as the new run's), or one whose state.sqlite was lost,
where θ₀ overwrote v0 and pruning deleted every other checkpoint as a crash's orphan. Now the start refuses both,
pruning deletes only what a crash mid-commit leaves, and a first start that crashed before its first commit still
starts again. Real SQLite and real files throughout.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rcswarm.cli.dht import Mirror
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import open_group
from rcswarm.state.store import StateStore
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state
from tests.helpers.verified_state import VERSIONS, checkpoint, committed_run, open_coordinator, spec

MIRROR_ROWS = 100


def files_of(state_dir: Path) -> dict[str, str]:
    """Every file under `state_dir`/checkpoints and the SHA-256 of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted((state_dir / "checkpoints").iterdir())}


def mirrored_state_dir(state_dir: Path) -> str:
    """A hivemind mirror's state dir (the real `rcswarm dht` Mirror) with MIRROR_ROWS metric rows; its run id."""
    hive = tiny_spec(run={"rounds": 10}, sync={"backend": "hivemind"}, inner={"lr": 3e-1})
    mirror = Mirror(hive, state_dir)
    try:
        now = time.time()
        mirror.store.add_metrics([(mirror.run_id, "peer-a", v, v * 5 + k, 32, 4, 5.0 - 0.01 * v, 128, now + v, 0.1,
                                   0.0, 0, 0, "", now + v + k * 0.01) for v in range(20) for k in range(5)])
        return mirror.run_id
    finally:
        mirror.close()


def test_a_coordinator_refuses_a_mirrors_state_dir_and_changes_nothing(tmp_path: Path) -> None:
    """The review's reproduction: `open_group` on a mirror's state dir started version 0 there, overwrote its run id
    and spec, and `rcswarm fit` read the mirror's 100 rows as the new run's."""
    state_dir = tmp_path / "state"
    run_id = mirrored_state_dir(state_dir)
    before = read_state(state_dir, lambda store: (store.run_identity(), len(store.training_rows())))
    with pytest.raises(ValueError, match=rf"state dir {state_dir} holds a hivemind mirror's run \(`rcswarm dht`: its "
                                         r"swarm view\); give the coordinator a state dir of its own"):
        open_group(tiny_spec(run={"rounds": 10}), state_dir)
    assert read_state(state_dir, lambda store: (store.run_identity(), len(store.training_rows()))) == before
    assert before[0][0] == run_id and before[1] == MIRROR_ROWS
    assert files_of(state_dir) == {}


def _stored_run_id(store: StateStore) -> None:
    store.set_many({"run_id": "another-run"})


def _metric_rows(store: StateStore) -> None:
    store.add_metrics([("another-run", "w", 0, 1, 32, 4, 5.0, 128, 1.0, 0.1, 0.0, 0, 0, "", 1.0)] * 3)


def _event_rows(store: StateStore) -> None:
    store.add_event("w", "joined", "another run's worker")


@pytest.mark.parametrize(("write", "said"), [
    (_stored_run_id, (r"holds run 'another-run' without a committed checkpoint \(not a coordinator's run\); give "
                      "the coordinator a state dir of its own")),
    (_metric_rows, r"holds rows of no committed run \(3 metric\); give the coordinator a state dir of its own"),
    (_event_rows, r"holds rows of no committed run \(1 event\); give the coordinator a state dir of its own"),
], ids=["run-id", "metric-rows", "event-rows"])
def test_a_coordinator_refuses_another_runs_id_or_rows_without_a_checkpoint(tmp_path: Path, write, said) -> None:
    """A state dir without a committed checkpoint that holds another run's id or any rows is not a new run's:
    the start is refused before anything is written, naming the state dir and what it holds."""
    store = StateStore(tmp_path)
    write(store)
    store.close()
    with pytest.raises(ValueError, match=rf"state dir {tmp_path} {said}"):
        open_coordinator(tmp_path)
    assert files_of(tmp_path) == {}
    assert read_state(tmp_path, lambda store: store.get("checkpoint")) is None


def _crash_before_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first commit dies before its checkpoint file is written."""
    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed before the file")

    monkeypatch.setattr("rcswarm.state.store.write_checkpoint", crash)


def _crash_after_the_rename(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first commit dies after v0's file was renamed into place, inside its SQLite transaction (rolled back)."""
    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed inside the transaction")

    monkeypatch.setattr(StateStore, "_prune_events", crash)


@pytest.mark.parametrize("crash", [_crash_before_the_file, _crash_after_the_rename],
                         ids=["before-the-file", "after-the-rename"])
def test_a_first_start_that_crashed_before_its_first_commit_starts_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash) -> None:
    """A first start writes the spec and the parameter names, then commits version 0; killed in between, the state
    dir holds them (and maybe v0's file, never recorded): the restart is no other run's and starts version 0."""
    fresh = open_coordinator(tmp_path / "fresh")
    fresh.close()
    crash(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        open_coordinator(tmp_path / "crashed")
    monkeypatch.undo()
    assert read_state(tmp_path / "crashed", lambda store: (store.get("checkpoint"), store.ledger())) == (None, [])
    assert read_state(tmp_path / "crashed", lambda store: store.get("spec_json")) is not None
    assert checkpoint(tmp_path / "crashed", 0).exists() == (crash is _crash_after_the_rename)
    restarted = open_coordinator(tmp_path / "crashed")
    try:
        assert restarted.version == 0 and restarted.param_sha256 == fresh.param_sha256
    finally:
        restarted.close()
    assert list(files_of(tmp_path / "crashed")) == ["v00000000.safetensors"]


def remove_state_sqlite(state_dir: Path) -> None:
    """state.sqlite lost (deleted as corrupt, a backup restored without it), its WAL files with it."""
    for suffix in ("", "-wal", "-shm"):
        (state_dir / f"state.sqlite{suffix}").unlink(missing_ok=True)


def test_a_start_without_the_state_sqlite_that_recorded_the_checkpoints_is_refused_and_deletes_nothing(
        tmp_path: Path) -> None:
    """The review's reproduction: with state.sqlite gone, θ₀ overwrote v0, v1 was recycled and v2 unlinked, with
    no log line. Now the start is refused naming the files, and every file stays as it was."""
    committed_run(tmp_path)
    before = files_of(tmp_path)
    assert [name for name in before if name.startswith("v")] == [checkpoint(tmp_path, v).name for v in range(VERSIONS + 1)]
    remove_state_sqlite(tmp_path)
    with pytest.raises(ValueError, match=(
            rf"state dir {tmp_path} holds checkpoint files v00000000.safetensors, v00000001.safetensors, "
            rf"v00000002.safetensors, v00000003.safetensors in {tmp_path / 'checkpoints'} that its state.sqlite does "
            "not record: the state.sqlite that recorded them is missing; restore it, or move the files away")):
        open_coordinator(tmp_path)
    assert files_of(tmp_path) == before


def write_file(path: Path, metadata: dict[str, str]) -> None:
    """A checkpoint-named safetensors file with `metadata`."""
    save_file({"w": torch.ones(4)}, str(path), metadata=metadata)


def test_pruning_deletes_only_a_crash_orphan_of_the_run_above_the_committed_version(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Pruning deleted every `v*.safetensors` the ledger did not record. Now only what a crash mid-commit leaves (the
    run's file of a version above the committed one) goes; another run's file, a version of the run the ledger lost
    and an unreadable file stay, named in one WARNING."""
    committed_run(tmp_path)
    run_id = read_state(tmp_path, lambda store: store.get("run_id"))
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as connection:
        connection.execute("DELETE FROM checkpoints WHERE version = 1")  # the ledger's entry lost
    write_file(checkpoint(tmp_path, VERSIONS + 1), {"run_id": run_id, "version": str(VERSIONS + 1)})  # a crash's
    write_file(checkpoint(tmp_path, 7), {"run_id": "another-run", "version": "7"})
    checkpoint(tmp_path, 9).write_bytes(b"\xff" * 16)
    caplog.set_level(logging.WARNING, logger="rcswarm.state.store")
    coordinator = open_coordinator(tmp_path)
    try:
        assert coordinator.version == VERSIONS
        assert not checkpoint(tmp_path, VERSIONS + 1).exists()
        coordinator.store.commit_version(coordinator.run_id, VERSIONS + 1, coordinator.params,
                                         {"outer_momentum": coordinator.momentum}, None)
    finally:
        coordinator.close()
    left = [name for name in files_of(tmp_path) if name.startswith("v")]
    assert left == [checkpoint(tmp_path, v).name for v in (0, 1, 2, 3, VERSIONS + 1, 7, 9)]
    warnings = [r.getMessage() for r in caplog.records if "left in place" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert all(name in warnings[0] for name in ("v00000001.safetensors", "v00000007.safetensors", "v00000009.safetensors"))
    assert "'another-run'" in warnings[0] and "cannot be read" in warnings[0]


def test_a_restart_on_its_own_state_dir_still_resumes(tmp_path: Path) -> None:
    """The guards above look only at a state dir without a committed checkpoint: a run's own, with its rows and
    events, resumes as before."""
    digests = committed_run(tmp_path)
    store = StateStore(tmp_path)
    store.add_event("w", "joined", "a worker of the run")
    store.close()
    coordinator = SwarmCoordinator(spec(), StateStore(tmp_path, spec().coordinator.keep_checkpoints, durable=False))
    try:
        assert coordinator.version == VERSIONS and coordinator.param_sha256 == digests[VERSIONS]
    finally:
        coordinator.close()


def test_a_first_start_that_never_committed_is_replaced_by_a_start_with_another_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review (2026-11-29): a first start whose version 0 failed (a full disk) left its spec, and the next start,
    with another config, was refused as a restart of a run that never committed: the state dir was tied to it for
    good. It starts, with its own spec."""
    _crash_before_the_file(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        open_coordinator(tmp_path)
    monkeypatch.undo()
    other = tiny_spec(run={"rounds": 10}, inner={"lr": 3e-2})
    restarted = SwarmCoordinator(other, StateStore(tmp_path))
    try:
        assert restarted.version == 0
        assert RunSpec.from_json(read_state(tmp_path, lambda store: store.get("spec_json"))).inner.lr == 3e-2
    finally:
        restarted.close()


def test_a_fallback_killed_before_it_set_the_rejected_files_aside_has_them_set_aside_at_the_next_prune(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review (2026-11-29): a fallback killed between its SQLite commit and renaming the failed files to
    `.rejected` left them as unrecorded `v*.safetensors`; the restart renumbers above them, so they were no crash's
    orphan (not above the committed version) and stayed for good. A file of the run of a version the fallback set
    aside is set aside now, as the fallback would have."""
    import os

    from rcswarm.state import store as store_module
    from tests.helpers.verified_state import flip_bytes

    state_dir = tmp_path / "state"
    committed_run(state_dir)  # versions 0..3 committed
    flip_bytes(checkpoint(state_dir, 3))  # v3 fails verification: the fallback sets it aside
    replace = os.replace

    class Killed(BaseException):
        pass

    def killed_at_the_rename(source: object, destination: object) -> None:
        if str(destination).endswith(".rejected"):
            raise Killed
        replace(source, destination)

    monkeypatch.setattr(store_module.os, "replace", killed_at_the_rename)
    with pytest.raises(Killed):
        open_coordinator(state_dir)
    monkeypatch.undo()
    assert checkpoint(state_dir, 3).exists()  # left unrecorded by the killed fallback
    restarted = open_coordinator(state_dir)
    restarted.close()
    names = set(files_of(state_dir))
    assert "v00000003.safetensors" not in names and "v00000003.safetensors.rejected" in names, names


def test_the_refused_start_of_a_state_dir_that_lost_its_state_sqlite_leaves_no_empty_one(tmp_path: Path) -> None:
    """The refusal above came after the store had opened, which created an empty state.sqlite in place of the lost
    one (a restore then had to copy the backup over it, and a second start met an empty store, not a missing one).
    The group the commands open (`open_group`) now refuses before any store opens."""
    committed_run(tmp_path)
    before = files_of(tmp_path)
    remove_state_sqlite(tmp_path)
    with pytest.raises(ValueError, match="that its state.sqlite does not record: the state.sqlite that recorded"):
        open_group(spec(), tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("state.sqlite")) == []
    assert files_of(tmp_path) == before
