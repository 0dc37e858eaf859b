"""A worker whose TLS settings do not match the coordinator's ends at once, with the fix, instead of retrying for its
patience: a CA that did not sign the coordinator's certificate, TLS against a plaintext port, plaintext against a TLS
coordinator (told apart from a restarting one: that port answers a TLS handshake), no client certificate or one it
refuses against a coordinator with --tls-client-ca (told apart so: it closes the connection, or sends an alert, after
the TLS handshake instead of its HTTP/2 SETTINGS). What a restart looks like (a refused or closed connection) is still
retried, the retry message naming TLS as a possible cause."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from rcswarm.coordinator import TLSFiles
from rcswarm.coordinator.tls import ensure_quick_start
from rcswarm.worker.client import (
    CoordinatorClient,
    RetriesExhausted,
    RetryPolicy,
    TLSMismatch,
    answers_tls,
    closed_address,
    refused_after_handshake,
    refuses_client_certificate,
    tls_problem,
    tls_settings_problem,
)
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.tls import QUICK_NAMES

# Far longer than any of these tests may take: an end "at once" is not the patience running out.
PATIENCE_S = 120.0


def client(target: str, **tls: Any) -> CoordinatorClient:
    return CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=PATIENCE_S), **tls)


def join_fails(target: str, **tls: Any) -> tuple[RetriesExhausted, float]:
    """The error a join ends with, and the seconds it took."""
    worker = client(target, **tls)
    started = time.monotonic()
    try:
        with pytest.raises(RetriesExhausted) as raised:
            worker.join("w", "cpu", 1)
    finally:
        worker.close()
    return raised.value, time.monotonic() - started


@pytest.fixture
def tls_coordinator(start_coordinator: Any, tmp_path: Path) -> Any:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    return start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key)), quick


def test_a_plaintext_worker_against_a_tls_coordinator_ends_at_once_naming_tls_ca(tls_coordinator: Any) -> None:
    local, _ = tls_coordinator
    error, seconds = join_fails(local.target)
    assert isinstance(error, TLSMismatch) and seconds < 10, (seconds, error)
    text = str(error)
    assert f"{local.target} requires TLS" in text and "pass --tls-ca with the coordinator's CA certificate" in text
    assert "Socket closed" in text, "the gRPC error it was told from"
    assert local.service.status().workers == []


def test_a_ca_from_another_directory_ends_at_once(tls_coordinator: Any, tmp_path: Path) -> None:
    local, _ = tls_coordinator
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    error, seconds = join_fails(local.target, tls_ca=stranger.ca)
    assert isinstance(error, TLSMismatch) and seconds < 10, (seconds, error)
    text = str(error)
    assert f"does not verify against --tls-ca {stranger.ca}" in text and "pass --tls-ca" in text
    assert "CERTIFICATE_VERIFY_FAILED" in text


def test_tls_against_a_plaintext_coordinator_ends_at_once(start_coordinator: Any, tmp_path: Path) -> None:
    local = start_coordinator(tiny_spec())
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    error, seconds = join_fails(local.target, tls_ca=quick.ca)
    assert isinstance(error, TLSMismatch) and seconds < 10, (seconds, error)
    assert "does not speak TLS, but --tls-ca is given" in str(error)


def test_the_right_ca_joins(tls_coordinator: Any) -> None:
    local, quick = tls_coordinator
    worker = client(local.target, tls_ca=quick.ca)
    try:
        assert worker.join("w", "cpu", 1).worker_id
    finally:
        worker.close()


@pytest.fixture
def closing_port() -> Iterator[int]:
    """A port that accepts connections and closes them as soon as it has read what the client sent first, as a
    coordinator going down may: not TLS. (Closing with the client's bytes unread sends a reset instead of a close,
    "Connection reset by peer", which under load made the message this file checks flaky.)"""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.settimeout(0.5)
            try:
                connection.recv(65536)
            except OSError:
                pass
            connection.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def join_until_given_up(target: str, patience_s: float, caplog: pytest.LogCaptureFixture) -> RetriesExhausted:
    """A plaintext worker's Join at `target` retried until it gives up (within `patience_s`): what it raised."""
    worker = CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=patience_s))
    try:
        with caplog.at_level(logging.WARNING, "rcswarm.worker"), pytest.raises(RetriesExhausted) as raised:
            worker.join("w", "cpu", 1)
    finally:
        worker.close()
    return raised.value


