"""A state dir on a read-only filesystem (an archived run, a read-only mount) is readable (review of the state store,
2026-11-28): once its coordinator exited cleanly, SQLite had removed the WAL's `-shm` file, which a read-only open
must create, so `rcswarm status`, `fit` and the dashboard failed with "unable to open database file". A real tmpfs,
remounted read-only (needs root; skipped where mounting is not allowed)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rcswarm.state.store import StateStore


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Path]:
    """A fresh tmpfs at tmp_path/mnt, unmounted at teardown."""
    point = tmp_path / "mnt"
    point.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(point)], capture_output=True,
                          timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)


def test_a_state_dir_on_a_read_only_mount_is_read(mount: Path) -> None:
    state_dir = mount / "state"
    store = StateStore(state_dir, durable=False)
    try:
        store.commit_version("run", 0, {"w": torch.ones(4)}, {}, None)
        store.add_event("", "note", "written before the mount turned read-only", 1.0)
    finally:
        store.close()
    assert not (state_dir / "state.sqlite-shm").exists()  # a clean close removes it
    remount = subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True, timeout=30)
    assert remount.returncode == 0, remount.stderr
    reader = StateStore.open_read_only(state_dir)
    try:
        assert reader.get("version") == "0"
        assert [event.reason for event in reader.events("note")] == ["written before the mount turned read-only"]
    finally:
        reader.close()
