"""The worker's gRPC client of the coordinator: deadlines, credentials, and retries.

Every call carries the join token and a deadline; a joined worker's calls also carry its
worker secret (`Member`: the id and secret a JoinResponse returned, kept in memory only), by
which the coordinator authenticates them, so they go on when the join token is rotated. The
channel is TLS with `tls_ca` (and a client certificate with `tls_cert`/`tls_key` for a
coordinator that requires one), else plaintext, with one warning when the coordinator is not on
loopback (protos/transport.py). `classify` sorts each gRPC status into retry (the coordinator is
stalled, restarting, at capacity, or a stream broke), rejoin (it no longer knows this worker) or
fatal (it refused the request, the join token or this worker's identity). Transient failures are
retried with jittered exponential backoff until the stop event is set or the coordinator has not
answered any call of this client for `RetryPolicy.max_elapsed_s`, the patience (a stop set by then wins: Stopped, not
RetriesExhausted; but a peer that is not a
gRPC server, such as an HTTP server on that port, ends the call at once: `NotACoordinator`; so does TLS that does not
match the coordinator's, `TLSMismatch`: a certificate --tls-ca does not verify, one that does not name the host, a
TLS channel to a plaintext port, a plaintext channel to a port that answers a TLS handshake, or a TLS channel whose
client certificate, or its absence, the coordinator refuses after the handshake): the silence counts
from the first failure after its last answer (a reply, or a refusal), whichever thread made the
call, so a long push retried while heartbeats are answered goes on, and calls that fail one after
another share one patience instead of each starting its own. A transfer (a push, a pull) in flight is watched
(`CoordinatorClient._watched`): once the stop event has been set for the rpc timeout (a push about to land lands), or
that silence (the heartbeat's failures start it; the transfer's own messages, as they move, reset it) reaches the
patience, the call is cancelled and Stopped or RetriesExhausted raised, instead of the attempt running to its
transfer deadline (300 s by default) first. A refused payload (a pull that fails its
checks) is an answer, so it cannot count as silence: a pull gives up after
`RetryPolicy.max_refused_payloads` refused payloads in a row instead, however often other calls are
answered meanwhile. A join refused because every place is taken (RESOURCE_EXHAUSTED with the coordinator's
PLACE_RETRY_KEY trailer) is an answer too: the worker waits for a place, asking again when the trailer says,
one WARNING when it starts waiting, then one INFO line a minute, until a place frees, the run finishes
(FAILED_PRECONDITION), the stop event is set, or the coordinator goes silent for the patience. Anything else
is raised to the caller as `grpc.RpcError`. A pull is checked against
the parameter names and shapes the caller expects before any buffer is allocated.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol, Sequence, TypeVar

import grpc
import torch

from rcswarm.protos.transport import (
    MOVED_KEY,
    PLACE_RETRY_KEY,
    ClientTLS,
    not_grpc_problem,
    open_channel,
    target_host,
    target_port,
)
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS, WORKER_ID_METADATA, WORKER_SECRET_METADATA
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream

log = logging.getLogger("rcswarm.worker")
T = TypeVar("T")


class RetriesExhausted(RuntimeError):
    """The coordinator kept failing transiently for longer than the retry policy's patience."""


class NotACoordinator(RetriesExhausted):
    """What answered at the target is not a gRPC server (`transport.not_grpc_problem`): given up at once, since no
    retry changes it. A RetriesExhausted, so that every caller that gives up on an unreachable coordinator gives
    up on this too."""


class TLSMismatch(RetriesExhausted):
    """The channel's TLS settings do not match the coordinator's (`tls_problem`, `CoordinatorClient._tls_problem`):
    given up at once, since no retry changes them. A RetriesExhausted, as NotACoordinator is."""


class Stopped(RuntimeError):
    """The worker was asked to stop while waiting to retry."""


class BadPayload(RuntimeError):
    """A pulled payload failed its checks; the pull is retried for the full parameters."""


class Action(enum.Enum):
    """What a caller does about a failed call."""

    RETRY = "retry"
    REJOIN = "rejoin"
    FATAL = "fatal"


_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE: "the coordinator is unreachable or restarting",
    grpc.StatusCode.DEADLINE_EXCEEDED: "the coordinator did not answer within the deadline",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "the coordinator is at capacity",
    grpc.StatusCode.CANCELLED: "the call was cancelled before it completed",
    grpc.StatusCode.ABORTED: "the call was aborted",
    grpc.StatusCode.INTERNAL: "the stream broke",
    grpc.StatusCode.UNKNOWN: "the coordinator failed the call",
}