def test_a_closed_connection_that_is_not_tls_is_retried_with_the_hint(closing_port: int,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A restart is not a TLS problem: retried until the patience ends, the retry message naming --tls-ca."""
    given_up = join_until_given_up(f"127.0.0.1:{closing_port}", 1.5, caplog)
    assert not isinstance(given_up, TLSMismatch) and "gave up after" in str(given_up)
    assert any("Socket closed" in r.message and "or it requires TLS: then pass --tls-ca" in r.message
               for r in caplog.records), [r.message for r in caplog.records]
    assert not answers_tls(("127.0.0.1", closing_port))


def test_a_refused_connection_is_retried_without_a_tls_hint(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    given_up = join_until_given_up(f"127.0.0.1:{port}", 1.0, caplog)
    assert not isinstance(given_up, TLSMismatch)
    assert caplog.records and not any("--tls-ca" in r.message for r in caplog.records)


def test_closed_address_reads_grpcs_last_error() -> None:
    assert closed_address("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:4242: "
                          "Socket closed") == ("127.0.0.1", 4242)
    assert closed_address("last error: UNAVAILABLE: ipv6:%5B::1%5D:4242: Socket closed") == ("::1", 4242)
    assert closed_address("last error: UNAVAILABLE: ipv4:127.0.0.1:4242: Handshake read failed (Socket closed)") is None
    assert closed_address("last error: UNKNOWN: ipv4:127.0.0.1:4242: Failed to connect to remote host: "
                          "Connection refused") is None


def test_only_what_the_handshake_reports_for_good_is_a_tls_problem() -> None:
    unavailable, ca = grpc.StatusCode.UNAVAILABLE, Path("ca.pem")
    last = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:4242: "
    name = last + "Custom verification check failed with error: UNAUTHENTICATED: Hostname Verification Check failed."
    assert "does not name the host of --coordinator h:1" in tls_problem("h:1", ca, unavailable, name)
    protocol = last + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:10000410:SSL routines: x"
    assert "the TLS handshake with h:1 failed" in tls_problem("h:1", ca, unavailable, protocol)
    # A handshake cut short (a coordinator going down), a refused connection, plaintext, another status: retried.
    for details in (last.replace("UNKNOWN", "UNAVAILABLE") + "Handshake read failed (Socket closed)",
                    last + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SYSCALL",
                    last + "Failed to connect to remote host: Connection refused"):
        assert tls_problem("h:1", ca, unavailable, details) is None, details
    assert tls_problem("h:1", None, unavailable, protocol) is None
    assert tls_problem("h:1", ca, grpc.StatusCode.DEADLINE_EXCEEDED, protocol) is None


def test_an_address_a_status_names_is_never_dialled(tls_coordinator: Any) -> None:
    """The TLS probe dialled the address in an UNAVAILABLE status's details, text a hostile coordinator writes: it
    made volunteers' workers connect wherever it named, every retry (review of a hostile coordinator, 2026-11-28).
    Only the operator's own --coordinator is probed, and only when the details name its port."""
    local, _ = tls_coordinator  # a TLS server: a probe of it answers, so a dialled address would end the worker
    tls_port = int(local.target.rsplit(":", 1)[1])
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        plaintext_target = f"127.0.0.1:{other.getsockname()[1]}"
        # A status from the plaintext target naming the TLS port: nothing is dialled, no TLS verdict.
        named = f"failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:{tls_port}: Socket closed"
        assert tls_settings_problem(plaintext_target, None, grpc.StatusCode.UNAVAILABLE, named) is None
        # The operator's own target, when the details name its port, is probed as before.
        own = f"last error: UNAVAILABLE: ipv4:127.0.0.1:{tls_port}: Socket closed"
        problem = tls_settings_problem(local.target, None, grpc.StatusCode.UNAVAILABLE, own)
        assert problem is not None and "requires TLS" in problem


# The fix every refused client certificate, or its absence, names.
CLIENT_CERT_FIX = "pass --tls-cert and --tls-key with a client certificate the coordinator's --tls-client-ca signed"


@pytest.fixture
def mutual_coordinator(start_coordinator: Any, tmp_path: Path) -> Any:
    """A coordinator with --tls-client-ca (its quick start's CA, which signed its client.pem), and a stranger's
    quick start: a CA and a client certificate it did not sign."""
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    return start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key, client_ca=quick.ca)), quick, stranger


