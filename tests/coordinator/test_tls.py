"""TLS by default off loopback, the self-signed quick start, mutual TLS, the health port, dashboard auth.

Every server here binds 127.0.0.1 (or ::1); the refusal of non-loopback binds is shown by the pure
rule over many hosts and by `rcswarm coordinator` processes that must exit before binding anything.
"""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import os
import ssl
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.coordinator import RunningCoordinator, TLSFiles
from rcswarm.coordinator.tls import (
    QuickStart,
    bind_problem,
    ensure_quick_start,
    server_names,
    worker_host,
    write_self_signed,
)
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.observe.dashboard.auth import COOKIE, SESSION_S, SessionAuth, decide_dashboard_auth
from rcswarm.protos.transport import is_loopback_host, plaintext_warning
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.worker.client import CoordinatorClient, RetriesExhausted, RetryPolicy
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.tls import QUICK_NAMES, health_check, request

LOOPBACK = ["127.0.0.1", "127.0.0.53", "127.255.255.254", "::1", "[::1]", "localhost", "LOCALHOST", "localhost.",
            "::ffff:127.0.0.1", " 127.0.0.1 "]
NOT_LOOPBACK = ["0.0.0.0", "::", "[::]", "", "192.168.1.10", "10.0.0.1", "172.16.0.1", "8.8.8.8", "fe80::1",
                "2001:db8::1", "::ffff:192.168.1.10", "example.com", "myhost", "localhost.example.com",
                "127.0.0.1.nip.io", "ip6-localhost"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts_may_serve_plaintext(host: str) -> None:
    assert is_loopback_host(host)
    assert bind_problem(host, tls=False, insecure=False) is None


@pytest.mark.parametrize("host", NOT_LOOPBACK)
def test_other_hosts_need_tls_or_insecure(host: str) -> None:
    assert not is_loopback_host(host)
    problem = bind_problem(host, tls=False, insecure=False)
    assert problem is not None
    for remedy in ("--tls-self-signed DIR", "--tls-cert FILE --tls-key FILE", "--insecure", "in the clear"):
        assert remedy in problem, problem
    assert bind_problem(host, tls=True, insecure=False) is None
    assert bind_problem(host, tls=False, insecure=True) is None


def test_the_refusal_says_which_kind_of_host() -> None:
    assert "every network interface" in bind_problem("0.0.0.0", False, False)
    assert "every network interface" in bind_problem("::", False, False)
    assert "is not a loopback address" in bind_problem("192.168.1.10", False, False)
    assert "is a host name" in bind_problem("myhost", False, False)


def test_coordinator_refuses_a_lan_address_without_tls_with_a_valid_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: nothing could be bound even by mistake.
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    code = coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                    "--host", "192.0.2.1", "--token", TOKEN, "--port-file", str(tmp_path / "p.json")])
    assert code == 2
    assert "--host 192.0.2.1 is not a loopback address and TLS is off" in capsys.readouterr().err
    assert not (tmp_path / "state").exists() and not (tmp_path / "p.json").exists()


