"""The coordinator image's HEALTHCHECK script (docker/healthcheck.py) in its own process, against a real gRPC
health server."""

from __future__ import annotations

import subprocess
import sys

from grpc_health.v1 import health_pb2

from tests.helpers.deploy import COORDINATOR_SERVICE, DOCKER, load_healthcheck


def test_healthcheck_script_follows_the_health_service(health_server):
    servicer, address = health_server
    check = load_healthcheck()
    assert check.COORDINATOR_SERVICE == COORDINATOR_SERVICE
    servicer.set(COORDINATOR_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    done = subprocess.run([sys.executable, str(DOCKER / "healthcheck.py"), "--address", address],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "SERVING" in done.stdout, done.stdout + done.stderr
    servicer.set(COORDINATOR_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check.main(["--address", address]) == 1
    assert check.check(address, "no.such.Service", 5.0) == (False, "NOT_FOUND")
