"""Call admission on the Coordinator service: who may call, how many at once, and for how long.

Every call to rcswarm.v1.Coordinator passes `GuardInterceptor`, which checks the join token
of Join and GetStatus (constant-time compare of the `authorization: Bearer <token>` metadata
against each accepted token, `JoinTokens` of tokens.py, which can be a file re-read when it
changes); a joined worker's own calls (`WORKER_METHODS`) pass with or without a token, since the
service authenticates them by their worker secret, so rotating the token does not stop them; a
PushUpdate without a token must also present its worker's id and secret in the call's metadata,
checked before the stream takes a slot (`CREDENTIAL_METADATA_METHODS`). It refuses calls without a
client deadline, and bounds the call (`CallGate`): each RPC belongs to a kind (`RPC_KINDS`) with a
limit of calls running at once, beyond which a call is refused at once with RESOURCE_EXHAUSTED, and a
longest time the server spends on one call whatever deadline the client sent; a stream that carries no
message for `stream_idle_s` in either direction is cancelled with DEADLINE_EXCEEDED (`CallWatchdog`).
`CallLimits` holds the limits; the thread pool (server.py) has `headroom` threads beyond the sum of the
kind limits, so calls that hold a thread (long polls, streams) never take the last one: refusals and
the health service always find a thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc

from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import WORKER_ID_METADATA, WORKER_SECRET_METADATA

log = logging.getLogger("rcswarm.coordinator")

SERVICE_NAME = "rcswarm.v1.Coordinator"
# A call whose remaining time exceeds this carries no real deadline (gRPC reports "infinite").
NO_DEADLINE_S = 365 * 24 * 3600.0
# The longest the watchdog sleeps between looks at its entries.
WATCHDOG_POLL_S = 1.0


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

