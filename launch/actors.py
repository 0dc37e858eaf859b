"""Ray actor management for `rcswarm launch ray`: find, call, start and retire the actors of a namespace.

Ray is imported inside each function (the `ray` extra is optional). Calls wait at most a timeout and
answer None for an actor that is dead or does not answer, so the supervisor and the status never hang
on one actor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rcswarm.launch.plan import WORKER_PREFIX, LaunchPlan
from rcswarm.worker import FINISHED, RayWorker

CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 30.0
# Ray's actor states (GCS) before an actor first runs.
PENDING_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")


def connect(address: str, namespace: str) -> None:
    """Join the Ray cluster at `address` as a driver of `namespace` (ImportError without the `ray` extra)."""
    import ray

    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)


def named_actors(namespace: str) -> list[str]:
    """Names of the live (not dead) named actors of a Ray namespace."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace)


def lookup(name: str, namespace: str):
    """The handle of a named actor, or None when there is none (never created, or dead)."""
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def gcs_record(handle) -> dict[str, Any]:
    """Ray's record of an actor (State, NumRestarts, Pid, Address, DeathCause), from the GCS.

    `ray._private.state.actors` is Ray's DeveloperAPI for this and needs no dashboard; the
    public `ray.util.state` API goes through the dashboard, which a cluster may not run.
    """
    from ray._private import state

    return state.actors(actor_id=handle._actor_id.hex()) or {}


def call(handle, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
    """Call an actor's method and wait at most `timeout_s`; None when the actor is dead or does not answer.

    A call made while Ray restarts the actor fails at once (ActorUnavailableError) instead of
    waiting: it is tried again until the timeout.
    """
    import ray
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ref = getattr(handle, method).remote(*args)
            return ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except ActorUnavailableError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)
        except (RayActorError, GetTimeoutError):
            return None


def ask_all(handles: dict[str, Any], method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
    """Call one method of many actors at once; name -> answer of those that answered within the timeout."""
    import ray

    refs = {name: getattr(handle, method).remote(*args) for name, handle in handles.items()}
    if not refs:
        return {}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    answers = {}
    for name, ref in refs.items():
        if ref in ready:
            try:
                answers[name] = ray.get(ref, timeout=1.0)
            except ray.exceptions.RayError:
                continue
    return answers


def start_worker(plan: LaunchPlan, index: int):
    """Create (or find) the detached actor of worker `index`."""
    import ray

    return ray.remote(RayWorker).options(
        name=f"{WORKER_PREFIX}{index}", namespace=plan.namespace, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=0, max_concurrency=4,
        num_cpus=plan.cpus_per_worker, num_gpus=plan.gpus_per_worker,
    ).remote(asdict(plan.worker_config(index)))


def retire(handle, timeout_s: float = STOP_TIMEOUT_S) -> dict | None:
    """Stop a worker actor (its worker Leaves) unless it never started, then kill it for good; its last report."""
    import ray

    report = None
    if gcs_record(handle).get("State") not in PENDING_STATES:
        report = call(handle, "stop", timeout_s, timeout_s=timeout_s + CALL_TIMEOUT_S)
    ray.kill(handle, no_restart=True)
    return report


def describe_stop(report: dict | None) -> str:
    if report is None:
        return "it did not answer (not started, restarting or dead); killed"
    who = report.get("worker_id") or "no membership"
    if report.get("state") == FINISHED:
        return f"{who}: its run had finished"
    return f"{who} {'left the swarm' if report.get('left') else 'did not finish leaving in time'}"


def wait(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Whether `predicate` became true within `timeout_s` (checked every `interval_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False
