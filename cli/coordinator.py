"""`rcswarm coordinator`: serve one run or a sweep until SIGTERM or SIGINT.

    rcswarm coordinator --config RUN.toml --state-dir DIR --port P [--host H --tls-self-signed DIR]

The command line of the coordinator process that coordinator/server.py assembles (`RunningCoordinator`).
A non-loopback `--host` is served only with TLS (`--tls-cert/--tls-key`, or `--tls-self-signed DIR`,
whose worker command is logged) or with `--insecure`; `--tls-client-ca` requires client certificates
(coordinator/tls.py); a renewed --tls-cert/--tls-key or --tls-client-ca is served from the next handshake
on, without a restart (with --tls-self-signed, its files and a --tls-client-ca beside them are read once).
The dashboard's token rule is observe/dashboard/auth.py; `--http-trusted-proxy` (observe/dashboard/proxies.py)
names the reverse proxies whose X-Forwarded-For says which client a dashboard request is from.
The run spec's [coordinator] keys set the call limits
and the health stall time, which `--max-calls`, `--stream-idle-s` and `--health-stall-s` override
(`serving_limits`); `--token-file` is re-read when it changes and on SIGHUP, as is `--view-token-file` (read-only
tokens that open the dashboard and /metrics, never gRPC: `RunningCoordinator(view_tokens=)`; a reload of either that
would put a token in both files is refused, `AcceptedTokens.keep_apart`). The model the run spec names is counted
on the meta device before anything is built, and refused above `--max-params` parameters over all the runs
(default: what the host's memory holds at coordinator/capacity.py's bytes per parameter; `model_problem`). Errors
follow cli/usage.py: a usage error prints
one line `rcswarm coordinator: <what is wrong>` and exits 2 before anything is created or bound; so does a state
dir that cannot be opened or written (a full disk: `StoreError` or `OSError`, one line, no traceback);
a failure to serve (a port in use) exits 1. Whatever ends a start, a crash too (re-raised), removes the state dir
it created (`StartUp.abandon`).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from rcswarm.cli.main import interrupted_import
from rcswarm.cli.signals import StopSignal
from rcswarm.cli.usage import (
    TRUSTED_PROXY_HELP,
    empty_path_problem,
    output_dir_problem,
    output_file_problem,
    path_arg,
    usage_error,
)
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import (
    COORDINATOR_BYTES_PER_PARAMETER,
    DEFAULT_MAX_CALLS,
    CallLimits,
    JoinTokens,
    LivenessClock,
    ParameterLimit,
    RunGroup,
    RunningCoordinator,
    layout_problem,
    lock_state_dirs,
    model_problem,
    open_group,
    parse_max_calls,
    run_state_dirs,
)
from rcswarm.coordinator.server import health_stall_problem
from rcswarm.coordinator.tls import (
    HTTP_TLS_NEEDS_TLS,
    QuickStart,
    TLSFiles,
    bind_problem,
    ensure_quick_start,
    server_names,
    worker_host,
)
from rcswarm.coordinator.tokens import ViewTokens, view_tokens_problem
from rcswarm.protos.transport import host_port, is_loopback_host
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.state.errors import StoreError
from rcswarm.train.inner import data_problem
from rcswarm.worker.data_root import data_root_args

log = logging.getLogger("rcswarm.coordinator")
PROG = "rcswarm coordinator"


def parser() -> argparse.ArgumentParser:
    """The `rcswarm coordinator` command line."""
    parser = argparse.ArgumentParser(prog=PROG, description="Run the rcswarm coordinator.")
    parser.add_argument("--config", required=True, help="RUN.toml describing the run")
    parser.add_argument("--state-dir", required=True, help="directory for checkpoints and the SQLite state")
    parser.add_argument("--port", type=int, default=50051, help="port to listen on (0 = any free port; default: 50051)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default loopback; any other address needs TLS or --insecure)")
    parser.add_argument("--token", default=None, help=f"join token (default: ${TOKEN_ENV})")
    parser.add_argument("--token-file", type=path_arg, default=None,
                        help="file of accepted join tokens, one per line (# comments), re-read when it changes "
                             "and on SIGHUP; instead of --token (rotation without a restart)")
    parser.add_argument("--tls-cert", type=path_arg,
                        help="PEM certificate; with --tls-key enables TLS (both re-read when they change: renewal "
                             "without a restart)")
    parser.add_argument("--tls-key", type=path_arg, help="PEM private key")
    parser.add_argument("--tls-self-signed", type=path_arg, metavar="DIR",
                        help="serve TLS with a CA and server certificate made (or reused) in DIR, and log the "
                             "worker command with --tls-ca DIR/ca.pem; DIR/client.pem is a client certificate")
    parser.add_argument("--tls-san", action="append", default=[], metavar="NAME",
                        help="with --tls-self-signed: another DNS name or IP address workers dial (repeatable)")
    parser.add_argument("--tls-client-ca", type=path_arg, metavar="FILE",
                        help="mutual TLS: require client certificates signed by this CA (e.g. DIR/ca.pem)")
    parser.add_argument("--insecure", action="store_true",
                        help="serve plaintext gRPC on a non-loopback --host (the token crosses the network in the clear)")
    parser.add_argument("--health-port", type=int, default=None,
                        help="also serve grpc.health.v1 Check in plaintext on this port of --host, for probes that "
                             "cannot speak TLS (0 = any free port; default: off)")
    parser.add_argument("--port-file", type=path_arg, help="write {'port': P, 'pid': this process, ...} here once serving")
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
    parser.add_argument("--http-plaintext", action="store_true",
                        help="serve a dashboard that requires the token over plain HTTP on a non-loopback "
                             "--http-host (refused otherwise): for a TLS-terminating proxy in front of it, or a "
                             "trusted network")
    parser.add_argument("--view-token-file", type=path_arg, default=None, metavar="PATH",
                        help="file of read-only view tokens, one per line (# comments), re-read when it changes and on "
                             "SIGHUP: each opens the dashboard and /metrics (bearer or /login) but never gRPC (it "
                             "cannot join or submit); the join token still opens the dashboard too. Requires a token "
                             "on the dashboard wherever it binds; needs --http-port")
    parser.add_argument("--http-trusted-proxy", action="append", default=[], metavar="CIDR", help=TRUSTED_PROXY_HELP)
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
    parser.add_argument("--max-params", type=int, default=0, metavar="N",
                        help="refuse a run spec whose model, times the runs of a sweep (each holds its own copy), has "
                             "more than N parameters, counted before anything is built (default 0: what the host's "
                             "memory holds, a container's limit counted, at "
                             f"{COORDINATOR_BYTES_PER_PARAMETER} bytes per parameter)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed `rcswarm coordinator` command line (argparse exits 0 after --help, 2 on a usage error)."""
    return parser().parse_args(argv)


