"""Verified state at start (issue 13, finding 5): a restarted coordinator serves only parameters
whose digest and version match what was recorded at commit; otherwise it falls back to the newest
kept checkpoint that verifies, or refuses to start with a message naming the file."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import struct
from contextlib import closing
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rcswarm.cli.run import export_final
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state
from tests.helpers.verified_state import (
    VERSIONS,
    checkpoint,
    committed_run,
    flip_bytes,
    open_coordinator,
    spec,
    state_of,
    tensor_span,
)


def parameter_span(path: Path) -> tuple[int, int]:
    """The byte range of the first parameter's data (not the optimizer state's) in a safetensors file."""
    return tensor_span(path)[1:]


def run_id_of(state_dir: Path) -> str:
    return read_state(state_dir, lambda store: store.get("run_id"))


def edit_sql(state_dir: Path, statement: str) -> None:
    """One write to a state dir's database, as an operator with the sqlite3 shell would make it."""
    with closing(sqlite3.connect(state_dir / "state.sqlite", isolation_level=None)) as connection:
        connection.execute(statement)


def fallback_reasons(state_dir: Path) -> list[str]:
    return [event.reason for event in read_state(state_dir, lambda store: store.events("fallback"))]


def assert_resumed(state_dir: Path, version: int, digests: dict[int, bytes], source: int | None = None) -> None:
    """A coordinator opened on `state_dir` serves version `version` holding the θ committed as version `source`
    (None: `version`): a fallback to an older version numbers it past every version committed before."""
    source = version if source is None else source
    coordinator = open_coordinator(state_dir)
    try:
        assert coordinator.version == version
        assert coordinator.param_sha256 == digests[source]
        assert tensor_stream.params_sha256(coordinator.params) == digests[source]
    finally:
        coordinator.close()


def test_a_clean_restart_resumes_at_the_committed_version(tmp_path: Path) -> None:
    digests = committed_run(tmp_path)
    # A crash after the file of version 4 was renamed into place but before SQLite committed it.
    save_file(load_file(str(checkpoint(tmp_path, VERSIONS))), str(checkpoint(tmp_path, VERSIONS + 1)),
              metadata={"version": str(VERSIONS + 1)})
    assert_resumed(tmp_path, VERSIONS, digests)
    assert fallback_reasons(tmp_path) == []
    assert not checkpoint(tmp_path, VERSIONS + 1).exists()


def test_a_refused_config_changes_nothing_in_the_state_dir(tmp_path: Path) -> None:
    """A restart with a config that may not resume the run (another inner.lr) is refused before the state dir
    changes: its keep_checkpoints = 0 would otherwise have pruned the kept versions the run falls back to."""
    digests = committed_run(tmp_path)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert len(before) == VERSIONS + 1
    wrong = tiny_spec(run={"rounds": 10}, inner={"lr": 3e-2}, coordinator={"keep_checkpoints": 0})
    with pytest.raises(ValueError, match=r"holds a run whose spec differs in \['inner.lr'\]"):
        SwarmCoordinator(wrong, StateStore(tmp_path, wrong.coordinator.keep_checkpoints, durable=False))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    assert_resumed(tmp_path, VERSIONS, digests)


def test_a_restart_with_another_min_reports_resumes(tmp_path: Path) -> None:
    """`rcswarm run --workers N` on an existing run directory raises sync.min_reports with the worker count, which
    was not a key a restart may change: the resume was refused naming a key the user never set (review of the docs,
    2026-11-28). When a round may close is the coordinator's own pacing, and a restart may change it."""
    digests = committed_run(tmp_path)
    more = dataclasses.replace(spec(), sync=dataclasses.replace(spec().sync, min_reports=4))
    coordinator = SwarmCoordinator(more, StateStore(tmp_path, more.coordinator.keep_checkpoints, durable=False))
    try:
        assert coordinator.version == VERSIONS and coordinator.param_sha256 == digests[VERSIONS]
    finally:
        coordinator.close()


