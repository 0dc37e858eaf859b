"""`rcswarm dht --http-port P` with P in use (review of the hivemind backend, 2026-11-29): the dashboard's bind error
ended the command in a traceback. Now: one ERROR line naming the address and the reason, exit 1, the DHT and its p2pd
shut down. A real p2pd, so here among the tests that start processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers.hivemind import LOOPBACK
from tests.helpers.specs import hivemind_spec, write_spec


def test_a_dashboard_port_in_use_is_one_line_and_exit_1(tmp_path: Path, no_new_p2pd: None) -> None:
    config = write_spec(hivemind_spec(), tmp_path / "run.toml")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "rcswarm.cli", "dht", "--host-maddrs", LOOPBACK, "--config", str(config),
             "--state-dir", str(tmp_path / "state"), "--http-port", str(port)],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, done.stderr
    assert f"the dashboard cannot serve on 127.0.0.1:{port}: Address already in use" in errors[0], errors