PATH_FLAGS = ("--config", "--state-dir", "--token-file", "--tls-cert", "--tls-key", "--tls-self-signed",
              "--tls-client-ca", "--port-file", "--view-token-file")


def _flag_value(args: argparse.Namespace, flag: str) -> Any:
    return getattr(args, flag[2:].replace("-", "_"))


def host_port_problem(host: str) -> str | None:
    """`--host` with a port in it (127.0.0.1:5, [::1]:5, name:5): the port is --port's (pure)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return None
    except ValueError:
        pass
    head, sep, tail = host.rpartition(":")
    if sep and tail.isdigit() and (head.startswith("[") and head.endswith("]") or ":" not in head):
        return f"--host {host!r}: --host takes no port; use --port {tail}"
    return None


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line's values, or None (nothing is created or bound before this)."""
    for flag in PATH_FLAGS:  # an empty path would be the working directory
        problem = empty_path_problem(flag, _flag_value(args, flag))
        if problem is not None:
            return problem
    problem = host_port_problem(args.host)
    if problem is not None:
        return problem
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
    problem = output_dir_problem("--state-dir", args.state_dir)
    if problem is None and args.port_file is not None:
        problem = output_file_problem("--port-file", args.port_file)
    if problem is None and args.tls_self_signed is not None:
        problem = output_dir_problem("--tls-self-signed", args.tls_self_signed)
    if problem is not None:
        return problem
    if args.health_port and args.health_port == args.port:
        return f"--health-port {args.health_port}: the same as --port; expected another port"
    for flag, port in (("--port", args.port), ("--health-port", args.health_port)):
        if args.http_port and args.http_port == port:
            return f"--http-port {args.http_port}: the same as {flag}; expected another port"
    if args.http_plaintext and args.http_tls:
        return "--http-plaintext and --http-tls contradict each other: give one"
    if args.view_token_file is not None and args.http_port is None:
        return "--view-token-file: only with --http-port (view tokens open the dashboard, nothing else)"
    if args.http_trusted_proxy:
        from rcswarm.observe.dashboard.proxies import trusted_proxies_problem

        problem = trusted_proxies_problem(args.http_trusted_proxy, args.http_port)
        if problem is not None:
            return problem
    if args.http_port is not None:
        from rcswarm.observe.dashboard.auth import dashboard_transport_problem, decide_dashboard_auth

        try:
            required, _ = decide_dashboard_auth(args.http_host, args.http_token_required, args.http_insecure,
                                                view_tokens=args.view_token_file is not None)
        except ValueError as exc:
            return str(exc)
        problem = dashboard_transport_problem(args.http_host, required, args.http_tls,
                                              grpc_plaintext=args.insecure and not tls,
                                              http_plaintext=args.http_plaintext)
        if problem is not None:
            return problem
    return bind_problem(args.host, tls, args.insecure)