def test_a_restart_with_another_wall_time_budget_resumes(tmp_path: Path) -> None:
    """`rcswarm run --minutes M` on an existing run directory (a budget extended, or set) was refused naming
    run.minutes, as run.rounds never was; the restarted coordinator keeps the run and serves the new budget."""
    digests = committed_run(tmp_path)
    longer = dataclasses.replace(spec(), run=dataclasses.replace(spec().run, minutes=90.0))
    coordinator = SwarmCoordinator(longer, StateStore(tmp_path, longer.coordinator.keep_checkpoints, durable=False))
    try:
        assert coordinator.version == VERSIONS and coordinator.param_sha256 == digests[VERSIONS]
        assert coordinator.spec.run.minutes == 90.0
    finally:
        coordinator.close()
    assert RunSpec.from_json(read_state(tmp_path, lambda store: store.get("spec_json"))).run.minutes == 90.0


def test_flipped_bytes_in_the_newest_checkpoint_fall_back_to_the_previous_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    digests = committed_run(tmp_path)
    path = checkpoint(tmp_path, VERSIONS)
    data = bytearray(path.read_bytes())
    start, end = parameter_span(path)
    middle = (start + end) // 2
    for index in range(middle, middle + 64):
        data[index] ^= 0x01  # the lowest mantissa bit: still finite, another digest
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="rcswarm.coordinator"):
        assert_resumed(tmp_path, VERSIONS + 1, digests, source=VERSIONS - 1)
    [reason] = fallback_reasons(tmp_path)
    assert path.name in reason and "SHA-256" in reason and f"resuming at version {VERSIONS - 1}" in reason
    assert f"as version {VERSIONS + 1} (versions {VERSIONS}..{VERSIONS} set aside" in reason
    assert any("SHA-256" in record.getMessage() for record in caplog.records if record.levelno == logging.WARNING)
    assert read_state(tmp_path, lambda store: store.get("version")) == str(VERSIONS + 1)
    assert path.with_name(path.name + ".rejected").exists()