def test_running_coordinator_refuses_a_plaintext_non_loopback_host(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a loopback address and TLS is off"):
        RunningCoordinator(object(), TOKEN, host="192.0.2.1")  # type: ignore[arg-type]


@pytest.mark.parametrize("flags, expected", [
    (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs TLS"),
    (["--tls-san", "example.com"], "--tls-san names go into the certificate --tls-self-signed makes"),
    (["--tls-self-signed", "d", "--tls-cert", "c", "--tls-key", "k"], "give it or --tls-cert/--tls-key, not both"),
    (["--tls-cert", "c"], "--tls-cert and --tls-key go together"),
    (["--http-port", "0", "--http-token-required", "--http-insecure"], "contradict each other"),
    (["--health-port", "50051"], "--health-port 50051: the same as --port"),
    (["--health-port", "70000"], "--health-port 70000: expected 0..65535"),
    (["--http-tls"], "--http-tls serves the dashboard with the coordinator's certificate"),
    (["--host", "0.0.0.0", "--insecure"], None),
    (["--host", "0.0.0.0", "--tls-self-signed", "d"], None),
])
def test_argument_problems(flags: list[str], expected: str | None) -> None:
    args = coordinator_cli.parse_args(["--config", "run.toml", "--state-dir", "s", *flags])
    problem = coordinator_cli._argument_problem(args)
    assert problem == expected if expected is None else expected in problem


def test_quick_start_makes_a_ca_and_certificates_and_reuses_them(tmp_path: Path) -> None:
    from cryptography import x509

    directory = tmp_path / "tls"
    first = ensure_quick_start(directory, QUICK_NAMES)
    assert len(first.notes) == 3  # CA, server, client
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for key in (first.ca_key, first.key, first.client_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    ca = x509.load_pem_x509_certificate(first.ca.read_bytes())
    server = x509.load_pem_x509_certificate(first.cert.read_bytes())
    server.verify_directly_issued_by(ca)
    x509.load_pem_x509_certificate(first.client_cert.read_bytes()).verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost"}
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}

    files = {path: path.read_bytes() for path in (first.ca, first.ca_key, first.cert, first.client_cert)}
    again = ensure_quick_start(directory, QUICK_NAMES)
    assert again.notes == () and all(path.read_bytes() == data for path, data in files.items())

    renamed = ensure_quick_start(directory, [*QUICK_NAMES, "swarm.example.com"])
    assert renamed.ca.read_bytes() == files[first.ca], "a new name must keep the CA the workers trust"
    assert renamed.cert.read_bytes() != files[first.cert]
    assert any("does not cover swarm.example.com" in note for note in renamed.notes)

    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=380)
    renewed = ensure_quick_start(directory, QUICK_NAMES, now=later)
    assert renewed.ca.read_bytes() == files[first.ca]
    assert any("expires on" in note for note in renewed.notes) and len(renewed.notes) == 2

    os.chmod(first.key, 0o644)
    assert any("set its mode to 0600" in note for note in ensure_quick_start(directory, QUICK_NAMES).notes)
    assert stat.S_IMODE(first.key.stat().st_mode) == 0o600


def test_quick_start_never_replaces_a_broken_ca(tmp_path: Path) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    ca = quick.ca.read_bytes()
    quick.ca_key.unlink()
    with pytest.raises(ValueError, match="ca-key.pem is missing beside its pair"):
        ensure_quick_start(quick.directory, QUICK_NAMES)
    other = ensure_quick_start(tmp_path / "other", QUICK_NAMES)
    quick.ca_key.write_bytes(other.ca_key.read_bytes())
    with pytest.raises(ValueError, match="this key does not belong to the certificate"):
        ensure_quick_start(quick.directory, QUICK_NAMES)
    assert quick.ca.read_bytes() == ca


def test_quick_start_names() -> None:
    assert server_names("127.0.0.1", [], "box") == ["127.0.0.1", "localhost", "::1"]
    assert server_names("0.0.0.0", ["swarm.example.com", "203.0.113.7"], "box") == [
        "box", "swarm.example.com", "203.0.113.7", "localhost", "127.0.0.1", "::1"]
    assert server_names("[::]", [], "box")[0] == "box"
    assert server_names("10.1.2.3", ["0:0::1"], "box") == ["10.1.2.3", "::1", "localhost", "127.0.0.1"]
    with pytest.raises(ValueError, match="--tls-san 'a b': expected a DNS name"):
        server_names("127.0.0.1", ["a b"], "box")
    assert worker_host("0.0.0.0", [], "box") == "box"
    assert worker_host("0.0.0.0", ["swarm.example.com"], "box") == "swarm.example.com"
    assert worker_host("10.1.2.3", ["swarm.example.com"], "box") == "10.1.2.3"


def test_server_tls_files_are_checked(tmp_path: Path) -> None:
    cert, key = write_self_signed(tmp_path / "a")
    _, other_key = write_self_signed(tmp_path / "b")
    with pytest.raises(ValueError, match="does not belong to the certificate"):
        TLSFiles(cert, other_key).credentials()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="--tls-cert .*junk.pem: not a PEM file"):
        TLSFiles(tmp_path / "junk.pem", key).credentials()
    with pytest.raises(ValueError, match="--tls-client-ca .*absent.pem: cannot read it"):
        TLSFiles(cert, key, tmp_path / "absent.pem").credentials()


def tls_client(port: int, quick: QuickStart, client: QuickStart | None = None, patience_s: float = 5.0) -> CoordinatorClient:
    cert = client.client_cert if client else None
    key = client.client_key if client else None
    return CoordinatorClient(f"127.0.0.1:{port}", TOKEN, tls_ca=quick.ca, tls_cert=cert, tls_key=key,
                             retry=RetryPolicy(max_elapsed_s=patience_s))


def test_mutual_tls_accepts_only_certificates_of_the_client_ca(start_coordinator: Any, tmp_path: Path) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key, quick.ca))

    signed = tls_client(local.port, quick, quick)
    assert signed.join("signed", "cpu", 1).worker_id
    signed.close()
    # Told apart from a coordinator going down (worker/client.py `refuses_client_certificate`): the fix is named.
    for name, client, said in (("no certificate", None, "requires a client certificate"),
                               ("another CA's certificate", stranger, "refuses the client certificate")):
        refused = tls_client(local.port, quick, client, patience_s=1.0)
        started = time.monotonic()
        with pytest.raises(RetriesExhausted, match="UNAVAILABLE") as excinfo:
            refused.join(name, "cpu", 1)
        assert time.monotonic() - started < 10, "a refused handshake ends within the patience"
        assert said in str(excinfo.value) and "--tls-client-ca signed" in str(excinfo.value), str(excinfo.value)
        refused.close()
    assert [w.name for w in local.service.status().workers] == ["signed"]


