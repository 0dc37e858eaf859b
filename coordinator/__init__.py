"""The round server: what callers outside coordinator/ may use, and where each part of it lives.

    service.py      SwarmCoordinator: one run's membership, pace, θ served and status; its lock and call contract
    records.py      the value types of its state (WorkerRecord, OpenRound, RoundClose, ...) and its limits
    resume.py       what a run starts from: the run committed in its state dir, or version 0
    intake.py       UpdateIntake: every reason a push or a metrics report is refused
    close.py        RoundCloser: the round close, from a round's updates to the next version served
    decisions.py    the pure decisions: admit, evict, forget, close a round, pace, staleness
    liveness.py     LivenessClock: leases and deadlines on monotonic time that skips the coordinator's own stalls
    curriculum.py   CurriculumTracker: each worker's sequence length and batch, the adaptive ladder
    aggregation.py  bounded influence: the robust aggregators and the automatic norm bound
    sweep.py        RunGroup (open_group): a sweep's runs or one run, the interface the server and dashboard use
    guards.py       call admission: the join token, deadlines, per-kind limits and caps, idle streams
    server.py       RunningCoordinator: the gRPC server, health, the ticker, the dashboard, in one process
    tls.py, tokens.py  TLS files and the bind rule, the self-signed quick start; the accepted join tokens
    capacity.py     ParameterLimit, model_problem: the bound on the model the coordinator builds, before it is built

The command line, `rcswarm coordinator`, is cli/coordinator.py. The names of `__all__` are imported on
first use (PEP 562): `import rcswarm.coordinator`, which every import of one of its modules runs first,
stays as cheap as that module.
"""

from __future__ import annotations

import importlib

__all__ = [
    "SwarmCoordinator", "Refusal",  # one run
    # a run or a sweep, its state dirs
    "RunGroup", "SweepCoordinator", "open_group", "run_state_dirs", "layout_problem", "lock_state_dirs",
    "RunningCoordinator", "CallLimits", "DEFAULT_MAX_CALLS", "parse_max_calls", "TLSFiles", "JoinTokens",  # serving
    "LivenessClock",
    "ParameterLimit", "model_problem", "COORDINATOR_BYTES_PER_PARAMETER",  # the bound on the model it builds
    "aggregation", "curriculum", "decisions", "tls",  # modules
]
# The module of this package that defines each name of `__all__`; None for a module itself.
_WHERE = {
    "SwarmCoordinator": "service", "Refusal": "records",
    "RunGroup": "sweep", "SweepCoordinator": "sweep", "open_group": "sweep", "run_state_dirs": "sweep",
    "layout_problem": "sweep", "lock_state_dirs": "sweep",
    "RunningCoordinator": "server", "CallLimits": "guards", "DEFAULT_MAX_CALLS": "guards", "parse_max_calls": "guards",
    "TLSFiles": "tls", "JoinTokens": "tokens", "LivenessClock": "liveness",
    "ParameterLimit": "capacity", "model_problem": "capacity", "COORDINATOR_BYTES_PER_PARAMETER": "capacity",
    "aggregation": None, "curriculum": None, "decisions": None, "tls": None,
}


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use and then kept (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_WHERE[name] or name}")
    value = module if _WHERE[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