# The longest and shortest a worker waits between two asks for a place, whatever the coordinator's trailer says (it
# sends 1 to 10 s, `decisions.place_retry_s`; a shorter one would make the worker ask hundreds of times a second).
MAX_PLACE_RETRY_S = 60.0
MIN_PLACE_RETRY_S = 0.5
# A worker waiting for a place says so again once this long has passed since it last said so.
PLACE_REMINDER_S = 60.0
# How often a transfer in flight looks at the stop event and the patience (`CoordinatorClient._watched`).
TRANSFER_POLL_S = 0.2


def wait_until(done: threading.Event, poll_s: float, give_up: Callable[[], bool]) -> bool:
    """Wait for `done`, asking `give_up()` every `poll_s` seconds meanwhile: False once `done` is set, True as soon as
    `give_up()` is (a transfer's watch, `CoordinatorClient._watched`, and an overlapped round's `Exchange.wait`)."""
    while not done.wait(poll_s):
        if give_up():
            return True
    return False


def _trailer(err: grpc.RpcError, key: str) -> str | None:
    """The value of the first trailing-metadata entry `key` of a failed call, None when it has none."""
    trailers = getattr(err, "trailing_metadata", lambda: None)() or ()
    return next((value for name, value in trailers if name == key), None)


def moved(err: grpc.RpcError) -> bool:
    """Whether `err` is a NOT_FOUND whose membership's run no longer takes its updates (the MOVED_KEY trailer)."""
    return err.code() == grpc.StatusCode.NOT_FOUND and _trailer(err, MOVED_KEY) == "1"


def place_retry_s(err: grpc.RpcError) -> float | None:
    """Seconds until the next ask for a place when `err` is a join refused for want of one (RESOURCE_EXHAUSTED
    with a PLACE_RETRY_KEY trailer holding a positive number of milliseconds, capped at MAX_PLACE_RETRY_S),
    else None: a RESOURCE_EXHAUSTED without it is a busy coordinator, retried with backoff."""
    value = _trailer(err, PLACE_RETRY_KEY) if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else None
    if value is None:
        return None
    try:
        seconds = float(value) / 1000
    except (TypeError, ValueError):
        return None
    return min(max(seconds, MIN_PLACE_RETRY_S), MAX_PLACE_RETRY_S) if seconds > 0 else None


def classify(code: grpc.StatusCode) -> tuple[Action, str]:
    """(action, reason) for a call that failed with `code`.

    Stalls, restarts, capacity limits and broken streams are retried; NOT_FOUND (the
    coordinator forgot this worker) asks for a new Join; every other status is the
    coordinator refusing the request, which retrying would not change.
    """
    if code in _TRANSIENT:
        return Action.RETRY, _TRANSIENT[code]
    if code == grpc.StatusCode.NOT_FOUND:
        return Action.REJOIN, "the coordinator no longer knows this worker"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Action.FATAL, "the coordinator refused the join token"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Action.FATAL, "the coordinator refused this worker's identity (its worker secret does not match its id)"
    return Action.FATAL, "the coordinator refused the request"


# The fix of a worker whose TLS settings do not match the coordinator's.
CA_FIX = ("pass --tls-ca with the coordinator's CA certificate (ca.pem in its --tls-self-signed directory; its log "
          "prints the worker command)")
# gRPC's "last error" for a connection the peer closed: the address it dialled (IPv6 URL-quoted, in brackets).
_CLOSED_AT = re.compile(r"\b(?:ipv4|ipv6):(\S+):(\d+): Socket closed")
# Seconds a client waits for a TLS handshake with a peer that closed its connection (`answers_tls`,
# `refuses_client_certificate`).
TLS_PROBE_S = 3.0
# The TLS alerts (OpenSSL's reasons) by which a server refuses the client's certificate, or its absence: TLS 1.3's
# certificate_required, a certificate it cannot verify or will not take, and TLS 1.2's handshake_failure, which an
# OpenSSL server sends to a client that presented none. Only a peer's alert: CERTIFICATE_VERIFY_FAILED is this side's.
CLIENT_CERTIFICATE_ALERTS = frozenset({
    "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE", "SSLV3_ALERT_BAD_CERTIFICATE",
    "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED", "SSLV3_ALERT_CERTIFICATE_REVOKED", "TLSV1_ALERT_ACCESS_DENIED",
})
# The fix of a worker whose client certificate, or its absence, a coordinator with --tls-client-ca refuses.
CLIENT_CERT_FIX = "pass --tls-cert and --tls-key with a client certificate the coordinator's --tls-client-ca signed"


