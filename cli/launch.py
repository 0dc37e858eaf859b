"""`rcswarm launch ray`: rcswarm workers as Ray actors on an existing Ray cluster (issue #16).

    rcswarm launch ray --address auto --coordinator HOST:PORT --workers N [--gpus-per-worker G | --cpu-only]
                       [--cpus-per-worker C] [--namespace NAME] [--device auto] [--tls-ca F] [--detach]
                       [--data-root DIR]
    rcswarm launch ray --address auto --namespace NAME --with-coordinator --config RUN.toml --state-dir DIR ...
    rcswarm launch ray --address auto --namespace NAME --status [--json]
    rcswarm launch ray --address auto --namespace NAME --stop

The command line: flags (the client flags of cli/client_flags.py without --token: every actor reads
`RCSWARM_TOKEN` from its node's environment, and the TLS files are paths on every Ray node), usage
errors (one line, exit 2) and main. The control plane it drives (the plan, the supervisor, the worker
and coordinator actors, status and stop) and its design are launch/ (`rcswarm.launch`). Ray is not
imported here: `rcswarm launch --help` works without the `ray` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rcswarm.cli.client_flags import add_client_flags, client_options
from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.launch import (
    HEAD_LOST_STATUS,
    NAMESPACE,
    NAMESPACE_RULE,
    CoordinatorSpec,
    HeadLost,
    HeadOptions,
    HeadWatch,
    LaunchPlan,
    OnThread,
    collect_status,
    connect,
    ensure_supervisor,
    follow,
    gcs_address,
    head_lost_line,
    interrupted,
    interrupted_start,
    joined,
    named_actors,
    print_status,
    replaced,
    resources,
    start_coordinator,
    stop_all,
    stop_command,
)
from rcswarm.launch.coordinator_actor import FOLDER
from rcswarm.worker import WorkerOptions
from rcswarm.worker.options import device_problem, seconds_problem

if TYPE_CHECKING:
    from rcswarm.cli.signals import StopSignal

PROG = "rcswarm launch ray"
RAY_EXTRA = "Ray is not installed: pip install 'rcswarm[ray]'"
# The default of --start-timeout-s (another value without --detach is refused: it would do nothing).
START_TIMEOUT_DEFAULT_S = 300.0
# The `rcswarm coordinator` flags the coordinator actor sets itself (`CoordinatorSpec.argv`): argparse's last wins, so
# one in --coordinator-arg would override it unseen. Its dest -> (the flag, the launcher flag that sets it, if any).
ACTOR_FLAGS = {"config": ("--config", "--config"), "state_dir": ("--state-dir", "--state-dir"),
               "host": ("--host", "--coordinator-host"), "port": ("--port", "--coordinator-port"),
               "port_file": ("--port-file", None)}
T = TypeVar("T")


def parser() -> argparse.ArgumentParser:
    parser = new_parser(PROG, "Run rcswarm workers as detached Ray actors on an existing Ray cluster, one per "
                              "--gpus-per-worker GPUs; Ray restarts them when they die.")
    parser.add_argument("--address", default="auto",
                        help="the Ray cluster: auto (on a node of it) or its GCS HOST:PORT; not ray:// (Ray Client)")
    parser.add_argument("--namespace", default="rcswarm", help="Ray namespace of this swarm's actors (one per run)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="print the namespace's actors, worker ids, restarts and "
                                                            "pending reasons, then exit")
    what.add_argument("--stop", action="store_true", help="each worker leaves the swarm, then every actor of the "
                                                          "namespace is removed")
    parser.add_argument("--json", action="store_true", help="with --status: print JSON")
    add_client_flags(parser, "HOST:PORT of the coordinator the workers join", token=False, files_on="every Ray node")
    parser.add_argument("--workers", type=int, default=None, help="worker actors to keep running")
    parser.add_argument("--gpus-per-worker", type=float, default=None,
                        help="GPUs of each worker actor (default 1; 0: CPU workers, as --cpu-only)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="CPU workers, for a cluster without GPUs (one machine, say): no GPU per actor, "
                             "--device cpu")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs of each worker actor")
    parser.add_argument("--device", default="auto", help="worker device: auto (the actor's GPU when it has one), cpu, cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: --cpus-per-worker rounded up)")
    parser.add_argument("--patience-s", type=float, default=300.0, help="how long a worker retries an unreachable coordinator")
    parser.add_argument("--data-root", type=Path, default=None, metavar="DIR",
                        help="the folder on every Ray node that holds the run's git dataset (a worker reads one only "
                             "at or under it; default: none)")
    parser.add_argument("--detach", action="store_true", help="return once every worker has joined (or --start-timeout-s)")
    parser.add_argument("--start-timeout-s", type=float, default=START_TIMEOUT_DEFAULT_S,
                        help="with --detach: how long to wait for the joins")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between status checks while following")
    coordinator = parser.add_argument_group("a coordinator on the Ray head (instead of --coordinator)")
    coordinator.add_argument("--with-coordinator", action="store_true",
                             help="run the coordinator as a detached actor on the head node (it dies with the head)")
    coordinator.add_argument("--config", type=Path, help="RUN.toml of the run (read here, sent to the actor)")
    coordinator.add_argument("--state-dir", default="",
                             help="state dir on the head node's persistent storage (an absolute path there)")
    coordinator.add_argument("--coordinator-host", default="0.0.0.0",
                             help="address the coordinator binds on the head (a non-loopback one needs TLS or "
                                  "--coordinator-arg=--insecure)")
    coordinator.add_argument("--coordinator-port", type=int, default=50051, help="gRPC port of the coordinator (0: any)")
    coordinator.add_argument("--coordinator-cpus", type=float, default=1.0, help="CPUs reserved for the coordinator")
    coordinator.add_argument("--coordinator-arg", action="append", default=[], metavar="ARG",
                             help="an extra `rcswarm coordinator` argument, e.g. --coordinator-arg=--insecure "
                                  "or --coordinator-arg=--tls-cert=/certs/tls.crt (repeat for each)")
    parser.set_defaults(coordinator_spec=None)  # `check_arguments` builds it from the flags above
    return parser


def plan_of(args: argparse.Namespace, coordinator: str) -> LaunchPlan:
    """The plan of the command line (ValueError naming the flag that is wrong)."""
    if args.workers is None:
        raise ValueError("--workers N is required to launch (or --status / --stop)")
    gpus, device = (1.0 if args.gpus_per_worker is None else args.gpus_per_worker), args.device
    problem = device_problem(device)  # its form only: the launcher need not have CUDA (the actor's node does)
    if problem is not None:
        raise ValueError(problem)
    if args.cpu_only:
        if gpus and args.gpus_per_worker is not None:
            raise ValueError(f"--cpu-only and --gpus-per-worker {args.gpus_per_worker:g}: give one of them")
        if device not in ("auto", "cpu"):
            raise ValueError(f"--cpu-only and --device {device}: CPU workers train on the CPU")
        gpus, device = 0.0, "cpu"
    worker = client_options(args, WorkerOptions, coordinator=coordinator, device=device, threads=args.threads,
                            patience_s=args.patience_s, data_root=args.data_root)
    return LaunchPlan(worker=worker, workers=args.workers, gpus_per_worker=gpus,
                      cpus_per_worker=args.cpus_per_worker, namespace=args.namespace)


def check_arguments(args: argparse.Namespace) -> str | None:
    """The first usage problem of a launch, or None."""
    if not NAMESPACE.fullmatch(args.namespace):
        return f"--namespace {args.namespace!r}: {NAMESPACE_RULE}"
    if args.address.startswith("ray://"):
        return (f"--address {args.address!r}: Ray Client (ray://) is not supported, since the launcher reads its actors' "
                "records from Ray's GCS; run it on a node of the cluster (--address auto), give the GCS HOST:PORT "
                "(port 6379 by default), or submit it as a Ray job")
    if args.json and not args.status:
        return "--json: only with --status (it prints the status as JSON)"
    if args.status or args.stop:
        return None
    if args.start_timeout_s != START_TIMEOUT_DEFAULT_S and not args.detach:
        return "--start-timeout-s: only with --detach (a following launch waits for the run's end)"
    if args.with_coordinator:
        if args.coordinator:
            return "--coordinator and --with-coordinator exclude each other"
        if args.config is None or not args.state_dir:
            return "--with-coordinator needs --config RUN.toml and --state-dir DIR"
        try:
            args.coordinator_spec = coordinator_spec(args)  # read and checked once: `launch` sends it
            coordinator_problem(args.coordinator_spec)
        except ValueError as exc:
            return str(exc)
    elif not args.coordinator:
        return "--coordinator HOST:PORT is required (or --with-coordinator)"
    for flag, value in (("--poll-s", args.poll_s), ("--start-timeout-s", args.start_timeout_s)):
        problem = seconds_problem(flag, value)
        if problem is not None:
            return problem
    try:
        plan_of(args, args.coordinator or "head:0")
    except ValueError as exc:
        return str(exc)
    return None


def coordinator_spec(args: argparse.Namespace) -> CoordinatorSpec:
    """What the coordinator actor runs (ValueError naming the flag): the run spec at --config, read and checked
    here (its data too, and that a git dataset has --data-root) and sent as text, with `curriculum.law_from` made
    absolute as `RunSpec.from_toml` does (the actor does not run in this directory), and the coordinator flags."""
    from rcswarm.config.runspec import RunSpec
    from rcswarm.train.inner import data_problem

    if not args.config.is_file():
        raise ValueError(f"--config {str(args.config)!r}: no such file")
    spec = RunSpec.from_toml(args.config)
    problem = data_problem(spec)
    if problem is not None:
        raise ValueError(problem)
    if spec.data.source == "git" and args.data_root is None:  # its workers would refuse it (worker/data_root.py)
        raise ValueError(f"--config {str(args.config)!r} trains on the git dataset "
                         f"{spec.data.task_config.get('dataset')!r}: give --data-root DIR, the folder that holds it on "
                         "every Ray node")
    return CoordinatorSpec(spec.to_toml(), args.state_dir, args.coordinator_host, args.coordinator_port,
                           tuple(args.coordinator_arg), args.coordinator_cpus)


def coordinator_problem(spec: CoordinatorSpec) -> None:
    """Refuse (ValueError) what `rcswarm coordinator` would refuse inside the actor before serving: an argument it
    does not take, or plaintext gRPC on an address other than loopback (`bind_problem`)."""
    from rcswarm.cli.coordinator import parser as coordinator_parser
    from rcswarm.coordinator.tls import bind_problem

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parsed = coordinator_parser().parse_args(spec.argv(Path(spec.state_dir) / FOLDER))
    except SystemExit:
        said = errors.getvalue().strip().splitlines()
        raise ValueError(f"--coordinator-arg {' '.join(spec.extra_args)!r}: `rcswarm coordinator` refuses it: "
                         f"{said[-1] if said else 'a bad argument'}") from None
    overridden = actor_flags_set(spec, coordinator_parser)
    if overridden:
        flag, instead = ACTOR_FLAGS[overridden[0]]
        raise ValueError(f"--coordinator-arg {' '.join(spec.extra_args)!r}: sets `rcswarm coordinator`'s {flag}, which "
                         "the coordinator actor sets itself" + (f"; use {instead}" if instead else
                                                                 f" (in --state-dir's {FOLDER}/)"))
    problem = bind_problem(parsed.host, bool(parsed.tls_cert or parsed.tls_self_signed), parsed.insecure)
    if problem is not None:
        raise ValueError(problem.replace("--host", "--coordinator-host", 1)
                         + " (`rcswarm coordinator` flags go in --coordinator-arg=FLAG, e.g. --coordinator-arg=--insecure)")


def actor_flags_set(spec: CoordinatorSpec, make_parser: Callable[[], argparse.ArgumentParser]) -> list[str]:
    """The dests of ACTOR_FLAGS that `spec.extra_args` set again, as `rcswarm coordinator`'s parser (`make_parser`)
    reads them: every spelling it takes (`--flag value`, `--flag=value`, an unambiguous prefix) is found, since the
    arguments are parsed twice, after two sets of the actor's own values, and each value the extra arguments change in
    either is theirs. [] when the parser refuses them (`coordinator_problem` says why)."""
    folder = Path(spec.state_dir) / FOLDER
    found: list[str] = []
    for mark in (1, 2):
        own = replace(spec, state_dir=f"/rcswarm-actor-{mark}", host=f"rcswarm-actor-{mark}", port=mark)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                alone = make_parser().parse_args(replace(own, extra_args=()).argv(folder / str(mark)))
                given = make_parser().parse_args(own.argv(folder / str(mark)))
        except SystemExit:
            return []
        found += [dest for dest in ACTOR_FLAGS if getattr(given, dest) != getattr(alone, dest) and dest not in found]
    return found


def until_stopped(step: Callable[[], T], stop: threading.Event) -> T | None:
    """`step()`'s answer, waited for on its own thread so that a signal ends the wait: None once `stop` is set (the
    step goes on; `launch` then exits at once). What it raised is raised here."""
    call = OnThread(step, "launcher-start")
    while call.running(0.1):
        if stop.is_set():
            return None
    return call.result()


def stopped_starting(args: argparse.Namespace, stop: StopSignal, step: str) -> int:
    """A signal came while `step` (start-up): say which actors stay and how to remove them (`interrupted_start`), then
    end the process at once with 128 + its number (the step's thread may still wait inside Ray: `exit_now`)."""
    name = signal.Signals(stop.signum).name if stop.signum else "a signal"
    print(f"{PROG}: {interrupted_start(named_actors(args.namespace), args.namespace, args.address, name, step)}",
          file=sys.stderr, flush=True)
    return exit_now(128 + (stop.signum or signal.SIGTERM))


def launch(args: argparse.Namespace) -> int:
    from rcswarm.cli.signals import StopSignal

    # Before the start-up, which may wait minutes (the coordinator actor's start, an old supervisor's halt): before,
    # a signal there ended the launcher with Ray's SIGTERM dump or a bare "interrupted" (review, 2026-11-29).
    stop = StopSignal(second_exits=True).install(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    coordinator = args.coordinator
    if args.with_coordinator:
        spec = args.coordinator_spec or coordinator_spec(args)
        coordinator = until_stopped(lambda: start_coordinator(args.namespace, spec), stop)
        if stop.is_set():
            return stopped_starting(args, stop, "starting the coordinator actor")
        print(f"coordinator actor serving on {coordinator}", flush=True)
    plan = plan_of(args, coordinator)
    until_stopped(lambda: ensure_supervisor(plan), stop)
    if stop.is_set():
        return stopped_starting(args, stop, "starting the supervisor")
    print(f"{PROG}: {plan.workers} workers ({resources(plan.demand())} each) in namespace {plan.namespace}, "
          f"joining {plan.worker.coordinator}", flush=True)
    if not args.detach:
        try:
            verdict = follow(plan, args.poll_s, stop, HeadWatch(HeadOptions(gcs_address(args.address))))
        except HeadLost as lost:
            state_dir = args.state_dir if args.with_coordinator else ""
            command = getattr(args, "command", None) or ["rcswarm", "launch", "ray", "--address", args.address,
                                                          "--namespace", plan.namespace, "..."]
            print(f"{PROG}: {head_lost_line(str(lost), plan.namespace, plan.worker.coordinator, state_dir, command)}",
                  file=sys.stderr, flush=True)
            return exit_now(HEAD_LOST_STATUS)
    else:
        deadline = time.monotonic() + args.start_timeout_s
        verdict = joined(collect_status(plan.namespace), plan)
        while verdict is None and time.monotonic() < deadline and not stop.wait(args.poll_s):
            verdict = joined(collect_status(plan.namespace), plan)
        status = collect_status(plan.namespace)
        print_status(status)
        if verdict is not None and verdict.status != 0 and replaced(status, plan) is not None:
            print(f"{PROG}: {verdict.reason}", file=sys.stderr)  # its actors are the other launch's now
            return verdict.status
    if verdict is None and stop.is_set():
        name = signal.Signals(stop.signum).name if stop.signum else "a signal"
        print(interrupted(collect_status(plan.namespace), plan, args.address, name), flush=True)
        return 128 + stop.signum
    if verdict is None:
        print(f"{PROG}: not every worker joined within {args.start_timeout_s:g}s (see pending and problem lines); "
              "the supervisor keeps trying", file=sys.stderr)
        return 1
    if verdict.status != 0 and args.detach:
        print(f"{PROG}: {verdict.reason}; the actors stay: fix the cause, then "
              f"{stop_command(args.address, plan.namespace)} and launch again", file=sys.stderr)
    return verdict.status


def exit_now(status: int) -> int:
    """End the process with `status` at once: after its Ray head is gone, a normal exit runs Ray's shutdown while the
    abandoned poll's thread is still inside Ray (seen: that thread then started a new local Ray instance, 7 s more).
    Tests replace it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: rcswarm launch ray [ARGS]   (rcswarm launch ray --help)", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] != "ray":
        return usage_error("rcswarm launch", f"unknown target {argv[0]!r}: expected `ray`")
    args = parse_or_status(parser(), argv[1:])
    if isinstance(args, int):
        return args
    args.command = ["rcswarm", "launch", *argv]  # what resumes this launch (`head_lost_line`)
    problem = check_arguments(args)
    if problem is not None:
        return usage_error(PROG, problem)
    try:
        connect(args.address, args.namespace)
    except ImportError:
        return usage_error(PROG, RAY_EXTRA)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(f"{PROG}: cannot connect to the Ray cluster at {args.address!r}: {exc}", file=sys.stderr)
        return 1
    try:
        if args.status:
            status = collect_status(args.namespace)
            if args.json:
                print(json.dumps({k: v for k, v in status.items() if k != "rows"}, indent=2, default=str))
            else:
                print_status(status)
            return 0 if status["rows"] or status["plan"] else 1
        if args.stop:
            lines = stop_all(args.namespace)
            for line in lines or [f"no rcswarm actors in namespace {args.namespace}"]:
                print(line)
            return 0
        return launch(args)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    except RuntimeError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
