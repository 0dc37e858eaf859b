"""`rcswarm run`'s watch over its processes (cli/run.py): real processes stand in for the coordinator and a worker."""

from __future__ import annotations

import dataclasses
import io
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

from rcswarm.cli import run
from rcswarm.worker import CoordinatorClient, RetryPolicy
from tests.helpers.specs import tiny_spec


def test_the_watch_waits_out_a_coordinator_that_does_not_answer_and_ends_when_it_exits(tmp_path: Path):
    """A coordinator that does not answer (stalled; here nothing listens on its port) is waited out, as its workers
    wait it out: the status client's RetriesExhausted once ended the launcher with a traceback, stopping a healthy
    swarm without a summary. The watch ends when the coordinator's process does."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    swarm = run.Swarm(tiny_spec(), tmp_path, 1)
    swarm.coordinator = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    swarm.workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]
    client = CoordinatorClient(f"127.0.0.1:{port}", "token", retry=RetryPolicy(max_elapsed_s=0.3))
    try:
        started = time.monotonic()
        out_of_time = run.watch(swarm, client, 10, Console(file=io.StringIO()), threading.Event(), time.monotonic() + 30)
        elapsed = time.monotonic() - started
    finally:
        client.close()
        for process in (swarm.coordinator, *swarm.workers):
            process.kill()
            process.wait()
    assert out_of_time is False and 3.0 < elapsed < 15.0, elapsed


def test_a_coordinator_that_refuses_to_start_ends_the_launcher_with_its_own_message(tmp_path: Path):
    """The coordinator's refusal at start (here: its state dir is a file) is the launcher's error line, with the
    exit code it ended with; it was a traceback saying the coordinator "did not start within 60s"."""
    (tmp_path / "state").write_text("not a state dir\n")
    result = subprocess.run([sys.executable, "-m", "rcswarm.cli", "run", "--run-dir", str(tmp_path), "--rounds", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("rcswarm run: the coordinator exited with code 2 at start;"), result.stderr
    state = str(tmp_path / "state")
    assert f"rcswarm coordinator: --state-dir {state!r}: {state!r} is not a directory" in result.stderr
    assert "Traceback" not in result.stderr and "did not start within" not in result.stderr
    assert not (tmp_path / "logs" / "worker-0.log").exists()  # no worker was started


def test_a_second_launch_in_the_same_run_dir_waits_for_its_own_coordinator(tmp_path: Path):
    """The previous launch's coordinator.json names a port nothing serves now: `rcswarm run --run-dir X` run again
    read it at once and sent its workers to the dead port for their whole patience (a hang). The launcher now takes
    only the port file its own coordinator wrote (the file names the writer's pid)."""
    stale = {"port": 1, "http_port": 2, "run_id": "old", "pid": 1}
    (tmp_path / "coordinator.json").write_text(json.dumps(stale))
    swarm = run.Swarm(tiny_spec(), tmp_path, 1)
    (tmp_path / "run.toml").write_text(swarm.spec.to_toml())
    try:
        port, http_port = swarm.start_coordinator()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        swarm.stop()
    assert (port, http_port) != (1, 2)
    assert json.loads((tmp_path / "coordinator.json").read_text())["pid"] == swarm.coordinator.pid


def test_a_refused_relaunch_keeps_the_run_dirs_config_and_logs(tmp_path: Path):
    """A second `rcswarm run` into a run dir with a config its state dir refuses (another lr) wrote its config over
    run.toml, the one the refusal tells the user to use, and cut the coordinator's log to the refusal: run.toml
    becomes a launch's config only once its coordinator serves, and the logs are appended to."""
    spec = tiny_spec(run={"rounds": 1, "workers": 1})
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(spec.to_toml())
    second.write_text(dataclasses.replace(spec, inner=dataclasses.replace(spec.inner, lr=0.5)).to_toml())
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rcswarm.cli", "run", "--run-dir", str(run_dir)]
    done = subprocess.run([*command, str(first)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    log_before = (run_dir / "logs" / "coordinator.log").read_text()
    refused = subprocess.run([*command, str(second)], capture_output=True, text=True, timeout=180)
    assert refused.returncode == 1 and "differs" in refused.stderr, refused.stdout + refused.stderr
    assert (run_dir / "run.toml").read_text() == spec.to_toml()
    assert not (run_dir / "run.toml.launching").exists()
    log_after = (run_dir / "logs" / "coordinator.log").read_text()
    assert log_after.startswith(log_before) and log_after.count("--- rcswarm run: launched") == 2
