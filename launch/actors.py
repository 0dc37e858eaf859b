"""Ray actor management for `rcswarm launch ray`: find, call, start and retire the actors of a namespace.

Ray is imported inside each function (the `ray` extra is optional). Calls wait at most a timeout and
answer None for an actor that is dead or does not answer, so the supervisor and the status never hang
on one actor.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rcswarm.launch.plan import WORKER_PREFIX, LaunchPlan
from rcswarm.worker import FAILED, FINISHED, RayWorker

CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 3.0
# Ray's actor states (GCS) before an actor first runs.
PENDING_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")


def connect(address: str, namespace: str) -> None:
    """Join the Ray cluster at `address` as a driver of `namespace` (ImportError without the `ray` extra).

    ConnectionError when nothing answers at a HOST:PORT address (`reach_problem`): Ray itself retries for
    minutes, deaf to Ctrl-C."""
    problem = reach_problem(address, PROBE_TIMEOUT_S)
    if problem is not None:
        raise ConnectionError(problem)
    import ray

    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)


def gcs_address(given: str) -> str:
    """The GCS HOST:PORT this driver is connected to (`--address auto` resolved), else `given`. Ray is not imported
    here: a driver that connected has imported it already (and importing it first would fix its settings from the
    environment as it is now)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():  # a runtime context would start a local Ray instance
        return given
    try:
        return ray.get_runtime_context().gcs_address or given
    except (AttributeError, RuntimeError):
        return given


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a HOST:PORT or [V6]:PORT address (pure); None for another form (`auto`, `local`, a URL)."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or "://" in address or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def reach_problem(address: str, timeout_s: float) -> str | None:
    """Why nothing could answer at the Ray address `address` (one TCP connection, at most `timeout_s`), or None:
    also None for an address that is not HOST:PORT (`auto` finds the local cluster's own address)."""
    target = split_address(address)
    if target is None:
        return None
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return None
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return (f"nothing answers at {address} ({why} within {timeout_s:g}s); expected the GCS address of a running "
                "Ray cluster (`ray start --head` prints it; `ray status` on a node shows it)")


def named_actors(namespace: str) -> list[str]:
    """Names of the live (not dead) named actors of a Ray namespace."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace)


def lookup(name: str, namespace: str):
    """The handle of a named actor, or None when there is none (never created, or dead).

    A handle loads the actor's class from its job's function table in the GCS, which Ray deletes once the job's
    driver has exited and its last actor is dead: an actor being killed as it is looked up (replaced by the
    supervisor) then fails an assertion inside Ray ("Expected str or bytes, got NoneType"). It is going: None.
    """
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except (ValueError, AssertionError):
        return None


def gcs_record(handle) -> dict[str, Any]:
    """Ray's record of the actor of `handle` (`actor_record`)."""
    return actor_record(handle._actor_id.hex())


def actor_record(actor_id: str) -> dict[str, Any]:
    """Ray's record of the actor `actor_id` (hex) from the GCS: State, NumRestarts, Pid, DeathCause (text) and RequiredResources
    (what it asked of Ray: a pending actor's own demand); {} when the GCS has none.

    Read with `ray._private.state`, Ray's DeveloperAPI for the actor table, which needs no dashboard (the
    public `ray.util.state` API goes through the dashboard, which a cluster may not run) but does not work
    through Ray Client (`ray://`, refused by the command line).
    """
    import ray
    from ray._private import state
    from ray.core.generated import gcs_pb2

    raw = state.state._connect_and_get_accessor().get_actor_info(ray.ActorID(bytes.fromhex(actor_id)))
    if raw is None:
        return {}
    data = gcs_pb2.ActorTableData.FromString(raw)
    return {
        "State": gcs_pb2.ActorTableData.ActorState.Name(data.state),
        "NumRestarts": data.num_restarts,
        "Pid": data.pid,
        "DeathCause": death_cause_text(data.death_cause) if data.HasField("death_cause") else "",
        "RequiredResources": dict(data.required_resources),
    }


def death_cause_text(cause) -> str:
    """Why a dead actor died, in words (pure): the exception of a failed constructor (its last line), or Ray's
    message for the other causes (killed, its node died, out of memory, unschedulable, runtime env)."""
    kind = cause.WhichOneof("context")
    if kind is None:
        return ""
    context = getattr(cause, kind)
    if kind == "creation_task_failure_context":
        lines = context.formatted_exception_string.strip().splitlines()
        return lines[-1].strip() if lines else "its constructor raised"
    return context.error_message.strip()


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


def retire_all(handles: dict[str, Any], timeout_s: float = STOP_TIMEOUT_S) -> tuple[dict[str, dict], set[str]]:
    """Stop worker actors (name -> handle; each worker Leaves) unless Ray never started them, then kill them for good.
    Every stop is asked together, so that scaling from 10 workers to 1 takes one stop's time, not nine (each up to
    STOP_TIMEOUT_S + CALL_TIMEOUT_S, one after another on the supervisor's reconcile thread, which meanwhile restarted
    no one). (name -> last report of those that answered, names of those Ray never started)."""
    import ray

    never = {name for name, handle in handles.items() if gcs_record(handle).get("State") in PENDING_STATES}
    reports = ask_all({name: handle for name, handle in handles.items() if name not in never}, "stop", timeout_s,
                      timeout_s=timeout_s + CALL_TIMEOUT_S)
    for handle in handles.values():
        ray.kill(handle, no_restart=True)
    return reports, never


def describe_stop(report: dict | None) -> str:
    """What a worker actor's stop did (its `RayWorker.stop` report), in words: it said "left the swarm" of a worker
    that had failed or never joined, which had no membership to leave."""
    if report is None:
        return "it did not answer (not started, restarting or dead); killed"
    who = report.get("worker_id") or "no membership"
    if report.get("state") == FINISHED:
        return f"{who}: its run had finished"
    if report.get("was") == FAILED:
        return f"it had failed before ({report.get('problem') or 'no reason given'}); removed"
    if not report.get("worker_id"):
        return "it had not joined; removed"
    return f"{who} {'left the swarm' if report.get('left') else 'did not finish leaving in time'}"


def wait(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Whether `predicate` became true within `timeout_s` (checked every `interval_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False
