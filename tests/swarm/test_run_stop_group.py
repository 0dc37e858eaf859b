"""`rcswarm run`'s stop of a process that outlives its SIGTERM (review of the hivemind backend, 2026-11-29): the
fallback SIGKILLed the worker's pid alone, and a hivemind worker's forked children (its DHT and averager processes,
their p2pd) ran on. Now the fallback kills the worker's whole process group (each worker leads one: `Swarm._spawn`
starts it in its own session), and a process in the caller's group alone. Plain Python processes stand in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rcswarm.cli import run as run_cli
from tests.helpers.specs import tiny_spec
from tests.helpers.waiting import wait_for

# A worker that ignores SIGTERM and forks a child into its own process group that ignores it too, then waits.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('child ready', flush=True); time.sleep(300)"], stdout=open(sys.argv[1], "w"))
    open(sys.argv[2], "w").write(str(child.pid))
    time.sleep(300)
""")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_worker_that_outlives_its_sigterm_is_killed_with_its_children(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_cli, "STOP_TIMEOUT_S", 1.0)  # the wait for the SIGTERM, not its 30 s
    swarm = run_cli.Swarm(tiny_spec(), tmp_path, 1)
    ready, child_pid = tmp_path / "child.out", tmp_path / "child.pid"
    worker = swarm._spawn(["-c", STUBBORN, str(ready), str(child_pid)], "worker-0.log")
    swarm.workers.append(worker)
    child = 0
    try:
        wait_for(lambda: "child ready" in (ready.read_text() if ready.exists() else ""), 30, "the worker's child")
        child = int(child_pid.read_text())
        assert os.getpgid(child) == worker.pid
        swarm.stop()
        assert worker.returncode == -signal.SIGKILL
        wait_for(lambda: not alive(child), 10, f"the worker's child {child} to end with it")
    finally:
        for pid in (worker.pid, child):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_process_in_the_callers_group_is_killed_alone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    assert os.getpgid(proc.pid) == os.getpgrp()
    try:
        run_cli.kill_group(proc)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_process_already_reaped_is_not_killed_nor_the_group_its_pid_names_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kill_group` read the group of a reaped process's pid and SIGKILLed it: that pid, free once reaped, may be a
    new process's leading a group of its own (here `os.getpgid` answers so, as it would then). Now it leaves a reaped
    process alone, as `Popen.kill` does; `os.killpg` and `os.kill` only record what would be sent."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait(timeout=30)
    sent: list[tuple[str, int, int]] = []
    monkeypatch.setattr(run_cli.os, "getpgid", lambda pid: pid)
    monkeypatch.setattr(run_cli.os, "killpg", lambda group, sig: sent.append(("killpg", group, sig)))
    monkeypatch.setattr(run_cli.os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))

    run_cli.kill_group(proc)

    assert sent == []