def test_no_client_certificate_against_mutual_tls_ends_at_once(mutual_coordinator: Any) -> None:
    local, quick, _ = mutual_coordinator
    error, seconds = join_fails(local.target, tls_ca=quick.ca)
    assert isinstance(error, TLSMismatch) and seconds < 10, (seconds, error)
    text = str(error)
    assert f"{local.target} requires a client certificate (it runs with --tls-client-ca) and none is given" in text
    assert CLIENT_CERT_FIX in text and "Socket closed" in text, text
    assert "\n" not in text and local.service.status().workers == []


def test_a_client_certificate_another_ca_signed_ends_at_once(mutual_coordinator: Any) -> None:
    local, quick, stranger = mutual_coordinator
    error, seconds = join_fails(local.target, tls_ca=quick.ca, tls_cert=stranger.client_cert,
                                tls_key=stranger.client_key)
    assert isinstance(error, TLSMismatch) and seconds < 10, (seconds, error)
    text = str(error)
    assert f"{local.target} refuses the client certificate --tls-cert {stranger.client_cert}" in text, text
    assert CLIENT_CERT_FIX in text and "requires a client certificate" not in text, text


def test_the_right_client_certificate_joins_and_is_not_refused(mutual_coordinator: Any) -> None:
    local, quick, _ = mutual_coordinator
    worker = client(local.target, tls_ca=quick.ca, tls_cert=quick.client_cert, tls_key=quick.client_key)
    try:
        assert worker.join("w", "cpu", 1).worker_id
    finally:
        worker.close()
    address = ("127.0.0.1", local.port)
    assert not refuses_client_certificate(address, "127.0.0.1", quick.ca, quick.client_cert, quick.client_key)
    assert refuses_client_certificate(address, "127.0.0.1", quick.ca)


def test_rcswarm_status_prints_the_same_line(mutual_coordinator: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from rcswarm.cli.status import main

    local, quick, stranger = mutual_coordinator
    flags = ["--coordinator", local.target, "--token", TOKEN, "--tls-ca", str(quick.ca), "--timeout", "5"]
    assert main(flags) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"rcswarm status: {local.target} requires a client certificate") and CLIENT_CERT_FIX in line
    assert "\n" not in line, line
    assert main([*flags, "--tls-cert", str(stranger.client_cert), "--tls-key", str(stranger.client_key)]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"rcswarm status: {local.target} refuses the client certificate --tls-cert "
                           f"{stranger.client_cert}") and CLIENT_CERT_FIX in line, line


def _ssl_error(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] ...")
    error.reason = reason  # what OpenSSL's errors carry
    return error


