"""`rcswarm worker`: join a coordinator and train (worker/worker.py), or train peer to peer (worker/hivemind_worker.py).

    rcswarm worker --coordinator HOST:PORT --token T [--device auto] [--tls-ca CA [--tls-cert C --tls-key K]]
    rcswarm worker --backend hivemind (--config RUN.toml | --coordinator HOST:PORT --token T)
                   [--initial-peers MADDR ...] [--client-mode] [--host-maddrs MADDR ...]
                   [--announce-maddrs MADDR ...] [--identity-path F] [--out DIR]

The command's flags (the client flags of cli/client_flags.py among them), its usage errors (one line
on stderr, exit 2) and the process around the worker loop: torch threads (`--threads`, else this
machine's cores divided by the rcswarm workers running on it), SIGTERM and SIGINT (the worker
finishes its current step, then leaves). The loop's own exit status is the command's: 0 when the run
finished or the worker was stopped, 1 when it had to give up (one ERROR line says why).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from rcswarm.cli.client_flags import add_client_flags, client_options, client_token
from rcswarm.cli.signals import StopSignal
from rcswarm.cli.usage import empty_path_problem, path_arg, usage_error
from rcswarm.config.runspec import RunSpec
from rcswarm.state.lock import LOCK_NAME, StateDirBusy, StateDirLock, holder_text
from rcswarm.worker.data_root import data_root_problem
from rcswarm.worker.log_lines import log_to_stderr
from rcswarm.worker.options import WorkerOptions, seconds_problem, threads_problem, transfer_timeout_problem
from rcswarm.worker.startup import process_started

if TYPE_CHECKING:
    from rcswarm.protos.transport import ClientTLS

PROG = "rcswarm worker"
# The membership file a worker keeps in its --state-dir when no --membership-file is given.
MEMBERSHIP_NAME = "membership.json"
# The lock a worker holds on its membership file for its life is a file beside it, named by it and this.
MEMBERSHIP_LOCK_SUFFIX = ".lock"
log = logging.getLogger("rcswarm.worker")
# `python -m MODULE worker ...` runs the `rcswarm` command too.
COMMAND_MODULES = ("rcswarm.cli", "rcswarm.cli.main")


def is_worker_command(argv: list[str]) -> bool:
    """Whether a process's argv runs an rcswarm worker: `rcswarm worker`, `python -m rcswarm.cli worker`
    (or `rcswarm.cli.main worker`)."""
    for index, arg in enumerate(argv):
        if argv[index + 1:index + 2] == ["worker"] and (os.path.basename(arg) == "rcswarm" or arg in COMMAND_MODULES):
            return True
    return False


def workers_on_host() -> int:
    """rcswarm worker processes running on this machine, this one included (Linux /proc; 1 elsewhere)."""
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        count += is_worker_command(argv)
    return max(count, 1)


def auto_threads() -> tuple[int, str]:
    """(threads, why): the cores this process may use divided by the workers on this host, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = workers_on_host()
    return max(1, cores // workers), f"{cores} cores / {workers} workers on this host"


def set_threads(threads: int) -> None:
    """torch's CPU threads: `threads`, or with 0 this worker's share of the host's cores (`auto_threads`)."""
    import torch

    threads, why = (threads, "--threads") if threads else auto_threads()
    torch.set_num_threads(threads)
    log.info("torch threads: %d (%s)", threads, why)


def add_hivemind_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags of `rcswarm worker --backend hivemind` (worker/hivemind_worker.py; hivemind is imported only there);
    their actions, which the coordinator backend refuses (`unused_hivemind_flags`)."""
    group = parser.add_argument_group("hivemind backend (--backend hivemind)")
    return [
        group.add_argument("--config", type=path_arg, help="RUN.toml with [sync] backend = \"hivemind\" (no coordinator)"),
        group.add_argument("--initial-peers", nargs="+", default=[], metavar="MADDR",
                           help="multiaddrs of running peers, e.g. the one `rcswarm dht` prints"),
        group.add_argument("--client-mode", action="store_true",
                           help="dial out only (behind NAT); still averages, serves no state"),
        group.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/0"], metavar="MADDR",
                           help="multiaddrs to listen on (default: %(default)s)"),
        group.add_argument("--announce-maddrs", nargs="+", default=[], metavar="MADDR",
                           help="multiaddrs other peers should dial (default: what libp2p observes)"),
        group.add_argument("--identity-path", type=path_arg,
                           help="private key file: a stable peer id (created if missing)"),
        group.add_argument("--out", type=path_arg, help="write final.safetensors and summary.json here at the end"),
    ]


def unused_hivemind_flags(args: argparse.Namespace) -> str | None:
    """With the coordinator backend, the hivemind backend's flags that were given, where they would do nothing."""
    actions = add_hivemind_arguments(argparse.ArgumentParser(add_help=False))
    given = [action.option_strings[0] for action in actions if getattr(args, action.dest) != action.default]
    if args.backend != "coordinator" or not given:
        return None
    why = "; the coordinator serves the run spec, so --config has no effect" if "--config" in given else ""
    return f"{', '.join(given)}: only with --backend hivemind, not with the coordinator backend{why}"


# The path flags an empty value is refused for (`empty_path`): Path("") would be the working directory, which the
# worker would lock and write its residual and membership file into (or, for --out, its final files; --config '' read
# the directory "." as a config).
PATH_FLAGS = ("--state-dir", "--membership-file", "--data-root", "--tls-ca", "--tls-cert", "--tls-key", "--config",
              "--out", "--identity-path")


def empty_path(args: argparse.Namespace) -> str | None:
    """`--flag '': expected a path` for the first of PATH_FLAGS given an empty value, else None."""
    for flag in PATH_FLAGS:
        problem = empty_path_problem(flag, getattr(args, flag[2:].replace("-", "_")))
        if problem is not None:
            return problem
    return None


DEFAULT_TRANSFER_S = 300.0  # --transfer-timeout-s when not given (or --rpc-timeout-s, when that is longer)
# The coordinator backend's own flags: a hivemind peer pulls and pushes nothing through a coordinator and keeps no
# state dir (no residual file, no membership file, no lock).
COORDINATOR_ONLY_FLAGS = ("--transfer-timeout-s", "--membership-file", "--state-dir")


def dial_problem(target: str | None) -> str | None:
    """Why `--coordinator TARGET` is no address a worker can dial (`target_problem`, dialled): a URL, a host that is
    not a host name or an IP address ("a b", retried UNAVAILABLE for the whole patience), or a port outside 1..65535
    (port 0 is a server's "any free port", on which nobody listens: the worker retried "Connection refused" until its
    patience ran out); None otherwise, and for no target."""
    if target is None:
        return None
    from rcswarm.protos.transport import target_problem  # grpc, only once a coordinator is named

    return target_problem(target, dialled=True)


class FlagGiven(argparse.Action):
    """Stores a flag's value and the spelling it was given by (in `<dest>_flag`), so that a refusal names the flag
    typed: `--max-unavailable-s`, --patience-s's former name, was refused as `--patience-s`."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def unused_coordinator_flags(args: argparse.Namespace) -> str | None:
    """With the hivemind backend, the coordinator backend's flags that were given, where they would do nothing (before,
    accepted and dropped: two peers on one --state-dir took no lock)."""
    defaults = parser()
    dests = {flag: flag[2:].replace("-", "_") for flag in COORDINATOR_ONLY_FLAGS}
    given = [flag for flag, dest in dests.items() if getattr(args, dest) != defaults.get_default(dest)]
    if args.backend != "hivemind" or not given:
        return None
    return f"{', '.join(given)}: only with the coordinator backend, not with --backend hivemind"


def lock_os_problem(flag: str, path: Path, lock_file: Path, exc: OSError) -> str:
    """`FLAG PATH: why` for an OSError of taking the lock of `path` in `lock_file` (as cli/coordinator.py's
    `_os_error_problem` names its flags): the directory not made (a read-only filesystem, /proc, a file in the way) or
    the lock file not opened or written (a full disk). Before, the bare error named no flag: "rcswarm worker: [Errno
    30] Read-only file system: '.../x'"."""
    if exc.filename is None:  # StateDirLock could not write the holder into the lock file it opened
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return f"{flag} {path}: cannot write its lock file {lock_file} ({reason})"
    where = Path(os.fsdecode(exc.filename))
    reason = exc.strerror or str(exc)
    if isinstance(exc, FileExistsError) and not where.is_dir():  # a file where its directory would be made
        reason = os.strerror(errno.ENOTDIR)
    return f"{flag} {path}: {reason}" if where == path else f"{flag} {path}: {reason}: {str(where)!r}"


