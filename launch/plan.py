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
NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
NAMESPACE_RULE = "expected letters, digits, '_', '.', '-' (at most 63)"


def _finite(flag: str, value: float, low: float, inclusive: bool) -> None:
    ok = math.isfinite(value) and (value >= low if inclusive else value > low)
    if not ok:
        raise ValueError(f"{flag} {value}: expected a number {'>=' if inclusive else '>'} {low:g}")


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
        _finite("--gpus-per-worker", self.gpus_per_worker, 0.0, inclusive=True)
        _finite("--cpus-per-worker", self.cpus_per_worker, 0.0, inclusive=False)
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError(f"--gpus-per-worker {self.gpus_per_worker:g}: above 1 it must be a whole number of GPUs")
        if not NAMESPACE.match(self.namespace):
            raise ValueError(f"--namespace {self.namespace!r}: {NAMESPACE_RULE}")
        for flag, path in (("--tls-ca", self.worker.tls_ca), ("--tls-cert", self.worker.tls_cert),
                           ("--tls-key", self.worker.tls_key)):
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

    def made(self, index: int, info: dict[str, Any]) -> bool:
        """Whether worker actor `index`, whose `info()` this is, was made for this plan (its config is this plan's)."""
        return info["config"] == dataclasses.asdict(self.worker_config(index))


def resources(values: dict[str, float]) -> str:
    """Ray resources for people: "1 GPU, 2 CPU"."""
    shown = [f"{values[k]:g} {k}" for k in ("GPU", "CPU") if k in values]
    return ", ".join(shown) or "nothing"


def pending_reason(demand: dict[str, float], nodes: list[dict[str, Any]], available: dict[str, float]) -> str:
    """Why an actor asking `demand` is not running: no alive node could ever hold it, or none has it free.

    `nodes` are `ray.nodes()` entries (`Alive`, `Resources` = totals), `available` is
    `ray.available_resources()` (free now, summed over the cluster).
    """
    totals = [node["Resources"] for node in nodes if node.get("Alive")]
    if not any(all(total.get(k, 0.0) >= v for k, v in demand.items()) for total in totals):
        largest = max(totals, key=lambda t: (t.get("GPU", 0.0), t.get("CPU", 0.0)), default={})
        return (f"infeasible: no node of the cluster has {resources(demand)} (the largest has "
                f"{resources(largest)}); an autoscaler may add one, else lower --gpus-per-worker/--cpus-per-worker")
    return (f"waiting for {resources(demand)} free on one node (free in the whole cluster now: "
            f"{resources(available)})")


def worker_index(name: str) -> int | None:
    """The index of a worker actor's name (`rcswarm-worker-<i>`), None for another actor."""
    match = WORKER_NAME.match(name)
    return int(match.group(1)) if match else None
