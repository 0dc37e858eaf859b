"""TLS for the coordinator: when a bind needs it, the self-signed quick start, and checked key pairs.

`bind_problem(host, tls, insecure)` is the pure rule `rcswarm coordinator` applies before it
creates anything: a non-loopback address (0.0.0.0, ::, a LAN address, any host name other than
`localhost`) is served only with TLS, or plaintext with `--insecure`.

`ensure_quick_start(DIR, names)` is `--tls-self-signed DIR`: a CA (ca.pem, ca-key.pem), a server
certificate it signs for `names` (server.pem, server-key.pem) and a client certificate for mutual
TLS (client.pem, client-key.pem), EC P-256, private keys written with mode 0600. A CA already in
DIR is kept (workers trust it), and a certificate is issued again only when it no longer fits:
not signed by that CA, a name missing, or fewer than `RENEW_DAYS` days left.

Production deployments may bring their own certificates (--tls-cert/--tls-key); `check_key_pair`
refuses a key that does not belong to its certificate before gRPC would fail with a bare
"Failed to bind". `TLSFiles` is the server's certificate and key (and with a client CA, mutual TLS)
as gRPC credentials and as the dashboard's HTTPS context. `write_self_signed` writes one self-signed
certificate for tests and benchmarks. The `cryptography` package is imported only inside these functions.

Renewal without a restart: gRPC credentials of `TLSFiles` with `reload` (the default; the quick start's
files are served as read at start) follow the files. Before every TLS handshake gRPC asks
`CertificateReloader.fetch`, which compares the files' stamps (mtime, size, inode, ctime: `tokens.file_stamp`) with
those last seen and reads and checks the files again only after a change; the next handshakes serve the new
certificate, key and client CA, while connections already open keep theirs. A half-written or mismatched
renewal (a file missing or cut short, a key not the certificate's) keeps the last good files served and logs
one warning per distinct problem; the next change is tried again. The dashboard's HTTPS
(`TLSFiles.dashboard_context`) follows them the same way: each accepted connection asks
`DashboardCertificates.current` for its context, which is built again after the files changed and checked.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import re
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rcswarm.coordinator.tokens import Stamp, file_stamp
from rcswarm.protos.transport import is_loopback_host, is_wildcard_host, read_pem

log = logging.getLogger("rcswarm.coordinator")

CA_DAYS = 3650
LEAF_DAYS = 397
RENEW_DAYS = 30
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CLIENT_NAME = "rcswarm-worker"
# The largest certificate, key or client CA file read (checked before reading, so a reload's work is bounded).
MAX_PEM_BYTES = 1 << 20
# Why --http-tls cannot serve without the coordinator's own TLS (the command line and `RunningCoordinator`).
HTTP_TLS_NEEDS_TLS = ("--http-tls serves the dashboard with the coordinator's certificate: "
                      "add --tls-self-signed DIR or --tls-cert/--tls-key")
_DNS_NAME = re.compile(r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


def bind_problem(host: str, tls: bool, insecure: bool) -> str | None:
    """Why the coordinator must not serve plaintext gRPC on `host`, or None when it may (pure).

    Loopback is always allowed; any other address needs TLS, or `insecure` (the operator's
    explicit choice, logged as a warning by the caller).
    """
    if tls or insecure or is_loopback_host(host):
        return None
    if is_wildcard_host(host):
        where = f"--host {host!r} listens on every network interface"
    else:
        try:
            ipaddress.ip_address(host.strip("[]"))
            where = f"--host {host} is not a loopback address"
        except ValueError:
            where = f"--host {host} is a host name, not 'localhost' or a loopback address"
    return (
        f"{where} and TLS is off, so the join token, worker secrets and parameters would cross the network "
        "in the clear. Serve with TLS: --tls-self-signed DIR (makes a CA and a server certificate and prints "
        "the worker command with --tls-ca DIR/ca.pem), or --tls-cert FILE --tls-key FILE; or pass --insecure "
        "to serve plaintext on a network you trust (or bind 127.0.0.1 for this machine only)"
    )


def server_names(host: str, extra: Sequence[str], hostname: str) -> list[str]:
    """The names a quick-start server certificate covers: the bind host (or, for a wildcard bind, this
    machine's `hostname`), every `--tls-san`, and localhost, 127.0.0.1, ::1; each once, in that order.
    ValueError names a value that is neither a DNS name nor an IP address."""
    first = [hostname] if is_wildcard_host(host) else [host.strip("[]")]
    names: list[str] = []
    for name in [*first, *extra, *LOOPBACK_NAMES]:
        name = _normalized(name)
        if name.lower() not in (known.lower() for known in names):
            names.append(name)
    return names


def _normalized(name: str) -> str:
    """An IP address in its canonical text, or a DNS name as given; ValueError for anything else."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not _DNS_NAME.match(name) or len(name) > 253:
        raise ValueError(f"--tls-san {name!r}: expected a DNS name (letters, digits, '-', '.') or an IP address")
    return name


def worker_host(host: str, extra: Sequence[str], hostname: str) -> str:
    """The host a worker should dial: the bind host, or for a wildcard bind the first --tls-san, else `hostname`."""
    if not is_wildcard_host(host):
        return host.strip("[]")
    return extra[0] if extra else hostname


@dataclass(frozen=True)
class QuickStart:
    """The files of `--tls-self-signed DIR`, and what this start wrote or fixed (for the log)."""

    directory: Path
    notes: tuple[str, ...]

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca-key.pem"

    @property
    def cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key(self) -> Path:
        return self.directory / "server-key.pem"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client-key.pem"


def ensure_quick_start(directory: Path, names: Sequence[str], now: datetime.datetime | None = None) -> QuickStart:
    """Create or reuse the CA, server and client certificates in `directory` (see the module docstring).

    ValueError names a CA file that is missing its pair, unreadable, not a CA, or expired: the CA
    is never replaced behind the workers' back.
    """
    from cryptography import x509

    now = now or datetime.datetime.now(datetime.UTC)
    paths = QuickStart(Path(directory), ())
    paths.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    notes: list[str] = []
    ca_cert, ca_key = _ensure_ca(paths, now, notes)
    server_reason = _leaf_problem(paths.cert, paths.key, ca_cert, names, x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, now)
    if server_reason is not None:
        _issue_leaf(paths.cert, paths.key, ca_cert, ca_key, names[0], names, True, now)
        notes.append(f"wrote {paths.cert.name} for {', '.join(names)} ({server_reason})")
    client_reason = _leaf_problem(
        paths.client_cert, paths.client_key, ca_cert, (), x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH, now)
    if client_reason is not None:
        _issue_leaf(paths.client_cert, paths.client_key, ca_cert, ca_key, CLIENT_NAME, (), False, now)
        notes.append(f"wrote {paths.client_cert.name} ({client_reason})")
    for key in (paths.ca_key, paths.key, paths.client_key):
        if key.stat().st_mode & 0o077:
            os.chmod(key, 0o600)
            notes.append(f"{key.name} was readable by others: set its mode to 0600")
    return QuickStart(paths.directory, tuple(notes))


def _ensure_ca(paths: QuickStart, now: datetime.datetime, notes: list[str]) -> tuple[Any, Any]:
    """The CA certificate and key in the directory, created when neither file exists."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    present = [path.exists() for path in (paths.ca, paths.ca_key)]
    if not any(present):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "rcswarm quick-start CA")])
        cert = (
            _builder(subject, subject, key.public_key(), now, CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write_pair(paths.ca, paths.ca_key, cert, key)
        notes.append(f"wrote a new CA {paths.ca.resolve()} ({paths.ca_key.name} never leaves this machine)")
        return cert, key
    if not all(present):
        missing = paths.ca if not present[0] else paths.ca_key
        raise ValueError(f"--tls-self-signed {paths.directory}: {missing.name} is missing beside its pair; restore it, "
                         "or remove ca.pem and ca-key.pem to make a new CA (workers then need the new ca.pem)")
    cert, key = _load_pair(paths.ca, paths.ca_key, "--tls-self-signed")
    constraints = _extension(cert, x509.BasicConstraints)
    if constraints is None or not constraints.ca:
        raise ValueError(f"--tls-self-signed {paths.ca}: not a CA certificate (BasicConstraints ca=False)")
    if cert.not_valid_after_utc <= now:
        raise ValueError(f"--tls-self-signed {paths.ca}: the CA expired on {cert.not_valid_after_utc:%Y-%m-%d}; remove "
                         "ca.pem and ca-key.pem to make a new one (workers then need the new ca.pem)")
    return cert, key


def _leaf_problem(cert_path: Path, key_path: Path, ca_cert: Any, names: Sequence[str], usage: Any,
                  now: datetime.datetime) -> str | None:
    """Why the certificate at `cert_path` must be issued again, or None when it can be reused."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    if not cert_path.exists() or not key_path.exists():
        return "there was none"
    try:
        cert, _ = _load_pair(cert_path, key_path, "--tls-self-signed")
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        return f"the old one is unusable: {exc}"
    if cert.not_valid_after_utc - now < datetime.timedelta(days=RENEW_DAYS):
        return f"the old one expires on {cert.not_valid_after_utc:%Y-%m-%d}"
    usages = _extension(cert, x509.ExtendedKeyUsage)
    if usages is None or usage not in usages:
        return "the old one lacks the extended key usage"
    missing = [name for name in names if name.lower() not in _covered(cert)]
    if missing:
        return f"the old one does not cover {', '.join(missing)}"
    return None


def _covered(cert: Any) -> set[str]:
    """The lower-cased DNS names and IP addresses in a certificate's subjectAltName."""
    from cryptography import x509

    sans = _extension(cert, x509.SubjectAlternativeName)
    if sans is None:
        return set()
    return {name.lower() for name in sans.get_values_for_type(x509.DNSName)} | {
        str(address) for address in sans.get_values_for_type(x509.IPAddress)}


def _issue_leaf(cert_path: Path, key_path: Path, ca_cert: Any, ca_key: Any, common_name: str, names: Sequence[str],
                server: bool, now: datetime.datetime) -> None:
    """Write a new key and a certificate signed by the CA: a server's for `names`, or a client's."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, common_name)])
    usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(subject, ca_cert.subject, key.public_key(), now, LEAF_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(_general_names(names)), critical=False)
    _write_pair(cert_path, key_path, builder.sign(ca_key, hashes.SHA256()), key)


def _builder(subject: Any, issuer: Any, public_key: Any, now: datetime.datetime, days: int) -> Any:
    from cryptography import x509

    return (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
    )


def _key_usage(ca: bool) -> Any:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )


def _general_names(names: Sequence[str]) -> list[Any]:
    from cryptography import x509

    general: list[Any] = []
    for name in names:
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            general.append(x509.DNSName(name))
    return general


def _extension(cert: Any, kind: type) -> Any:
    from cryptography import x509

    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def _load_pair(cert_path: Path, key_path: Path, flag: str) -> tuple[Any, Any]:
    """(certificate, private key) from PEM files; ValueError names the file that is unreadable or does not match."""
    try:
        cert_pem = cert_path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {cert_path}: not a readable PEM certificate ({exc})") from None
    try:
        key_pem = key_path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {key_path}: not a readable, unencrypted PEM private key ({exc})") from None
    return _parse_pair(cert_path, cert_pem, key_path, key_pem, flag)


def _parse_pair(cert_path: Path, cert_pem: bytes, key_path: Path, key_pem: bytes, flag: str) -> tuple[Any, Any]:
    """(first certificate, private key) of PEM bytes read from the paths; ValueError names the path whose bytes
    do not parse, or the key that does not belong to the certificate."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    cert = _parse_certificates(cert_path, cert_pem, flag)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"{flag} {key_path}: not a readable, unencrypted PEM private key ({exc})") from None
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        raise ValueError(f"{flag} {key_path}: this key does not belong to the certificate {cert_path}")
    return cert, key


def _parse_certificates(path: Path, pem: bytes, flag: str) -> list[Any]:
    """Every certificate of PEM bytes read from `path`, in order; ValueError names the path when there is none,
    one does not parse, or one is cut short (a file read while it was being written)."""
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise ValueError(f"{flag} {path}: not a readable PEM certificate ({exc})") from None
    begun = pem.count(b"-----BEGIN CERTIFICATE-----")
    if len(certificates) < begun:
        raise ValueError(f"{flag} {path}: {begun - len(certificates)} of its {begun} certificates are cut short "
                         "(still being written?)")
    return certificates


def _public_der(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def check_key_pair(cert_path: Path, key_path: Path) -> None:
    """Refuse (ValueError naming the file) a certificate or key that cannot be read, or a key not its certificate's."""
    _load_pair(Path(cert_path), Path(key_path), "--tls-cert/--tls-key")


def _read_pem(path: Path, flag: str) -> bytes:
    """`read_pem`, refusing (ValueError naming the file) one larger than MAX_PEM_BYTES before reading it."""
    stamp = file_stamp(path)
    if stamp is not None and stamp[1] > MAX_PEM_BYTES:
        raise ValueError(f"{flag} {path}: {stamp[1]} bytes, more than the {MAX_PEM_BYTES} a PEM file may hold here")
    return read_pem(path, flag)


@dataclass(frozen=True)
class ServerPem:
    """One read of the server's TLS files, checked: the PEM bytes gRPC serves and the leaf certificate parsed."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    leaf: Any

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """These bytes as the certificate configuration gRPC's dynamic credentials serve."""
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.client_ca)

    def same_bytes(self, other: ServerPem) -> bool:
        """Whether `other` holds the same certificate, key and client CA bytes."""
        return (self.cert, self.key, self.client_ca) == (other.cert, other.key, other.client_ca)

    def describe(self) -> str:
        """The leaf certificate's subject and end of validity, for the log."""
        return f"{self.leaf.subject.rfc4514_string()}, valid until {self.leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"


@dataclass
class TLSFiles:
    """The server's PEM certificate and private key, and with `client_ca` mutual TLS: every client must
    present a certificate that CA signed, or its handshake fails. With `reload` the gRPC credentials
    follow the files when they change (`CertificateReloader`); without, they serve the files as read once."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    reload: bool = True

    def paths(self) -> tuple[Path, ...]:
        """The certificate, the key and the client CA when there is one."""
        return (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)

    def stamps(self) -> tuple[Stamp, ...]:
        """Each path's `file_stamp`: what changes when a file is rewritten or replaced (three stat calls at most)."""
        return tuple(file_stamp(path) for path in self.paths())

    def read(self) -> ServerPem:
        """Read and check the files once; ValueError names a file that is unreadable, too large, not PEM, cut
        short, or a key not the certificate's."""
        cert, key = _read_pem(self.cert, "--tls-cert"), _read_pem(self.key, "--tls-key")
        leaf, _ = _parse_pair(self.cert, cert, self.key, key, "--tls-cert/--tls-key")
        client_ca = None
        if self.client_ca is not None:
            client_ca = _read_pem(self.client_ca, "--tls-client-ca")
            _parse_certificates(self.client_ca, client_ca, "--tls-client-ca")
        return ServerPem(cert, key, client_ca, leaf)

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials, which with `reload` read the files again when they change; ValueError as `read`."""
        required = self.client_ca is not None
        if self.reload:
            reloader = CertificateReloader(self)
            return grpc.dynamic_ssl_server_credentials(reloader.initial, reloader.fetch,
                                                       require_client_authentication=required)
        pem = self.read()
        return grpc.ssl_server_credentials([(pem.key, pem.cert)], root_certificates=pem.client_ca,
                                           require_client_auth=required)

    def ssl_context(self) -> ssl.SSLContext:
        """The dashboard's HTTPS context: the same certificate, TLS 1.2 or newer, no client certificates."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context

    def dashboard_context(self) -> ssl.SSLContext | Callable[[], ssl.SSLContext]:
        """The dashboard's HTTPS: with `reload`, the function each accepted connection asks for its context
        (`DashboardCertificates.current`); without, the context as read once (`ssl_context`)."""
        return DashboardCertificates(self).current if self.reload else self.ssl_context()


class CertificateReloader:
    """gRPC's certificate configuration fetcher for `TLSFiles`: a renewal is served from the next handshake on.

    `fetch` returns None (serve as before) while the files' stamps are those last seen; after a change it reads
    and checks the files (`TLSFiles.read`) and returns their configuration, or, when they are bad (a renewal half
    written: a file missing or cut short, a key not the certificate's), keeps the one served and logs a warning
    naming the file and the problem: once per distinct problem (not per handshake) until good files are read.

    Threads: gRPC calls `fetch` on its threads before every TLS handshake, several at once. `_lock` (a
    `threading.Lock`) guards `_stamps`, `_served` and `_warned`; `fetch` only tries to take it and never waits:
    while one handshake's thread looks at the files, the others are served as before. Under the lock the work
    is bounded: three stat calls, and after a change reading three files of at most MAX_PEM_BYTES and parsing them.
    """

    def __init__(self, files: TLSFiles) -> None:
        """Read and check the files now (ValueError as `TLSFiles.read`: a start with bad files is refused)."""
        self.files = files
        self._lock = threading.Lock()
        self._stamps = files.stamps()
        self._served = files.read()
        self._warned: str | None = None
        self.initial = self._served.configuration()

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The configuration to serve from this handshake on, or None to keep the current one (gRPC's threads)."""
        pem = self.renewed()
        return pem.configuration() if pem is not None else None

    def renewed(self) -> ServerPem | None:
        """The files as read again when they changed since last seen and hold other good bytes than those served;
        None otherwise (unchanged, the same bytes, bad, or another thread looking: any thread, never waits)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            stamps = self.files.stamps()
            if stamps == self._stamps:
                return None
            self._stamps = stamps
            return self._reload()
        finally:
            self._lock.release()

    def _reload(self) -> ServerPem | None:
        """The changed files, or None when they hold what is served or are bad (`_lock` held)."""
        try:
            pem = self._checked(self.files.read())
        except ValueError as exc:
            self._warn(str(exc))
            return None
        self._warned = None
        if pem.same_bytes(self._served):
            return None
        self._served = pem
        log.info("TLS: serving the certificate now in %s (%s) from the next %s on", self.files.cert,
                 pem.describe(), self.served_to)
        return pem

    # What is served, for the log; a subclass that builds more from the files says so.
    served_to = "handshake"

    def _checked(self, pem: ServerPem) -> ServerPem:
        """`pem` once what is served from it can be built (ValueError: it cannot); `_lock` held."""
        return pem

    def _warn(self, problem: str) -> None:
        """Log `problem` unless it is the one logged last (`_lock` held)."""
        if problem == self._warned:
            return
        self._warned = problem
        log.warning("TLS certificate not reloaded: %s; still serving %s (tried again when the files change)",
                    problem, self._served.describe())


class DashboardCertificates(CertificateReloader):
    """The dashboard's HTTPS context, built again when the certificate files change (`current`).

    `current` runs on the dashboard's accepting thread, once per connection: three stat calls, and after a change
    reading and checking the files (`TLSFiles.read`) and loading them into a new `ssl.SSLContext`. Bad files (half
    written, a key not the certificate's, or changed again between the check and the load) keep the context served
    and warn as the gRPC side does. Threads: `current` takes `_lock` as `renewed` does; `_context` is replaced whole.
    """

    served_to = "dashboard connection"

    def __init__(self, files: TLSFiles) -> None:
        """Read, check and load the files now (ValueError as `TLSFiles.read`; ssl.SSLError from loading them)."""
        super().__init__(files)
        self._context = files.ssl_context()
        self._loaded: ssl.SSLContext | None = None

    def current(self) -> ssl.SSLContext:
        """The context for the next connection (the dashboard's accepting thread)."""
        if self.renewed() is not None and self._loaded is not None:
            self._context = self._loaded
        return self._context

    def _checked(self, pem: ServerPem) -> ServerPem:
        """`pem` once its context loaded (`_loaded`); ValueError names the files when it did not."""
        try:
            self._loaded = self.files.ssl_context()
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"--tls-cert {self.files.cert} / --tls-key {self.files.key}: the dashboard's HTTPS "
                             f"could not load them ({exc})") from None
        return pem


def _write_pair(cert_path: Path, key_path: Path, cert: Any, key: Any) -> None:
    """Write the key (mode 0600) and then the certificate, each through a temporary file and a rename."""
    from cryptography.hazmat.primitives import serialization

    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    _write_file(key_path, key_pem, 0o600)
    _write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_file(path: Path, data: bytes, mode: int) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def write_self_signed(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), days: int = 1) -> tuple[Path, Path]:
    """Write cert.pem and key.pem (EC P-256, one self-signed certificate valid for `hosts`); return their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    if not hosts:
        raise ValueError("hosts is empty: expected at least one DNS name or IP address")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, hosts[0])])
    cert = (
        _builder(subject, subject, key.public_key(), datetime.datetime.now(datetime.UTC), days)
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    _write_pair(cert_path, key_path, cert, key)
    return cert_path, key_path
