"""The coordinator's gRPC server: the Coordinator service, grpc.health.v1, guards, and its CLI.

Every call to rcswarm.v1.Coordinator passes a server interceptor that checks the join token
of Join and GetStatus (constant-time compare of the `authorization: Bearer <token>` metadata
against each accepted token, `JoinTokens` of tokens.py, which can be a file re-read when it
changes); a joined worker's own calls (`WORKER_METHODS`) pass with or without a token, since the
service authenticates them by their worker secret, so rotating the token does not stop them; a
PushUpdate without a token must also present its worker's id and secret in the call's metadata,
checked before the stream takes a slot (`CREDENTIAL_METADATA_METHODS`). It refuses calls without a client deadline, and bounds the call (`CallGate`): each RPC belongs to a
kind (`RPC_KINDS`) with a limit of calls running at once, beyond which a call is refused at once
with RESOURCE_EXHAUSTED, and a longest time the server spends on one call whatever deadline
the client sent; a stream that carries no message for `stream_idle_s` in either direction
is cancelled with DEADLINE_EXCEEDED (`CallWatchdog`). The thread pool has `headroom` threads
beyond the sum of the kind limits, so calls that hold a thread (long polls, streams) never
take the last one: refusals and the health service always find a thread.

The health service (Check; Watch is not served) is exempt from the token, the deadline and
the kind limits, so load balancers and Kubernetes probes can reach it, also in plaintext on
`--health-port` when the main port speaks TLS. It reports NOT_SERVING while the coordinator
cannot close rounds: its ticker's latest tick raised, or no tick has completed for
`health_stall_s` (`decide_health`). The service talks to one interface, `RunGroup`
(sweep.py): a single run is a group of one.

A non-loopback `--host` is served only with TLS (`--tls-cert/--tls-key`, or `--tls-self-signed
DIR`, whose worker command is logged) or with `--insecure`; `--tls-client-ca` requires client
certificates (coordinator/tls.py). The dashboard's token rule is `dashboard/auth.py`.

    rcswarm coordinator --config RUN.toml --state-dir DIR --port P [--host H --tls-self-signed DIR]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import os
import shlex
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import RunGroup, open_group
from rcswarm.coordinator.tls import (
    QuickStart,
    bind_problem,
    check_key_pair,
    ensure_quick_start,
    server_names,
    worker_host,
)
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.protos.transport import host_port, is_loopback_host, read_pem
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS, TOKEN_ENV, WORKER_ID_METADATA, WORKER_SECRET_METADATA

log = logging.getLogger("rcswarm.coordinator")

SERVICE_NAME = "rcswarm.v1.Coordinator"
# A call whose remaining time exceeds this carries no real deadline (gRPC reports "infinite").
NO_DEADLINE_S = 365 * 24 * 3600.0
TICK_S = 0.2
# The longest the watchdog sleeps between looks at its entries.
WATCHDOG_POLL_S = 1.0
# Threads (and calls at once) of the plaintext health-only server of --health-port.
HEALTH_THREADS = 4
HTTP_TLS_NEEDS_TLS = ("--http-tls serves the dashboard with the coordinator's certificate: "
                      "add --tls-self-signed DIR or --tls-cert/--tls-key")


@dataclass(frozen=True)
class RpcKind:
    """RPCs that share a concurrency limit, and the longest the server spends on one of them."""

    name: str
    methods: tuple[str, ...]
    max_call_s: float


# Every RPC of the Coordinator service, by kind. `max_call_s` is what one call can need: a
# unary call is answered in far less; AwaitVersion waits at most coordinator.max_wait_s
# (the handler sees its time remaining cut at 60 s); a pull or push of a large model over a
# slow link takes minutes. A client may send a longer deadline; the server never serves longer.
RPC_KINDS = (
    RpcKind("membership", ("Join", "Heartbeat", "Leave"), 30.0),
    RpcKind("query", ("GetStatus", "ReportMetrics"), 30.0),
    RpcKind("long_poll", ("AwaitVersion",), 60.0),
    RpcKind("pull", ("PullParameters",), 600.0),
    RpcKind("push", ("PushUpdate",), 600.0),
)
KIND_OF_METHOD = {method: kind for kind in RPC_KINDS for method in kind.methods}
# A joined worker's calls, authenticated by its worker secret in the service (service.py), not by the
# join token; every other RPC needs a join token.
WORKER_METHODS = frozenset({"Heartbeat", "Leave", "PullParameters", "AwaitVersion", "PushUpdate", "ReportMetrics"})
# Worker methods whose handler waits on the client before it sees a worker id: without a join token they
# must present the worker's id and secret in the call's metadata, checked before the call takes its slot,
# so that nobody without credentials can hold a stream slot for `stream_idle_s`.
CREDENTIAL_METADATA_METHODS = frozenset({"PushUpdate"})
DEFAULT_MAX_CALLS = {"membership": 32, "query": 16, "long_poll": 64, "pull": 16, "push": 16}


@dataclass(frozen=True)
class CallLimits:
    """Bounded concurrency of the Coordinator service.

    `max_calls[kind]` calls of each kind of `RPC_KINDS` run at once, the next is refused with
    RESOURCE_EXHAUSTED; a stream that carries no message for `stream_idle_s` is cancelled; the
    thread pool has `headroom` threads beyond the sum of the kind limits, for the health
    service and for refusals.
    """

    max_calls: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_MAX_CALLS))
    stream_idle_s: float = 10.0
    headroom: int = 16

    def __post_init__(self) -> None:
        """Refuse an unknown or missing kind, a limit below 1, a non-positive idle time or headroom."""
        known = [kind.name for kind in RPC_KINDS]
        for name, limit in self.max_calls.items():
            if name not in known:
                raise ValueError(f"max_calls[{name!r}]: unknown RPC kind; expected one of {', '.join(known)}")
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"max_calls[{name!r}] = {limit!r}: expected an integer >= 1")
        missing = [name for name in known if name not in self.max_calls]
        if missing:
            raise ValueError(f"max_calls lacks {', '.join(missing)}: expected a limit for every RPC kind")
        if not self.stream_idle_s > 0:
            raise ValueError(f"stream_idle_s = {self.stream_idle_s!r}: expected a number of seconds > 0")
        if isinstance(self.headroom, bool) or not isinstance(self.headroom, int) or self.headroom < 1:
            raise ValueError(f"headroom = {self.headroom!r}: expected an integer >= 1")

    @property
    def threads(self) -> int:
        """The RPC thread pool's size: every kind at its limit, plus the headroom."""
        return sum(self.max_calls.values()) + self.headroom


