"""`rcswarm worker --backend hivemind` whose p2pd cannot start (none of its --initial-peers answers, its --host-maddrs
port is in use): hivemind's P2PDaemonError ended the worker in a traceback (a review, 2026-11-29; `rcswarm dht`
already said one line). Now: one ERROR line naming the flag, its value and what p2pd said, exit 1. Real p2pd
processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.hivemind import LOOPBACK
from tests.helpers.processes import worker_env
from tests.helpers.specs import hivemind_spec, write_spec

pytest.importorskip("hivemind")

# A well-formed peer id nobody listens for.
NOBODY = "QmTmJxP2uLLbDXoepuTtjkUfEditFEahfE3HD6hsyN6RbU"


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback TCP port held (listening) by this test while it runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound a moment, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_worker(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """`rcswarm worker --backend hivemind` of a small run with `flags`, run to its end."""
    config = write_spec(hivemind_spec(run={"name": "p2pd"}), tmp_path / "run.toml")
    return subprocess.run([sys.executable, "-m", "rcswarm.cli", "worker", "--backend", "hivemind", "--config",
                           str(config), "--name", "w", "--threads", "1", *flags],
                          env=worker_env(), capture_output=True, text=True, timeout=120, check=False)


def assert_one_error_line(done: subprocess.CompletedProcess, names: str, said: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert f"w cannot start its hivemind peer: p2pd cannot start with {names}: " in errors[0], errors[0]
    assert said in errors[0], errors[0]


def test_a_worker_whose_initial_peers_do_not_answer_says_so_in_one_line(tmp_path: Path, no_new_p2pd: None) -> None:
    nobody = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{NOBODY}"
    done = run_worker(tmp_path, "--host-maddrs", LOOPBACK, "--initial-peers", nobody)
    assert_one_error_line(done, f"--initial-peers {nobody}", "failed to connect to bootstrap peers")


@pytest.mark.wide  # about 15 s; the initial-peers case stays in the default suite
def test_a_worker_whose_host_port_is_in_use_says_so_in_one_line(tmp_path: Path, no_new_p2pd: None,
                                                               busy_port: int) -> None:
    taken = f"/ip4/127.0.0.1/tcp/{busy_port}"
    done = run_worker(tmp_path, "--host-maddrs", taken)
    assert_one_error_line(done, f"--host-maddrs {taken}", "address already in use")
