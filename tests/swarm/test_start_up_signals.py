"""`rcswarm coordinator` processes signalled at the edges of their start, and a port file the OS refuses half-way.

Before (a review, 2026-11-29): `StartUpSignals.hand_over` set SIGTERM to SIG_DFL, with SIGTERM blocked in the main
thread only, before the serving handler was installed: a SIGTERM then reached another thread (gRPC's, the ticker's)
and the default action killed the process (status -15; 3 of 6 runs signalled as soon as the port file appeared); the
port file was written before the hand-over, so a SIGTERM right after it was taken for a stopped start (status 143,
state dir removed, the port file left naming a dead process); a port file whose write failed left `PORT.partial`.
Each coordinator binds 127.0.0.1, port 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.processes import worker_env
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

# The coordinator's main with a patch applied first (PATCH is Python run in the child before main).
LAUNCH = """
import os, resource, signal, sys, time
from rcswarm.cli import coordinator as cli
from rcswarm.cli import signals as signals_module
{patch}
sys.exit(cli.main(sys.argv[1:]))
"""

# The port file written, then 0.5 s before main goes on: a SIGTERM sent as soon as it appears lands in that time.
SLOW_AFTER_PORT_FILE = """
real_write = cli.write_port_file
def write_port_file(path, info):
    real_write(path, info)
    time.sleep(0.5)
cli.write_port_file = write_port_file
"""

# A SIGTERM at the hand-over, just before the serving handler is installed (what one arriving then does).
SIGTERM_AT_HAND_OVER = """
real_install = signals_module.StopSignal.install
def install(self, *signals):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    return real_install(self, *signals)
signals_module.StopSignal.install = install
"""

# A full disk for the port file only: RLIMIT_FSIZE of 8 bytes while it is written (write() fails with EFBIG after
# open() created the file; SIGXFSZ ignored), everything before it written normally.
FULL_DISK_FOR_THE_PORT_FILE = """
real_write = cli.write_port_file
def write_port_file(path, info):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8, hard))
    try:
        return real_write(path, info)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
cli.write_port_file = write_port_file
"""


# A second SIGHUP while the first's reload holds the tokens' lock: the reload of the token file sends it, then
# takes 0.3 s more (once).
SIGHUP_DURING_A_RELOAD = """
from rcswarm.coordinator import tokens as tokens_module
real_load = tokens_module.AcceptedTokens._load
sent = []
def _load(self, path):
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.3)
    return real_load(self, path)
tokens_module.AcceptedTokens._load = _load
"""


def start(tmp_path: Path, patch: str = "", token: list[str] | None = None) -> tuple[subprocess.Popen, Path, Path]:
    """A coordinator process on 127.0.0.1 (port 0) with a port file; (it, its port file, its state dir). `token`:
    its token arguments (default --token TOKEN)."""
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    port_file, state = tmp_path / "port.json", tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH.format(patch=patch), "--config", str(config), "--state-dir", str(state),
         "--host", "127.0.0.1", "--port", "0", *(token or ["--token", TOKEN]), "--port-file", str(port_file)],
        env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    return proc, port_file, state


def sigterm_once_it_serves(proc: subprocess.Popen, port_file: Path) -> tuple[int, str]:
    """SIGTERM as soon as the port file appears (polled every 0.5 ms: an orchestrator that reacts at once); the
    status and stderr."""
    deadline = time.monotonic() + 90
    while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the coordinator hung after SIGTERM:\n{err.decode()[-3000:]}") from None
    return proc.returncode, err.decode()


def ended(proc: subprocess.Popen) -> str:
    """The stderr of `proc` once it ended on its own (killed after 90 s)."""
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return err.decode()


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if " coordinator INFO " not in line and " coordinator WARNING " not in line]


def test_a_sigterm_as_soon_as_the_port_file_appears_stops_a_serving_coordinator(tmp_path: Path) -> None:
    """Status 0 with its orderly stop, the state dir kept, every time: 3 runs as the review's orchestrator, then one
    whose port file is followed by 0.5 s of start-up work (before, that SIGTERM was a stopped start, 143)."""
    for run, patch in enumerate(["", "", "", SLOW_AFTER_PORT_FILE]):
        folder = tmp_path / f"run{run}"
        folder.mkdir()
        proc, port_file, state = start(folder, patch)
        status, err = sigterm_once_it_serves(proc, port_file)
        assert status == 0, f"run {run}: status {status}:\n{err[-3000:]}"
        assert errors(err) == [] and " coordinator INFO stopping: " in err, f"run {run}:\n{err[-3000:]}"
        assert state.is_dir() and port_file.exists(), f"run {run}"


def test_a_sigterm_at_the_hand_over_stops_the_start_never_the_default_action(tmp_path: Path) -> None:
    """Just before the serving handler is installed, SIGTERM still has the start-up one: a stopped start (143, one
    line, no state dir, no port file), never the process killed by the signal's default action (-15)."""
    proc, port_file, state = start(tmp_path, SIGTERM_AT_HAND_OVER)
    err = ended(proc)
    assert proc.returncode == 128 + signal.SIGTERM, f"status {proc.returncode}:\n{err[-3000:]}"
    assert errors(err) == ["rcswarm coordinator: stopped by SIGTERM while starting; removed the new state dir"], err
    assert not state.exists() and not port_file.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]


def test_a_port_file_the_disk_refuses_half_way_leaves_nothing_behind(tmp_path: Path) -> None:
    """A real write() failure (RLIMIT_FSIZE, as a full disk) after open() created `port.partial`: status 1, one line,
    and neither the state dir nor the partial port file is left."""
    proc, port_file, _ = start(tmp_path, FULL_DISK_FOR_THE_PORT_FILE)
    err = ended(proc)
    assert proc.returncode == 1, f"status {proc.returncode}:\n{err[-3000:]}"
    said = f"rcswarm coordinator: --port-file {str(port_file)!r}: cannot write it: File too large; stopped serving"
    assert errors(err) == [said], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]


def test_a_sighup_during_a_token_reload_is_taken_and_sigterm_still_stops_the_coordinator(tmp_path: Path) -> None:
    """SIGHUP's handler reloaded the token file itself, taking the tokens' lock on the main thread: a second SIGHUP
    arriving during that reload ran the handler again, which waited for the lock its own thread held, for good (a
    review, 2026-11-29): SIGTERM then stopped nothing. Now the handler only counts, and the serving loop reloads."""
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKEN + "\n")
    proc, port_file, state = start(tmp_path, SIGHUP_DURING_A_RELOAD, ["--token-file", str(token_file)])
    try:
        deadline = time.monotonic() + 90
        while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert port_file.exists(), "the coordinator did not start"
        proc.send_signal(signal.SIGHUP)
        time.sleep(3.0)  # the reload (and the one the second SIGHUP asks for) done within a loop turn or two
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the coordinator hung after SIGHUP and SIGTERM:\n{err.decode()[-3000:]}") from None
    err = err.decode()
    assert proc.returncode == 0, f"status {proc.returncode}:\n{err[-3000:]}"
    assert err.count("join tokens reloaded: 1 tokens") == 2, err[-3000:]
    assert errors(err) == [] and state.is_dir()
