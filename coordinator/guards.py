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
kind limits and the reserve, so calls that hold a thread (long polls, streams) never take the last one:
refusals and the health service always find a thread.

First messages. gRPC Python's sync server gives a call its pool thread before the call's request message has
arrived, and its unary path waits for that message on the thread, before any interceptor's handler runs: a client
that sends headers and nothing else held a thread for as long as it liked, with no token and no deadline (600 such
calls took all 480 threads of a tiny run's coordinator; members were evicted). So the guard serves every
unary-request method (of every service on the port, health Check included) as a request-streaming one: the token
and the deadline are checked before anything is read, and the one request message is then read under
`FirstMessages`: at most `first_message_calls` calls wait for theirs at once (`headroom` includes them), each for
at most `first_message_s`, and a call that finds them all waiting cancels the one that has waited longest. An honest
unary client sends its message with its headers and waits milliseconds, so neither a slow sender nor a flood of
half-sent calls, from any number of hosts, takes more than those threads. `FirstMessageInterceptor` puts the same
bound on the plaintext health port's server (server.py).

Fair share (issue #31). Every call counts against a caller (`identify`): an active worker, by its id
when the call carries that worker's own secret (in the request, or for PushUpdate in the metadata), or
else the peer host it comes from (Join, GetStatus, a call whose credential does not check out). A worker
runs at most `per_worker` calls of a kind at once, a peer host at most `per_peer` (half of the kind's
limit unless set); and an active worker with no call of a kind running always gets one, beyond the
kind's limit, from a reserve of `reserve` (the run's `coordinator.max_workers`) per kind
(`decide_slot`, pure). Memberships are at most max_workers, and the calls of one that ends are cancelled
at once (`CallGate.end_worker`), so the reserve always has a slot for every member: one worker, or all
the workers one join token may create, can hold the kind's shared slots but never a member's own.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc

from rcswarm.config.runspec import CALL_KINDS, MAX_CALLS, MAX_SECONDS, MIN_SECONDS
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import WORKER_ID_METADATA, WORKER_SECRET_METADATA

MIN_STREAM_IDLE_S = MIN_SECONDS["coordinator.stream_idle_s"]

log = logging.getLogger("rcswarm.coordinator")

SERVICE_NAME = "rcswarm.v1.Coordinator"

# The deadline (time.monotonic) of the Coordinator call the current handler thread serves, set by `_guarded` around
# its handler (`serving_until`); unset outside a call (the ticker, the dashboard, a test calling a run directly). A
# run bounds a handler's wait for its lock by it (`call_time_left`, `SwarmCoordinator._hold`).
_call = threading.local()


@contextlib.contextmanager
def serving_until(deadline: float | None) -> Iterator[None]:
    """The current thread serves a call whose deadline is `deadline` (time.monotonic; None: none) for the block."""
    previous = getattr(_call, "deadline", None)
    _call.deadline = deadline
    try:
        yield
    finally:
        _call.deadline = previous


def call_time_left() -> float | None:
    """Seconds left to the deadline of the call the current thread serves, or None outside a call (any thread)."""
    deadline = getattr(_call, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


def _deadline_of(context: grpc.ServicerContext) -> float | None:
    """The call's deadline on time.monotonic (its handler's view: the client's deadline cut at the call's cap), or
    None without one (the guard refused those already)."""
    remaining = context.time_remaining()
    return None if remaining is None or remaining > NO_DEADLINE_S else time.monotonic() + remaining
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
assert tuple(kind.name for kind in RPC_KINDS) == CALL_KINDS, "the run spec validates max_calls against CALL_KINDS"
KIND_OF_METHOD = {method: kind for kind in RPC_KINDS for method in kind.methods}
# A joined worker's calls, authenticated by its worker secret in the service (service.py), not by the
# join token; every other RPC needs a join token.
WORKER_METHODS = frozenset({"Heartbeat", "Leave", "PullParameters", "AwaitVersion", "PushUpdate", "ReportMetrics"})
# Worker methods whose handler waits on the client before it sees a worker id: without a join token they
# must present the worker's id and secret in the call's metadata, checked before the call takes its slot,
# so that nobody without credentials can hold a stream slot for `stream_idle_s`.
CREDENTIAL_METADATA_METHODS = frozenset({"PushUpdate"})
DEFAULT_MAX_CALLS = {"membership": 32, "query": 16, "long_poll": 64, "pull": 16, "push": 16}


def _check_count(name: str, value: Any, least: int, most: int | None = None) -> None:
    """ValueError naming `name` unless `value` is an integer >= `least` (and <= `most` when given)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        bound = f"in [{least}, {most}]" if most is not None else f">= {least}"
        raise ValueError(f"{name} = {value!r}: expected an integer {bound}")


@dataclass(frozen=True)
class CallLimits:
    """Bounded concurrency of the Coordinator service.

    `max_calls[kind]` calls of each kind of `RPC_KINDS` run at once, the next is refused with
    RESOURCE_EXHAUSTED; one worker runs at most `per_worker` calls of a kind, one peer host (anonymous
    calls) at most `per_peer[kind]` (default half of `max_calls[kind]`); an active worker's first call of a
    kind is admitted beyond the limit from a reserve of `reserve` per kind (the module docstring); a stream
    that carries no message for `stream_idle_s` is cancelled; the thread pool has `headroom` threads beyond
    the sum of the kind limits and the reserves: `first_message_calls` of them for unary calls waiting for their
    request message (each at most `first_message_s`, `FirstMessages`), the rest (16 by default) for the health
    service and for refusals.
    """

    max_calls: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_MAX_CALLS))
    stream_idle_s: float = 10.0
    headroom: int = 64
    per_worker: int = 2
    per_peer: Mapping[str, int] = field(default_factory=dict)
    reserve: int = 64
    first_message_calls: int = 48
    first_message_s: float = 5.0

    def __post_init__(self) -> None:
        """Refuse an unknown or missing kind, a limit below 1, a non-positive idle time or headroom, and first-message
        limits that leave no thread of the headroom to refusals and health."""
        known = [kind.name for kind in RPC_KINDS]
        for table in ("max_calls", "per_peer"):
            for name, limit in getattr(self, table).items():
                if name not in known:
                    raise ValueError(f"{table}[{name!r}]: unknown RPC kind; expected one of {', '.join(known)}")
                _check_count(f"{table}[{name!r}]", limit, 1, MAX_CALLS)  # each sizes the RPC thread pool
        missing = [name for name in known if name not in self.max_calls]
        if missing:
            raise ValueError(f"max_calls lacks {', '.join(missing)}: expected a limit for every RPC kind")
        if not MIN_STREAM_IDLE_S <= self.stream_idle_s <= MAX_SECONDS:
            raise ValueError(f"stream_idle_s = {self.stream_idle_s!r}: expected a number of seconds in "
                             f"[{MIN_STREAM_IDLE_S:g}, {MAX_SECONDS:g}] (shorter cancelled every pull at once)")
        _check_count("headroom", self.headroom, 1)
        _check_count("per_worker", self.per_worker, 1)
        _check_count("reserve", self.reserve, 0)
        _check_count("first_message_calls", self.first_message_calls, 1)
        if self.first_message_calls >= self.headroom:
            raise ValueError(f"first_message_calls = {self.first_message_calls} of headroom = {self.headroom}: expected "
                             "fewer, so that refusals and the health service keep threads of their own")
        if not self.first_message_s > 0:
            raise ValueError(f"first_message_s = {self.first_message_s!r}: expected a number of seconds > 0")

    def peer_limit(self, kind: str) -> int:
        """The calls of `kind` one peer host may run at once: `per_peer[kind]`, else half the kind's limit."""
        return self.per_peer.get(kind) or max(1, self.max_calls[kind] // 2)

    @property
    def threads(self) -> int:
        """The RPC thread pool's size: every kind at its limit and its reserve, plus the headroom."""
        return sum(self.max_calls.values()) + self.reserve * len(RPC_KINDS) + self.headroom


@dataclass(frozen=True)
class Caller:
    """Who a call counts against: an active worker (`member`, keyed by its id) or a peer host."""

    key: str
    member: bool

    @property
    def shown(self) -> str:
        """The caller as a refusal names it."""
        return f"worker {self.key}" if self.member else f"peer {self.key}"


@dataclass(frozen=True)
class SlotsHeld:
    """A kind's calls running now: all of them, those admitted from the reserve, and the caller's own."""

    total: int
    reserved: int
    caller: int


def decide_slot(kind: str, caller: Caller, held: SlotsHeld, limits: CallLimits) -> tuple[str | None, str]:
    """Whether a call of `kind` from `caller` runs (pure): "shared" (within the kind's limit), "reserved" (an
    active worker's first call of the kind, beyond it), or None (refused), and why."""
    own = limits.per_worker if caller.member else limits.peer_limit(kind)
    if held.caller >= own:
        key = "coordinator.max_calls_per_worker" if caller.member else "coordinator.max_calls_per_peer"
        return None, (f"{caller.shown} already has {held.caller} {kind} calls running, the most one "
                      f"{'worker' if caller.member else 'peer'} may run at once ({key} = {own}); retry with backoff")
    limit = limits.max_calls[kind]
    if held.total < limit:
        return "shared", f"{kind} call {held.total + 1} of {limit}"
    if caller.member and held.caller == 0 and held.reserved < limits.reserve:
        return "reserved", f"{caller.shown}'s own {kind} call, beyond the limit of {limit}"
    methods = ", ".join(next(k.methods for k in RPC_KINDS if k.name == kind))
    return None, (f"coordinator busy: {limit} {kind} calls ({methods}) already running, the limit "
                  f"(--max-calls {kind}={limit}); retry with backoff")


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


class FirstMessages:
    """Unary-request calls waiting for their one request message, each on a server thread (the module docstring).

    At most `capacity` wait at once: a call that finds them all waiting cancels the one that has waited longest
    with RESOURCE_EXHAUSTED (an honest unary client sends its message with its headers, so a flood must open
    `capacity` calls within the milliseconds its message takes to cancel it); each waits at most `wait_s`, then
    is cancelled with DEADLINE_EXCEEDED by the watchdog.

    Threads: `receive` and `waiting` run on handler threads; the table of waiting calls is guarded by `_lock`,
    which is never held while cancelling a call or waiting for a message; the watchdog takes its own lock.
    """

    def __init__(self, capacity: int, wait_s: float, watchdog: CallWatchdog) -> None:
        _check_count("capacity", capacity, 1)
        if not wait_s > 0:
            raise ValueError(f"wait_s = {wait_s!r}: expected a number of seconds > 0")
        self.capacity = capacity
        self.wait_s = wait_s
        self.watchdog = watchdog
        self._lock = threading.Lock()
        # handle -> (context, method) of each waiting call, the longest-waiting first.
        self._waiting: OrderedDict[int, tuple[grpc.ServicerContext, str]] = OrderedDict()
        self._handles = itertools.count()

    def waiting(self) -> int:
        """The calls waiting for their request message now: for tests and benchmarks."""
        with self._lock:
            return len(self._waiting)

    def _displaced(self, method: str) -> str:
        """The refusal of a call whose place a newer one took."""
        return (f"{method}: the request message had not arrived when {self.capacity} newer calls waited for theirs "
                f"(the most that may wait at once); retry with backoff")

    def receive(self, requests: Iterator[Any], context: grpc.ServicerContext, full_method: str) -> Any:
        """The one request message of a unary-request call (`requests` is the call's request iterator). Aborts the
        call when none came within `wait_s` (DEADLINE_EXCEEDED), when newer calls took its place
        (RESOURCE_EXHAUSTED), or when the client closed without one (UNIMPLEMENTED, gRPC's own words); re-raises
        the RpcError of a call its client cancelled."""
        method = full_method.rsplit("/", 1)[-1]
        with self._lock:
            handle = next(self._handles)
            self._waiting[handle] = (context, method)
            displaced = [self._waiting.popitem(last=False)[1] for _ in range(len(self._waiting) - self.capacity)]
        for other, other_method in displaced:
            _cancel(other, grpc.StatusCode.RESOURCE_EXHAUSTED, self._displaced(other_method))
        silence = f"{method}: the client sent no request message for {self.wait_s:g} s; the call is cancelled"
        watch = self.watchdog.watch(context, time.monotonic() + self.wait_s, grpc.StatusCode.DEADLINE_EXCEEDED, silence)
        cancelled: grpc.RpcError | None = None
        try:
            request = next(requests, None)
        except grpc.RpcError as error:
            request, cancelled = None, error
        in_time = self.watchdog.unwatch(watch)
        with self._lock:
            kept = self._waiting.pop(handle, None) is not None
        if not in_time:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, silence)
        if not kept:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._displaced(method))
        if cancelled is not None:
            raise cancelled
        if request is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f'"{full_method}" requires exactly one request message.')
        return request