def parse_max_calls(values: list[str], configured: Mapping[str, int] | None = None) -> dict[str, int]:
    """The default limits, then the run spec's `coordinator.max_calls`, then `KIND=N` overrides from the
    command line; ValueError names a bad one."""
    limits = {**DEFAULT_MAX_CALLS, **(configured or {})}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not number.strip().isdigit():
            raise ValueError(f"--max-calls {value!r}: expected KIND=N, e.g. long_poll=64")
        limits[name.strip()] = int(number)
    return limits


def _cancel(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """Cancel a call so the client sees `code` and `message`, and wake its handler from any gRPC wait.

    The public `context.cancel()` sends a bare CANCELLED; the call object behind the context
    (C-core's cancel with a status) carries the code and the message. Where that is absent
    (another gRPC version), the bare cancel still frees the thread.
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    if call is None:
        context.cancel()
    else:
        call.cancel(code.value[0], message)


class CallWatchdog:
    """One thread that cancels calls at a given time unless their handler unwatches them first.

    Handlers `watch` a call before a wait gRPC may not end by itself (the next message of a
    stream, the whole of a call capped below its client deadline) and `unwatch` it after;
    `unwatch` says whether the watchdog fired meanwhile. Threads: `watch` and `unwatch` run
    on handler threads, `_run` on the watchdog's own thread; all three take `_condition`,
    and `_run` cancels outside it.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._entries: dict[int, tuple[grpc.ServicerContext, grpc.StatusCode, str]] = {}
        self._handles = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="rpc-watchdog", daemon=True)

    def start(self) -> None:
        """Start the watchdog's thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (pending entries never fire) and wait for it, at most a few seconds."""
        with self._condition:
            self._stopped = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=WATCHDOG_POLL_S * 2)

    def watch(self, context: grpc.ServicerContext, at: float, code: grpc.StatusCode, message: str) -> int:
        """Cancel `context`'s call with `code` and `message` at `at` (time.monotonic) unless unwatched first."""
        with self._condition:
            handle = next(self._handles)
            self._entries[handle] = (context, code, message)
            heapq.heappush(self._heap, (at, handle))
            if self._heap[0][1] == handle:
                self._condition.notify()
        return handle

    def unwatch(self, handle: int) -> bool:
        """Forget `handle`: True if it had not fired, False if its call was cancelled."""
        with self._condition:
            pending = self._entries.pop(handle, None) is not None
            if len(self._heap) > 4 * len(self._entries) + 1024:
                self._heap = [entry for entry in self._heap if entry[1] in self._entries]
                heapq.heapify(self._heap)
            return pending

    def _take_due(self, now: float) -> list[tuple[grpc.ServicerContext, grpc.StatusCode, str]]:
        """The entries whose time has come, removed (`_condition` held)."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            _, handle = heapq.heappop(self._heap)
            entry = self._entries.pop(handle, None)
            if entry is not None:
                due.append(entry)
        return due

    def _run(self) -> None:
        """The watchdog's thread: cancel due calls, sleep until the next is due (at most WATCHDOG_POLL_S)."""
        while True:
            with self._condition:
                if self._stopped:
                    return
                due = self._take_due(time.monotonic())
                if not due:
                    next_at = self._heap[0][0] if self._heap else time.monotonic() + WATCHDOG_POLL_S
                    self._condition.wait(timeout=min(max(next_at - time.monotonic(), 0.0), WATCHDOG_POLL_S))
            for context, code, message in due:
                log.info("cancelling a call from %s: %s", context.peer(), message)
                _cancel(context, code, message)


