"""What a hivemind `rcswarm run` does with a run directory before it starts anything (review of the fixes to the
hivemind launcher, 2026-11-29): it moved an earlier launch's results aside and rewrote run.toml, and only then found
(in the bootstrap peer's or coordinator's refusal, a traceback) that the run dir held a coordinator's run; a move
that failed midway split the results across the run dir and earlier/<time>/ with a message saying they "cannot be
moved". Now the run dir is checked first (nothing changes on a refusal: one line, exit 1), the results go into one
folder named `.partial` until all are in, and a failure says which moved where. No process is started here."""

from __future__ import annotations

import errno
import io
import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from rcswarm.cli import run as run_cli
from rcswarm.cli import run_hivemind
from rcswarm.cli.dht import Mirror
from tests.helpers.specs import hivemind_spec, tiny_spec, write_spec
from tests.helpers.verified_state import committed_run


def snapshot(run_dir: Path) -> dict[str, bytes | None]:
    """Every path under `run_dir` and a file's content (None for a folder), but launcher.lock, which the launcher
    takes before it looks at the run dir (its content is the holder's pid), and SQLite's -wal and -shm files, which
    a reader of a state dir (the launcher's check, as `rcswarm status --state-dir`) creates: state.sqlite is compared."""
    return {str(path.relative_to(run_dir)): (path.read_bytes() if path.is_file() else None)
            for path in sorted(run_dir.rglob("*"))
            if path.name != run_cli.LAUNCHER_LOCK_NAME and not path.name.endswith(("-wal", "-shm"))}


def coordinator_run_dir(run_dir: Path) -> None:
    """A run directory a coordinator's `rcswarm run` (no hivemind) left: its run.toml, a committed run in state/,
    summary.json, final.safetensors and a log."""
    spec = tiny_spec(run={"name": "hm", "rounds": 10}, coordinator={"keep_checkpoints": 3})
    run_dir.mkdir()
    (run_dir / "run.toml").write_text(spec.to_toml())
    committed_run(run_dir / "state")
    (run_dir / "summary.json").write_text('{"outcome": "completed"}')
    (run_dir / "final.safetensors").write_bytes(b"the coordinator's final parameters")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "coordinator.log").write_text(f"{run_cli.LAUNCH_MARK} 2026-11-28 10:00:00 ---\nserving\n")


def test_a_hivemind_launch_on_a_coordinators_run_dir_changes_nothing_and_exits_1_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It moved the coordinator's summary.json and final.safetensors to earlier/, rewrote run.toml with the hivemind
    config and ended in a traceback when its bootstrap peer refused the coordinator's state/. Now it is refused before
    anything is moved or written, and before any process starts (no dht.log)."""
    run_dir = tmp_path / "run"
    coordinator_run_dir(run_dir)
    before = snapshot(run_dir)
    config = write_spec(hivemind_spec(run={"name": "hm", "rounds": 1, "workers": 1}), tmp_path / "hm.toml")

    assert run_cli.main([str(config), "--run-dir", str(run_dir)]) == 1

    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"rcswarm run: --run-dir {str(run_dir)!r}: its state dir {run_dir / 'state'} holds "
                                   "a coordinator's run 'test-"), captured.err
    assert "(sync.backend = 'coordinator')" in captured.err, captured.err
    assert captured.err.rstrip().endswith("give the hivemind launch a --run-dir of its own"), captured.err
    assert "Traceback" not in captured.out + captured.err
    assert snapshot(run_dir) == before


def test_a_hivemind_launchs_own_run_dir_is_set_aside_with_its_state(tmp_path: Path) -> None:
    """state/ stayed, so a new launch (from θ_0) mixed its rows into the earlier launch's run: one run id, both
    launches' worker-0 in `rcswarm status`, and with a coordinator the earlier launch's curriculum rung and clock. Now
    it goes to earlier/<time>/ with the other results, and the line says so."""
    run_dir = tmp_path / "run"
    Mirror(hivemind_spec(run={"name": "first", "workers": 1}), run_dir / "state").close()
    (run_dir / "summary.json").write_text('{"outcome": "completed"}')
    (run_dir / "peers" / "worker-0").mkdir(parents=True)
    state_files = {path.name: path.read_bytes() for path in (run_dir / "state").iterdir() if path.is_file()}
    written = time.mktime((2026, 11, 28, 10, 0, 0, 0, 0, -1))
    for path in run_dir.rglob("*"):
        os.utime(path, (written, written))
    console = Console(file=io.StringIO(), width=400)

    assert run_hivemind.run_dir_problem(run_dir) is None  # a mirror of another run name: set aside, not refused
    assert run_hivemind.announce_earlier_results(run_dir, console)

    earlier = run_dir / "earlier" / "20261128-100000"
    said = console.file.getvalue()
    assert f"holds an earlier launch's summary.json, peers, state: moved to {earlier}" in said, said
    assert "resumes neither the earlier replicas nor their state" in said, said
    assert sorted(path.name for path in run_dir.iterdir()) == ["earlier"]
    assert sorted(path.name for path in earlier.iterdir()) == ["peers", "state", "summary.json"]
    for name, content in state_files.items():
        if name != "coordinator.lock":  # the launcher holds the state dir's lock while it moves it
            assert (earlier / "state" / name).read_bytes() == content, name


def test_a_state_dir_in_use_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    """A bootstrap peer an earlier launch left running (its launcher SIGKILLed) holds state/: it would go on writing
    into the folder moved aside. The set-aside takes state/'s lock first and stops, naming the holder."""
    run_dir = tmp_path / "run"
    mirror = Mirror(hivemind_spec(), run_dir / "state")
    try:
        (run_dir / "summary.json").write_text("{}")
        before = snapshot(run_dir)
        with pytest.raises(run_hivemind.SetAsideFailed, match=rf"state is in use by a mirror \(pid {os.getpid()} "):
            run_hivemind.set_aside_earlier_results(run_dir)
        assert snapshot(run_dir) == before
    finally:
        mirror.close()


