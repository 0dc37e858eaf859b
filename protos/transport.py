"""Addresses and channels both ends share: HOST:PORT, whether a host is loopback, client TLS.

The coordinator asks `is_loopback_host` before it binds (a non-loopback address needs TLS or
`--insecure`, coordinator/tls.py) and before its dashboard serves without the token; the worker
and `rcswarm status` open their channel with `open_channel`, which warns once per channel when a
join token would cross the network in the clear. The check is on the name as given, without a
DNS lookup: only IP literals in 127.0.0.0/8 or ::1 (also IPv4-mapped) and the name `localhost`
count as loopback, so a host name that happens to resolve to loopback is treated as a network
address (use 127.0.0.1 or `localhost` instead).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("rcswarm.transport")

LOCALHOST_NAMES = ("localhost", "localhost.")
# gRPC's own target scheme written with "//" (dns://AUTHORITY/HOST:PORT); any other "scheme://" is a URL.
GRPC_URL_SCHEMES = ("dns",)
# The trailing-metadata key of a Join refused RESOURCE_EXHAUSTED because every place is taken: milliseconds until
# the worker asks again. A worker that reads it waits for a place (the coordinator answered) instead of counting
# the refusal against its patience; without it, RESOURCE_EXHAUSTED is a busy coordinator, retried with backoff.
PLACE_RETRY_KEY = "rcswarm-place-retry-ms"
# The trailing-metadata key (value "1") of a NOT_FOUND whose membership ended because its run no longer takes its
# updates: the run finished or was stopped while the sweep goes on, or the sweep moved the worker to another run.
# A worker told so by a heartbeat stops the round it trains (its update would be dropped) and joins again; without
# it (an eviction), the round is finished and its update pushed after the re-join, where it may still be merged.
MOVED_KEY = "rcswarm-moved"


def _strip_brackets(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback_host(host: str) -> bool:
    """Whether `host` (an IP literal, bracketed IPv6, or a name) is loopback without resolving it."""
    bare = _strip_brackets(host.strip())
    if bare.lower() in LOCALHOST_NAMES:
        return True
    try:
        address = ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_wildcard_host(host: str) -> bool:
    """Whether binding `host` listens on every interface ("", 0.0.0.0, ::)."""
    bare = _strip_brackets(host.strip())
    if not bare:
        return True
    try:
        return ipaddress.ip_address(bare).is_unspecified
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """`host:port` as gRPC and URLs want it: an IPv6 literal in brackets."""
    bare = _strip_brackets(host)
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def target_host(target: str) -> str | None:
    """The host of a gRPC target (`HOST:PORT`, `[V6]:PORT`, `dns:///HOST:PORT`); None for a unix socket."""
    if target.startswith(("unix:", "unix-abstract:")):
        return None
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    if target.startswith("["):
        return target[1:target.find("]")] if "]" in target else target
    return target.rsplit(":", 1)[0] if target.count(":") == 1 else target


def target_problem(target: str, dialled: bool = False) -> str | None:
    """Why `target` is not an address a gRPC client dials (pure): a URL scheme such as http:// or https://, which
    gRPC would take for a host name and retry forever, a host that is not a host name or an IP address, a port
    outside 0..65535, and with `dialled` port 0 too (a server's "any free port", on which nobody listens: a worker
    retried "Connection refused" until its patience ran out). Without `dialled` port 0 is taken: a launcher plans its
    workers with a placeholder (`head:0`) before its coordinator has a port. None for HOST:PORT and gRPC's own
    targets. Servers bind with their own checks (`--port 0` is theirs to take)."""
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", target)
    if match is None:
        return _port_problem(target, dialled)
    if match.group(1).lower() in GRPC_URL_SCHEMES:
        port = target_port(target)  # dns:///HOST:PORT: the host is gRPC's to parse, a port given is checked
        return None if port is None or _port_taken(port, dialled) else _bad_port(target, dialled)
    return (f"--coordinator {target!r}: {match.group(1)}:// is a URL scheme, but the coordinator speaks gRPC, "
            f"not HTTP: expected HOST:PORT (e.g. {target[match.end():].split('/', 1)[0] or '127.0.0.1:50051'})")


def target_port(target: str) -> int | None:
    """The port of a gRPC target (`HOST:PORT`, `[V6]:PORT`, `dns:///HOST:PORT`) as a number; None for a target
    without one, a unix socket, or a port that is not digits (pure)."""
    if ":" not in target or target.startswith(("unix:", "unix-abstract:")):
        return None
    port = target.rsplit(":", 1)[1]
    return int(port) if port.isascii() and port.isdigit() else None


# gRPC's own target schemes without "//" (dns:HOST:PORT, ipv4:ADDR:PORT, ipv6:[ADDR]:PORT, unix:PATH): their
# hosts are gRPC's to parse, only their port is checked.
GRPC_TARGET_PREFIXES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:")


# A host name as a client dials it: labels of ASCII letters, digits, '-' and '_' (a Docker Compose service's name)
# joined by dots, with an optional final dot; an IPv4 address is one. "a b" was dialled as a name gRPC's resolver
# never finds: UNAVAILABLE, retried for the whole patience.
HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")


def _host_problem(target: str) -> str | None:
    """Why the host of a HOST:PORT `target` is not one gRPC dials as written: surrounding whitespace, an empty host
    (":50051"), or an IPv6 address, or more than one colon, without brackets ("::1" is read as host ":" and port 1,
    and gRPC dials [::1]:443; "host:1:2"), something in brackets that is not an IP address, or a host that is not a
    host name (`HOST_NAME`: "a b"); None for HOST:PORT, [V6]:PORT and gRPC's own targets."""
    if target != target.strip():
        return f"--coordinator {target!r}: surrounding whitespace; expected HOST:PORT"
    if ":" not in target or target.startswith(GRPC_TARGET_PREFIXES):
        return None
    if target.startswith("["):
        end = target.find("]")
        if end < 0:
            return f"--coordinator {target!r}: no ']' after the IPv6 address; expected [V6]:PORT"
        if not target[1:end].strip():
            return f"--coordinator {target!r}: empty host; expected [V6]:PORT"
        if not target[end + 1:].startswith(":"):
            return f"--coordinator {target!r}: expected [V6]:PORT (a port after the ']')"
        try:
            ipaddress.ip_address(target[1:end])
        except ValueError:
            return f"--coordinator {target!r}: {target[1:end]!r} is not an IP address; expected [V6]:PORT"
        return None
    if target.count(":") > 1:
        return (f"--coordinator {target!r}: more than one ':' without brackets; expected HOST:PORT, an IPv6 address "
                "in brackets ([::1]:50051)")
    host = target.split(":", 1)[0]
    if not host:
        return f"--coordinator {target!r}: empty host; expected HOST:PORT (e.g. 127.0.0.1{target})"
    if not HOST_NAME.fullmatch(host):
        return (f"--coordinator {target!r}: host {host!r}: expected a host name (letters, digits, '-', '_' and '.') "
                "or an IP address")
    return None


