"""Processes for the tests under tests/swarm/: worker and coordinator commands, their environment and logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.helpers.specs import TOKEN
from tests.helpers.waiting import wait_for


def worker_env(threads: int = 1) -> dict[str, str]:
    return {**os.environ, "RCSWARM_TOKEN": TOKEN, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `python -m rcswarm.cli worker` processes; any still alive at teardown are killed."""
    procs: list[subprocess.Popen] = []

    def spawn(target: str, name: str, *extra: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", target, "--name", name, "--threads", "1", *extra],
            env=worker_env(), stdout=log, stderr=subprocess.STDOUT,
        )
        proc.log_path = tmp_path / f"{name}.log"  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


ROOT = Path(__file__).resolve().parents[2]


def spawn_paced(target: str, name: str, factor: float, floor_s: float, log_dir: Path) -> subprocess.Popen:
    """A `tests.helpers.paced_worker` process (one torch thread) whose steps take factor × max(t, floor_s)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.paced_worker", "--factor", str(factor), "--floor-s", str(floor_s),
         "--coordinator", target, "--name", name, "--threads", "1"],
        env=worker_env(1), cwd=ROOT, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
    )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def logs_of(procs: list[subprocess.Popen]) -> str:
    return "\n".join(f"--- {Path(p.log_path).stem} ---\n{Path(p.log_path).read_text(errors='replace')[-3000:]}" for p in procs)


def start_coordinator_process(config, state_dir, port, log_path) -> subprocess.Popen:
    port_file = state_dir.parent / "port.json"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", str(state_dir),
         "--port", str(port), "--port-file", str(port_file)],
        env=worker_env(), stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,
    )
    wait_for(port_file.exists, 60, "the coordinator to serve")
    return proc


def train_to_the_end(local, spawn_worker, workers: int, timeout: float = 180.0):
    """Spawn `workers` worker processes (w0, w1, ...) at the coordinator `local`, wait until each exited 0 (the run
    finished) and return the coordinator's status."""
    procs = [spawn_worker(local.target, f"w{i}") for i in range(workers)]
    for proc in procs:
        assert proc.wait(timeout=timeout) == 0, logs_of(procs)
    return local.client().status()