class _CappedContext:
    """A handler's view of its call: the real context, with `time_remaining` cut at the call's cap."""

    def __init__(self, context: grpc.ServicerContext, deadline: float) -> None:
        self._context = context
        self._deadline = deadline

    def time_remaining(self) -> float:
        """Seconds left before the client's deadline or the server's cap, whichever comes first."""
        return max(min(self._context.time_remaining(), self._deadline - time.monotonic()), 0.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


@dataclass
class _Admission:
    """One admitted call: its kind's slot, its watchdog entry (or None) and the context its handler sees."""

    slot: threading.Semaphore
    watchdog: CallWatchdog
    handle: int | None
    context: _CappedContext

    def close(self) -> None:
        """Give the slot back and forget the watchdog entry (the handler's thread, once, when it ends)."""
        if self.handle is not None:
            self.watchdog.unwatch(self.handle)
        self.slot.release()


class CallGate:
    """Admission and time bounds of Coordinator calls: a slot of the call's kind, its cap, idle streams.

    Threads: every method runs on gRPC handler threads; a kind's slots are a semaphore
    (non-blocking acquire, so a call beyond the limit is refused at once), the watchdog takes its own lock.
    """

    def __init__(self, limits: CallLimits, watchdog: CallWatchdog) -> None:
        self.limits = limits
        self.watchdog = watchdog
        self._slots = {kind.name: threading.BoundedSemaphore(limits.max_calls[kind.name]) for kind in RPC_KINDS}
        served = set(pb.DESCRIPTOR.services_by_name["Coordinator"].methods_by_name)
        unbounded = sorted(served - set(KIND_OF_METHOD))
        if unbounded:
            raise RuntimeError(f"RPCs without a kind in RPC_KINDS: {', '.join(unbounded)}")

    def admit(self, method: str, context: grpc.ServicerContext) -> _Admission:
        """Take a slot of `method`'s kind and watch the call's cap; abort with RESOURCE_EXHAUSTED when none is free."""
        kind = KIND_OF_METHOD[method]
        limit = self.limits.max_calls[kind.name]
        slot = self._slots[kind.name]
        if not slot.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"coordinator busy: {limit} {kind.name} calls ({', '.join(kind.methods)}) already running, "
                f"the limit (--max-calls {kind.name}={limit}); retry with backoff",
            )
        deadline = time.monotonic() + kind.max_call_s
        handle = None
        if context.time_remaining() > kind.max_call_s:
            handle = self.watchdog.watch(
                context, deadline, grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{method} ran for {kind.max_call_s:.0f} s, the longest the coordinator serves one {kind.name} call",
            )
        return _Admission(slot, self.watchdog, handle, _CappedContext(context, deadline))

    def _idle_watch(self, context: grpc.ServicerContext, message: str) -> int:
        """Watch the next message of a stream for `stream_idle_s`."""
        return self.watchdog.watch(
            context, time.monotonic() + self.limits.stream_idle_s, grpc.StatusCode.DEADLINE_EXCEEDED,
            f"{message} for {self.limits.stream_idle_s:g} s (stream_idle_s); the stream is cancelled",
        )

    def idle_bounded_requests(self, requests: Iterator[Any], context: grpc.ServicerContext, method: str) -> Iterator[Any]:
        """`requests`, where a wait for the next message past `stream_idle_s` cancels the call and raises
        Refusal(DEADLINE_EXCEEDED) in the handler."""
        silence = f"{method}: the client sent no message"
        idle = Refusal(grpc.StatusCode.DEADLINE_EXCEEDED, f"{silence} for {self.limits.stream_idle_s:g} s")
        while True:
            handle = self._idle_watch(context, silence)
            try:
                request = next(requests, None)
            except grpc.RpcError:
                if self.watchdog.unwatch(handle):
                    raise
                raise idle from None
            if not self.watchdog.unwatch(handle):
                raise idle
            if request is None:
                return
            yield request

    def idle_bounded_responses(self, responses: Iterator[Any], context: grpc.ServicerContext, method: str) -> Iterator[Any]:
        """`responses`, where a client that reads nothing for `stream_idle_s` has the call cancelled."""
        for response in responses:
            handle = self._idle_watch(context, f"{method}: the client read no message")
            try:
                yield response
            finally:
                self.watchdog.unwatch(handle)