def _port_taken(port: int, dialled: bool) -> bool:
    """Whether `port` is one a target may name: 1..65535 where it is `dialled`, else 0..65535."""
    return (1 if dialled else 0) <= port <= 65535


def _bad_port(target: str, dialled: bool) -> str:
    """The refusal of `target`'s port (digits as they were typed, anything else quoted)."""
    text = target.rsplit(":", 1)[1]
    shown = text if text.isascii() and text.isdigit() else repr(text)
    ports = "1..65535 (0 cannot be dialled)" if dialled else "0..65535"
    return f"--coordinator {target!r}: port {shown}: expected HOST:PORT with a port in {ports}"


def _port_problem(target: str, dialled: bool = False) -> str | None:
    """Why the host (`_host_problem`) or the port of a HOST:PORT `target` is not one (gRPC dials 99999 or -5 as some
    other port, silently; with `dialled`, nobody listens on port 0)."""
    host = _host_problem(target)
    if host is not None:
        return host
    if ":" not in target or target.startswith(("unix:", "unix-abstract:")):
        return None
    port = target_port(target)
    return None if port is not None and _port_taken(port, dialled) else _bad_port(target, dialled)


# How gRPC's client reports an HTTP proxy's 413 answer (ingress-nginx's request body limit) in a call's details.
HTTP_413 = "http2 header with status: 413"


