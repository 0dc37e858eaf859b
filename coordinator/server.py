"""The coordinator's gRPC server: the Coordinator service, grpc.health.v1, the ticker, the process assembly.

`RunningCoordinator` puts a coordinator process together: the gRPC server with `GuardInterceptor`
in front of every Coordinator call (guards.py: the join token, deadlines, per-kind limits and caps,
idle streams) and `CoordinatorServicer`, whose handlers each call one method of a `RunGroup`
(sweep.py: a single run is a group of one); the ticker thread, which runs the group's evictions and
round deadlines every TICK_S; the health service and its thread; the call watchdog; and the optional
dashboard (observe/dashboard/). TLS files and the bind rule are tls.py's; the `rcswarm coordinator`
command line is cli/coordinator.py.

The health service (Check; Watch is not served) is exempt from the token, the deadline and
the kind limits, so load balancers and Kubernetes probes can reach it, also in plaintext on
`--health-port` when the main port speaks TLS; on both ports its request message is read under
`guards.FirstMessages`, so half-sent Checks never hold the threads a probe needs. It reports NOT_SERVING while the coordinator
cannot close rounds: its ticker's latest tick raised, or no tick has completed for
`health_stall_s` (`decide_health`), or updates wait in a round open for more than
`coordinator.health_round_deadlines` round deadlines (`decisions.decide_progress`); the log says why.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rcswarm.config.runspec import MAX_SECONDS, MIN_SECONDS
from rcswarm.coordinator import decisions
from rcswarm.coordinator.guards import (
    SERVICE_NAME,
    CallGate,
    CallLimits,
    CallWatchdog,
    FirstMessageInterceptor,
    FirstMessages,
    GuardInterceptor,
)
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import RunGroup
from rcswarm.coordinator.tls import HTTP_TLS_NEEDS_TLS, TLSFiles, bind_problem
from rcswarm.coordinator.tokens import JoinTokens, ViewTokens
from rcswarm.protos.transport import MOVED_KEY, PLACE_RETRY_KEY, host_port
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS
from rcswarm.state.errors import StoreError

log = logging.getLogger("rcswarm.coordinator")

TICK_S = 0.2
# Health Checks of the plaintext --health-port server that may wait for their request message at once
# (guards.FirstMessages: a newer one cancels the longest-waiting), and its threads: those plus 8 for answers.
HEALTH_WAITING = 8
HEALTH_THREADS = HEALTH_WAITING + 8
# Calls at once on that server, beyond which gRPC refuses on its polling thread (no thread taken): a backstop
# for calls queued for a thread while a flood's are cancelled.
HEALTH_MAX_CALLS = 4 * HEALTH_THREADS
# gRPC servers set SO_REUSEPORT by default, so a second server on a port in use would bind and share its calls;
# a coordinator's ports are its own, and a port in use is a bind failure.
EXCLUSIVE_PORT = (("grpc.so_reuseport", 0),)


# errno values of a write refused for want of space: no space left, quota exceeded, file too large.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def storage_refusal(method: str, error: StoreError | OSError) -> Refusal:
    """The status a call gets when the state dir could not be written (a handler thread): RESOURCE_EXHAUSTED
    when the disk is full, else UNAVAILABLE, both retried by workers; logged as one WARNING line, no traceback."""
    full = error.full if isinstance(error, StoreError) else error.errno in DISK_FULL_ERRNOS
    log.warning("%s refused: the state dir could not be written: %s", method, error)
    what = "the coordinator's disk is full" if full else "the coordinator could not write its state"
    return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED if full else grpc.StatusCode.UNAVAILABLE,
                   f"{method} refused: {what} ({error}); retry later")


def abort(context: grpc.ServicerContext, refusal: Refusal) -> None:
    """End the call with `refusal`'s status and message, a join refused for want of a place with the
    PLACE_RETRY_KEY trailer, a membership moved off its run with MOVED_KEY (a handler thread; raises, as context.abort
    does)."""
    if refusal.place_retry_s > 0:
        context.set_trailing_metadata(((PLACE_RETRY_KEY, str(round(refusal.place_retry_s * 1000))),))
    elif refusal.moved:
        context.set_trailing_metadata(((MOVED_KEY, "1"),))
    context.abort(refusal.code, refusal.message)


def _handled(method: Callable[..., Any]) -> Callable[..., Any]:
    """Map Refusal to the gRPC status it names, and a state dir that cannot be written to `storage_refusal`'s."""
    def unary(self: CoordinatorServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Refusal as refusal:
            abort(context, refusal)
        except (StoreError, OSError) as error:
            refusal = storage_refusal(method.__name__, error)
            abort(context, refusal)
    return unary



# The shortest health stall time (the spec's coordinator.health_stall_s has the same floor): below it a busy tick
# already reads NOT_SERVING, and an orchestrator restarts a healthy coordinator.
MIN_HEALTH_STALL_S = MIN_SECONDS["coordinator.health_stall_s"]


def health_stall_problem(seconds: float, name: str = "health_stall_s =") -> str | None:
    """What is wrong with a health stall time, or None (pure); `name` says what gave it: the server's and the run
    spec's key by default, the flag (`--health-stall-s`) on the command line."""
    if isinstance(seconds, (int, float)) and MIN_HEALTH_STALL_S <= seconds <= MAX_SECONDS:
        return None
    return (f"{name} {seconds!r}: expected a number of seconds in [{MIN_HEALTH_STALL_S:g}, {MAX_SECONDS:g}] "
            "(shorter reads NOT_SERVING between two ticks)")

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
            abort(context, refusal)
        except (StoreError, OSError) as error:
            refusal = storage_refusal("PullParameters", error)
            abort(context, refusal)

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
    same servicer, for probes that cannot speak the main port's TLS; its Checks wait for their request
    message under `guards.FirstMessages` (HEALTH_WAITING at once), so half-sent calls never hold its
    threads from a probe. The dashboard (`http_port`)
    requires the join token when `http_token_required` is True, or when it is None (the default) and
    `http_host` is not loopback (`dashboard.auth.decide_dashboard_auth`). With `view_tokens` (--view-token-file's
    `ViewTokens`) it requires a token wherever it binds (http_token_required=False is refused as a contradiction)
    and takes a view token besides the join tokens (`auth.token_check`, each session bound to the token that logged
    in); the gRPC guard is given the join tokens alone and never sees a view token. `http_trusted_proxies`
    (--http-trusted-proxy) are the reverse proxies whose X-Forwarded-For names the dashboard's clients
    (observe/dashboard/proxies.py).

    Threads: the ticker thread replaces `_tick_record` whole after every tick and the health
    thread reads it (one reference, no lock); `start` and `stop` run on the caller's thread.
    """

    def __init__(
        self, coordinator: SwarmCoordinator | RunGroup, token: str | JoinTokens, host: str = "127.0.0.1", port: int = 0,
        tls: TLSFiles | None = None, limits: CallLimits | None = None, health_stall_s: float = 60.0,
        http_port: int | None = None, http_host: str = "127.0.0.1", *, insecure: bool = False,
        health_port: int | None = None, http_token_required: bool | None = None, http_tls: bool = False,
        view_tokens: ViewTokens | None = None, http_trusted_proxies: Sequence[str] = (),
    ) -> None:
        tokens = token if isinstance(token, JoinTokens) else JoinTokens([token])
        problem = health_stall_problem(health_stall_s)
        if problem is not None:
            raise ValueError(problem)
        if view_tokens is not None:
            if http_port is None:
                raise ValueError("view tokens open the dashboard and nothing else: they need http_port")
            if http_token_required is False:
                raise ValueError("view tokens need a dashboard that requires a token: they contradict "
                                 "http_token_required=False")
            http_token_required = True  # view tokens on a dashboard that asks for none would guard nothing
        problem = bind_problem(host, tls is not None, insecure)
        if problem is not None:
            raise ValueError(problem)
        trusted_proxies: tuple[Any, ...] = ()
        if http_trusted_proxies:  # checked before anything binds (ValueError names a bad one)
            from rcswarm.observe.dashboard.proxies import parse_trusted_proxies

            trusted_proxies = parse_trusted_proxies(http_trusted_proxies)
        if http_tls and tls is None:
            raise ValueError(HTTP_TLS_NEEDS_TLS)
        self.coordinator = coordinator
        self.group = RunGroup.of(coordinator)
        # Every member's own slot of each kind comes from a reserve of the swarm's coordinator.max_workers.
        reserve = sum(run.spec.coordinator.max_workers for run in self.group.runs)
        self.limits = dataclasses.replace(limits or CallLimits(), reserve=reserve)
        self.health_stall_s = health_stall_s
        self.watchdog = CallWatchdog()
        self.gate = CallGate(self.limits, self.watchdog)
        for run in self.group.runs:
            run.on_membership_end = self.gate.end_worker
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.limits.threads, thread_name_prefix="rpc"),
            interceptors=[GuardInterceptor(tokens, self.gate, self.group.owns_credential)],
            options=[*MESSAGE_SIZE_OPTIONS, *EXCLUSIVE_PORT],
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
            waiting = FirstMessages(HEALTH_WAITING, self.limits.first_message_s, self.watchdog)
            self.health_server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=HEALTH_THREADS, thread_name_prefix="health"),
                interceptors=[FirstMessageInterceptor(waiting)],
                maximum_concurrent_rpcs=HEALTH_MAX_CALLS, options=list(EXCLUSIVE_PORT),
            )
            health_pb2_grpc.add_HealthServicer_to_server(HealthChecks(self.health), self.health_server)
            try:
                self.health_port = _bind(self.health_server, host_port(host, health_port), None)
            except RuntimeError:
                self.server.stop(None)
                raise
        self._stop = threading.Event()
        self._tick_record = TickRecord(time.monotonic())
        # Why health says what it says (the health thread replaces it every TICK_S).
        self.health_reason = "starting"
        self._ticker = threading.Thread(target=self._tick_loop, name="ticker", daemon=True)
        self._health_thread = threading.Thread(target=self._health_loop, name="health", daemon=True)
        # The optional HTTP dashboard (observe/dashboard.py); None unless http_port is given.
        self.dashboard: Any = None
        if http_port is not None:
            from rcswarm.observe.dashboard import Dashboard
            from rcswarm.observe.dashboard.auth import VIEW_CREDENTIAL, SessionAuth, decide_dashboard_auth, token_check

            required = http_token_required
            if required is None:
                required, _ = decide_dashboard_auth(http_host, False, False)
            auth = None
            if required and view_tokens is not None:  # the join tokens or a view token; the gRPC guard: join only
                auth = SessionAuth(token_check(tokens.accepts_token, view_tokens.accepts_token),
                                   credential=VIEW_CREDENTIAL)
            elif required:
                auth = SessionAuth(tokens.accepts_token)
            context = tls.dashboard_context() if http_tls and tls is not None else None
            try:
                self.dashboard = Dashboard(self.group, http_host, http_port, auth=auth, ssl_context=context,
                                           trusted_proxies=trusted_proxies)
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
        """The health thread: every TICK_S, `decide_health` on the ticker's record, then `decisions.decide_progress`
        on every run's open round; logs and reports each change. It never waits long for a run's lock: a run whose
        lock stays held (a write under it hangs) keeps the previous status for that pass, and the ticker, which
        needs the same lock, stops completing ticks, which `decide_health` turns into NOT_SERVING. A pass that raises
        (a bug in a check) is NOT_SERVING with its error as the reason, logged with its traceback once per distinct
        error, and the thread goes on: before, it ended, and health stayed at its last status for good."""
        serving, failed = True, None
        while not self._stop.wait(TICK_S):
            try:
                now_serving, reason = decide_health(time.monotonic(), self._tick_record, self.health_stall_s)
                if now_serving:
                    rounds = [run.round_progress() for run in self.group.runs]
                    if any(r is None for r in rounds):
                        continue
                    progress = decisions.decide_progress(rounds)
                    now_serving, reason = progress.ok, progress.reason
                failed = None
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != failed:
                    log.exception("the health check failed; health reports NOT_SERVING until it passes")
                failed = error
                now_serving, reason = False, f"the health check failed: {error}"
            self.health_reason = reason
            if now_serving != serving:
                try:
                    self._set_health(health_pb2.HealthCheckResponse.SERVING if now_serving
                                     else health_pb2.HealthCheckResponse.NOT_SERVING)
                except Exception:  # the next pass tries again
                    log.exception("health: could not report %s", "SERVING" if now_serving else "NOT_SERVING")
                    continue
                serving = now_serving
                if serving:
                    log.info("health: SERVING again (%s)", reason)
                else:
                    log.warning("health: NOT_SERVING: %s", reason)

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


def port_in_use(host: str, port: int) -> str | None:
    """Why `host`:`port` cannot be bound, found by binding it once with a plain socket as gRPC would (SO_REUSEADDR,
    not SO_REUSEPORT), or None when it can (or for port 0, or a host this check cannot resolve: gRPC says then)."""
    if port == 0:
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, IndexError):
        return None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _bind(server: grpc.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Add a listening port (TLS with `credentials`) and return it; RuntimeError naming the address when it cannot
    (a port in use is found before gRPC tries, so the refusal is one line)."""
    host, _, port = address.rpartition(":")
    problem = port_in_use(host, int(port))
    if problem is not None:
        raise RuntimeError(f"could not bind {address}: {problem} (another coordinator, or another program, uses it)")
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise RuntimeError(f"could not bind {address} (in use, or not an address of this machine)")
    return port

