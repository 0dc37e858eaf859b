"""A renewed TLS certificate (and client CA) is served without a restart; a half-written renewal breaks nothing.
The dashboard's HTTPS (`--http-tls`) follows the same files.

Each test serves the coordinator's gRPC port on 127.0.0.1 from certificate files in tmp_path, replaces them
the way an operator or cert-manager does (whole files, `os.replace`), and dials new channels that trust one
CA or the other. A channel gets its own connection (a local subchannel pool), so every dial is a handshake.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.coordinator import TLSFiles
from rcswarm.coordinator.tls import QuickStart, ensure_quick_start
from tests.helpers.specs import tiny_spec
from tests.helpers.tls import QUICK_NAMES

# A new connection per channel: a channel must not reuse another's connection (and its old handshake).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def replace_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole, through a temporary file and a rename (as cert-manager and editors do)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def serve_files(directory: Path, quick: QuickStart) -> TLSFiles:
    """The quick start's server certificate and key copied into `directory` (the files a test then renews)."""
    directory.mkdir()
    files = TLSFiles(directory / "tls.crt", directory / "tls.key")
    replace_file(files.key, quick.key.read_bytes())
    replace_file(files.cert, quick.cert.read_bytes())
    return files


def open_channel(port: int, ca: QuickStart, client: QuickStart | None = None) -> grpc.Channel:
    """A channel to the coordinator that trusts `ca`, presenting `client`'s client certificate when given."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.ca.read_bytes(),
        private_key=client.client_key.read_bytes() if client else None,
        certificate_chain=client.client_cert.read_bytes() if client else None,
    )
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=OWN_CONNECTION)


def answers(channel: grpc.Channel) -> bool:
    """Whether a health Check over `channel` succeeds; False when the handshake (or anything) fails."""
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return False
    return True


def handshakes(port: int, ca: QuickStart, client: QuickStart | None = None) -> bool:
    """Whether a new channel that trusts only `ca` (with `client`'s certificate) completes a call."""
    with open_channel(port, ca, client) as channel:
        return answers(channel)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and "not reloaded" in record.getMessage()]


@pytest.fixture
def authorities(tmp_path: Path) -> tuple[QuickStart, QuickStart]:
    """Two CAs, each with a server and a client certificate for loopback."""
    return ensure_quick_start(tmp_path / "ca1", QUICK_NAMES), ensure_quick_start(tmp_path / "ca2", QUICK_NAMES)


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(
        start_coordinator: Any, tmp_path: Path, authorities: tuple[QuickStart, QuickStart],
        caplog: pytest.LogCaptureFixture) -> None:
    first, second = authorities
    files = serve_files(tmp_path / "served", first)
    local = start_coordinator(tiny_spec(), tls=files)
    assert handshakes(local.port, first) and not handshakes(local.port, second)
    with open_channel(local.port, first) as open_before:
        assert answers(open_before)
        with caplog.at_level(logging.INFO, logger="rcswarm.coordinator"):
            replace_file(files.key, second.key.read_bytes())
            replace_file(files.cert, second.cert.read_bytes())
            assert handshakes(local.port, second), "a new connection gets the renewed certificate"
            assert not handshakes(local.port, first), "and no longer the old one"
        assert answers(open_before), "a connection opened before the renewal keeps its session"
    switched = [record.getMessage() for record in caplog.records if "serving the certificate now" in record.getMessage()]
    assert len(switched) == 1 and str(files.cert) in switched[0], switched
    assert warnings_of(caplog) == []