def hold_lock(flag: str, path: Path, lock_file: Path, subject: str | None) -> StateDirLock:
    """The lock of `path` (given by `flag`) in `lock_file`, held by this worker (role "worker"; its directory created
    if missing); ValueError naming the flag when another process holds it (`subject` "is in use by another worker
    (pid N on HOST)"; None: `StateDirBusy`'s own words, "state dir DIR is in use ...") or it cannot be taken
    (`lock_os_problem`)."""
    try:
        return StateDirLock.acquire(lock_file.parent, role="worker", name=lock_file.name)
    except StateDirBusy as exc:
        if subject is None:
            raise ValueError(str(exc)) from None
        raise ValueError(f"{subject} is in use by another worker ({holder_text(lock_file)}); stop it first, or give "
                         f"this one another {flag}") from None
    except OSError as exc:
        raise ValueError(lock_os_problem(flag, path, lock_file, exc)) from None


def hold_locks(state_dir: Path | None, membership_file: Path | None, given: bool) -> list[StateDirLock]:
    """The locks a worker holds for its life (the kernel drops them however the process ends), taken before it ends a
    previous membership: its --state-dir's (`StateDirLock`'s file in it), and its membership file's, in a file beside it
    (`<file>.lock`), `given` by --membership-file or the state dir's own. Without them a second worker on either ended
    this one's membership at its start (Leave "restarted"; this one joined again), this one removed the file recording
    the second's membership when it stopped, and on a state dir the second overwrote its residual. The state dir's
    membership file is locked too: a worker given it by --membership-file alone takes only that file's lock.
    ValueError naming the flag (`hold_lock`); nothing is left held then."""
    locks: list[StateDirLock] = []
    try:
        if state_dir is not None:
            locks.append(hold_lock("--state-dir", state_dir, state_dir / LOCK_NAME, None))
        if membership_file is not None:
            lock_file = membership_file.with_name(membership_file.name + MEMBERSHIP_LOCK_SUFFIX)
            if given or state_dir is None:
                flag, path, subject = "--membership-file", membership_file, f"--membership-file {membership_file}"
            else:
                flag, path, subject = "--state-dir", state_dir, f"--state-dir {state_dir}: its {membership_file}"
            locks.append(hold_lock(flag, path, lock_file, subject))
    except BaseException:
        release_locks(locks)
        raise
    return locks