def tls_problem(target: str, tls_ca: Path | None, code: grpc.StatusCode, details: str) -> str | None:
    """What is wrong with a TLS channel's settings (`tls_ca`: its CA, None for plaintext), with the fix, when a
    failed call's status says its TLS handshake failed for good (pure); None for every other failure. Only what the
    handshake reports counts: a certificate `tls_ca` does not verify, a certificate that does not name the host,
    or a protocol error (SSL_ERROR_SSL, e.g. a peer that does not speak TLS); a connection closed or reset during
    the handshake, as by a coordinator that restarts, is not one. A plaintext channel's handshake with a TLS
    coordinator reports only "Socket closed", as a coordinator going down does: see `answers_tls`."""
    if code != grpc.StatusCode.UNAVAILABLE or tls_ca is None:
        return None
    error = f"({code.name}: {details})"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (f"the coordinator's TLS certificate does not verify against --tls-ca {tls_ca}, so retrying cannot "
                f"help: {CA_FIX} {error}")
    if "Hostname Verification Check failed" in details:
        return (f"the coordinator's TLS certificate does not name the host of --coordinator {target}: give a "
                "name or address its certificate holds (the coordinator's log prints the worker command), or "
                f"reissue the certificate for this one {error}")
    if "WRONG_VERSION_NUMBER" in details:
        return (f"{target} does not speak TLS, but --tls-ca is given: the coordinator may run without TLS (then drop "
                "--tls-ca, --tls-cert and --tls-key), or this is not its gRPC port " + error)
    if "SSL_ERROR_SSL" in details:
        return f"the TLS handshake with {target} failed: check --tls-ca, --tls-cert and --tls-key {error}"
    return None


def closed_address(details: str) -> tuple[str, int] | None:
    """(host, port) gRPC dialled when the peer closed the connection ("ipv4:HOST:PORT: Socket closed" in a failed
    call's details), or None (pure)."""
    match = _CLOSED_AT.search(details)
    if match is None:
        return None
    host = urllib.parse.unquote(match.group(1))
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), int(match.group(2))


def _target_address(target: str) -> tuple[str, int] | None:
    """(host, port) of a HOST:PORT gRPC target (`dns:///HOST:PORT`, `[V6]:PORT` too); None without a port (pure)."""
    host, port = target_host(target), target_port(target)
    return None if host is None or port is None else (host, port)


def answers_tls(address: tuple[str, int], timeout_s: float = TLS_PROBE_S) -> bool:
    """Whether a TLS handshake with `address` completes: only whether the peer speaks TLS, so its certificate is not
    checked and nothing is sent after the handshake. False when the connection fails, the peer closes it, or it
    answers as a plaintext server does (a gRPC server without TLS reads the handshake as a bad HTTP/2 preface)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(address, timeout=timeout_s) as raw, context.wrap_socket(raw):
            return True
    except (OSError, ValueError):  # ssl.SSLError and socket.timeout are OSErrors
        return False


def refused_after_handshake(handshake_done: bool, outcome: bytes | BaseException) -> bool:
    """Whether a TLS probe's outcome says the server refused the client's certificate, or its absence (pure):
    `handshake_done`, whether this side's handshake completed (its certificate verified against the CA, its name
    checked); `outcome`, the first bytes read after it, or what the handshake or that read raised. A refusal is an
    alert of CLIENT_CERTIFICATE_ALERTS (an OpenSSL server's: TLS 1.3 sends it after the client's side of the
    handshake completed, TLS 1.2 during it), or, after a completed handshake, the connection closed before the
    server sent anything: a gRPC server (BoringSSL) that refuses a client certificate closes without an alert,
    while one that accepts it sends its HTTP/2 SETTINGS frame at once. A connection closed, reset or silent
    during the handshake, as by a coordinator that restarts, is no refusal, nor is a timeout."""
    if isinstance(outcome, ssl.SSLError) and getattr(outcome, "reason", None) in CLIENT_CERTIFICATE_ALERTS:
        return True
    if not handshake_done:
        return False
    return outcome == b"" or isinstance(outcome, (ssl.SSLEOFError, ssl.SSLZeroReturnError))


def refuses_client_certificate(address: tuple[str, int], host: str, tls_ca: Path, tls_cert: Path | None = None,
                               tls_key: Path | None = None, timeout_s: float = TLS_PROBE_S) -> bool:
    """Whether the TLS server at `address` refuses this client's certificate (`tls_cert`/`tls_key`; None: none):
    a TLS handshake as the channel makes it (the server's certificate verified against `tls_ca` for `host`, ALPN
    h2, the client certificate presented), then one read, all within about `timeout_s`, judged by
    `refused_after_handshake`. Nothing is sent after the handshake. False when the files cannot be loaded, the
    connection fails, the server's certificate does not verify, or the server answers."""
    deadline = time.monotonic() + timeout_s
    try:
        context = ssl.create_default_context(cafile=str(tls_ca))
        context.set_alpn_protocols(["h2"])
        if tls_cert is not None and tls_key is not None:
            # A key that needs a password is refused rather than prompted for (gRPC cannot use one either).
            context.load_cert_chain(str(tls_cert), str(tls_key), password=lambda: b"")
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False
    handshake_done = False
    try:
        with socket.create_connection(address, timeout=timeout_s) as raw:
            raw.settimeout(max(deadline - time.monotonic(), 0.05))
            with context.wrap_socket(raw, server_hostname=host, suppress_ragged_eofs=False) as tls:
                handshake_done = True
                tls.settimeout(max(deadline - time.monotonic(), 0.05))
                outcome: bytes | BaseException = tls.recv(16)
    except (OSError, ValueError) as error:  # ssl.SSLError and socket.timeout are OSErrors
        outcome = error
    return refused_after_handshake(handshake_done, outcome)


