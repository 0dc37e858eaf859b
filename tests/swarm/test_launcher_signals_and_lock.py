"""What the review of the local launcher (2026-11-29) found, with real `rcswarm run` processes: a SIGTERM while the
summary was made ended the launcher before summary.json (rc 143, no summary.json), and a second launch on a run
directory in use deleted the first one's coordinator.json and quoted the first one's log as its reason (exit 1)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

from rcswarm.state.lock import StateDirLock
from tests.helpers.specs import tiny_spec, write_spec
from tests.helpers.waiting import wait_for

# `rcswarm run` with its sweep's fit made slow (60 s), so that a signal surely lands in the summary stretch.
SLOW_FIT_LAUNCH = """
import sys, time
from rcswarm.cli import run

def slow_fit(console, run_dir, held_out=None):
    time.sleep(60)
    return None

run.fit_law = slow_fit
sys.exit(run.main(sys.argv[1:]))
"""
NOTES_LINE = "¹ mean training loss"
LAUNCHER_LOCK = "launcher.lock"  # state/lock.py LAUNCHER_LOCK_NAME


def run_command(*args: str) -> list[str]:
    """The command line of `rcswarm run args...`."""
    return [sys.executable, "-m", "rcswarm.cli", "run", *args]


def stop(launcher: subprocess.Popen) -> None:
    """End a launcher a failed test leaves running: SIGTERM first, so that it stops its coordinator and workers (in
    sessions of their own, a SIGKILL would leave them running), SIGKILL if it does not end within a minute."""
    if launcher.poll() is not None:
        return
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


def test_a_sigterm_while_the_summary_is_made_exits_143_after_summary_json(tmp_path: Path) -> None:
    """SIGTERM as the summary's table is printed (the sweep's fit next): the launcher writes summary.json, leaves the
    law out and exits 143; it was killed at once, without summary.json."""
    config = write_spec(tiny_spec(run={"rounds": 2, "workers": 2}, sweep={"seq_lens": [4, 8]}), tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-c", SLOW_FIT_LAUNCH, str(config), "--run-dir", str(run_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in launcher.stdout:
            lines.append(line)
            if line.startswith(NOTES_LINE):
                launcher.send_signal(signal.SIGTERM)
                break
        rest, _ = launcher.communicate(timeout=30)
    finally:
        stop(launcher)
    output = "".join(lines) + rest
    assert launcher.returncode == 128 + signal.SIGTERM, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "completed" and [r["seq_len"] for r in summary["runs"]] == [4, 8]
    assert summary["law"] is None and summary["law_problem"] == "not fitted: interrupted by SIGTERM"
    assert "SIGTERM: the sweep's law is not fitted" in output


def test_a_second_launch_on_a_run_dir_in_use_is_refused_and_leaves_the_first_ones_files(tmp_path: Path) -> None:
    """B on A's --run-dir: refused at once with exit 2 naming A's pid and its coordinator's address; A's
    coordinator.json and logs untouched; A's lock released when A ends (by SIGTERM here)."""
    config = write_spec(tiny_spec(run={"rounds": 100000, "workers": 1}), tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    first = subprocess.Popen(run_command(str(config), "--run-dir", str(run_dir), "--minutes", "1"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_path = run_dir / "coordinator.json"
        wait_for(lambda: port_path.exists() and port_path.read_text(), 60, "the first launch's coordinator serving")
        port_file = port_path.read_text()
        address = f"127.0.0.1:{json.loads(port_file)['port']}"
        log = (run_dir / "logs" / "coordinator.log").read_text()
        second = subprocess.run(run_command(str(config), "--run-dir", str(run_dir), "--rounds", "5"),
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.strip() == (f"rcswarm run: --run-dir {str(run_dir)!r} is in use by another rcswarm run "
                                         f"(pid {first.pid} on {socket.gethostname()}, its "
                                         f"coordinator serving on {address}); stop it first, or give this one another "
                                         "--run-dir")
        assert port_path.read_text() == port_file
        log_now = (run_dir / "logs" / "coordinator.log").read_text()
        assert log_now.startswith(log) and log_now.count("--- rcswarm run: launched") == 1
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        stop(first)
    StateDirLock.acquire(run_dir, role="launcher", name=LAUNCHER_LOCK).release()