def test_the_exported_final_parameters_are_the_newest_that_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rcswarm run`'s export reads what a restart would serve, not the committed file as it is: with the newest
    checkpoint's bytes flipped, version VERSIONS - 1 (and says so), the state dir untouched (it opens it read-only)."""
    digests = committed_run(tmp_path)
    out = tmp_path / "final.safetensors"
    exported = export_final(tmp_path, out)
    assert tensor_stream.params_sha256(exported) == digests[VERSIONS]
    written = load_file(str(out))
    assert tensor_stream.params_sha256({name: written[name] for name in exported}) == digests[VERSIONS]
    flip_bytes(checkpoint(tmp_path, VERSIONS))
    exported = export_final(tmp_path, out)
    assert tensor_stream.params_sha256(exported) == digests[VERSIONS - 1]
    with safe_open(str(out), framework="pt") as handle:
        assert handle.metadata() == {"source": checkpoint(tmp_path, VERSIONS - 1).name, "version": str(VERSIONS - 1)}
    assert f"exporting version {VERSIONS - 1}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left
    assert read_state(tmp_path, lambda store: store.get("version")) == str(VERSIONS)  # no fallback written


def test_loaded_tensors_do_not_change_when_their_file_is_recycled(tmp_path: Path) -> None:
    """The store rewrites a pruned checkpoint's file in place for a later version (`.recycled`): what a restart
    loaded from it must not be a view of that file (safetensors maps files), or θ would change under the run."""
    committed_run(tmp_path)
    store = StateStore(tmp_path, keep_checkpoints=0, durable=False)
    try:
        loaded = store.load_current()
        kept = {name: tensor.clone() for name, tensor in loaded.params.items()}
        kept_state = {group: {k: t.clone() for k, t in tensors.items()} for group, tensors in loaded.state.items()}
        run_id = store.get("run_id")
        for version in range(VERSIONS + 1, VERSIONS + 4):
            params = {name: torch.full_like(tensor, float(version)) for name, tensor in kept.items()}
            store.commit_version(run_id, version, params, state_of(params, version), None)
    finally:
        store.close()
    assert all(torch.equal(loaded.params[name], kept[name]) for name in kept)
    assert all(torch.equal(loaded.state[g][k], kept_state[g][k]) for g in kept_state for k in kept_state[g])


def test_a_nan_in_a_well_formed_newest_checkpoint_falls_back(tmp_path: Path) -> None:
    digests = committed_run(tmp_path)
    path = checkpoint(tmp_path, VERSIONS)
    tensors = load_file(str(path))
    name = next(key for key in sorted(tensors) if "/" not in key)
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(path), metadata={"run_id": run_id_of(tmp_path), "version": str(VERSIONS)})
    assert_resumed(tmp_path, VERSIONS + 1, digests, source=VERSIONS - 1)
    [reason] = fallback_reasons(tmp_path)
    assert path.name in reason and "non-finite" in reason and name in reason


def test_a_truncated_newest_checkpoint_falls_back(tmp_path: Path) -> None:
    digests = committed_run(tmp_path)
    path = checkpoint(tmp_path, VERSIONS)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_resumed(tmp_path, VERSIONS + 1, digests, source=VERSIONS - 1)
    [reason] = fallback_reasons(tmp_path)
    assert path.name in reason and "truncated" in reason


def test_an_edited_run_state_version_resumes_at_the_checkpoints_own_version(tmp_path: Path) -> None:
    digests = committed_run(tmp_path)
    edit_sql(tmp_path, "UPDATE run_state SET value = '7' WHERE key = 'version'")
    assert_resumed(tmp_path, VERSIONS, digests)
    [reason] = fallback_reasons(tmp_path)
    assert "run_state.version = '7'" in reason and checkpoint(tmp_path, VERSIONS).name in reason


def test_no_verified_checkpoint_refuses_to_start_naming_the_files(tmp_path: Path) -> None:
    committed_run(tmp_path)
    paths = sorted((tmp_path / "checkpoints").glob("v*.safetensors"))
    assert len(paths) == 4
    for path in paths:
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="no checkpoint verifies") as refused:
        open_coordinator(tmp_path)
    for path in paths:
        assert path.name in str(refused.value)
    assert fallback_reasons(tmp_path) == []


def test_the_served_parameters_are_the_verified_ones(tmp_path: Path, start_coordinator) -> None:
    digests = committed_run(tmp_path / "state")
    path = checkpoint(tmp_path / "state", VERSIONS)
    tensors = load_file(str(path))
    for key in tensors:
        if "/" not in key:
            tensors[key] = tensors[key] * 2.0
    save_file(tensors, str(path), metadata={"run_id": run_id_of(tmp_path / "state"),
                                            "version": str(VERSIONS)})
    local = start_coordinator(spec(), tmp_path / "state")
    client = local.client()
    try:
        joined = client.join("probe", "cpu", 1)
        version, params = client.pull(joined, joined.run_id)
    finally:
        client.close()
    assert version == VERSIONS + 1  # version VERSIONS - 1's θ, numbered past the version set aside
    assert tensor_stream.params_sha256(params) == digests[VERSIONS - 1]
    assert torch.isfinite(torch.cat([p.reshape(-1) for p in params.values()])).all()


def test_a_state_dir_from_before_the_ledger_is_verified_from_its_rounds(tmp_path: Path) -> None:
    digests = committed_run(tmp_path)
    edit_sql(tmp_path, "DELETE FROM checkpoints")
    edit_sql(tmp_path, "PRAGMA user_version = 0")
    assert_resumed(tmp_path, VERSIONS, digests)
    assert fallback_reasons(tmp_path) == []
    assert [entry.version for entry in read_state(tmp_path, lambda store: store.ledger())] == list(range(1, VERSIONS + 1))


def assert_state_of(state_dir: Path, version: int, source: int | None = None) -> None:
    """A coordinator opened on `state_dir` resumes at `version` with exactly the momentum and broadcast residual
    committed with version `source` (None: `version`; what the helper committed)."""
    coordinator = open_coordinator(state_dir)
    try:
        assert coordinator.version == version
        want = state_of(coordinator.params, version if source is None else source)
        for name, tensor in coordinator.momentum.items():
            assert torch.equal(tensor, want["outer_momentum"][name]), name
        residual = coordinator.broadcast_feedback.snapshot()
        assert sorted(residual) == sorted(want["broadcast_residual"])
        for name, tensor in residual.items():
            assert torch.equal(tensor, want["broadcast_residual"][name]), name
    finally:
        coordinator.close()


@pytest.mark.parametrize("group", ["outer_momentum", "broadcast_residual"])
def test_flipped_bytes_in_the_optimizer_state_fall_back_to_the_previous_version(tmp_path: Path, group: str) -> None:
    digests = committed_run(tmp_path)
    path = checkpoint(tmp_path, VERSIONS)
    key = flip_bytes(path, group)
    assert key.startswith(f"{group}/")
    assert_resumed(tmp_path, VERSIONS + 1, digests, source=VERSIONS - 1)
    assert_state_of(tmp_path, VERSIONS + 1, source=VERSIONS - 1)
    [reason] = fallback_reasons(tmp_path)
    assert path.name in reason and "header and optimizer state" in reason and "differs from the" in reason
    assert path.with_name(path.name + ".rejected").exists()


def test_an_edited_header_falls_back(tmp_path: Path) -> None:
    # A momentum tensor's dtype changed from F32 to I32 in the header (same length, so the file still parses):
    # the same bytes would load as integers, which no finite check looks at.
    digests = committed_run(tmp_path)
    path = checkpoint(tmp_path, VERSIONS)
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + size].decode()
    key = tensor_span(path, "outer_momentum")[0]
    at = header.index(f'"{key}":{{"dtype":"F32"')
    edited = header[:at] + header[at:].replace('"F32"', '"I32"', 1)
    path.write_bytes(data[:8] + edited.encode() + data[8 + size:])
    assert_resumed(tmp_path, VERSIONS + 1, digests, source=VERSIONS - 1)
    [reason] = fallback_reasons(tmp_path)
    assert path.name in reason and "header and optimizer state" in reason


def test_flipped_optimizer_state_in_every_checkpoint_refuses_to_start(tmp_path: Path) -> None:
    committed_run(tmp_path)
    paths = sorted((tmp_path / "checkpoints").glob("v*.safetensors"))
    for path in paths:
        flip_bytes(path, "outer_momentum")
    with pytest.raises(ValueError, match="no checkpoint verifies, refusing to serve unverified parameters") as refused:
        open_coordinator(tmp_path)
    for path in paths:
        assert path.name in str(refused.value)
    assert str(refused.value).count("header and optimizer state") == len(paths)


def test_a_ledger_from_before_the_state_digest_is_verified_over_theta_and_upgraded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # A state dir written before the ledger had rest_blake3: the column does not exist.
    digests = committed_run(tmp_path)
    edit_sql(tmp_path, "ALTER TABLE checkpoints DROP COLUMN rest_blake3")
    assert [entry.rest_blake3 for entry in read_state(tmp_path, lambda store: store.ledger())] == [None] * (VERSIONS + 1)
    with caplog.at_level(logging.INFO, logger="rcswarm.state.store"):
        assert_resumed(tmp_path, VERSIONS, digests)
    assert any("verified over its parameters only" in record.getMessage() for record in caplog.records)
    assert_state_of(tmp_path, VERSIONS)
    # The first commit after the upgrade records the full digest, and that version is checked over every byte.
    coordinator = open_coordinator(tmp_path)
    try:
        params = {name: tensor + 1.0 for name, tensor in coordinator.params.items()}
        coordinator.store.commit_version(coordinator.run_id, VERSIONS + 1, params, state_of(params, VERSIONS + 1), None)
    finally:
        coordinator.close()
    newest = read_state(tmp_path, lambda store: store.ledger())[-1]
    assert newest.version == VERSIONS + 1 and newest.rest_blake3 is not None and len(newest.rest_blake3) == 64
    flip_bytes(checkpoint(tmp_path, VERSIONS + 1), "outer_momentum")
    assert_resumed(tmp_path, VERSIONS + 2, digests, source=VERSIONS)