def tls_settings_problem(target: str, tls_ca: Path | None, code: grpc.StatusCode, details: str,
                         probe_s: float = TLS_PROBE_S, *, tls_cert: Path | None = None,
                         tls_key: Path | None = None) -> str | None:
    """`tls_problem`; when the coordinator closed the connection, also what a probe of that address (waiting at
    most `probe_s`) tells apart from a coordinator that restarts: on a plaintext channel (`tls_ca` None), one that
    answers a TLS handshake (`answers_tls`: it requires TLS); on a TLS channel, one that refuses its client
    certificate `tls_cert`/`tls_key`, or its absence, after the handshake (`refuses_client_certificate`: it runs
    with --tls-client-ca). None for every other failure."""
    problem = tls_problem(target, tls_ca, code, details)
    if problem is not None or code != grpc.StatusCode.UNAVAILABLE:
        return problem
    closed, own = closed_address(details), _target_address(target)
    # Only the coordinator the operator named is probed: the address in `details` is text the server may have
    # written, and a worker must not dial whatever a status names (its own network, metadata endpoints).
    if closed is None or own is None or closed[1] != own[1]:
        return None
    error = f"({code.name}: {details})"
    if tls_ca is None:
        if not answers_tls(own, probe_s):
            return None
        return (f"{target} requires TLS: it closed this plaintext connection and answers a TLS handshake, so "
                f"retrying cannot help: {CA_FIX} {error}")
    if tls_cert is None or tls_key is None:
        if not refuses_client_certificate(own, own[0], tls_ca, None, None, probe_s):
            return None
        return (f"{target} requires a client certificate (it runs with --tls-client-ca) and none is given: it closed "
                f"the connection after the TLS handshake, so retrying cannot help: {CLIENT_CERT_FIX} {error}")
    if not refuses_client_certificate(own, own[0], tls_ca, tls_cert, tls_key, probe_s):
        return None
    return (f"{target} refuses the client certificate --tls-cert {tls_cert}: it closed the connection after the TLS "
            f"handshake (its --tls-client-ca did not sign that certificate, or it expired), so retrying cannot help: "
            f"{CLIENT_CERT_FIX} {error}")


def retry_hint(tls_ca: Path | None, tls_cert: Path | None, details: str) -> str:
    """What else a connection the coordinator closed may mean, for the retry message: "" unless `details` is a
    closed connection ("Socket closed"; not a handshake cut short, which a restart causes). For what the probes of
    `tls_settings_problem` could not tell apart: a probe that timed out, or a server that closed it another way."""
    if closed_address(details) is None:
        return ""
    if tls_ca is None:
        return f"; or it requires TLS: then {CA_FIX}"
    if tls_cert is None:
        return "; or it requires a client certificate (--tls-client-ca): then pass --tls-cert and --tls-key"
    return f"; or it refuses --tls-cert {tls_cert}: then pass a client certificate its --tls-client-ca signed"


class Member(Protocol):
    """Whom a worker's call is for: its id and the worker secret its Join returned (a JoinResponse is one)."""

    @property
    def worker_id(self) -> str: ...

    @property
    def worker_secret(self) -> bytes: ...


@dataclass(frozen=True)
class Identity:
    """One membership's credentials, in memory only: replaced whole by a join, so a thread that reads it
    gets an id and the secret that goes with it. The secret stays out of its repr."""

    worker_id: str = ""
    worker_secret: bytes = field(default=b"", repr=False)

    @classmethod
    def of(cls, response: Member) -> Identity:
        """The credentials a JoinResponse returned."""
        return cls(response.worker_id, response.worker_secret)


