"""The plan of `rcswarm launch ray`: N worker actors of one shape in one Ray namespace (`LaunchPlan`), and the names.

A plan composes the worker's own options (`WorkerOptions`: coordinator, device, threads, TLS files,
patience; no token, no name) and adds what is the launcher's: how many workers, the Ray resources of
each, the namespace. Worker `i` is the actor `rcswarm-worker-<i>`, named `<namespace>-worker-<i>` in
the coordinator's status. No Ray here: the command plans (and refuses a bad plan) without it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from rcswarm.worker import RayWorkerConfig, WorkerOptions

SUPERVISOR = "rcswarm-supervisor"
COORDINATOR = "rcswarm-coordinator"
WORKER_PREFIX = "rcswarm-worker-"
WORKER_NAME = re.compile(rf"^{WORKER_PREFIX}(\d+)$")
NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # the whole name (fullmatch: no trailing newline)
NAMESPACE_RULE = "expected letters, digits, '_', '.', '-' (at most 63)"


# Ray counts resources in units of 1/10000 (RESOURCE_UNIT_SCALING): it refuses less and truncates finer values.
RESOURCE_UNIT = 10_000


def resource_problem(flag: str, value: float, positive: bool) -> str | None:
    """Why `value` is not a Ray resource quantity for `flag` (pure): not finite, below zero (or zero when `positive`),
    or finer than Ray's 0.0001 (Ray refuses less than 0.0001 at every creation and truncates finer steps), or None."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        return f"{flag} {value}: expected a number {'>' if positive else '>='} 0"
    units = value * RESOURCE_UNIT
    if abs(units - round(units)) > 1e-6 * max(1.0, units):
        return f"{flag} {value}: Ray counts resources in steps of 0.0001; expected at most 4 decimals"
    return None


@dataclass(frozen=True)
class LaunchPlan:
    """What the supervisor keeps running: `workers` actors of `worker`'s options, each with `gpus_per_worker`
    GPUs and `cpus_per_worker` CPUs, in `namespace` (no token: the plan travels through Ray).

    `worker.threads` 0 means `cpus_per_worker` rounded up; its TLS files are paths on every Ray node.
    """

    worker: WorkerOptions
    workers: int
    gpus_per_worker: float = 1.0
    cpus_per_worker: float = 1.0
    namespace: str = "rcswarm"

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"--workers {self.workers}: expected an integer >= 0")
        for flag, value, positive in (("--gpus-per-worker", self.gpus_per_worker, False),
                                      ("--cpus-per-worker", self.cpus_per_worker, True)):
            problem = resource_problem(flag, value, positive)
            if problem is not None:
                raise ValueError(problem)
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError(f"--gpus-per-worker {self.gpus_per_worker:g}: above 1 it must be a whole number of GPUs")
        if not NAMESPACE.fullmatch(self.namespace):
            raise ValueError(f"--namespace {self.namespace!r}: {NAMESPACE_RULE}")
        for flag, path in (("--tls-ca", self.worker.tls_ca), ("--tls-cert", self.worker.tls_cert),
                           ("--tls-key", self.worker.tls_key), ("--data-root", self.worker.data_root)):
            if path is not None and not path.is_absolute():
                raise ValueError(f"{flag} {str(path)!r}: expected an absolute path (it is read on every Ray node)")

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> LaunchPlan:
        """The plan of `dataclasses.asdict(plan)`, as the supervisor gets it through Ray, validated again."""
        return cls(**{**fields, "worker": WorkerOptions.from_dict(fields["worker"])})

    def demand(self) -> dict[str, float]:
        """The resources of one worker actor, as Ray names them."""
        return {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}

    def worker_config(self, index: int) -> RayWorkerConfig:
        """The config of worker actor `index`: the plan's worker options, named, with its threads decided."""
        options = dataclasses.replace(self.worker, name=f"{self.namespace}-worker-{index}",
                                      threads=self.worker.threads or max(1, math.ceil(self.cpus_per_worker)))
        return RayWorkerConfig(worker=options, num_gpus=self.gpus_per_worker, num_cpus=self.cpus_per_worker)

    def describe(self) -> str:
        """This plan for people: "3 workers of 1 GPU, 0.5 CPU joining HOST:PORT"."""
        return f"{self.workers} workers of {resources(self.demand())} joining {self.worker.coordinator}"

    def made(self, index: int, info: dict[str, Any]) -> bool:
        """Whether worker actor `index`, whose `info()` this is, was made for this plan (its config is this plan's)."""
        return info["config"] == dataclasses.asdict(self.worker_config(index))


def resources(values: dict[str, float]) -> str:
    """Ray resources for people: "1 GPU, 2 CPU"."""
    shown = [f"{values[k]:g} {k}" for k in ("GPU", "CPU") if k in values]
    return ", ".join(shown) or "nothing"


def same_resources(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether two resource requests are the same, to Ray's 0.0001 (a zero quantity is no request)."""
    keys = {k for request in (a, b) for k, v in request.items() if v}
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) < 0.5 / RESOURCE_UNIT for k in keys)


# The flags that set a worker actor's demand (what `pending_reason` tells to lower when no node could hold it).
WORKER_FLAGS = "--gpus-per-worker/--cpus-per-worker"


def pending_reason(demand: dict[str, float], nodes: list[dict[str, Any]], available: dict[str, float],
                   flags: str = WORKER_FLAGS) -> str:
    """Why an actor asking `demand` is not running: no alive node could ever hold it, or none has it free.

    `nodes` are `ray.nodes()` entries (`Alive`, `Resources` = totals), `available` is
    `ray.available_resources()` (free now, summed over the cluster); `flags`: those that set `demand`.
    """
    totals = [node["Resources"] for node in nodes if node.get("Alive")]
    if not any(all(total.get(k, 0.0) >= v for k, v in demand.items()) for total in totals):
        largest = max(totals, key=lambda t: (t.get("GPU", 0.0), t.get("CPU", 0.0)), default={})
        return (f"infeasible: no node of the cluster has {resources(demand)} (the largest has "
                f"{resources(largest)}); an autoscaler may add one, else lower {flags}")
    return (f"waiting for {resources(demand)} free on one node (free in the whole cluster now: "
            f"{resources(available)})")


def worker_index(name: str) -> int | None:
    """The index of a worker actor's name (`rcswarm-worker-<i>`), None for another actor."""
    match = WORKER_NAME.match(name)
    return int(match.group(1)) if match else None