def _tls_files(args: argparse.Namespace) -> tuple[TLSFiles | None, QuickStart | None]:
    """The server's TLS files from the flags (making or reusing the quick start's), checked; ValueError names a bad one.
    --tls-cert/--tls-key (with --tls-client-ca) are re-read when they change; the quick start's are read once."""
    quick = None
    if args.tls_self_signed:
        names = server_names(args.host, args.tls_san, socket.gethostname())
        quick = ensure_quick_start(args.tls_self_signed, names)
        tls = TLSFiles(quick.cert, quick.key, args.tls_client_ca, reload=False)
    elif args.tls_cert:
        tls = TLSFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
    else:
        return None, None
    tls.read()
    return tls, quick


def worker_command(args: argparse.Namespace, port: int, quick: QuickStart, spec: RunSpec) -> list[str]:
    """The `rcswarm worker` command for the quick start's CA (and its client certificate under mutual TLS), with the
    git dataset `spec` names as its data root (a worker reads none without one)."""
    host = worker_host(args.host, args.tls_san, socket.gethostname())
    command = ["rcswarm", "worker", "--coordinator", host_port(host, port), "--tls-ca", str(quick.ca.resolve())]
    if args.tls_client_ca is not None and args.tls_client_ca.resolve() == quick.ca.resolve():
        command += ["--tls-cert", str(quick.client_cert.resolve()), "--tls-key", str(quick.client_key.resolve())]
    return command + data_root_args(spec)