@dataclass(frozen=True)
class RetryPolicy:
    """Jittered exponential backoff, retried until the coordinator has not answered for `max_elapsed_s` (the
    patience), or a pull's payload was refused `max_refused_payloads` times in a row."""

    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    max_elapsed_s: float = 300.0
    max_refused_payloads: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"initial_backoff_s = {self.initial_backoff_s}, max_backoff_s = {self.max_backoff_s}: "
                "expected 0 < initial <= max"
            )
        if self.multiplier < 1 or self.max_elapsed_s <= 0:
            raise ValueError(f"multiplier = {self.multiplier}, max_elapsed_s = {self.max_elapsed_s}: expected >= 1 and > 0")
        if self.max_refused_payloads < 1:
            raise ValueError(f"max_refused_payloads = {self.max_refused_payloads}: expected >= 1")

    def backoffs(self, rng: random.Random) -> Iterator[float]:
        """Full-jitter exponential backoff: uniform(0, min(max, initial * multiplier^k))."""
        ceiling = self.initial_backoff_s
        while True:
            yield rng.uniform(0.0, ceiling)
            ceiling = min(self.max_backoff_s, ceiling * self.multiplier)


@dataclass
class PlaceWait:
    """One call's wait for a place: when it started and when the worker last said so (monotonic; None before)."""

    since: float | None = None
    said_at: float = 0.0


@dataclass(frozen=True)
class Timeouts:
    """Deadlines of one attempt: unary calls (plus the wait of a long poll) and tensor transfers."""

    unary_s: float = 10.0
    transfer_s: float = 300.0

    def __post_init__(self) -> None:
        if not (self.unary_s > 0 and self.transfer_s > 0):
            raise ValueError(f"unary_s = {self.unary_s}, transfer_s = {self.transfer_s}: expected both > 0")


def apply_delta(
    header: pb.TensorHeader, step: Mapping[str, torch.Tensor], have: tuple[int, Mapping[str, torch.Tensor]] | None
) -> dict[str, torch.Tensor]:
    """θ_new = θ_have − step, element-wise in float32, verified against header.result_sha256."""
    if have is None or header.delta_from_version != have[0]:
        held = None if have is None else have[0]
        raise tensor_stream.PayloadError(f"got a delta from version {header.delta_from_version} but this worker holds {held}")
    base = have[1]
    if list(step) != list(base) or any(step[k].shape != base[k].shape for k in base):
        raise tensor_stream.PayloadError("the delta's tensor names or shapes differ from the held parameters")
    params = {name: base[name] - step[name] for name in base}
    if tensor_stream.params_sha256(params) != header.result_sha256:
        raise tensor_stream.PayloadError(
            f"parameters rebuilt from the delta {header.delta_from_version} -> {header.version} do not match their SHA-256"
        )
    return params


def receive_pull(
    responses: Iterator[pb.PullParametersResponse], run_id: str, expected: Mapping[str, tuple[int, ...]] | None,
    wire_format: codecs.WireFormat | None = None,
) -> tuple[pb.TensorHeader, dict[str, torch.Tensor], int]:
    """(header, decoded tensors, message bytes) of one PullParameters stream.

    The header is checked against `expected` (names and shapes in order) before the receive buffer is allocated, and
    its codec too: the full parameters come in fp32, a step (`delta_from_version`) in the run's `wire_format` with
    its parameters (a coordinator's fp32 run cannot make the worker take θ as block-1 sparse, 9.25 bytes a
    parameter); a stream that ends before its header or its last chunk is a PayloadError.
    """
    first = next(responses, None)
    if first is None:
        raise tensor_stream.PayloadError("PullParameters: the stream ended before its header")
    if first.WhichOneof("part") != "header":
        raise tensor_stream.PayloadError(f"PullParameters: expected a header first, got {first.WhichOneof('part')}")
    step = first.header.HasField("delta_from_version")
    codecs_allowed = ((wire_format.codec,) if wire_format is not None else None) if step else (pb.CODEC_FP32,)
    receiver = tensor_stream.PayloadReceiver(first.header, expected=expected, run_id=run_id, expected_format=wire_format,
                                             allowed_codecs=codecs_allowed)
    received = first.ByteSize()
    for message in responses:
        if message.WhichOneof("part") != "chunk":
            raise tensor_stream.PayloadError(f"PullParameters: expected a chunk, got {message.WhichOneof('part')}")
        receiver.add(message.chunk)
        received += message.ByteSize()
    return first.header, receiver.finish(), received


