"""The coordinator's gRPC server: the Coordinator service, grpc.health.v1, guards, and its CLI.

Every call to rcswarm.v1.Coordinator passes a server interceptor that checks the join token
(constant-time compare of the `authorization: Bearer <token>` metadata) and refuses calls
without a client deadline. The health service is exempt from both, so load balancers and
Kubernetes probes can reach it. The service talks to one interface, `RunGroup` (sweep.py):
a single run is a group of one.

    rcswarm coordinator --config RUN.toml --state-dir DIR --port P
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.service import Refusal, SwarmCoordinator
from rcswarm.coordinator.sweep import RunGroup, open_group
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS, TOKEN_ENV

log = logging.getLogger("rcswarm.coordinator")

SERVICE_NAME = "rcswarm.v1.Coordinator"
# A call whose remaining time exceeds this carries no real deadline (gRPC reports "infinite").
NO_DEADLINE_S = 365 * 24 * 3600.0
TICK_S = 0.2


def _guarded(behavior: Callable[..., Any], streaming_response: bool, authorized: bool) -> Callable[..., Any]:
    """`behavior` behind the token and deadline checks."""
    def check(context: grpc.ServicerContext) -> None:
        if not authorized:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong join token")
        remaining = context.time_remaining()
        if remaining is None or remaining > NO_DEADLINE_S:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "calls to the coordinator must set a deadline")

    if streaming_response:
        def stream_behavior(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            yield from behavior(request, context)
        return stream_behavior

    def unary_behavior(request: Any, context: grpc.ServicerContext) -> Any:
        check(context)
        return behavior(request, context)
    return unary_behavior


class GuardInterceptor(grpc.ServerInterceptor):
    """Token and deadline checks on every call of the Coordinator service."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        metadata = dict(details.invocation_metadata or ())
        presented = str(metadata.get("authorization", "")).encode()
        authorized = hmac.compare_digest(presented, self._expected)
        kind = "unary_unary" if not handler.request_streaming else "stream_unary"
        if handler.response_streaming:
            kind = "unary_stream" if not handler.request_streaming else "stream_stream"
        wrapped = _guarded(getattr(handler, kind), handler.response_streaming, authorized)
        return handler._replace(**{kind: wrapped})


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
    """The server's PEM certificate and private key."""

    cert: Path
    key: Path

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key.read_bytes(), self.cert.read_bytes())])


class RunningCoordinator:
    """A started server with its ticker thread; `stop()` shuts both down.

    `coordinator` is what the caller gave (a bare SwarmCoordinator or a RunGroup); `group` is the
    RunGroup over it that the gRPC service, the ticker and the dashboard talk to.
    """

    def __init__(
        self, coordinator: SwarmCoordinator | RunGroup, token: str, host: str = "127.0.0.1", port: int = 0,
        tls: TLSFiles | None = None, max_threads: int = 128,
        http_port: int | None = None, http_host: str = "127.0.0.1",
    ) -> None:
        if not token:
            raise ValueError("a join token is required (--token or the RCSWARM_TOKEN environment variable)")
        self.coordinator = coordinator
        self.group = RunGroup.of(coordinator)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="rpc"),
            interceptors=[GuardInterceptor(token)],
            options=list(MESSAGE_SIZE_OPTIONS),
        )
        pb_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(self.group), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"{host}:{port}"
        self.port = (
            self.server.add_secure_port(address, tls.credentials()) if tls else self.server.add_insecure_port(address)
        )
        if self.port == 0:
            raise RuntimeError(f"could not bind {address}")
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="ticker", daemon=True)
        # The optional HTTP dashboard (coordinator/dashboard.py); None unless http_port is given.
        self.dashboard: Any = None
        if http_port is not None:
            from rcswarm.coordinator.dashboard import Dashboard

            try:
                self.dashboard = Dashboard(self.group, http_host, http_port)
            except OSError as exc:
                self.server.stop(None)
                raise RuntimeError(f"could not bind the dashboard on {http_host}:{http_port}: {exc.strerror}") from None

    def start(self) -> RunningCoordinator:
        """Serve gRPC, health and the dashboard, and start the ticker."""
        self.server.start()
        self._ticker.start()
        if self.dashboard is not None:
            self.dashboard.start()
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return self

    def _tick_loop(self) -> None:
        """The ticker thread: the group's evictions and round deadlines every TICK_S."""
        while not self._stop.wait(TICK_S):
            try:
                self.group.tick()
            except Exception:
                log.exception("coordinator tick failed")

    def stop(self, grace: float = 2.0) -> None:
        """Stop the ticker, the dashboard and the server (in-flight calls get `grace` seconds), then close the stores."""
        self._stop.set()
        if self.dashboard is not None:
            self.dashboard.stop()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait(grace + 1.0)
        self._ticker.join(timeout=2.0)
        self.group.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The `rcswarm coordinator` command line."""
    parser = argparse.ArgumentParser(prog="rcswarm coordinator", description="Run the rcswarm coordinator.")
    parser.add_argument("--config", required=True, help="RUN.toml describing the run")
    parser.add_argument("--state-dir", required=True, help="directory for checkpoints and the SQLite state")
    parser.add_argument("--port", type=int, default=50051, help="port to listen on (0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for all interfaces)")
    parser.add_argument("--token", default=None, help=f"join token (default: ${TOKEN_ENV})")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate; with --tls-key enables TLS")
    parser.add_argument("--tls-key", type=Path, help="PEM private key")
    parser.add_argument("--port-file", type=Path, help="write {'port': P} here once serving")
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve the HTTP dashboard and /metrics on this port (0 = any free port; default: off)")
    parser.add_argument("--http-host", default="127.0.0.1",
                        help="address the dashboard binds (default loopback; it has no authentication)")
    return parser.parse_args(argv)


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line's values, or None."""
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    for flag, port in (("--port", args.port), ("--http-port", args.http_port)):
        if port is not None and not 0 <= port <= 65535:
            return f"{flag} {port}: expected 0..65535"
    return None


def main(argv: list[str] | None = None) -> int:
    """`rcswarm coordinator`: serve one run or a sweep until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s coordinator %(levelname)s %(message)s")
    args = parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV, "")
    problem = _argument_problem(args)
    if problem is None:
        try:
            spec = RunSpec.from_toml(args.config)
            coordinator = open_group(spec, args.state_dir)
            tls = TLSFiles(args.tls_cert, args.tls_key) if args.tls_cert else None
            running = RunningCoordinator(
                coordinator, token, args.host, args.port, tls, http_port=args.http_port, http_host=args.http_host,
            ).start()
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"rcswarm coordinator: {problem}", file=sys.stderr)
        return 2
    log.info("run %s serving on %s:%d at version %d", coordinator.run_id, args.host, running.port, coordinator.version)
    if running.dashboard is not None:
        log.info("dashboard on %s (metrics at %smetrics)", running.dashboard.url, running.dashboard.url)
        from rcswarm.coordinator.dashboard import is_loopback

        if not is_loopback(args.http_host):
            log.warning("the dashboard on %s has no authentication: it shows the run to anyone who can reach it",
                        args.http_host)
    if args.port_file:
        partial = args.port_file.with_suffix(".partial")
        info: dict[str, Any] = {"port": running.port, "run_id": coordinator.run_id}
        if running.dashboard is not None:
            info["http_port"] = running.dashboard.port
        partial.write_text(json.dumps(info))
        os.replace(partial, args.port_file)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    log.info("stopping at version %d", coordinator.version)
    running.stop()
    return 0