def _guarded(
    behavior: Callable[..., Any], handler: grpc.RpcMethodHandler, method: str, gate: CallGate,
    authorized: Callable[[], bool],
) -> Callable[..., Any]:
    """`behavior` behind the credential and deadline checks, its kind's slot and cap, and idle-stream bounds.
    `authorized` runs on the handler thread before the call takes a slot."""
    def admit(request: Any, context: grpc.ServicerContext) -> tuple[Any, _Admission]:
        if not authorized():
            if method in CREDENTIAL_METADATA_METHODS:
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              f"{method} needs a join token, or the worker's id and secret in the call's metadata "
                              f"({WORKER_ID_METADATA}, {WORKER_SECRET_METADATA}) of an active membership")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong join token")
        remaining = context.time_remaining()
        if remaining is None or remaining > NO_DEADLINE_S:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "calls to the coordinator must set a deadline")
        admission = gate.admit(method, context)
        if handler.request_streaming:
            request = gate.idle_bounded_requests(request, context, method)
        return request, admission

    if handler.response_streaming:
        def stream_behavior(request: Any, context: grpc.ServicerContext) -> Any:
            request, admission = admit(request, context)
            try:
                yield from gate.idle_bounded_responses(behavior(request, admission.context), context, method)
            finally:
                admission.close()
        return stream_behavior

    def unary_behavior(request: Any, context: grpc.ServicerContext) -> Any:
        request, admission = admit(request, context)
        try:
            return behavior(request, admission.context)
        finally:
            admission.close()
    return unary_behavior


class GuardInterceptor(grpc.ServerInterceptor):
    """Token, deadline and `CallGate` checks on every call of the Coordinator service (the server's polling thread).

    The join token is checked for every method but `WORKER_METHODS`, which the service authenticates by
    the worker secret; `tokens` may be re-read from a file meanwhile (`JoinTokens` takes its own lock).
    """

    def __init__(
        self, tokens: str | JoinTokens, gate: CallGate, owns_credential: Callable[[str, bytes], bool] | None = None,
    ) -> None:
        """`owns_credential(worker_id, secret)` says whether an active membership has that secret (it takes the
        coordinator's locks: called on handler threads, never on the polling thread); None refuses
        `CREDENTIAL_METADATA_METHODS` without a token."""
        self._tokens = tokens if isinstance(tokens, JoinTokens) else JoinTokens([tokens])
        self._gate = gate
        self._owns_credential = owns_credential

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        metadata = dict(details.invocation_metadata or ())
        presented = str(metadata.get("authorization", "")).encode()
        if method in CREDENTIAL_METADATA_METHODS:
            credential = (str(metadata.get(WORKER_ID_METADATA, "")), metadata.get(WORKER_SECRET_METADATA, b""))
            authorized = partial(self._credential_or_token, presented, *credential)
        else:
            token_ok = method in WORKER_METHODS or self._tokens.accepts(presented)
            authorized = partial(bool, token_ok)
        kind = "unary_unary" if not handler.request_streaming else "stream_unary"
        if handler.response_streaming:
            kind = "unary_stream" if not handler.request_streaming else "stream_stream"
        wrapped = _guarded(getattr(handler, kind), handler, method, self._gate, authorized)
        return handler._replace(**{kind: wrapped})

    def _credential_or_token(self, presented: bytes, worker_id: str, secret: Any) -> bool:
        """Whether a call presents an accepted join token or an active worker's own id and secret (handler thread)."""
        if self._tokens.accepts(presented):
            return True
        if self._owns_credential is None or not worker_id or not isinstance(secret, bytes) or not secret:
            return False
        return self._owns_credential(worker_id, secret)