def not_grpc_problem(target: str, code: grpc.StatusCode, details: str) -> str | None:
    """What answered at `target` when it is not a gRPC server, from a failed call's status (pure): gRPC reports a
    peer that does not speak HTTP/2, e.g. an HTTP/1 server such as the coordinator's dashboard, as UNAVAILABLE,
    and a proxy's "413 Request Entity Too Large" as UNKNOWN, both of which a client would retry, though no retry
    changes them. None for every other failure."""
    if HTTP_413 in details:
        return (f"a proxy in front of {target} refused the call as too large (HTTP 413; {code.name}): gRPC streams "
                "count against an HTTP proxy's request body limit, so no update gets through; raise the limit (for "
                'ingress-nginx the annotation nginx.ingress.kubernetes.io/proxy-body-size: "0", which the Helm chart '
                "sets; docs/DEPLOY.md)")
    if code != grpc.StatusCode.UNAVAILABLE or "Failed parsing HTTP/2" not in details:
        return None
    return (f"{target} answered, but not as a gRPC server (its first bytes are not HTTP/2): an HTTP server, such as "
            "the coordinator's dashboard (--http-port), is on that port; give the coordinator's gRPC port (--port)")


def plaintext_warning(target: str) -> str | None:
    """The warning for a plaintext channel to `target`, or None when it stays on this machine (pure)."""
    host = target_host(target)
    if host is None or is_loopback_host(host):
        return None
    return (f"connecting to {target} without TLS: the join token and the parameters cross the network in the "
            "clear; pass --tls-ca with the coordinator's CA certificate (the coordinator's --tls-self-signed "
            "prints the command)")


@dataclass(frozen=True)
class ClientTLS:
    """A client's TLS files: the CA that signed the coordinator's certificate, and optionally a client
    certificate and key for a coordinator that requires one (--tls-client-ca)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError(f"--tls-cert {self.cert} and --tls-key {self.key}: give both or neither")

    @classmethod
    def from_flags(cls, ca: Path | None, cert: Path | None = None, key: Path | None = None) -> ClientTLS | None:
        """The TLS of `--tls-ca/--tls-cert/--tls-key`, None for plaintext; ValueError for a client certificate
        without a CA or a certificate without its key (the files are read later, by `credentials`)."""
        if ca is None:
            if cert is not None or key is not None:
                raise ValueError("--tls-cert/--tls-key need --tls-ca, the CA that signed the coordinator's certificate")
            return None
        return cls(Path(ca), cert, key)

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials; ValueError names a file that cannot be read or is not PEM."""
        ca = read_pem(self.ca, "--tls-ca")
        if self.cert is None or self.key is None:
            return grpc.ssl_channel_credentials(root_certificates=ca)
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=read_pem(self.key, "--tls-key"),
            certificate_chain=read_pem(self.cert, "--tls-cert"),
        )


def read_pem(path: Path, flag: str) -> bytes:
    """The bytes of a PEM file; ValueError naming `flag` and the file when unreadable or not PEM."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{flag} {path}: not a PEM file (expected a '-----BEGIN ...' block)")
    return data


def open_channel(target: str, tls: ClientTLS | None, options: list[tuple[str, int]]) -> grpc.Channel:
    """A channel to `target`: TLS with `tls`, else plaintext, with a warning when `target` is not loopback."""
    if tls is not None:
        return grpc.secure_channel(target, tls.credentials(), options=options)
    warning = plaintext_warning(target)
    if warning is not None:
        log.warning("%s", warning)
    return grpc.insecure_channel(target, options=options)