def test_a_refusal_is_a_certificate_alert_or_a_close_after_the_handshake() -> None:
    # TLS 1.3: the client's side of the handshake completes; an OpenSSL server then alerts, a gRPC server closes.
    for reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE"):
        assert refused_after_handshake(True, _ssl_error(reason)), reason
    assert refused_after_handshake(True, ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    assert refused_after_handshake(True, b"")
    # TLS 1.2: the server alerts during the handshake.
    assert refused_after_handshake(False, _ssl_error("SSLV3_ALERT_HANDSHAKE_FAILURE"))
    assert refused_after_handshake(False, _ssl_error("TLSV1_ALERT_UNKNOWN_CA"))
    # A server that accepts the client sends its HTTP/2 SETTINGS frame first.
    assert not refused_after_handshake(True, b"\x00\x00\x18\x04\x00")
    # A restart (a connection closed, reset or refused during the handshake), a silent server, this side's own
    # verification of the server's certificate: no refusal.
    for outcome in (ssl.SSLEOFError(8, "EOF"), ConnectionResetError(104, "reset"), ConnectionRefusedError(111, "refused"),
                    socket.timeout("timed out"), _ssl_error("CERTIFICATE_VERIFY_FAILED")):
        assert not refused_after_handshake(False, outcome), outcome
    assert not refused_after_handshake(True, socket.timeout("timed out"))
    assert not refused_after_handshake(True, ConnectionResetError(104, "reset"))


@pytest.fixture(params=[ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2], ids=["tls1.3", "tls1.2"])
def openssl_mutual_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, Any]]:
    """An OpenSSL server on loopback that requires a client certificate its quick start's CA signed (at most
    `request.param`): it sends an alert to a client without one (certificate_required in TLS 1.3,
    handshake_failure in 1.2) or with one another CA signed (unknown_ca), and "hello" first to one it accepts."""
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(quick.cert, quick.key)
    context.load_verify_locations(quick.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.maximum_version = request.param
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(connection, server_side=True) as tls:
                    tls.sendall(b"hello")
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1], quick
    finally:
        server.close()


def test_the_probe_reads_an_openssl_servers_alerts(openssl_mutual_server: tuple[int, Any], tmp_path: Path) -> None:
    port, quick = openssl_mutual_server
    stranger = ensure_quick_start(tmp_path / "stranger", QUICK_NAMES)
    address = ("127.0.0.1", port)
    assert refuses_client_certificate(address, "127.0.0.1", quick.ca)
    assert refuses_client_certificate(address, "127.0.0.1", quick.ca, stranger.client_cert, stranger.client_key)
    assert not refuses_client_certificate(address, "127.0.0.1", quick.ca, quick.client_cert, quick.client_key)
    # The server's certificate is checked as the channel checks it: another CA, or a name it does not hold, is not
    # a verdict on the client certificate (and gets none sent).
    assert not refuses_client_certificate(address, "127.0.0.1", stranger.ca)
    assert not refuses_client_certificate(address, "not-the-coordinator.invalid", quick.ca)


def test_a_restarting_coordinator_is_no_refusal_and_is_retried(closing_port: int, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A port that closes connections (a coordinator going down) or refuses them (one not up yet) is no verdict on
    the client certificate: a TLS worker without one retries until its patience ends (gRPC reports this port's
    close as a handshake cut short, "Handshake read failed (Socket closed)", which is not even probed)."""
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    assert not refuses_client_certificate(("127.0.0.1", closing_port), "127.0.0.1", quick.ca)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        refused = unused.getsockname()[1]
    assert not refuses_client_certificate(("127.0.0.1", refused), "127.0.0.1", quick.ca)
    details = f"failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:{closing_port}: Socket closed"
    assert tls_settings_problem(f"127.0.0.1:{closing_port}", quick.ca, grpc.StatusCode.UNAVAILABLE, details) is None
    worker = CoordinatorClient(f"127.0.0.1:{closing_port}", TOKEN, tls_ca=quick.ca,
                               retry=RetryPolicy(max_elapsed_s=1.5))
    try:
        with caplog.at_level(logging.WARNING, "rcswarm.worker"), pytest.raises(RetriesExhausted) as raised:
            worker.join("w", "cpu", 1)
    finally:
        worker.close()
    assert not isinstance(raised.value, TLSMismatch) and "gave up after" in str(raised.value)


def test_a_tls_status_naming_another_port_probes_nothing(mutual_coordinator: Any) -> None:
    """As for plaintext: only the operator's own --coordinator is probed, when the details name its port."""
    local, quick, _ = mutual_coordinator
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        target = f"127.0.0.1:{other.getsockname()[1]}"
        named = f"last error: UNAVAILABLE: ipv4:127.0.0.1:{local.port}: Socket closed"
        assert tls_settings_problem(target, quick.ca, grpc.StatusCode.UNAVAILABLE, named) is None
        own = f"last error: UNAVAILABLE: ipv4:127.0.0.1:{local.port}: Socket closed"
        problem = tls_settings_problem(local.target, quick.ca, grpc.StatusCode.UNAVAILABLE, own)
        assert problem is not None and "requires a client certificate" in problem