def test_a_half_written_renewal_keeps_the_old_certificate_and_warns_once_per_problem(
        start_coordinator: Any, tmp_path: Path, authorities: tuple[QuickStart, QuickStart],
        caplog: pytest.LogCaptureFixture) -> None:
    first, second = authorities
    files = serve_files(tmp_path / "served", first)
    local = start_coordinator(tiny_spec(), tls=files)
    with caplog.at_level(logging.INFO, logger="rcswarm.coordinator"):
        replace_file(files.cert, second.cert.read_bytes())  # the certificate renewed, the key not yet
        for _ in range(3):
            assert handshakes(local.port, first), "the last good certificate is served"
        mismatch = warnings_of(caplog)
        assert len(mismatch) == 1, mismatch
        assert f"{files.key}: this key does not belong to the certificate {files.cert}" in mismatch[0]

        replace_file(files.key, b"half a key")
        assert handshakes(local.port, first) and handshakes(local.port, first)
        replace_file(files.key, b"half a key, then more")  # changed again, the same problem: no second warning
        assert handshakes(local.port, first)
        garbage = warnings_of(caplog)[1:]
        assert len(garbage) == 1 and f"--tls-key {files.key}: not a PEM file" in garbage[0], garbage

        pem = second.key.read_bytes()
        replace_file(files.key, pem[:len(pem) // 2])
        assert handshakes(local.port, first)
        cut = warnings_of(caplog)[2:]
        assert len(cut) == 1 and f"{files.key}: not a readable, unencrypted PEM private key" in cut[0], cut

        replace_file(files.key, pem)  # the renewal completed
        assert handshakes(local.port, second) and not handshakes(local.port, first)
    assert len(warnings_of(caplog)) == 3


def test_a_certificate_cut_short_is_not_served(
        start_coordinator: Any, tmp_path: Path, authorities: tuple[QuickStart, QuickStart],
        caplog: pytest.LogCaptureFixture) -> None:
    first, second = authorities
    files = serve_files(tmp_path / "served", first)
    local = start_coordinator(tiny_spec(), tls=files)
    chain = second.cert.read_bytes() + second.ca.read_bytes()
    with caplog.at_level(logging.WARNING, logger="rcswarm.coordinator"):
        replace_file(files.key, second.key.read_bytes())
        replace_file(files.cert, chain[:len(chain) - 100])  # the leaf whole, the CA after it cut short
        assert handshakes(local.port, first) and not handshakes(local.port, second)
        warned = warnings_of(caplog)
        assert len(warned) == 1 and f"{files.cert}: 1 of its 2 certificates are cut short" in warned[0], warned
        replace_file(files.cert, chain)
        assert handshakes(local.port, second) and not handshakes(local.port, first)


def test_mutual_tls_follows_a_renewed_client_ca(
        start_coordinator: Any, tmp_path: Path, authorities: tuple[QuickStart, QuickStart]) -> None:
    first, second = authorities
    served = serve_files(tmp_path / "served", first)
    files = TLSFiles(served.cert, served.key, tmp_path / "served" / "client-ca.pem")
    replace_file(files.client_ca, first.ca.read_bytes())
    local = start_coordinator(tiny_spec(), tls=files)
    assert handshakes(local.port, first, first)
    assert not handshakes(local.port, first, second) and not handshakes(local.port, first)
    replace_file(files.client_ca, second.ca.read_bytes())
    assert handshakes(local.port, first, second), "a client certificate of the new client CA is accepted"
    assert not handshakes(local.port, first, first), "and one of the old client CA no longer"
    assert not handshakes(local.port, first), "a certificate is still required"


def test_the_fetcher_reads_the_files_only_after_they_change(tmp_path: Path, authorities: tuple[QuickStart, QuickStart],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    from rcswarm.coordinator.tls import CertificateReloader

    first, second = authorities
    files = serve_files(tmp_path / "served", first)
    reloader = CertificateReloader(files)
    reads: list[int] = []
    read = files.read
    files.read = lambda: reads.append(1) or read()  # type: ignore[method-assign]
    assert [reloader.fetch() for _ in range(100)] == [None] * 100 and reads == []

    stamp = files.cert.stat()
    os.utime(files.cert, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))
    with caplog.at_level(logging.INFO, logger="rcswarm.coordinator"):
        assert reloader.fetch() is None and reloader.fetch() is None, "the same bytes are not served again"
    assert len(reads) == 1 and caplog.records == []

    replace_file(files.key, second.key.read_bytes())
    replace_file(files.cert, second.cert.read_bytes())
    with reloader._lock:
        assert reloader.fetch() is None, "a handshake never waits while another reads the files"
    assert isinstance(reloader.fetch(), grpc.ServerCertificateConfiguration)
    assert reloader.fetch() is None and len(reads) == 2


def test_only_the_operators_files_are_reloaded(tmp_path: Path) -> None:
    base = ["--config", "run.toml", "--state-dir", str(tmp_path / "state")]
    quick, _ = coordinator_cli._tls_files(coordinator_cli.parse_args([*base, "--tls-self-signed", str(tmp_path / "qs")]))
    assert quick is not None and quick.reload is False, "the quick start's files are served as made at start"
    made = ensure_quick_start(tmp_path / "qs", QUICK_NAMES)
    own, _ = coordinator_cli._tls_files(coordinator_cli.parse_args(
        [*base, "--tls-cert", str(made.cert), "--tls-key", str(made.key)]))
    assert own is not None and own.reload is True


def dashboard_certificate(port: int, ca: QuickStart) -> bytes | None:
    """The certificate (DER) the dashboard's HTTPS presents to a new connection that trusts only `ca`; None when that
    handshake fails."""
    context = ssl.create_default_context(cafile=str(ca.ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
                return connection.getpeercert(binary_form=True)
    except (ssl.SSLError, OSError):
        return None


def test_the_dashboards_https_follows_a_renewal_and_keeps_its_certificate_through_a_half_written_one(
        start_coordinator: Any, tmp_path: Path, authorities: tuple[QuickStart, QuickStart],
        caplog: pytest.LogCaptureFixture) -> None:
    """It read its certificate once, at start: after a renewal the dashboard served the old one until a restart
    (and, once that expired, every browser refused it)."""
    first, second = authorities
    files = serve_files(tmp_path / "served", first)
    local = start_coordinator(tiny_spec(), tls=files, http_port=0, http_tls=True)
    port = local.running.dashboard.port
    old, new = (ssl.PEM_cert_to_DER_cert(quick.cert.read_text()) for quick in authorities)
    assert dashboard_certificate(port, first) == old and dashboard_certificate(port, second) is None
    with caplog.at_level(logging.INFO, logger="rcswarm.coordinator"):
        replace_file(files.cert, second.cert.read_bytes())  # half written: the key not yet renewed
        assert dashboard_certificate(port, first) == old, "the last good certificate is served"
        assert dashboard_certificate(port, first) == old
        replace_file(files.key, second.key.read_bytes())
        assert dashboard_certificate(port, second) == new, "a new connection gets the renewed certificate"
        assert dashboard_certificate(port, first) is None
    mismatch = warnings_of(caplog)
    assert len(mismatch) == 1 and "this key does not belong to the certificate" in mismatch[0], mismatch
    switched = [r.getMessage() for r in caplog.records if "from the next dashboard connection on" in r.getMessage()]
    assert len(switched) == 1 and str(files.cert) in switched[0], switched


def test_a_files_mode_change_is_a_change(tmp_path: Path) -> None:
    """A renewal whose key the coordinator could not read (written 0600 by another user) warned, and once the
    operator fixed the mode nothing was read again until the next content change: chmod leaves mtime, size and
    inode as they were (review, 2026-11-28: "fetches after chmod: [None, None, None]"). The stamp holds ctime too."""
    from rcswarm.coordinator.tokens import file_stamp

    key = tmp_path / "tls.key"
    key.write_bytes(b"key")
    os.chmod(key, 0o000)
    before = file_stamp(key)
    os.chmod(key, 0o600)
    assert file_stamp(key) != before
