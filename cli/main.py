"""The `rcswarm` command: dispatches to the coordinator, a worker, or the local launcher.

    rcswarm run [RUN.toml]                               a local swarm: coordinator + N workers
    rcswarm coordinator --config RUN.toml --state-dir DIR --port P
    rcswarm worker --coordinator HOST:PORT --token T [--device auto]
    rcswarm bench diag --task maze --models lstm transformer --budget-minutes 5
    rcswarm bench gpu [--parts kernels timings bptt swarm]   the GPU check (one line and exit 0 without CUDA)
    rcswarm launch ray --address auto --coordinator HOST:PORT --workers N   workers as Ray actors
    rcswarm dht --host-maddrs /ip4/0.0.0.0/tcp/31337 [--config RUN.toml --state-dir DIR]   hivemind bootstrap peer

Each subcommand's module is imported only when it runs.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "run": ("rcswarm.cli.run", "start a coordinator and N workers on this machine and train"),
    "coordinator": ("rcswarm.cli.coordinator", "serve a run: membership, rounds, outer optimizer, metrics"),
    "worker": ("rcswarm.cli.worker", "join a coordinator and train"),
    "bench": ("rcswarm.cli.main", "benchmarks on this machine: `rcswarm bench diag ...`, `rcswarm bench gpu`"),
    "fit": ("rcswarm.cli.fit", "fit scaling laws to recorded metrics and plot them"),
    "data": ("rcswarm.cli.data", "build training data: `rcswarm data frames --repo PATH --out DIR`"),
    "status": ("rcswarm.cli.status", "print a coordinator's runs, workers, rounds and fits"),
    "launch": ("rcswarm.cli.launch", "workers on a cluster manager: `rcswarm launch ray --address auto ...`"),
    "dht": ("rcswarm.cli.dht", "a bootstrap peer of a hivemind swarm (sync.backend = \"hivemind\"), mirroring its metrics"),
}
BENCHES = {"diag": "rcswarm.cli.bench", "gpu": "rcswarm.cli.bench_gpu"}


def usage() -> str:
    lines = ["usage: rcswarm COMMAND [ARGS]   (rcswarm --version; rcswarm COMMAND --help)", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"rcswarm {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"rcswarm: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if command == "bench":
        return bench(rest)
    try:
        module = importlib.import_module(COMMANDS[command][0])
        return module.main(rest)
    except KeyboardInterrupt:  # Ctrl-C before a command installs its own handler (while torch imports)
        print("rcswarm: interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:
        if not interrupted_import(exc):
            raise
        print("rcswarm: interrupted", file=sys.stderr)
        return 130


def interrupted_import(exc: BaseException) -> bool:
    """Whether `exc` is an ImportError raised because a Ctrl-C landed inside an import: its chain of causes and
    contexts holds a KeyboardInterrupt (a half-imported module then fails as "cannot import name ..." or numpy's
    "cannot load module more than once per process")."""
    if not isinstance(exc, ImportError):
        return False
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return True
        pending += [current.__cause__, current.__context__]
    return False


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("rcswarm")
    except PackageNotFoundError:
        return "unknown (not installed)"


def bench(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        help_ = bool(argv) and argv[0] in ("-h", "--help")
        print(f"usage: rcswarm bench {{{','.join(BENCHES)}}} [ARGS]", file=sys.stdout if help_ else sys.stderr)
        return 0 if help_ else 2
    return importlib.import_module(BENCHES[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