def _log_security(args: argparse.Namespace, running: RunningCoordinator, quick: QuickStart | None,
                  spec: RunSpec) -> None:
    """Log how workers connect (the quick start's exact worker command) and every opt-out of a protection."""
    if quick is not None:
        for note in quick.notes:
            log.info("--tls-self-signed: %s", note)
        log.info("worker command: %s", shlex.join(worker_command(args, running.port, quick, spec)))
        log.info("(the worker reads the join token from $%s or --token; copy %s to each worker's machine%s)",
                 TOKEN_ENV, quick.ca.name, ", with client.pem and client-key.pem" if args.tls_client_ca else "")
        if spec.data.source == "git":
            log.info("(the git dataset %r is opened where the worker runs: a worker on another machine needs it at "
                     "that path there, and --data-root naming it or a folder above it)",
                     spec.data.task_config.get("dataset"))
        if args.tls_client_ca is not None and args.tls_client_ca.resolve() != quick.ca.resolve():
            log.info("workers also need --tls-cert/--tls-key of a client certificate signed by %s", args.tls_client_ca)
    if args.insecure and not (args.tls_cert or args.tls_self_signed) and not is_loopback_host(args.host):
        log.warning("serving plaintext gRPC on %s (--insecure): anyone on the network path can read the join token "
                    "and the parameters, and act as a worker", args.host)
    if running.health_port is not None:
        log.info("plaintext health checks (grpc.health.v1 Check) on %s", host_port(args.host, running.health_port))
    if running.dashboard is not None:
        dashboard = running.dashboard
        asked = ("the join token" if args.view_token_file is None
                 else "a view token (--view-token-file) or the join token")
        log.info("dashboard on %s (metrics at %smetrics)%s", dashboard.url, dashboard.url,
                 f"; it requires {asked} (Authorization: Bearer, or log in at /login)" if dashboard.auth else "")
        from rcswarm.observe.dashboard.auth import decide_dashboard_auth

        _, warning = decide_dashboard_auth(args.http_host, args.http_token_required, args.http_insecure, args.http_tls,
                                           view_tokens=args.view_token_file is not None)
        if warning is not None:
            log.warning("%s", warning)
        if args.http_trusted_proxy:
            from rcswarm.observe.dashboard.proxies import trusted_proxies_line

            log.info("dashboard: %s", trusted_proxies_line(args.http_trusted_proxy))


def read_view_tokens(path: Path | None, tokens: JoinTokens) -> ViewTokens | None:
    """--view-token-file's tokens (None without it): read and checked as --token-file's are (`ViewTokens`), and none
    of them a join token (`view_tokens_problem`); ValueError naming the flag, the path and what is wrong. From then on
    a reload of either file that would put a token in both is refused (`AcceptedTokens.keep_apart`)."""
    if path is None:
        return None
    view_tokens = ViewTokens.from_file(path)
    problem = view_tokens_problem(view_tokens, tokens)
    if problem is not None:
        raise ValueError(problem)
    view_tokens.keep_apart(tokens)
    return view_tokens


def serving_limits(args: argparse.Namespace, spec: RunSpec) -> tuple[CallLimits, float]:
    """The call limits and the health stall time: the run spec's [coordinator] keys, overridden by the
    command line's --max-calls, --stream-idle-s and --health-stall-s where given."""
    served = spec.coordinator
    _check_serving_flags(args)
    idle_s = served.stream_idle_s if args.stream_idle_s is None else args.stream_idle_s
    stall_s = served.health_stall_s if args.health_stall_s is None else args.health_stall_s
    problem = health_stall_problem(stall_s, "health_stall_s =" if args.health_stall_s is None else "--health-stall-s")
    if problem is not None:
        raise ValueError(problem)
    limits = CallLimits(parse_max_calls(args.max_calls, served.max_calls), idle_s,
                        per_worker=served.max_calls_per_worker, per_peer=served.max_calls_per_peer)
    return limits, stall_s


