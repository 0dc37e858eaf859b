"""`--http-trusted-proxy CIDR` on `rcswarm coordinator` and `rcswarm dht`: checked before anything starts (a usage
error naming the value), and passed to the dashboard, where a trusted proxy's X-Forwarded-For names the client
(observe/dashboard/proxies.py; the rule and the dashboard's behaviour: tests/observe/test_dashboard_trusted_proxies.py).
Every server here binds 127.0.0.1."""

from __future__ import annotations

import http.client
import ipaddress
import logging
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.cli import dht as dht_cli
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.state.store import StateStore
from tests.helpers.dht_mirror import spec as mirror_spec
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

ALICE, MALLORY = "203.0.113.7", "198.51.100.66"


def login(port: int, token: str, client: str) -> int:
    """POST /login through "the proxy" 127.0.0.1 for `client` (X-Forwarded-For): the status."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/login", body=f"token={token}",
                           headers={"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-For": client})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def coordinator_flags(tmp_path: Path, *more: str) -> list[str]:
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    return ["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0", "--token", TOKEN, *more]


def test_the_coordinator_checks_its_trusted_proxies_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def problem(*flags: str) -> str | None:
        return coordinator_cli._argument_problem(coordinator_cli.parse_args(coordinator_flags(tmp_path, *flags)))

    dashboard = ("--http-port", "0")
    assert problem(*dashboard, "--http-trusted-proxy", "10.0.0.0/8", "--http-trusted-proxy", "fd00::/8") is None
    assert problem(*dashboard, "--http-trusted-proxy", "127.0.0.1") is None
    assert problem("--http-trusted-proxy", "10.0.0.0/8") == (
        "--http-trusted-proxy: only with --http-port (it names the reverse proxies in front of the dashboard)")
    said = problem(*dashboard, "--http-trusted-proxy", "10.0.0.0/8", "--http-trusted-proxy", "10.1.2.3/16")
    assert said is not None and said.startswith("--http-trusted-proxy '10.1.2.3/16': ") and "10.1.0.0/16" in said
    assert "trusts every address" in (problem(*dashboard, "--http-trusted-proxy", "0.0.0.0/0") or "")

    code = coordinator_cli.main(coordinator_flags(tmp_path, *dashboard, "--http-trusted-proxy", "ingress-nginx",
                                                  "--port-file", str(tmp_path / "p.json")))
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rcswarm coordinator: --http-trusted-proxy 'ingress-nginx': expected an IP network"), err
    assert not (tmp_path / "state").exists() and not (tmp_path / "p.json").exists()


def test_the_coordinator_passes_its_trusted_proxies_to_the_dashboard(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Recorded(RunningCoordinator):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.update(kwargs)
            raise RuntimeError("recorded")

    monkeypatch.setattr(coordinator_cli, "RunningCoordinator", Recorded)
    flags = coordinator_flags(tmp_path, "--http-port", "0", "--http-trusted-proxy", "10.0.0.0/8",
                              "--http-trusted-proxy", "127.0.0.1")
    assert coordinator_cli.main(flags) == 1
    assert seen["http_trusted_proxies"] == ["10.0.0.0/8", "127.0.0.1"]


def test_a_running_coordinators_dashboard_counts_the_forwarded_client(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    spec = tiny_spec()
    store = StateStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    service = SwarmCoordinator(spec, store)
    with pytest.raises(ValueError, match="--http-trusted-proxy 'bogus'"):
        RunningCoordinator(service, TOKEN, http_port=0, http_trusted_proxies=["bogus"])
    running = RunningCoordinator(service, TOKEN, http_port=0, http_token_required=True,
                                 http_trusted_proxies=["127.0.0.1"]).start()
    try:
        dashboard = running.dashboard
        assert dashboard.trusted_proxies.networks == (ipaddress.ip_network("127.0.0.1/32"),)
        with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
            # The throttle's 5 free failures and the one that earns a backoff, all Mallory's.
            assert [login(dashboard.port, f"guess{index}", MALLORY) for index in range(6)] == [401] * 6
        assert dashboard.auth.throttle.wait_s("127.0.0.1") == 0.0, "the proxy itself is not held back"
        assert login(dashboard.port, TOKEN, ALICE) == 303
        assert f"a failed login from {MALLORY} (via 127.0.0.1)" in caplog.text
    finally:
        running.stop(grace=0.5)
        service.close()


def test_the_mirror_checks_and_passes_its_trusted_proxies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("RCSWARM_TOKEN", raising=False)
    config = str(write_spec(mirror_spec(), tmp_path / "run.toml"))
    flags = ["--config", config, "--state-dir", str(tmp_path / "state"), "--http-port", "0"]

    def problem(*more: str) -> str | None:
        return dht_cli._argument_problem(dht_cli.parser().parse_args([*flags, *more]))

    assert problem("--http-trusted-proxy", "10.0.0.0/8", "--http-trusted-proxy", "::1") is None
    assert (problem("--http-trusted-proxy", "10.0.0.0/99") or "").startswith("--http-trusted-proxy '10.0.0.0/99': ")
    assert dht_cli.main(["--http-trusted-proxy", "10.0.0.0/8"]) == 2
    assert "--http-trusted-proxy: only with --http-port" in capsys.readouterr().err
    assert dht_cli.main([*flags, "--http-trusted-proxy", "nonsense"]) == 2
    assert "rcswarm dht: --http-trusted-proxy 'nonsense': expected an IP network" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()

    dht_cli.Mirror(mirror_spec(), tmp_path / "state").close()  # a mirrored state dir
    monkeypatch.setenv("RCSWARM_TOKEN", TOKEN)
    args = dht_cli.parser().parse_args([*flags, "--http-token-required", "--http-trusted-proxy", "127.0.0.1"])
    assert dht_cli._argument_problem(args) is None
    dashboard = dht_cli.start_dashboard(args)
    try:
        assert dashboard.trusted_proxies.networks == (ipaddress.ip_network("127.0.0.1/32"),)
        assert [login(dashboard.port, f"guess{index}", MALLORY) for index in range(6)] == [401] * 6
        assert login(dashboard.port, TOKEN, ALICE) == 303
    finally:
        dashboard.stop()
        dashboard.coordinator.close()