def release_locks(locks: list[StateDirLock]) -> None:
    """Give `locks` up, the last taken first."""
    for lock in reversed(locks):
        lock.release()


def parser() -> argparse.ArgumentParser:
    """The `rcswarm worker` command line."""
    parser = argparse.ArgumentParser(prog=PROG, description="Join an rcswarm coordinator and train.")
    parser.add_argument("--backend", choices=("coordinator", "hivemind"), default="coordinator",
                        help="sync backend: through a coordinator (default) or peer to peer with hivemind")
    add_client_flags(parser, "HOST:PORT of the coordinator (required with --backend coordinator)")
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when present, else CPU), cpu, cuda, cuda:1, ... (default: auto)")
    parser.add_argument("--name", default="", help="name shown in the coordinator's status (default: the worker id)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default 0: this machine's cores divided by the rcswarm workers "
                             "running on it)")
    parser.add_argument(
        "--patience-s", type=float, default=300.0, action=FlagGiven,
        help="retry a stalled, restarting or busy coordinator this long per call before giving up "
             "(default: %(default)s)",
    )
    parser.add_argument("--max-unavailable-s", type=float, dest="patience_s", default=argparse.SUPPRESS,
                        action=FlagGiven, help=argparse.SUPPRESS)
    parser.set_defaults(patience_s_flag="--patience-s")
    parser.add_argument("--rpc-timeout-s", type=float, default=10.0,
                        help="deadline of one unary call; a long poll adds its wait (default: %(default)s)")
    parser.add_argument("--transfer-timeout-s", type=float, default=DEFAULT_TRANSFER_S,
                        help="deadline of one parameter pull or update push, at least --rpc-timeout-s (default: "
                             "%(default)s, or --rpc-timeout-s when that is longer)")
    parser.add_argument("--membership-file", type=path_arg, default=None, metavar="PATH",
                        help="keep this worker's membership (its id and secret, mode 0600) here, so that the process "
                             "started after this one was killed ends it at once and trains sooner (give it a private "
                             "directory, created if missing; one worker at a time: locked in PATH.lock while it runs; "
                             f"default: {MEMBERSHIP_NAME} in --state-dir, else none: the secret stays in memory)")
    parser.add_argument("--max-params", type=int, default=0,
                        help="refuse a run spec whose model has more parameters (default 0: what the device's memory "
                             "holds at 32 bytes of training state per parameter)")
    parser.add_argument("--max-step-tokens", type=int, default=0,
                        help="refuse a run spec or an assignment whose step trains or evaluates more positions "
                             "(batch × seq_len) at once (default 0: 2,097,152)")
    parser.add_argument("--data-root", type=path_arg, default=None, metavar="DIR",
                        help="read a run's git dataset only at or under DIR (the path the run spec names, absolute or "
                             "relative to the working directory; default: none, a run on a git dataset is refused; "
                             "with --backend hivemind --config alone, the dataset that file names)")
    parser.add_argument("--state-dir", type=path_arg, default=None,
                        help="this worker's own directory (one worker at a time: locked while it runs): its "
                             "error-feedback residual (rewritten after each delivered update) and its membership "
                             "file, so a restarted worker resumes what it has not sent yet and ends its killed "
                             "predecessor's membership at once (default: memory only)")
    add_hivemind_arguments(parser)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed `rcswarm worker` command line (argparse exits 0 after --help, 2 on a usage error)."""
    return parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """`rcswarm worker`: the exit status (0 the run finished or the worker was stopped, 1 it gave up, 2 a usage
    error: an empty path among PATH_FLAGS included)."""
    log_to_stderr("worker")
    args = parse_args(argv)
    problem = empty_path(args) or dial_problem(args.coordinator) or seconds_problem(args.patience_s_flag, args.patience_s)
    if problem is not None:
        return usage_error(PROG, problem)
    if args.backend == "hivemind":
        return main_hivemind(args)
    if args.coordinator is None:
        return usage_error(PROG, "--coordinator HOST:PORT is required (or --backend hivemind)")
    unused = unused_hivemind_flags(args)
    if unused is not None:
        return usage_error(PROG, unused)
    try:
        problem = data_root_problem(args.data_root)
        if problem:
            raise ValueError(problem)
        token = client_token(args)
        membership_file = args.membership_file
        if membership_file is None and args.state_dir is not None:
            membership_file = args.state_dir / MEMBERSHIP_NAME
        # The default transfer deadline is at least the rpc timeout (`--rpc-timeout-s 400` alone was refused, naming a
        # --transfer-timeout-s nobody typed); a shorter one given is refused below.
        transfer_s = args.transfer_timeout_s
        if transfer_s == DEFAULT_TRANSFER_S:
            transfer_s = max(transfer_s, args.rpc_timeout_s)
        options = client_options(
            args, WorkerOptions, device=args.device, name=args.name, threads=args.threads, patience_s=args.patience_s,
            rpc_timeout_s=args.rpc_timeout_s, transfer_timeout_s=transfer_s, max_params=args.max_params,
            max_step_tokens=args.max_step_tokens, membership_file=membership_file, state_dir=args.state_dir,
            data_root=args.data_root,
        )
        problem = transfer_timeout_problem(options.transfer_timeout_s, options.rpc_timeout_s)
        if problem is not None:
            raise ValueError(problem)
        tls = options.tls()
        locks = hold_locks(args.state_dir, options.membership_file, given=args.membership_file is not None)
    except (ValueError, OSError) as exc:
        return usage_error(PROG, str(exc))
    try:
        return run_worker(options, token, tls)
    finally:
        release_locks(locks)


def run_worker(options: WorkerOptions, token: str, tls: ClientTLS | None) -> int:
    """End the membership the membership file records (a killed predecessor's), build the worker and run it until it
    ends; its exit status (2 for a worker refused at its start)."""
    previous = None
    if options.membership_file is not None:  # before torch is imported: the round stops waiting for the killed one
        from rcswarm.worker.membership import end_previous

        previous = end_previous(options.membership_file, options.coordinator, tls, options.rpc_timeout_s)
    from rcswarm.worker.worker import Worker

    try:
        set_threads(options.threads)
        worker = Worker(options, token, previous=previous)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    StopSignal(target=worker.stop).install(signal.SIGTERM, signal.SIGINT)
    return worker.run()


def main_hivemind(args: argparse.Namespace) -> int:
    """`rcswarm worker --backend hivemind ...`: a peer of a hivemind swarm, with a coordinator as its control plane
    when `--coordinator` is given (hivemind is imported only now)."""
    import grpc

    from rcswarm.cli.dht import HIVEMIND_EXTRA, import_hivemind_sync
    from rcswarm.train.inner import data_problem, worker_data_seed
    from rcswarm.train.round import resolve_device
    from rcswarm.worker import ControlPlane, RetriesExhausted

    unused = unused_coordinator_flags(args)
    if unused is not None:
        return usage_error(PROG, unused)
    problem = threads_problem(args.threads) or seconds_problem("--rpc-timeout-s", args.rpc_timeout_s)
    if problem is not None:
        return usage_error(PROG, problem)
    hivemind_sync = import_hivemind_sync()
    if hivemind_sync is None:
        return usage_error(PROG, HIVEMIND_EXTRA)
    control, data_seed = None, None
    try:
        if args.config is None and args.coordinator is None:
            raise ValueError("--backend hivemind needs --config RUN.toml (the run spec every peer trains) "
                             "or --coordinator HOST:PORT (which serves it)")
        spec = RunSpec.from_toml(args.config) if args.config is not None else None
        problem = data_root_problem(args.data_root) or (data_problem(spec) if spec is not None else None)
        if problem is not None:
            raise ValueError(problem)
        options = hivemind_sync.HivemindOptions(
            initial_peers=tuple(args.initial_peers), host_maddrs=tuple(args.host_maddrs),
            announce_maddrs=tuple(args.announce_maddrs), client_mode=args.client_mode, identity_path=args.identity_path,
        )
        set_threads(args.threads)
        device = str(resolve_device(args.device))
        name = args.name or f"{socket.gethostname()}-{os.getpid()}"
        if args.coordinator is not None:
            client, token = client_options(args), client_token(args)
            control = ControlPlane(client.coordinator, token, name, device, patience_s=args.patience_s,
                                   rpc_timeout_s=args.rpc_timeout_s, tls_ca=client.tls_ca, tls_cert=client.tls_cert,
                                   tls_key=client.tls_key)
    except (ValueError, OSError) as exc:
        return usage_error(PROG, str(exc))
    if control is not None:
        try:
            joined = control.join()
            spec = RunSpec.from_json(joined.run_spec_json)
        except (grpc.RpcError, RetriesExhausted, ValueError) as exc:
            log.error("%s cannot join %s: %s", name, args.coordinator, exc)
            control.client.close()
            return 1
        data_seed = worker_data_seed(spec.run.seed, joined.data_seed)
        control.start()  # beats from now on: building the model and the peer may outlast the lease
    import torch

    from rcswarm.protos.wire import REFUSED_LEAVE
    from rcswarm.worker import HivemindWorker  # looked up now: a test may have replaced it in its module
    from rcswarm.worker.worker import first_line

    try:
        worker = HivemindWorker(spec, options, name=name, device=device, out=args.out, control=control,
                                data_seed=data_seed, max_params=args.max_params,
                                max_step_tokens=args.max_step_tokens, data_root=args.data_root,
                                started=process_started())
    except ValueError as exc:
        status = usage_error(PROG, str(exc))
        if control is not None:
            control.close(f"{REFUSED_LEAVE}{exc}")
        return status
    except torch.OutOfMemoryError as exc:  # one line and a Leave, not a traceback and a membership left to its lease
        reason = f"{name} cannot train this run: out of memory on {device} building its model: {first_line(exc)}"
        log.error("%s", reason)
        if control is not None:
            control.close(f"{REFUSED_LEAVE}{reason}")
        return 1
    StopSignal(target=worker.stop).install(signal.SIGTERM, signal.SIGINT)
    return worker.run()