def _request_streaming(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """`handler` served as a request-streaming method by `behavior` (request iterator, context): on the wire a unary
    request is the same framing, and gRPC runs a request-streaming behavior as soon as the call has a thread,
    without waiting for the message."""
    if handler.response_streaming:
        return handler._replace(request_streaming=True, unary_stream=None, stream_stream=behavior)
    return handler._replace(request_streaming=True, unary_unary=None, stream_unary=behavior)


def first_message_bounded(handler: grpc.RpcMethodHandler, full_method: str, messages: FirstMessages) -> grpc.RpcMethodHandler:
    """A unary-request `handler` whose request message is read under `messages` before its behavior runs (the
    polling thread builds it; the behavior runs on a handler thread)."""
    behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary

    def serve(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        return behavior(messages.receive(requests, context, full_method), context)
    return _request_streaming(handler, serve)


class FirstMessageInterceptor(grpc.ServerInterceptor):
    """Every unary-request method of a server behind `FirstMessages` (the health port's server, which has no other
    guard). Runs on the server's polling thread; holds no state of its own."""

    def __init__(self, messages: FirstMessages) -> None:
        self._messages = messages

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        return first_message_bounded(handler, details.method, self._messages)


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


@dataclass(eq=False)
class _Admission:
    """One admitted call: its kind and caller, whether it came from the reserve, its watchdog entry (or None)
    and the context its handler sees."""

    gate: CallGate
    kind: str
    caller: Caller
    reserved: bool
    handle: int | None
    context: _CappedContext
    # The handler thread serving it (threading.get_ident()).
    thread: int = 0
    released: bool = False

    def close(self) -> None:
        """Forget the watchdog entry and give the slot back (the handler's thread when it ends; once)."""
        if self.handle is not None:
            self.gate.watchdog.unwatch(self.handle)
        self.gate.release(self)


class CallGate:
    """Admission and time bounds of Coordinator calls: a slot of the call's kind for its caller (`decide_slot`),
    its cap, idle streams, and the end of a member's calls when its membership ends.

    Threads: `admit`, `release` and `end_worker` run on gRPC handler threads (`end_worker` also on the ticker's,
    under a run's lock: it takes `_lock` after it, never the other way round); the counts are guarded by
    `_lock`, which is never held while calling out; the watchdog takes its own lock.
    """

    def __init__(self, limits: CallLimits, watchdog: CallWatchdog) -> None:
        self.limits = limits
        self.watchdog = watchdog
        # Unary calls waiting for their request message (before they are identified or take a slot).
        self.first_messages = FirstMessages(limits.first_message_calls, limits.first_message_s, watchdog)
        self._lock = threading.Lock()
        self._total = dict.fromkeys(limits.max_calls, 0)
        self._reserved = dict.fromkeys(limits.max_calls, 0)
        # (kind, caller) -> its calls running; caller -> its admissions (to end a member's calls).
        self._held: dict[tuple[str, Caller], int] = {}
        self._calls: dict[Caller, set[_Admission]] = {}
        served = set(pb.DESCRIPTOR.services_by_name["Coordinator"].methods_by_name)
        unbounded = sorted(served - set(KIND_OF_METHOD))
        if unbounded:
            raise RuntimeError(f"RPCs without a kind in RPC_KINDS: {', '.join(unbounded)}")

    def admit(self, method: str, context: grpc.ServicerContext, caller: Caller) -> _Admission:
        """Take a slot of `method`'s kind for `caller` and watch the call's cap; abort with RESOURCE_EXHAUSTED
        when `decide_slot` refuses."""
        kind = KIND_OF_METHOD[method]
        with self._lock:
            held = SlotsHeld(self._total[kind.name], self._reserved[kind.name], self._held.get((kind.name, caller), 0))
            slot, reason = decide_slot(kind.name, caller, held, self.limits)
            if slot is not None:
                self._total[kind.name] += 1
                self._reserved[kind.name] += slot == "reserved"
                self._held[(kind.name, caller)] = held.caller + 1
        if slot is None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        deadline = time.monotonic() + kind.max_call_s
        handle = None
        if context.time_remaining() > kind.max_call_s:
            handle = self.watchdog.watch(
                context, deadline, grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{method} ran for {kind.max_call_s:.0f} s, the longest the coordinator serves one {kind.name} call",
            )
        admission = _Admission(self, kind.name, caller, slot == "reserved", handle, _CappedContext(context, deadline),
                               threading.get_ident())
        with self._lock:
            self._calls.setdefault(caller, set()).add(admission)
        return admission

    def release(self, admission: _Admission) -> None:
        """Give an admission's slot back, once (its handler's end, or `end_worker`)."""
        with self._lock:
            if admission.released:
                return
            admission.released = True
            self._total[admission.kind] -= 1
            self._reserved[admission.kind] -= admission.reserved
            key = (admission.kind, admission.caller)
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]
            calls = self._calls.get(admission.caller)
            if calls is not None:
                calls.discard(admission)
                if not calls:
                    del self._calls[admission.caller]

    def end_worker(self, worker_id: str, reason: str) -> None:
        """A membership ended (left or evicted): cancel its calls still running with NOT_FOUND and give their
        slots back now, so that a member's reserve slot is never held by one that is gone. The call on the thread
        that ended it (its Leave, or a push whose close evicted it) answers as it would have."""
        here = threading.get_ident()
        with self._lock:
            calls = [a for a in self._calls.get(Caller(worker_id, True), ()) if a.thread != here]
        for admission in calls:
            _cancel(admission.context, grpc.StatusCode.NOT_FOUND,
                    f"worker {worker_id!r} is no longer a member ({reason}); join again")
            admission.close()

    def running(self, kind: str) -> tuple[int, int]:
        """(calls of `kind` running, of them from the reserve): for tests and benchmarks."""
        with self._lock:
            return self._total[kind], self._reserved[kind]

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


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:/path"): what
    anonymous calls are counted by."""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return address.rpartition(":")[0].strip("[]") or address
    return peer


def _guarded(
    behavior: Callable[..., Any], handler: grpc.RpcMethodHandler, method: str, gate: CallGate,
    authorized: Callable[[], bool], identify: Callable[[Any], str],
) -> Callable[..., Any]:
    """`behavior` behind the credential and deadline checks, its kind's slot for its caller and cap, and
    idle-stream bounds, as a request-streaming behavior (`_request_streaming`): the checks run before anything is
    read, then a unary method's one request message is read under `gate.first_messages`. `authorized` and
    `identify` (the request -> the active worker's id it carries with that worker's own secret, or "") run on the
    handler thread before the call takes a slot."""
    full_method = f"/{SERVICE_NAME}/{method}"

    def admit(requests: Iterator[Any], context: grpc.ServicerContext) -> tuple[Any, _Admission]:
        if not authorized():
            if method in CREDENTIAL_METADATA_METHODS:
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              f"{method} needs a join token, or the worker's id and secret in the call's metadata "
                              f"({WORKER_ID_METADATA}, {WORKER_SECRET_METADATA}) of an active membership")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong join token")
        remaining = context.time_remaining()
        if remaining is None or remaining > NO_DEADLINE_S:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "calls to the coordinator must set a deadline")
        request = None if handler.request_streaming else gate.first_messages.receive(requests, context, full_method)
        worker_id = identify(request)
        caller = Caller(worker_id, True) if worker_id else Caller(peer_host(context.peer()), False)
        admission = gate.admit(method, context, caller)
        if handler.request_streaming:
            request = gate.idle_bounded_requests(requests, context, method)
        return request, admission

    if handler.response_streaming:
        def stream_behavior(requests: Any, context: grpc.ServicerContext) -> Any:
            request, admission = admit(requests, context)
            try:
                with serving_until(_deadline_of(admission.context)):
                    yield from gate.idle_bounded_responses(behavior(request, admission.context), context, method)
            finally:
                admission.close()
        return stream_behavior

    def unary_behavior(requests: Any, context: grpc.ServicerContext) -> Any:
        request, admission = admit(requests, context)
        try:
            with serving_until(_deadline_of(admission.context)):
                return behavior(request, admission.context)
        finally:
            admission.close()
    return unary_behavior


class GuardInterceptor(grpc.ServerInterceptor):
    """Token, deadline and `CallGate` checks on every call of the Coordinator service (the server's polling thread),
    and the first-message bound (`FirstMessages`) on every unary-request method of the server's other services
    (health Check).

    The join token is checked for every method but `WORKER_METHODS`, which the service authenticates by
    the worker secret; `tokens` may be re-read from a file meanwhile (`JoinTokens` takes its own lock).
    """

    def __init__(
        self, tokens: str | JoinTokens, gate: CallGate, owns_credential: Callable[[str, bytes], bool] | None = None,
    ) -> None:
        """`owns_credential(worker_id, secret)` says whether an active membership has that secret (it takes no lock,
        the runs' snapshots, and hashes the secret: called on handler threads, never on the polling thread); None refuses
        `CREDENTIAL_METADATA_METHODS` without a token."""
        self._tokens = tokens if isinstance(tokens, JoinTokens) else JoinTokens([tokens])
        self._gate = gate
        self._owns_credential = owns_credential

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        if not details.method.startswith(f"/{SERVICE_NAME}/"):
            if handler.request_streaming:
                return handler
            return first_message_bounded(handler, details.method, self._gate.first_messages)
        method = details.method.rsplit("/", 1)[-1]
        metadata = dict(details.invocation_metadata or ())
        presented = str(metadata.get("authorization", "")).encode()
        credential = (str(metadata.get(WORKER_ID_METADATA, "")), metadata.get(WORKER_SECRET_METADATA, b""))
        if method in CREDENTIAL_METADATA_METHODS:
            authorized = partial(self._credential_or_token, presented, *credential)
        else:
            token_ok = method in WORKER_METHODS or self._tokens.accepts(presented)
            authorized = partial(bool, token_ok)
        identify = partial(self._member_id, method, *credential)
        kind = "unary_unary" if not handler.request_streaming else "stream_unary"
        if handler.response_streaming:
            kind = "unary_stream" if not handler.request_streaming else "stream_stream"
        wrapped = _guarded(getattr(handler, kind), handler, method, self._gate, authorized, identify)
        return _request_streaming(handler, wrapped)

    def _member_id(self, method: str, metadata_id: str, metadata_secret: Any, request: Any) -> str:
        """The active worker a call counts against: the id it carries (the request's, or for PushUpdate the
        metadata's) when it carries that worker's own secret, else "" (handler thread; takes no lock: a run stalled on
        its lock or its disk holds up no other run's calls here)."""
        if method not in WORKER_METHODS or self._owns_credential is None:
            return ""
        if method in CREDENTIAL_METADATA_METHODS:
            worker_id, secret = metadata_id, metadata_secret
        else:
            worker_id, secret = request.worker_id, request.worker_secret
        if not worker_id or not isinstance(secret, bytes) or not secret:
            return ""
        return worker_id if self._owns_credential(worker_id, secret) else ""

    def _credential_or_token(self, presented: bytes, worker_id: str, secret: Any) -> bool:
        """Whether a call presents an accepted join token or an active worker's own id and secret (handler thread)."""
        if self._tokens.accepts(presented):
            return True
        if self._owns_credential is None or not worker_id or not isinstance(secret, bytes) or not secret:
            return False
        return self._owns_credential(worker_id, secret)