def test_quick_start_without_client_ca_serves_any_tls_client(start_coordinator: Any, tmp_path: Path) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key))
    client = tls_client(local.port, quick)
    assert client.join("tls", "cpu", 1).worker_id
    client.close()
    args = coordinator_cli.parse_args(["--config", "c", "--state-dir", "s", "--tls-self-signed", str(quick.directory)])
    command = coordinator_cli.worker_command(args, local.port, quick, tiny_spec())
    assert command == ["rcswarm", "worker", "--coordinator", f"127.0.0.1:{local.port}", "--tls-ca", str(quick.ca.resolve())]
    # A run on a git dataset: the command carries it as the data root (the worker reads none without one).
    git = tiny_spec(model={"name": "frame", "preset": "tiny"},
                    data={"source": "git", "seq_len": 8, "task_config": {"dataset": str(tmp_path / "frames")}})
    command = coordinator_cli.worker_command(args, local.port, quick, git)
    assert command[-2:] == ["--data-root", str((tmp_path / "frames").resolve())]


def test_health_port_answers_in_plaintext_while_the_main_port_is_tls(start_coordinator: Any, tmp_path: Path) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key), health_port=0)
    health_target = f"127.0.0.1:{local.running.health_port}"
    for service in ("", "rcswarm.v1.Coordinator"):
        assert health_check(health_target, service) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as plaintext_main:
        health_check(local.target)
    assert plaintext_main.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(health_target) as channel:
        with pytest.raises(grpc.RpcError) as coordinator_rpc:
            pb_grpc.CoordinatorStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5,
                                                       metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert coordinator_rpc.value.code() == grpc.StatusCode.UNIMPLEMENTED, "the health port serves health only"
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as watched:
            next(watch)
        assert watched.value.code() == grpc.StatusCode.UNIMPLEMENTED, "a Watch stream would hold a thread"
    local.running.health.set("rcswarm.v1.Coordinator", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert health_check(health_target) == health_pb2.HealthCheckResponse.NOT_SERVING, "one status for both ports"


def test_the_coordinator_serves_ipv6_loopback(start_coordinator: Any) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        pytest.skip(f"no IPv6 loopback here: {error}")
    local = start_coordinator(tiny_spec(), host="::1", health_port=0)
    client = CoordinatorClient(f"[::1]:{local.port}", TOKEN, retry=RetryPolicy(max_elapsed_s=5.0))
    assert client.join("v6", "cpu", 1).worker_id
    client.close()
    assert health_check(f"[::1]:{local.running.health_port}") == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_warning_only_off_loopback() -> None:
    for target in ("127.0.0.1:50051", "localhost:50051", "[::1]:50051", "dns:///localhost:50051", "unix:/tmp/sock"):
        assert plaintext_warning(target) is None, target
    for target in ("192.0.2.1:50051", "swarm.example.com:443", "[2001:db8::1]:50051", "dns:///swarm.example.com:1"):
        warning = plaintext_warning(target)
        assert warning is not None and target in warning and "--tls-ca" in warning


def test_a_plaintext_client_of_a_remote_coordinator_warns_once(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.WARNING, logger="rcswarm.transport")
    CoordinatorClient("192.0.2.1:50051", TOKEN).close()  # no call: the channel never connects
    assert [r.getMessage() for r in caplog.records].count(plaintext_warning("192.0.2.1:50051")) == 1
    caplog.clear()
    CoordinatorClient("127.0.0.1:50051", TOKEN).close()
    cert, _ = write_self_signed(tmp_path)
    CoordinatorClient("192.0.2.1:50051", TOKEN, tls_ca=cert).close()
    assert caplog.records == []


def test_a_client_certificate_needs_a_ca_and_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="need --tls-ca"):
        CoordinatorClient("127.0.0.1:1", TOKEN, tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem")
    with pytest.raises(ValueError, match="give both or neither"):
        CoordinatorClient("127.0.0.1:1", TOKEN, tls_ca=tmp_path / "ca.pem", tls_cert=tmp_path / "c.pem")


@pytest.mark.parametrize("host, required, insecure, https, expected, warning", [
    ("127.0.0.1", False, False, False, False, None),
    ("::1", False, False, False, False, None),
    ("localhost", False, False, False, False, None),
    ("127.0.0.1", True, False, False, True, None),
    ("0.0.0.0", False, False, True, True, None),
    ("::", False, False, True, True, None),
    ("192.168.1.10", False, False, True, True, None),
    ("dashboard.example.com", True, False, True, True, None),
    ("0.0.0.0", False, False, False, True, "over plain HTTP"),
    ("0.0.0.0", False, True, False, False, "no authentication (--http-insecure)"),
])
def test_dashboard_requires_the_token_off_loopback(host: str, required: bool, insecure: bool, https: bool,
                                                   expected: bool, warning: str | None) -> None:
    needed, said = decide_dashboard_auth(host, required, insecure, https)
    assert needed is expected
    assert said is None if warning is None else warning in said


GUARDED = ["/", "/api/status", "/metrics", "/api/metrics?since=0", "/plot/loss_step.png"]


def test_dashboard_with_the_token_required(start_coordinator: Any) -> None:
    local = start_coordinator(tiny_spec(), http_port=0, http_token_required=True)
    port = local.running.dashboard.port
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in GUARDED:
        status, headers, _ = request(port, "GET", path)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
        assert request(port, "GET", path, {"Authorization": "Bearer wrong"})[0] == 401, path
        assert request(port, "GET", path, {"Authorization": f"Bearer {TOKEN}x"})[0] == 401, path
        assert request(port, "GET", path, bearer)[0] == 200, path
    status, _, page = request(port, "GET", "/")
    assert b'<form method="post" action="/login">' in page and TOKEN.encode() not in page
    assert request(port, "GET", "/healthz")[0] == 200
    assert request(port, "GET", "/login")[0] == 200

    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, _ = request(port, "POST", "/login", form, "token=wrong")
    assert status == 401 and headers.get("Set-Cookie") is None
    status, headers, _ = request(port, "POST", "/login", form, f"token={TOKEN}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert TOKEN not in cookie and TOKEN.encode().hex() not in cookie, "the cookie must not hold the token"
    session = cookie.split(";", 1)[0]
    assert session.startswith(f"{COOKIE}=")
    for path in GUARDED:
        assert request(port, "GET", path, {"Cookie": session})[0] == 200, path
    forged = session[:-4] + ("0000" if not session.endswith("0000") else "1111")
    assert request(port, "GET", "/api/status", {"Cookie": forged})[0] == 401
    status, _, body = request(port, "GET", "/api/status", bearer)
    assert json.loads(body)["run_id"] == local.service.run_id


def test_dashboard_on_loopback_needs_no_token_by_default(start_coordinator: Any) -> None:
    local = start_coordinator(tiny_spec(), http_port=0)
    assert local.running.dashboard.auth is None
    assert request(local.running.dashboard.port, "GET", "/api/status")[0] == 200
    assert request(local.running.dashboard.port, "POST", "/login", {}, f"token={TOKEN}")[0] == 405


def test_session_cookies_expire_and_die_with_the_process() -> None:
    now = [1_000_000.0]
    auth = SessionAuth(JoinTokens([TOKEN]).accepts_token, clock=lambda: now[0])
    value = auth.new_cookie()
    assert auth.cookie_ok(value)
    assert not SessionAuth(JoinTokens([TOKEN]).accepts_token, clock=lambda: now[0]).cookie_ok(value), "another process's key"
    now[0] += SESSION_S + 1
    assert not auth.cookie_ok(value)
    for bad in ("", "v1", "v1.x.y.z", f"v2.{int(now[0])}.00.00", value.replace("v1.", "v1.9", 1)):
        assert not auth.cookie_ok(bad), bad
    assert not auth.token_ok("") and auth.token_ok(TOKEN) and not auth.token_ok(TOKEN[:-1])


def test_dashboard_over_https_with_the_coordinators_certificate(start_coordinator: Any, tmp_path: Path) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key), http_port=0, http_tls=True,
                              http_token_required=True)
    dashboard = local.running.dashboard
    assert dashboard.url.startswith("https://127.0.0.1:")
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert request(dashboard.port, "GET", "/api/status", ca=quick.ca)[0] == 401
    assert request(dashboard.port, "GET", "/api/status", bearer, ca=quick.ca)[0] == 200
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, _ = request(dashboard.port, "POST", "/login", form, f"token={TOKEN}", ca=quick.ca)
    assert status == 303 and "; Secure" in headers["Set-Cookie"]
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        request(dashboard.port, "GET", "/api/status", bearer)  # plain HTTP gets no answer
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    with pytest.raises(ssl.SSLCertVerificationError):
        request(dashboard.port, "GET", "/healthz", ca=stranger.ca)
    assert request(dashboard.port, "GET", "/healthz", ca=quick.ca)[0] == 200, "a failed handshake harms no one else"


def test_https_dashboard_needs_the_coordinators_tls(start_coordinator: Any) -> None:
    with pytest.raises(ValueError, match="--http-tls serves the dashboard with the coordinator's certificate"):
        start_coordinator(tiny_spec(), http_port=0, http_tls=True)