def failing_at(call: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.replace in cli/run_hivemind.py fails at its `call`-th call (EACCES), as a folder the launcher may not
    write (a results folder of another user's, a read-only mount) makes it fail."""
    calls = []
    replace = os.replace

    def refusing(src: os.PathLike, dst: os.PathLike) -> None:
        calls.append(src)
        if len(calls) == call:
            raise PermissionError(errno.EACCES, "Permission denied", str(src))
        replace(src, dst)

    monkeypatch.setattr(run_hivemind.os, "replace", refusing)


def test_a_move_that_fails_midway_says_what_moved_where_and_a_next_launch_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The results were moved one by one into earlier/<time>/ itself: a failure at the second left summary.json
    there and the rest in the run dir, said as "they cannot be moved", and the next launch moved the rest into
    earlier/<time>-2/. Now they go into earlier/<time>.partial/, the message names what moved and what stayed, and a
    next launch is refused while that folder is there (nothing changes)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    (run_dir / "final.safetensors").write_bytes(b"final")
    (run_dir / "peers" / "worker-0").mkdir(parents=True)
    failing_at(2, monkeypatch)

    assert not run_hivemind.announce_earlier_results(run_dir, Console(file=io.StringIO()))

    partial = next((run_dir / "earlier").iterdir())
    assert partial.name.endswith(".partial") and sorted(p.name for p in partial.iterdir()) == ["summary.json"]
    assert sorted(path.name for path in run_dir.iterdir()) == ["earlier", "final.safetensors", "peers"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"summary.json moved to {partial}, but final.safetensors cannot be ([Errno 13] Permission denied" in err, err
    assert (f"final.safetensors, peers stayed in {run_dir}; move summary.json back into the run directory (or "
            f"final.safetensors, peers into {partial.name} and rename that to {partial.stem}) before") in err, err
    monkeypatch.undo()

    before = snapshot(run_dir)
    config = write_spec(hivemind_spec(run={"name": "hm", "rounds": 1, "workers": 1}), tmp_path / "hm.toml")
    assert run_cli.main([str(config), "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err == (f"rcswarm run: --run-dir {str(run_dir)!r}: {partial} holds part of an earlier launch's results "
                   "(summary.json) that a failed move left there; move what it holds back into the run directory (or "
                   f"the rest of the results into {partial.name} and rename that to {partial.stem}), then launch "
                   "again\n")
    assert snapshot(run_dir) == before


def test_a_move_that_fails_at_once_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing moved: the empty `.partial` folder is removed, so a next launch finds nothing to misread."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    failing_at(1, monkeypatch)
    with pytest.raises(run_hivemind.SetAsideFailed, match=r"summary.json cannot be moved to .*; nothing moved$"):
        run_hivemind.set_aside_earlier_results(run_dir)
    assert list((run_dir / "earlier").iterdir()) == []
    assert run_hivemind.run_dir_problem(run_dir) is None
