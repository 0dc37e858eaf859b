"""Shared fixtures: tiny run specs, an in-process coordinator on loopback, worker processes."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.state.store import StateStore
from rcswarm.worker import CoordinatorClient, RetryPolicy

TOKEN = "test-token-0123456789"

# Tests run small models, where one intra-op thread is fastest and immune to oversubscription
# when other processes (worker subprocesses, a parallel build) share the two cores.
torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--wide", action="store_true", help="also run the wide suite (tests marked `wide`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `wide` run only with --wide (make test-all) or RCSWARM_WIDE=1."""
    if config.getoption("--wide") or os.environ.get("RCSWARM_WIDE") == "1":
        return
    skip = pytest.mark.skip(reason="wide suite: run with --wide (make test-all) or RCSWARM_WIDE=1")
    for item in items:
        if "wide" in item.keywords:
            item.add_marker(skip)


def tiny_spec(**tables: dict[str, Any]) -> RunSpec:
    """The tiny LSTM on short windows, with per-table overrides: tiny_spec(sync={"codec": "fp32"})."""
    base: dict[str, dict[str, Any]] = {
        "run": {"name": "test", "rounds": 3, "workers": 2},
        "model": {"name": "lstm_lm", "preset": "tiny"},
        "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
        "inner": {"steps": 5, "lr": 1e-2},
        "sync": {"round_deadline_s": 60.0},
        "coordinator": {"lease_s": 10.0, "max_wait_s": 2.0},
    }
    for table, values in tables.items():
        base.setdefault(table, {}).update(values)
    return RunSpec.from_dict(base)


def write_spec(spec: RunSpec, path: Path) -> Path:
    path.write_text(spec.to_toml())
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class LocalCoordinator:
    running: RunningCoordinator
    state_dir: Path

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    @property
    def service(self) -> SwarmCoordinator:
        return self.running.coordinator

    def client(self, token: str = TOKEN) -> CoordinatorClient:
        return CoordinatorClient(self.target, token, retry=RetryPolicy(max_elapsed_s=5.0))


@pytest.fixture
def start_coordinator(tmp_path: Path) -> Iterator[Callable[..., LocalCoordinator]]:
    """Start in-process coordinators (real gRPC on loopback, port 0); all stopped at teardown."""
    started: list[LocalCoordinator] = []

    def start(spec: RunSpec, state_dir: Path | None = None, **kwargs: Any) -> LocalCoordinator:
        state_dir = state_dir or tmp_path / f"state{len(started)}"
        store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
        running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN, **kwargs).start()
        local = LocalCoordinator(running, state_dir)
        started.append(local)
        return local

    yield start
    for local in started:
        local.running.stop(grace=0.5)


def creds(member: Any) -> dict[str, Any]:
    """The worker_id and worker_secret fields of a request made for `member` (a JoinResponse, or an Identity)."""
    return {"worker_id": member.worker_id, "worker_secret": member.worker_secret}


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


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| / max(max |reference|, tiny): the kernels' comparison with their references."""
    scale = reference.abs().max().clamp_min(1e-300)
    return float((value - reference).abs().max() / scale)


def sql(state_dir: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one SQL statement on a state dir's state.sqlite, through a plain read-only connection.

    Tests may look into the tables directly; the package reads them only through StateStore's named reads.
    """
    connection = sqlite3.connect(f"{(Path(state_dir) / 'state.sqlite').resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        return connection.execute(statement, params).fetchall()
    finally:
        connection.close()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def logs_of(procs: list[subprocess.Popen]) -> str:
    return "\n".join(f"--- {Path(p.log_path).stem} ---\n{Path(p.log_path).read_text(errors='replace')[-3000:]}" for p in procs)