class CoordinatorClient:
    """One channel to the coordinator; each method is one RPC with its deadline and retries.

    Methods may be called from several threads (the worker's loop and its heartbeat thread):
    they share the channel, which gRPC makes thread-safe, the byte counters, which only the
    worker's loop updates, and the patience clock `_silent_since`, which every call reads and
    writes under `_silence_lock` (`_answered`, `_silence`; held for an assignment, never across a call).
    """

    def __init__(
        self, target: str, token: str, *, tls_ca: Path | None = None, tls_cert: Path | None = None,
        tls_key: Path | None = None, retry: RetryPolicy = RetryPolicy(), timeouts: Timeouts = Timeouts(),
        stop: threading.Event | None = None,
    ) -> None:
        self.target = target
        self.tls_ca, self.tls_cert, self.tls_key = tls_ca, tls_cert, tls_key
        self.channel = open_channel(target, ClientTLS.from_flags(tls_ca, tls_cert, tls_key), list(MESSAGE_SIZE_OPTIONS))
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.retry = retry
        self.timeouts = timeouts
        self.stop = stop or threading.Event()
        self._rng = random.Random()
        self._silence_lock = threading.Lock()
        # Monotonic time of the first transient failure since the coordinator last answered; None while it answers.
        self._silent_since: float | None = None
        self.bytes_sent = 0
        self.bytes_received = 0

    def close(self) -> None:
        """Close the channel; calls in flight fail with CANCELLED."""
        self.channel.close()

    def _answered(self) -> None:
        """The coordinator answered a call (a reply or a refusal): the patience starts afresh (takes `_silence_lock`)."""
        with self._silence_lock:
            self._silent_since = None

    def _progressing(self, messages: Iterator[T]) -> Iterator[T]:
        """`messages` (a pull's responses received, a push's requests taken by gRPC to send, which its flow control
        holds back while the coordinator takes nothing), each counted as the coordinator answering (`_answered`): a
        transfer that moves is no silence, however long it takes (one that took longer than the patience after a
        failed attempt, or behind timed-out heartbeats on a slow link, was cancelled)."""
        for message in messages:
            self._answered()
            yield message

    def _silent_for(self) -> float:
        """Seconds since the first failure after the coordinator's last answer, 0 while it answers; starts no clock
        (takes `_silence_lock`)."""
        with self._silence_lock:
            return 0.0 if self._silent_since is None else time.monotonic() - self._silent_since

    @contextlib.contextmanager
    def _watched(self, what: str, call: grpc.Future) -> Iterator[None]:
        """Run the body, which waits on the transfer `call` (a push's future, a pull's response stream), while a
        watcher thread cancels `call` once the stop event has been set for the rpc timeout (`Timeouts.unary_s`: a
        healthy push about to land still lands, and its round counts; cancelled at once, a scale-down lost it) or the
        coordinator has been silent for the patience (`_silent_for`: the failures of other calls, the heartbeat's,
        start that clock; an answer to any call, and each message of the transfer itself, `_progressing`, resets it,
        so a long transfer goes on while it moves). The body's failure is then raised as Stopped (a stop wins) or
        RetriesExhausted. Before, the attempt ran to its transfer deadline: a SIGTERMed worker pushing to a stalled
        coordinator left after 318 s, and `--patience-s 10` gave up after 322 s. A body that ends before the cancel
        takes hold keeps its outcome (a push answered is delivered)."""
        ended = threading.Event()
        why: list[RuntimeError] = []
        stopped_at: list[float] = []  # when the watch first saw the stop

        def give_up() -> bool:
            silent = self._silent_for()
            if self.stop.is_set() and not stopped_at:
                stopped_at.append(time.monotonic())
            if stopped_at and time.monotonic() - stopped_at[0] >= self.timeouts.unary_s:
                why.append(Stopped(f"{what}: stopped, and the transfer in flight did not end within the "
                                   f"{self.timeouts.unary_s:g}s (--rpc-timeout-s) a stop gives it (cancelled)"))
            elif silent >= self.retry.max_elapsed_s:
                why.append(RetriesExhausted(
                    f"{what}: gave up after {silent:.1f}s without an answer from the coordinator (patience "
                    f"{self.retry.max_elapsed_s:g}s), the transfer in flight cancelled"))
            return bool(why)

        def watch() -> None:
            if wait_until(ended, TRANSFER_POLL_S, give_up):
                call.cancel()

        watcher = threading.Thread(target=watch, name=f"{what}-watch", daemon=True)
        watcher.start()
        try:
            yield
        except (grpc.RpcError, grpc.FutureCancelledError) as err:
            if why:
                raise why[0] from err
            raise
        finally:
            ended.set()
            watcher.join()

    def _silence(self) -> float:
        """Seconds since the first failure after the coordinator's last answer, starting that clock now if
        this is that failure (takes `_silence_lock`)."""
        now = time.monotonic()
        with self._silence_lock:
            if self._silent_since is None:
                self._silent_since = now
            return now - self._silent_since

    def _with_retry(self, what: str, attempt: Callable[[], T]) -> T:
        """attempt() until it returns, retrying transient failures until the coordinator was silent for the patience."""
        backoffs = self.retry.backoffs(self._rng)
        refused, first_refused = 0, 0.0
        waiting = PlaceWait()
        while True:
            try:
                result = attempt()
            except grpc.RpcError as err:
                wait_s = place_retry_s(err)
                if wait_s is not None:
                    self._answered()
                    self._wait_for_place(what, err.details() or "", wait_s, waiting, err)
                    continue
                action, reason = classify(err.code())
                if action is not Action.RETRY:
                    self._answered()
                    raise
                problem = not_grpc_problem(self.target, err.code(), err.details() or "")
                if problem is not None:
                    raise NotACoordinator(f"{what}: {problem}") from None
                problem = self._tls_problem(err.code(), err.details() or "")
                if problem is not None:
                    raise TLSMismatch(f"{what}: {problem}") from None
                hint = retry_hint(self.tls_ca, self.tls_cert, err.details() or "")
                self._pause(what, f"{err.code().name}: {err.details()} ({reason}{hint})", next(backoffs), err)
            except BadPayload as exc:
                # The coordinator answered, with something this worker refuses: not silence, counted on its own.
                self._answered()
                refused, first_refused = refused + 1, first_refused or time.monotonic()
                if refused >= self.retry.max_refused_payloads:
                    raise RetriesExhausted(
                        f"{what}: refused {refused} payloads in a row over {time.monotonic() - first_refused:.1f}s "
                        f"(max_refused_payloads {self.retry.max_refused_payloads}); last: {exc}"
                    ) from exc
                self._pause(what, f"a bad payload ({exc}; {refused} of {self.retry.max_refused_payloads} refused "
                                  "in a row)", next(backoffs), exc)
            else:
                self._answered()
                return result

    def _tls_problem(self, code: grpc.StatusCode, details: str) -> str | None:
        """`tls_settings_problem` of this client's channel."""
        return tls_settings_problem(self.target, self.tls_ca, code, details, min(TLS_PROBE_S, self.timeouts.unary_s),
                                    tls_cert=self.tls_cert, tls_key=self.tls_key)

    def _wait_for_place(self, what: str, refusal: str, wait_s: float, waiting: PlaceWait, cause: Exception) -> None:
        """Wait about `wait_s` (jittered down to half, so that spares do not ask in step) before asking for a place
        again; says so when the wait starts, then once every PLACE_REMINDER_S. Raises Stopped when the stop
        event is set."""
        now = time.monotonic()
        if waiting.since is None:
            waiting.since = waiting.said_at = now
            log.warning("%s: %s; waiting for a place, asking again about every %.0fs", what, refusal, wait_s)
        elif now - waiting.said_at >= PLACE_REMINDER_S:
            waiting.said_at = now
            log.info("%s: still waiting for a place after %.0fs: %s", what, now - waiting.since, refusal)
        if self.stop.wait(self._rng.uniform(wait_s / 2, wait_s)):
            raise Stopped(what) from cause

    def _pause(self, what: str, problem: str, delay: float, cause: Exception) -> None:
        """Wait `delay` (at most what is left of the patience) before the next attempt.

        Raises Stopped when the stop event is set (before, or while waiting; a stop wins over a spent patience, so
        that a stopped worker leaves with exit status 0) and RetriesExhausted once the coordinator has not answered
        for the patience.
        """
        if self.stop.is_set():
            raise Stopped(what) from cause
        elapsed = self._silence()
        left = self.retry.max_elapsed_s - elapsed
        if left <= 0:
            raise RetriesExhausted(
                f"{what}: gave up after {elapsed:.1f}s without an answer from the coordinator "
                f"(patience {self.retry.max_elapsed_s:g}s); last error: {problem}"
            ) from cause
        delay = min(delay, left)
        log.warning("%s: %s; retrying in %.2fs (%.1fs of patience left)", what, problem, delay, left)
        if self.stop.wait(delay):
            raise Stopped(what) from cause

    def _unary(self, name: str, request, timeout: float | None = None):
        method = getattr(self.stub, name)
        return self._with_retry(name, lambda: method(request, timeout=timeout or self.timeouts.unary_s, metadata=self.metadata))

    def join(self, name: str, device: str, pid: int, run_id: str = "", previous: Member | None = None,
             refused: Sequence[str] = ()) -> pb.JoinResponse:
        """Ask to join the swarm; a re-join names the run it trained for (`run_id`) and its membership there
        (`previous`: its id with its worker secret, without which the coordinator takes nothing of it over), so that
        a sweep sends it back to that run and the new membership takes over what the ended one had, and every run it
        refused (`refused`), so that a sweep places it in none of them."""
        request = pb.JoinRequest(worker_name=name, device=device, pid=pid, run_id=run_id, refused_run_ids=list(refused))
        if previous is not None and previous.worker_id:
            request.previous_worker_id, request.previous_worker_secret = previous.worker_id, previous.worker_secret
        return self._unary("Join", request)

    def heartbeat(self, member: Member) -> pb.HeartbeatResponse:
        """Renew `member`'s lease."""
        return self._unary("Heartbeat", pb.HeartbeatRequest(worker_id=member.worker_id, worker_secret=member.worker_secret))

    def leave(self, member: Member, reason: str) -> None:
        """End `member`'s membership: one attempt, not retried (the worker is on its way out)."""
        request = pb.LeaveRequest(worker_id=member.worker_id, worker_secret=member.worker_secret, reason=reason)
        self.stub.Leave(request, timeout=self.timeouts.unary_s, metadata=self.metadata)

    def await_version(self, member: Member, min_version: int, wait_s: float) -> pb.AwaitVersionResponse:
        """Long poll for `min_version` for up to `wait_s` (the deadline adds the unary timeout)."""
        request = pb.AwaitVersionRequest(
            worker_id=member.worker_id, worker_secret=member.worker_secret, min_version=min_version, wait_ms=int(wait_s * 1000)
        )
        return self._unary("AwaitVersion", request, timeout=wait_s + self.timeouts.unary_s)

    def report_metrics(self, member: Member, metrics: list[pb.Metric], run_id: str) -> None:
        """Send a batch of `member`'s per-step metrics, trained for run `run_id` (a run refuses another run's rows):
        one attempt, not retried (metrics are best effort: the caller keeps or drops the rows of a failed one and
        tries again later), raising grpc.RpcError."""
        request = pb.ReportMetricsRequest(worker_id=member.worker_id, worker_secret=member.worker_secret,
                                          metrics=metrics, run_id=run_id)
        try:
            self.stub.ReportMetrics(request, timeout=self.timeouts.unary_s, metadata=self.metadata)
        except grpc.RpcError as err:
            if classify(err.code())[0] is not Action.RETRY:
                self._answered()
            raise
        self._answered()

    def status(self) -> pb.GetStatusResponse:
        """The coordinator's status of the run (or sweep)."""
        return self._unary("GetStatus", pb.GetStatusRequest())

    def pull(
        self, member: Member, run_id: str, have: tuple[int, Mapping[str, torch.Tensor]] | None = None, *,
        expected: Mapping[str, tuple[int, ...]] | None = None, repull: bool = False,
        wire_format: codecs.WireFormat | None = None,
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """The newest global parameters: (version, tensors), checked against the header's checksums.

        `have` = (version, parameters) the caller holds bit for bit; when the coordinator
        answers with the compressed step from that version, the parameters are rebuilt as
        have − step and checked against the SHA-256 of the new version. `expected` maps each
        parameter name, in order, to its shape: a header that disagrees is refused before
        anything is allocated. A payload that fails a check raises PayloadError, or with
        `repull` is retried like a transient failure, asking for the full parameters.
        """
        held = [have]

        def attempt() -> tuple[int, dict[str, torch.Tensor]]:
            request = pb.PullParametersRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
            if held[0] is not None:
                request.have_version = held[0][0]
            responses = self.stub.PullParameters(request, timeout=self.timeouts.transfer_s, metadata=self.metadata)
            try:
                with self._watched("PullParameters", responses):
                    header, tensors, received = receive_pull(self._progressing(responses), run_id, expected,
                                                             wire_format)
                if header.HasField("delta_from_version"):
                    tensors = apply_delta(header, tensors, held[0])
            except tensor_stream.PayloadError as exc:
                responses.cancel()
                if not repull:
                    raise
                held[0] = None
                raise BadPayload(str(exc)) from exc
            self.bytes_received += received
            return header.version, tensors

        return self._with_retry("PullParameters", attempt)

    def push(self, meta: pb.UpdateMeta, header: pb.TensorHeader, chunks: list[pb.TensorChunk]) -> pb.PushUpdateResponse:
        """Send one update (meta, with the worker's id and secret, header, chunks); the same messages are sent
        again on a retry. An attempt in flight is cancelled by a stop or a spent patience (`_watched`): whether it
        landed is then unknown, as for a kill (the caller's residual file holds for either, `Worker._push_deltas`)."""
        messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header)]
        messages += [pb.PushUpdateRequest(chunk=chunk) for chunk in chunks]
        size = sum(m.ByteSize() for m in messages)
        metadata = (*self.metadata, (WORKER_ID_METADATA, meta.worker_id), (WORKER_SECRET_METADATA, meta.worker_secret))

        def attempt() -> pb.PushUpdateResponse:
            call = self.stub.PushUpdate.future(self._progressing(iter(messages)), timeout=self.timeouts.transfer_s,
                                               metadata=metadata)
            with self._watched("PushUpdate", call):
                response = call.result()
            self.bytes_sent += size
            return response

        return self._with_retry("PushUpdate", attempt)