def _check_serving_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flag (not the run spec's key it overrides) for a bad --max-calls or --stream-idle-s, each
    checked as CallLimits would check the key (--health-stall-s: `serving_limits`, `health_stall_problem`)."""
    for value in args.max_calls:
        try:
            CallLimits(parse_max_calls([value]))
        except ValueError as exc:
            text, name = str(exc), value.partition("=")[0].strip()
            if text.startswith("--max-calls"):  # not KIND=N: parse_max_calls names the flag itself
                raise
            key = f"max_calls[{name!r}]"  # an unknown kind: "'polls': unknown RPC kind"; a bad limit: its bounds
            reason = f"{name!r}{text[len(key):]}" if text.startswith(f"{key}:") else _reason(text)
            raise ValueError(f"--max-calls {value!r}: {reason}") from None
    if args.stream_idle_s is not None:
        try:
            CallLimits(stream_idle_s=args.stream_idle_s)
        except ValueError as exc:
            raise ValueError(f"--stream-idle-s {args.stream_idle_s!r}: {_reason(str(exc))}") from None


def _reason(problem: str) -> str:
    """`key = value: reason` -> `reason`."""
    return problem.split(": ", 1)[1] if ": " in problem else problem


def _os_error_problem(args: argparse.Namespace, exc: OSError) -> str:
    """An OSError of the start-up in one line naming the flag whose path it concerns (the state dir's, a TLS or
    token file's), with the OS's reason."""
    if exc.filename is None:
        return str(exc)
    path = Path(os.fsdecode(exc.filename))
    reason = exc.strerror or str(exc)
    for flag in (*PATH_FLAGS[2:], "--config", "--state-dir"):
        value = _flag_value(args, flag)
        if value is None:
            continue
        given = Path(value)
        if path == given:
            return f"{flag} {str(value)!r}: {reason}"
        if given in path.parents:
            return f"{flag} {str(value)!r}: {reason}: {str(path)!r}"
    return f"{reason}: {str(path)!r}"


def new_state_dirs(spec: RunSpec, state_dir: Path) -> list[Path]:
    """The state dir and the runs' dirs (`run_state_dirs`) that do not exist yet: what a start that fails creates."""
    paths = [Path(state_dir), *(path for _, path in run_state_dirs(spec, state_dir))]
    return [path for path in dict.fromkeys(paths) if not path.exists()]


def discard_new_state(created: list[Path], coordinator: RunGroup | None, locks: list) -> None:
    """After a start that failed (a port in use, bad TLS files): remove the state dirs it created (`created`, each
    with the initial checkpoint and the run's config in its store), so that the next start, with its config perhaps
    changed, does not find a run that never served. Only with every lock held (`locks`: none when another process
    holds one, whose dirs these may be by then): the stores are closed, each dir is renamed aside while its lock is
    held (a coordinator starting meanwhile finds the lock taken, or no dir and makes its own), then the locks are
    released and the renamed dirs removed."""
    if coordinator is not None:
        coordinator.close()
    doomed = []
    for path in created if locks else []:
        aside = path.with_name(f".{path.name}.discarded-{os.getpid()}")
        try:
            path.rename(aside)
        except OSError:  # a mount point, gone already: removed where it is, still under its lock
            shutil.rmtree(path, ignore_errors=True)
        else:
            doomed.append(aside)
    for lock in locks:
        lock.release()
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)


class StartUpSignals:
    """The coordinator's SIGTERM and SIGINT handling from its start to its exit, in three phases.

    Starting (`install`): SIGTERM, and SIGINT where Python's default handler had it, raise KeyboardInterrupt in the
    main thread as Ctrl-C does (a model build, opening the stores), so that `main` stops what started and removes a
    state dir it created instead of the process dying at once (status -15) with it left behind; `signum` keeps the
    first signal's number. Serving (`hand_over`): `StopSignal`'s handler replaces this one, each signal's handler
    swapped in one step (never SIG_DFL in between, whose default action would end the process from whichever thread
    the kernel picks: gRPC's, the ticker's), before anything tells the world the coordinator serves (the port file,
    the announce). Cleaning up (`hold`, what every failed or stopped start does first, and what the first
    interrupting signal switches to before it raises): later signals are only noted, so a second SIGTERM or a
    double Ctrl-C cannot break off the clean-up half-way and leave the new state dir and its lock behind. `restore`
    gives both signals their handlers from before `install` (main thread only; elsewhere nothing is installed).

    SIGHUP (re-read the token files) is only counted (`hangups`), from `install` on: the serving loop reloads when
    the count moved. A handler that reloaded itself waited for the tokens' lock on the main thread, which a second
    SIGHUP arriving during the first's reload then held: the main thread waited for itself for good (SIGTERM
    stopped nothing); and before the hand-over SIGHUP's default action ended a starting coordinator."""

    signum = 0
    hangups = 0

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._holding = False
        self._stop: StopSignal | None = None

    def install(self) -> StartUpSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
            self._previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._hangup)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not one ignored (nohup, `cmd &`)
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        """Starting: note the signal, hold later ones, and interrupt the start-up; cleaning up: only note it."""
        if not self.signum:
            self.signum = signum
        if not self._holding:
            self._holding = True
            raise KeyboardInterrupt

    def _hangup(self, _signum: int, _frame: object) -> None:
        """SIGHUP: counted for the serving loop, which re-reads the token files (no lock taken here)."""
        self.hangups += 1

    def hand_over(self) -> StopSignal:
        """The serving loop's stop handler for SIGTERM and SIGINT, installed over the start-up one: a signal before
        the swap interrupts the start-up, one after it stops the serving loop (a signal that was noted but whose
        interrupt was swallowed on the way stops it at once)."""
        stop = self._stop = StopSignal()  # known before it installs: a SIGINT between its two swaps, which still
        stop.install(signal.SIGTERM, signal.SIGINT)  # interrupts the start, finds it to uninstall (`hold`)
        if self.signum:
            stop.handle(self.signum, None)
        return stop

    def hold(self) -> None:
        """From now on a signal is only noted (the clean-up of a failed or stopped start, the last steps of the
        exit): the serving loop's handler, if handed over, is uninstalled, which gives both signals back to
        `_handle`, holding."""
        self._holding = True
        stop, self._stop = self._stop, None
        if stop is not None:
            stop.uninstall()

    def restore(self) -> None:
        """Both signals' handlers from before `install` (holding until then)."""
        self.hold()
        while self._previous:
            signum, handler = self._previous.popitem()
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class StartUp:
    """What a coordinator's start has made so far, to undo when it fails or is stopped (`abandon`)."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        self.coordinator: RunGroup | None = None
        self.locks: list = []
        self.running: RunningCoordinator | None = None
        self.clock: LivenessClock | None = None
        self._abandoned = False

    def abandon(self) -> None:
        """Stop serving if it began, and discard the state it created; once (a second call does nothing, so no
        path runs the clean-up again after it began). Call it holding the signals (`StartUpSignals.hold`)."""
        if self._abandoned:
            return
        self._abandoned = True
        coordinator = self.coordinator
        if self.running is not None:
            self.running.stop()  # closes the stores too
            coordinator = None
        if self.clock is not None:
            self.clock.stop()
        discard_new_state(self.created, coordinator, self.locks)


def write_port_file(path: Path, info: dict[str, Any]) -> None:
    """`info` as JSON at `path`, whole or not at all (written beside it, then renamed); a write that fails (a full
    disk) removes what it wrote beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    try:
        partial.write_text(json.dumps(info))
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """`rcswarm coordinator`: serve one run or a sweep until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s coordinator %(levelname)s %(message)s")
    args = parse_args(argv)
    problem = _argument_problem(args)
    if problem is not None:
        return usage_error(PROG, problem)
    made = StartUp()
    start_up = StartUpSignals().install()
    try:
        return _serve(args, made, start_up)
    finally:
        start_up.restore()


def _serve(args: argparse.Namespace, made: StartUp, start_up: StartUpSignals) -> int:
    """`main` after the command line's checks: start (undone by `made.abandon` when it fails or is stopped, holding
    the signals first), serve until stopped, stop."""
    try:
        try:
            tokens = JoinTokens.from_cli(args.token, args.token_file, os.environ.get(TOKEN_ENV, ""))
            view_tokens = read_view_tokens(args.view_token_file, tokens)
            spec = RunSpec.from_toml(args.config)
            data = data_problem(spec)
            if data is not None:
                raise ValueError(data)
            too_large = model_problem(spec, ParameterLimit.of(args.max_params))
            if too_large:
                raise ValueError(too_large)
            limits, stall_s = serving_limits(args, spec)
            tls, quick = _tls_files(args)
            layout = layout_problem(spec, args.state_dir)
            if layout is not None:
                raise ValueError(layout)
            made.created = new_state_dirs(spec, args.state_dir)
            # One coordinator per state dir, for this process's life (StateDirBusy, a RuntimeError, names the holder).
            made.locks = lock_state_dirs(spec, args.state_dir)
            made.clock = LivenessClock().start()
            made.coordinator = coordinator = open_group(spec, args.state_dir, made.clock)
            http_required = True if args.http_token_required else False if args.http_insecure else None
            made.running = running = RunningCoordinator(
                coordinator, tokens, args.host, args.port, tls, limits, stall_s,
                http_port=args.http_port, http_host=args.http_host, insecure=args.insecure,
                health_port=args.health_port, http_token_required=http_required, http_tls=args.http_tls,
                view_tokens=view_tokens,  # a token required on the dashboard wherever it binds
                http_trusted_proxies=args.http_trusted_proxy,
            ).start()
            # Serving from here: a signal stops the serving loop, before the world is told (announce, port file).
            stop = start_up.hand_over()
        except (ValueError, StoreError) as exc:
            problem = str(exc)
        except OSError as exc:
            problem = _os_error_problem(args, exc)
        except RuntimeError as exc:
            start_up.hold()
            made.abandon()
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        else:
            problem = None
        if problem is not None:
            start_up.hold()
            made.abandon()
            return usage_error(PROG, problem)
        address = host_port(args.host, running.port)
        for lock in made.locks:
            lock.announce(address)
        log.info("serving on %s: %s", address, coordinator.versions_text())
        _log_security(args, running, quick, spec)
        for caution in spec.cautions():
            log.warning("%s", caution)
        if args.port_file:
            info: dict[str, Any] = {"port": running.port, "run_id": coordinator.run_id, "pid": os.getpid()}
            if running.dashboard is not None:
                info["http_port"] = running.dashboard.port
            if running.health_port is not None:
                info["health_port"] = running.health_port
            try:
                write_port_file(args.port_file, info)
            except OSError as exc:  # /proc, /sys, a full disk: found only when written
                start_up.hold()
                made.abandon()
                print(f"{PROG}: --port-file {str(args.port_file)!r}: cannot write it: {exc.strerror or exc}; "
                      "stopped serving", file=sys.stderr)
                return 1
    except BaseException as exc:
        start_up.hold()  # the clean-up below runs to its end whatever signals come meanwhile
        # Whatever ended the start (a signal, or a crash in it: a bug's ZeroDivisionError or KeyError), the state
        # dir it created goes with it: left behind, it held a run that never served, and the next start, its
        # config corrected, was refused as a run of another spec.
        made.abandon()
        if not isinstance(exc, KeyboardInterrupt) and not interrupted_import(exc):
            raise
        name = signal.Signals(start_up.signum).name if start_up.signum else "SIGINT"
        print(f"{PROG}: stopped by {name} while starting{'; removed the new state dir' if made.created else ''}",
              file=sys.stderr)
        return 128 + (start_up.signum or signal.SIGINT)
    hangups = 0
    while not stop.wait(1.0):
        if start_up.hangups != hangups:  # SIGHUP: re-read the token files here, outside the signal handler
            hangups = start_up.hangups
            for each in (tokens, view_tokens):
                if each is not None:
                    each.reload()
    log.info("stopping: %s", coordinator.versions_text())
    running.stop()
    made.clock.stop()
    for lock in made.locks:
        lock.release()
    return 0
