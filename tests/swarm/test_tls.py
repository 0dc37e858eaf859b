"""TLS with real processes: the coordinator command refuses a wildcard bind without TLS, the self-signed quick
start end to end with mutual TLS, and a worker with the wrong CA, or without the client certificate mutual TLS requires,
gives up with a clear message."""

from __future__ import annotations

import json
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from rcswarm.coordinator import TLSFiles
from rcswarm.coordinator.tls import (
    ensure_quick_start,
)
from tests.helpers.processes import logs_of, worker_env
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.state import read_state
from tests.helpers.tls import QUICK_NAMES, health_check, request
from tests.helpers.waiting import wait_for


@pytest.mark.slow
def test_coordinator_refuses_a_wildcard_bind_without_tls_before_creating_anything(tmp_path: Path) -> None:
    # The config does not exist: were the check late (after reading the config), the process would fail
    # on the config instead, and it never reaches a bind of 0.0.0.0 either way.
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(tmp_path / "absent.toml"), "--state-dir",
         str(tmp_path / "state"), "--port-file", str(tmp_path / "port.json"), "--host", "0.0.0.0", "--port", "0",
         "--http-port", "0"],
        env=worker_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "rcswarm coordinator: --host '0.0.0.0' listens on every network interface and TLS is off" in result.stderr
    assert "--tls-self-signed DIR" in result.stderr and "--insecure" in result.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "port.json").exists()


@pytest.mark.slow
def test_self_signed_quick_start_end_to_end_with_mutual_tls(tmp_path: Path) -> None:
    """The CLI path: the logged worker command trains a real worker; the health port and the HTTPS dashboard
    with the token required answer as configured."""
    config = write_spec(tiny_spec(run={"rounds": 2, "workers": 1}), tmp_path / "run.toml")
    port_file, log_path = tmp_path / "port.json", tmp_path / "coordinator.log"
    with open(log_path, "wb") as log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", str(tmp_path / "state"),
             "--port", "0", "--port-file", str(port_file), "--tls-self-signed", str(tmp_path / "tls"),
             "--tls-client-ca", str(tmp_path / "tls" / "ca.pem"), "--health-port", "0", "--http-port", "0",
             "--http-token-required", "--http-tls"],
            env=worker_env(), stdout=log, stderr=subprocess.STDOUT,
        )
    worker = None
    try:
        wait_for(port_file.exists, 60, "the coordinator to serve")
        info = json.loads(port_file.read_text())
        lines = [line for line in log_path.read_text().splitlines() if "worker command: " in line]
        assert len(lines) == 1, log_path.read_text()
        command = shlex.split(lines[0].split("worker command: ", 1)[1])
        assert command[:2] == ["rcswarm", "worker"]
        assert command[command.index("--coordinator") + 1] == f"127.0.0.1:{info['port']}"
        assert command[command.index("--tls-ca") + 1] == str((tmp_path / "tls" / "ca.pem").resolve())
        assert "--tls-cert" in command and "--tls-key" in command, "mutual TLS: the command carries the client cert"
        assert stat.S_IMODE((tmp_path / "tls" / "ca-key.pem").stat().st_mode) == 0o600
        assert health_check(f"127.0.0.1:{info['health_port']}") == health_pb2.HealthCheckResponse.SERVING
        ca = tmp_path / "tls" / "ca.pem"
        assert request(info["http_port"], "GET", "/api/status", ca=ca)[0] == 401
        assert request(info["http_port"], "GET", "/api/status", {"Authorization": f"Bearer {TOKEN}"}, ca=ca)[0] == 200

        with open(tmp_path / "worker.log", "wb") as worker_log:
            worker = subprocess.Popen([sys.executable, "-m", "rcswarm.cli", *command[1:], "--name", "w0", "--threads", "1"],
                                      env=worker_env(), stdout=worker_log, stderr=subprocess.STDOUT)
        worker.log_path = tmp_path / "worker.log"  # type: ignore[attr-defined]
        assert worker.wait(timeout=120) == 0, logs_of([worker]) + log_path.read_text()
        rounds = [r.version for r in read_state(tmp_path / "state", lambda store: store.rounds())]
        assert len(rounds) >= 2, rounds
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)


@pytest.mark.slow
def test_a_worker_with_the_wrong_ca_gives_up_with_a_clear_message(start_coordinator: Any, tmp_path: Path) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key))
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", f"127.0.0.1:{local.port}", "--tls-ca",
         str(stranger.ca), "--patience-s", "2", "--name", "lost", "--threads", "1"],
        env=worker_env(), capture_output=True, text=True, timeout=90,
    )
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 60
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    # Given up at once (worker/client.py `TLSMismatch`), not after the patience: no retry changes the CA.
    assert "does not verify against --tls-ca" in errors[0] and "CERTIFICATE_VERIFY_FAILED" in errors[0], errors[0]
    assert local.service.status().workers == []


@pytest.mark.slow
def test_a_worker_without_the_client_certificate_mutual_tls_requires_ends_at_once(start_coordinator: Any,
                                                                                   tmp_path: Path) -> None:
    """gRPC tells such a worker only "Socket closed", as a restarting coordinator: a probe tells them apart
    (worker/client.py `refuses_client_certificate`), and the worker and `rcswarm status` print the same fix."""
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key, client_ca=quick.ca))
    fix = "pass --tls-cert and --tls-key with a client certificate the coordinator's --tls-client-ca signed"
    for cert, said in ((None, f"{local.target} requires a client certificate (it runs with --tls-client-ca)"),
                       (stranger, f"{local.target} refuses the client certificate --tls-cert {stranger.client_cert}")):
        flags = ["--coordinator", local.target, "--tls-ca", str(quick.ca)]
        if cert is not None:
            flags += ["--tls-cert", str(cert.client_cert), "--tls-key", str(cert.client_key)]
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "rcswarm.cli", "worker", *flags, "--patience-s", "300",
                                 "--name", "lost", "--threads", "1"],
                                env=worker_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stderr
        assert time.monotonic() - started < 60, "ended at once, not after its patience"
        errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and said in errors[0] and fix in errors[0], result.stderr
        status = subprocess.run([sys.executable, "-m", "rcswarm.cli", "status", *flags, "--timeout", "5"],
                                env=worker_env(), capture_output=True, text=True, timeout=60)
        assert status.returncode == 1, status.stderr
        line = status.stderr.strip().splitlines()[-1]
        assert line.startswith(f"rcswarm status: {said}") and fix in line, status.stderr
        assert line.split(": ", 1)[1].split(" (UNAVAILABLE")[0] in errors[0], (line, errors[0])
    assert local.service.status().workers == []