def _handled(method: Callable[..., Any]) -> Callable[..., Any]:
    """Map Refusal to the gRPC status it names."""
    def unary(self: CoordinatorServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Refusal as refusal:
            context.abort(refusal.code, refusal.message)
    return unary


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """The gRPC handlers: each calls one method of the run group from a handler thread."""

    def __init__(self, group: RunGroup) -> None:
        self.c = group

    @_handled
    def Join(self, request, context):
        return self.c.join(request)

    @_handled
    def Heartbeat(self, request, context):
        return self.c.heartbeat(request)

    @_handled
    def Leave(self, request, context):
        return self.c.leave(request)

    def PullParameters(self, request, context):
        try:
            yield from self.c.pull(request)
        except Refusal as refusal:
            context.abort(refusal.code, refusal.message)

    @_handled
    def AwaitVersion(self, request, context):
        return self.c.await_version(request, context.time_remaining())

    @_handled
    def PushUpdate(self, request_iterator, context):
        return self.c.push(request_iterator)

    @_handled
    def ReportMetrics(self, request, context):
        return self.c.report_metrics(request)

    @_handled
    def GetStatus(self, request, context):
        return self.c.status()


@dataclass
class TLSFiles:
    """The server's PEM certificate and private key, and with `client_ca` mutual TLS: every client must
    present a certificate that CA signed, or its handshake fails."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials; ValueError names a file that is unreadable, not PEM, or a key not the cert's."""
        cert, key = read_pem(self.cert, "--tls-cert"), read_pem(self.key, "--tls-key")
        check_key_pair(self.cert, self.key)
        if self.client_ca is None:
            return grpc.ssl_server_credentials([(key, cert)])
        client_ca = read_pem(self.client_ca, "--tls-client-ca")
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca, require_client_auth=True)

    def ssl_context(self) -> ssl.SSLContext:
        """The dashboard's HTTPS context: the same certificate, TLS 1.2 or newer, no client certificates."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context


class HealthChecks(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 without a token: Check answers from the shared `HealthServicer`; Watch is not served
    (UNIMPLEMENTED), since each open Watch stream would hold a server thread for anyone who asks."""

    def __init__(self, statuses: health.HealthServicer) -> None:
        self._statuses = statuses

    def Check(self, request, context):
        return self._statuses.Check(request, context)


@dataclass(frozen=True)
class TickRecord:
    """The ticker's latest outcome: when a tick last completed (time.monotonic), and the error of the latest tick if it raised."""

    ok_at: float
    error: str | None = None


def decide_health(now: float, record: TickRecord, stall_s: float) -> tuple[bool, str]:
    """Whether the coordinator serves, and why (pure). Its ticker evicts workers and closes due rounds:
    the latest tick must not have raised, and one must have completed within `stall_s`."""
    if record.error is not None:
        return False, f"the latest tick (evictions, round closes) failed: {record.error}"
    silent = now - record.ok_at
    if silent > stall_s:
        return False, f"no tick (evictions, round closes) completed for {silent:.1f} s, more than {stall_s:g} s"
    return True, "ticks complete"


class RunningCoordinator:
    """A started server with its ticker, health and watchdog threads; `stop()` shuts them down.

    `coordinator` is what the caller gave (a bare SwarmCoordinator or a RunGroup); `group` is the
    RunGroup over it that the gRPC service, the ticker and the dashboard talk to. `limits` bound
    the Coordinator service's calls (`CallLimits`); health reports NOT_SERVING when the ticker's
    latest tick raised or none completed for `health_stall_s` seconds.

    A non-loopback `host` needs `tls` or `insecure` (`tls.bind_problem`). With `health_port` (0 = any
    free one) a second, plaintext gRPC server on the same host serves only grpc.health.v1, from the
    same servicer, for probes that cannot speak the main port's TLS. The dashboard (`http_port`)
    requires the join token when `http_token_required` is True, or when it is None (the default) and
    `http_host` is not loopback (`dashboard.auth.decide_dashboard_auth`).

    Threads: the ticker thread replaces `_tick_record` whole after every tick and the health
    thread reads it (one reference, no lock); `start` and `stop` run on the caller's thread.
    """

    def __init__(
        self, coordinator: SwarmCoordinator | RunGroup, token: str | JoinTokens, host: str = "127.0.0.1", port: int = 0,
        tls: TLSFiles | None = None, limits: CallLimits | None = None, health_stall_s: float = 60.0,
        http_port: int | None = None, http_host: str = "127.0.0.1", *, insecure: bool = False,
        health_port: int | None = None, http_token_required: bool | None = None, http_tls: bool = False,
    ) -> None:
        tokens = token if isinstance(token, JoinTokens) else JoinTokens([token])
        if not health_stall_s > 0:
            raise ValueError(f"health_stall_s = {health_stall_s!r}: expected a number of seconds > 0")
        problem = bind_problem(host, tls is not None, insecure)
        if problem is not None:
            raise ValueError(problem)
        if http_tls and tls is None:
            raise ValueError(HTTP_TLS_NEEDS_TLS)
        self.coordinator = coordinator
        self.group = RunGroup.of(coordinator)
        self.limits = limits or CallLimits()
        self.health_stall_s = health_stall_s
        self.watchdog = CallWatchdog()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.limits.threads, thread_name_prefix="rpc"),
            interceptors=[GuardInterceptor(tokens, CallGate(self.limits, self.watchdog), self.group.owns_credential)],
            options=list(MESSAGE_SIZE_OPTIONS),
        )
        pb_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(self.group), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(HealthChecks(self.health), self.server)
        address = host_port(host, port)
        credentials = tls.credentials() if tls else None
        self.port = _bind(self.server, address, credentials)
        self.health_server: grpc.Server | None = None
        self.health_port: int | None = None
        if health_port is not None:
            self.health_server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=HEALTH_THREADS, thread_name_prefix="health"),
                maximum_concurrent_rpcs=HEALTH_THREADS,
            )
            health_pb2_grpc.add_HealthServicer_to_server(HealthChecks(self.health), self.health_server)
            try:
                self.health_port = _bind(self.health_server, host_port(host, health_port), None)
            except RuntimeError:
                self.server.stop(None)
                raise
        self._stop = threading.Event()
        self._tick_record = TickRecord(time.monotonic())
        self._ticker = threading.Thread(target=self._tick_loop, name="ticker", daemon=True)
        self._health_thread = threading.Thread(target=self._health_loop, name="health", daemon=True)
        # The optional HTTP dashboard (observe/dashboard.py); None unless http_port is given.
        self.dashboard: Any = None
        if http_port is not None:
            from rcswarm.observe.dashboard import Dashboard
            from rcswarm.observe.dashboard.auth import SessionAuth, decide_dashboard_auth

            required = http_token_required
            if required is None:
                required, _ = decide_dashboard_auth(http_host, False, False)
            auth = SessionAuth(tokens.accepts_token) if required else None
            context = tls.ssl_context() if http_tls and tls is not None else None
            try:
                self.dashboard = Dashboard(self.group, http_host, http_port, auth=auth, ssl_context=context)
            except OSError as exc:
                self.server.stop(None)
                if self.health_server is not None:
                    self.health_server.stop(None)
                raise RuntimeError(f"could not bind the dashboard on {http_host}:{http_port}: {exc.strerror}") from None

    def start(self) -> RunningCoordinator:
        """Serve gRPC, health and the dashboard, and start the watchdog, the ticker and the health thread."""
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self.watchdog.start()
        self.server.start()
        if self.health_server is not None:
            self.health_server.start()
        self._tick_record = TickRecord(time.monotonic())
        self._ticker.start()
        self._health_thread.start()
        if self.dashboard is not None:
            self.dashboard.start()
        return self

    def _set_health(self, status: int) -> None:
        """Report `status` for the server and the Coordinator service."""
        for service in ("", SERVICE_NAME):
            self.health.set(service, status)

    def _tick_loop(self) -> None:
        """The ticker thread: the group's evictions and round deadlines every TICK_S; records each outcome
        and logs a failure with its traceback when it differs from the previous tick's."""
        while not self._stop.wait(TICK_S):
            try:
                self.group.tick()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != self._tick_record.error:
                    log.exception("coordinator tick failed")
                self._tick_record = TickRecord(self._tick_record.ok_at, error)
            else:
                self._tick_record = TickRecord(time.monotonic())

    def _health_loop(self) -> None:
        """The health thread: every TICK_S, `decide_health` on the ticker's record; logs and reports each change."""
        serving = True
        while not self._stop.wait(TICK_S):
            now_serving, reason = decide_health(time.monotonic(), self._tick_record, self.health_stall_s)
            if now_serving != serving:
                serving = now_serving
                if serving:
                    log.info("health: SERVING again (%s)", reason)
                else:
                    log.warning("health: NOT_SERVING: %s", reason)
                self._set_health(
                    health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
                )

    def stop(self, grace: float = 2.0) -> None:
        """Stop the ticker, the health thread, the dashboard and the server (in-flight calls get `grace`
        seconds), then the watchdog, and close the stores."""
        self._stop.set()
        if self.dashboard is not None:
            self.dashboard.stop()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait(grace + 1.0)
        if self.health_server is not None:
            self.health_server.stop(0).wait(1.0)
        self._ticker.join(timeout=2.0)
        self._health_thread.join(timeout=2.0)
        self.watchdog.stop()
        self.group.close()


def _bind(server: grpc.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Add a listening port (TLS with `credentials`) and return it; RuntimeError naming the address when it cannot."""
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise RuntimeError(f"could not bind {address} (in use, or not an address of this machine)")
    return port


def parser() -> argparse.ArgumentParser:
    """The `rcswarm coordinator` command line."""
    parser = argparse.ArgumentParser(prog="rcswarm coordinator", description="Run the rcswarm coordinator.")
    parser.add_argument("--config", required=True, help="RUN.toml describing the run")
    parser.add_argument("--state-dir", required=True, help="directory for checkpoints and the SQLite state")
    parser.add_argument("--port", type=int, default=50051, help="port to listen on (0 = any free port; default: 50051)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default loopback; any other address needs TLS or --insecure)")
    parser.add_argument("--token", default=None, help=f"join token (default: ${TOKEN_ENV})")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file of accepted join tokens, one per line (# comments), re-read when it changes "
                             "and on SIGHUP; instead of --token (rotation without a restart)")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate; with --tls-key enables TLS")
    parser.add_argument("--tls-key", type=Path, help="PEM private key")
    parser.add_argument("--tls-self-signed", type=Path, metavar="DIR",
                        help="serve TLS with a CA and server certificate made (or reused) in DIR, and log the "
                             "worker command with --tls-ca DIR/ca.pem; DIR/client.pem is a client certificate")
    parser.add_argument("--tls-san", action="append", default=[], metavar="NAME",
                        help="with --tls-self-signed: another DNS name or IP address workers dial (repeatable)")
    parser.add_argument("--tls-client-ca", type=Path, metavar="FILE",
                        help="mutual TLS: require client certificates signed by this CA (e.g. DIR/ca.pem)")
    parser.add_argument("--insecure", action="store_true",
                        help="serve plaintext gRPC on a non-loopback --host (the token crosses the network in the clear)")
    parser.add_argument("--health-port", type=int, default=None,
                        help="also serve grpc.health.v1 Check in plaintext on this port of --host, for probes that "
                             "cannot speak TLS (0 = any free port; default: off)")
    parser.add_argument("--port-file", type=Path, help="write {'port': P} here once serving")
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve the HTTP dashboard and /metrics on this port (0 = any free port; default: off)")
    parser.add_argument("--http-host", default="127.0.0.1",
                        help="address the dashboard binds (default loopback; elsewhere it requires the join token)")
    parser.add_argument("--http-token-required", action="store_true",
                        help="require the join token on the dashboard on loopback too")
    parser.add_argument("--http-insecure", action="store_true",
                        help="serve the dashboard on a non-loopback --http-host without the token")
    parser.add_argument("--http-tls", action="store_true",
                        help="serve the dashboard over HTTPS with the coordinator's TLS certificate")
    kinds = ", ".join(f"{name}={limit}" for name, limit in DEFAULT_MAX_CALLS.items())
    parser.add_argument("--max-calls", action="append", default=[], metavar="KIND=N",
                        help=f"calls of one kind running at once, beyond which a call gets RESOURCE_EXHAUSTED "
                             f"(repeatable; overrides the run spec's coordinator.max_calls; default {kinds})")
    parser.add_argument("--stream-idle-s", type=float, default=None,
                        help="cancel a stream that carries no message for this long (default: the run spec's "
                             "coordinator.stream_idle_s, 10)")
    parser.add_argument("--health-stall-s", type=float, default=None,
                        help="health says NOT_SERVING when no tick completed for this long (default: the run spec's "
                             "coordinator.health_stall_s, 60)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed `rcswarm coordinator` command line (argparse exits 0 after --help, 2 on a usage error)."""
    return parser().parse_args(argv)


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line's values, or None (nothing is created or bound before this)."""
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    if args.tls_cert and args.tls_self_signed:
        return "--tls-self-signed makes the certificate itself: give it or --tls-cert/--tls-key, not both"
    if args.tls_san and not args.tls_self_signed:
        return "--tls-san names go into the certificate --tls-self-signed makes: add --tls-self-signed DIR"
    tls = bool(args.tls_cert or args.tls_self_signed)
    if args.tls_client_ca and not tls:
        return "--tls-client-ca needs TLS: add --tls-self-signed DIR or --tls-cert/--tls-key"
    if args.http_tls and not tls:
        return HTTP_TLS_NEEDS_TLS
    for flag, port in (("--port", args.port), ("--http-port", args.http_port), ("--health-port", args.health_port)):
        if port is not None and not 0 <= port <= 65535:
            return f"{flag} {port}: expected 0..65535"
    if args.health_port and args.health_port == args.port:
        return f"--health-port {args.health_port}: the same as --port; expected another port"
    if args.http_port is not None:
        from rcswarm.observe.dashboard.auth import decide_dashboard_auth

        try:
            decide_dashboard_auth(args.http_host, args.http_token_required, args.http_insecure)
        except ValueError as exc:
            return str(exc)
    return bind_problem(args.host, tls, args.insecure)


def _tls_files(args: argparse.Namespace) -> tuple[TLSFiles | None, QuickStart | None]:
    """The server's TLS files from the flags (making or reusing the quick start's), checked; ValueError names a bad one."""
    quick = None
    if args.tls_self_signed:
        names = server_names(args.host, args.tls_san, socket.gethostname())
        quick = ensure_quick_start(args.tls_self_signed, names)
        tls = TLSFiles(quick.cert, quick.key, args.tls_client_ca)
    elif args.tls_cert:
        tls = TLSFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
    else:
        return None, None
    tls.credentials()
    return tls, quick


def worker_command(args: argparse.Namespace, port: int, quick: QuickStart) -> list[str]:
    """The `rcswarm worker` command for the quick start's CA (and its client certificate under mutual TLS)."""
    host = worker_host(args.host, args.tls_san, socket.gethostname())
    command = ["rcswarm", "worker", "--coordinator", host_port(host, port), "--tls-ca", str(quick.ca.resolve())]
    if args.tls_client_ca is not None and args.tls_client_ca.resolve() == quick.ca.resolve():
        command += ["--tls-cert", str(quick.client_cert.resolve()), "--tls-key", str(quick.client_key.resolve())]
    return command


def _log_security(args: argparse.Namespace, running: RunningCoordinator, quick: QuickStart | None) -> None:
    """Log how workers connect (the quick start's exact worker command) and every opt-out of a protection."""
    if quick is not None:
        for note in quick.notes:
            log.info("--tls-self-signed: %s", note)
        log.info("worker command: %s", shlex.join(worker_command(args, running.port, quick)))
        log.info("(the worker reads the join token from $%s or --token; copy %s to each worker's machine%s)",
                 TOKEN_ENV, quick.ca.name, ", with client.pem and client-key.pem" if args.tls_client_ca else "")
        if args.tls_client_ca is not None and args.tls_client_ca.resolve() != quick.ca.resolve():
            log.info("workers also need --tls-cert/--tls-key of a client certificate signed by %s", args.tls_client_ca)
    if args.insecure and not (args.tls_cert or args.tls_self_signed) and not is_loopback_host(args.host):
        log.warning("serving plaintext gRPC on %s (--insecure): anyone on the network path can read the join token "
                    "and the parameters, and act as a worker", args.host)
    if running.health_port is not None:
        log.info("plaintext health checks (grpc.health.v1 Check) on %s", host_port(args.host, running.health_port))
    if running.dashboard is not None:
        dashboard = running.dashboard
        log.info("dashboard on %s (metrics at %smetrics)%s", dashboard.url, dashboard.url,
                 "; it requires the join token (Authorization: Bearer, or log in at /login)" if dashboard.auth else "")
        from rcswarm.observe.dashboard.auth import decide_dashboard_auth

        _, warning = decide_dashboard_auth(args.http_host, args.http_token_required, args.http_insecure, args.http_tls)
        if warning is not None:
            log.warning("%s", warning)


def serving_limits(args: argparse.Namespace, spec: RunSpec) -> tuple[CallLimits, float]:
    """The call limits and the health stall time: the run spec's [coordinator] keys, overridden by the
    command line's --max-calls, --stream-idle-s and --health-stall-s where given."""
    served = spec.coordinator
    idle_s = served.stream_idle_s if args.stream_idle_s is None else args.stream_idle_s
    stall_s = served.health_stall_s if args.health_stall_s is None else args.health_stall_s
    return CallLimits(parse_max_calls(args.max_calls, served.max_calls), idle_s), stall_s


def main(argv: list[str] | None = None) -> int:
    """`rcswarm coordinator`: serve one run or a sweep until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s coordinator %(levelname)s %(message)s")
    args = parse_args(argv)
    problem = _argument_problem(args)
    if problem is None:
        try:
            tokens = JoinTokens.from_cli(args.token, args.token_file, os.environ.get(TOKEN_ENV, ""))
            spec = RunSpec.from_toml(args.config)
            limits, stall_s = serving_limits(args, spec)
            tls, quick = _tls_files(args)
            coordinator = open_group(spec, args.state_dir)
            http_required = True if args.http_token_required else False if args.http_insecure else None
            running = RunningCoordinator(
                coordinator, tokens, args.host, args.port, tls, limits, stall_s,
                http_port=args.http_port, http_host=args.http_host, insecure=args.insecure,
                health_port=args.health_port, http_token_required=http_required, http_tls=args.http_tls,
            ).start()
        except ValueError as exc:
            problem = str(exc)
        except RuntimeError as exc:
            print(f"rcswarm coordinator: {exc}", file=sys.stderr)
            return 1
    if problem is not None:
        print(f"rcswarm coordinator: {problem}", file=sys.stderr)
        return 2
    log.info("run %s serving on %s at version %d", coordinator.run_id, host_port(args.host, running.port),
             coordinator.version)
    _log_security(args, running, quick)
    if args.port_file:
        partial = args.port_file.with_suffix(".partial")
        info: dict[str, Any] = {"port": running.port, "run_id": coordinator.run_id}
        if running.dashboard is not None:
            info["http_port"] = running.dashboard.port
        if running.health_port is not None:
            info["health_port"] = running.health_port
        partial.write_text(json.dumps(info))
        os.replace(partial, args.port_file)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: tokens.reload())
    while not stop.wait(1.0):
        pass
    log.info("stopping at version %d", coordinator.version)
    running.stop()
    return 0
