"""`rcswarm launch ray`: rcswarm workers as Ray actors on an existing Ray cluster (issue #16).

    rcswarm launch ray --address auto --coordinator HOST:PORT --workers N [--gpus-per-worker G]
                       [--cpus-per-worker C] [--namespace NAME] [--device auto] [--tls-ca F] [--detach]
    rcswarm launch ray --address auto --namespace NAME --with-coordinator --config RUN.toml --state-dir DIR ...
    rcswarm launch ray --address auto --namespace NAME --status [--json]
    rcswarm launch ray --address auto --namespace NAME --stop

Design (plain Ray Core actors, not Ray Train: rcswarm workers are independent and the coordinator
already handles join and leave):

* Every worker is a detached, named actor `rcswarm-worker-<i>` of the Ray namespace
  (`worker/ray_worker.RayWorker`, `num_gpus` G, `num_cpus` C, `max_restarts=-1`): detached, because a
  non-detached actor dies with its driver whatever `max_restarts` says. Ray restarts a dead actor's
  process; the new process joins the coordinator again as a new worker.
* A detached supervisor actor `rcswarm-supervisor` (`num_cpus=0`) holds the plan (`LaunchPlan`) and
  reconciles every RECONCILE_S: it starts the missing `rcswarm-worker-<i>` for i < N (at most once
  per RECREATE_BACKOFF_S per slot: an actor killed for good or failing at creation is started again,
  not in a loop) and retires those with i >= N (each Leaves, then is killed). Running the command
  again with another plan (`--workers 3`) replaces the supervisor, whose arguments are then the new
  plan, so a restarted supervisor never goes back to an old count.
* The launcher then follows (status lines on every change) until every worker's run has ended, and
  then removes the actors; with `--detach` it returns once every worker has joined. A driver that
  exits leaves the detached actors training; `--status` and `--stop` from any later driver find them.
* Actors pending for lack of resources are reported with the reason (`pending_reason`: infeasible on
  every node, or waiting for free resources), never waited on silently.
* The coordinator runs outside Ray by default (`--coordinator`); `--with-coordinator` runs it as a
  detached actor pinned to the head node (`CoordinatorActor`), which dies with the head.
* The join token is never an actor argument nor part of a runtime_env (Ray records both): every
  actor reads `RCSWARM_TOKEN` from its node's environment.

Ray is imported only inside the functions that need it: `rcswarm launch --help` and the rest of
rcswarm work without the `ray` extra.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.worker.ray_worker import FINISHED, STARTING, TRAINING, RayWorker, RayWorkerConfig

log = logging.getLogger("rcswarm.launch")
PROG = "rcswarm launch ray"
SUPERVISOR = "rcswarm-supervisor"
COORDINATOR = "rcswarm-coordinator"
WORKER_PREFIX = "rcswarm-worker-"
WORKER_NAME = re.compile(rf"^{WORKER_PREFIX}(\d+)$")
NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
RECONCILE_S = 1.0
RECREATE_BACKOFF_S = 30.0
CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 30.0
COORDINATOR_START_S = 120.0
# Ray's actor states (GCS) before an actor first runs.
PENDING_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")
RAY_EXTRA = "Ray is not installed: pip install 'rcswarm[ray]'"


def _finite(flag: str, value: float, low: float, inclusive: bool) -> None:
    ok = math.isfinite(value) and (value >= low if inclusive else value > low)
    if not ok:
        raise ValueError(f"{flag} {value}: expected a number {'>=' if inclusive else '>'} {low:g}")


@dataclass(frozen=True)
class LaunchPlan:
    """What the supervisor keeps running: N worker actors of one shape, in one namespace (no token)."""

    coordinator: str
    workers: int
    gpus_per_worker: float = 1.0
    cpus_per_worker: float = 1.0
    namespace: str = "rcswarm"
    device: str = "auto"
    threads: int = 0
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    patience_s: float = 300.0

    def __post_init__(self) -> None:
        if ":" not in self.coordinator:
            raise ValueError(f"--coordinator {self.coordinator!r}: expected HOST:PORT")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"--workers {self.workers}: expected an integer >= 0")
        _finite("--gpus-per-worker", self.gpus_per_worker, 0.0, inclusive=True)
        _finite("--cpus-per-worker", self.cpus_per_worker, 0.0, inclusive=False)
        _finite("--patience-s", self.patience_s, 0.0, inclusive=False)
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError(f"--gpus-per-worker {self.gpus_per_worker:g}: above 1 it must be a whole number of GPUs")
        if not NAMESPACE.match(self.namespace):
            raise ValueError(f"--namespace {self.namespace!r}: expected letters, digits, '_', '.', '-' (at most 63)")
        if self.threads < 0:
            raise ValueError(f"--threads {self.threads}: expected >= 0 (0 = --cpus-per-worker rounded up)")
        for flag, path in (("--tls-ca", self.tls_ca), ("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path and not os.path.isabs(path):
                raise ValueError(f"{flag} {path!r}: expected an absolute path (it is read on every Ray node)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")

    def demand(self) -> dict[str, float]:
        """The resources of one worker actor, as Ray names them."""
        return {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}

    def worker_config(self, index: int) -> RayWorkerConfig:
        return RayWorkerConfig(
            coordinator=self.coordinator, name=f"{self.namespace}-worker-{index}", num_gpus=self.gpus_per_worker,
            num_cpus=self.cpus_per_worker, device=self.device,
            threads=self.threads or max(1, math.ceil(self.cpus_per_worker)), tls_ca=self.tls_ca,
            tls_cert=self.tls_cert, tls_key=self.tls_key, patience_s=self.patience_s,
        )


def _resources(values: dict[str, float]) -> str:
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
        return (f"infeasible: no node of the cluster has {_resources(demand)} (the largest has "
                f"{_resources(largest)}); an autoscaler may add one, else lower --gpus-per-worker/--cpus-per-worker")
    return (f"waiting for {_resources(demand)} free on one node (free in the whole cluster now: "
            f"{_resources(available)})")


def worker_index(name: str) -> int | None:
    match = WORKER_NAME.match(name)
    return int(match.group(1)) if match else None


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


class Supervisor:
    """The detached actor reconciling the plan's worker count with the worker actors that exist.

    Threads: the reconcile loop runs on its own thread; `plan`, `events` and `halt` run on Ray's
    task threads (max_concurrency > 1). `_lock` guards `_events`; the other fields belong to the loop.
    """

    def __init__(self, plan: dict) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
        self._plan = LaunchPlan(**plan)
        self._lock = threading.Lock()
        self._events: deque[str] = deque(maxlen=50)
        self._retry_at: dict[int, float] = {}
        self._known: dict[int, str] = {}  # worker index -> actor id last seen (a dead one's record names its cause)
        self._checked: set[str] = set()  # actor ids whose worker config matches the plan
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reconcile", daemon=True)
        self._thread.start()

    def _event(self, text: str) -> None:
        log.info("%s", text)
        with self._lock:
            self._events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive a failed round of calls
                self._event(f"reconcile failed: {type(exc).__name__}: {exc}")
            self._stop.wait(RECONCILE_S)

    def reconcile(self) -> None:
        plan = self._plan
        existing = {worker_index(n): n for n in named_actors(plan.namespace) if worker_index(n) is not None}
        for index in range(plan.workers):
            if self._stop.is_set():
                return
            handle = lookup(existing[index], plan.namespace) if index in existing else None
            if handle is not None:
                self._keep(index, handle)
                continue
            if time.monotonic() < self._retry_at.get(index, 0.0):
                continue
            self._retry_at[index] = time.monotonic() + RECREATE_BACKOFF_S
            self._note_death(index)
            handle = start_worker(plan, index)
            self._known[index] = handle._actor_id.hex()
            self._event(f"started {WORKER_PREFIX}{index}")
        for index, name in sorted(existing.items()):
            handle = lookup(name, plan.namespace) if index >= plan.workers else None
            if handle is not None and not self._stop.is_set():
                report = retire(handle)
                self._event(f"retired {name} (--workers {plan.workers}): {describe_stop(report)}")

    def _keep(self, index: int, handle) -> None:
        """An existing worker actor: replace it once when it was made for another plan (coordinator, device...)."""
        actor_id = handle._actor_id.hex()
        self._known[index] = actor_id
        if actor_id in self._checked or gcs_record(handle).get("State") != "ALIVE":
            return
        info = call(handle, "info")
        if info is None:
            return
        if info["config"] == asdict(self._plan.worker_config(index)):
            self._checked.add(actor_id)
            return
        report = retire(handle)
        self._event(f"replaced {WORKER_PREFIX}{index}, made for another plan: {describe_stop(report)}")

    def _note_death(self, index: int) -> None:
        """Record why the actor last started for this slot is gone (killed for good, or failed at creation)."""
        from ray._private import state

        actor_id = self._known.pop(index, None)
        record = state.actors(actor_id=actor_id) if actor_id else {}
        if record:
            cause = str(record.get("DeathCause", "")).strip().replace("\n", " ")[:300]
            self._event(f"{WORKER_PREFIX}{index} is gone ({record.get('State')}): {cause or 'no cause recorded'}")

    def plan(self) -> dict:
        return asdict(self._plan)

    def events(self) -> list[str]:
        with self._lock:
            return list(self._events)

    def halt(self) -> None:
        """Stop reconciling (before the supervisor is killed, so it starts nothing meanwhile)."""
        self._stop.set()
        self._thread.join(timeout=STOP_TIMEOUT_S)


def describe_stop(report: dict | None) -> str:
    if report is None:
        return "it did not answer (not started, restarting or dead); killed"
    who = report.get("worker_id") or "no membership"
    if report.get("state") == FINISHED:
        return f"{who}: its run had finished"
    return f"{who} {'left the swarm' if report.get('left') else 'did not finish leaving in time'}"


def _pdeathsig() -> None:
    """In the coordinator's child process: get SIGTERM when the actor process dies (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class CoordinatorActor:
    """`rcswarm coordinator` as the child process of a detached actor pinned to the head node.

    The child gets SIGTERM when the actor's process dies, so a restarted actor never runs beside
    an old coordinator on the same state dir; the coordinator resumes from its state dir. The token
    comes from the head node's environment, like the workers'.
    """

    def __init__(self, config_text: str, state_dir: str, host: str, port: int, extra_args: list[str]) -> None:
        import ray

        self.folder = Path(tempfile.mkdtemp(prefix="rcswarm-coordinator-"))
        config = self.folder / "run.toml"
        config.write_text(config_text)
        port_file = self.folder / "port.json"
        self.log_path = self.folder / "coordinator.log"
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", state_dir,
                 "--host", host, "--port", str(port), "--port-file", str(port_file), *extra_args],
                stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + COORDINATOR_START_S
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the coordinator did not start (exit {self.process.poll()}):\n{self.log_tail()}")
            time.sleep(0.2)
        self.port = json.loads(port_file.read_text())["port"]
        self.host = host if host not in ("0.0.0.0", "::") else ray.util.get_node_ip_address()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def info(self) -> dict:
        return {"address": f"{self.host}:{self.port}", "pid": self.process.pid, "exit_code": self.process.poll()}

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.info()


def start_coordinator(namespace: str, config_text: str, state_dir: str, host: str, port: int, extra_args: list[str],
                      cpus: float) -> str:
    """Find or create the coordinator actor on the head node; its HOST:PORT for the workers."""
    import ray

    handle = ray.remote(CoordinatorActor).options(
        name=COORDINATOR, namespace=namespace, lifetime="detached", get_if_exists=True, max_restarts=-1,
        num_cpus=cpus, resources={"node:__internal_head__": 0.001}, max_concurrency=2,
    ).remote(config_text, state_dir, host, port, extra_args)
    info = call(handle, "info", timeout_s=COORDINATOR_START_S + CALL_TIMEOUT_S)
    if info is None:
        cause = str(gcs_record(handle).get("DeathCause", "")).strip()[-2000:]
        raise RuntimeError(f"the coordinator actor did not start: {cause or 'no answer'}")
    return info["address"]


@dataclass(frozen=True)
class ActorRow:
    """One actor of the namespace as `--status` shows it: Ray's view and, when it answers, the worker's."""

    name: str
    ray_state: str
    restarts: int
    pid: int
    info: dict | None
    pending: str = ""

    def worker_state(self) -> str:
        if self.info is None:
            return "—"
        state = self.info["state"]
        if state == TRAINING and not self.info["worker_id"]:
            return "joining"
        return state

    def key(self) -> tuple:
        """What a follower prints a new line for when it changes (not the step count)."""
        info = self.info or {}
        return self.ray_state, self.restarts, self.worker_state(), info.get("worker_id"), self.pending, info.get("problem")

    def line(self) -> str:
        info = self.info or {}
        text = (f"{self.name:<20} {self.ray_state:<18} {self.restarts:>8}  {self.worker_state():<9} "
                f"{info.get('worker_id') or '—':<14} {info.get('step', 0):>6}  {info.get('device', '—'):<7} "
                f"{info.get('cuda_visible_devices') or '—':<6} {info.get('host', '—')}/{info.get('pid', self.pid)}")
        if self.pending:
            text += f"\n{'':<20} pending: {self.pending}"
        if info.get("problem"):
            text += f"\n{'':<20} problem: {info['problem']}"
        return text


HEADER = (f"{'actor':<20} {'ray state':<18} {'restarts':>8}  {'worker':<9} {'worker id':<14} {'step':>6}  "
          f"{'device':<7} {'CUDA':<6} host/pid")


def collect_status(namespace: str) -> dict[str, Any]:
    """Every rcswarm actor of the namespace: Ray's state and restarts, the worker's own report, pending reasons."""
    import ray

    supervisor = lookup(SUPERVISOR, namespace)
    plan = call(supervisor, "plan") if supervisor is not None else None
    events = call(supervisor, "events") if supervisor is not None else None
    demand = LaunchPlan(**plan).demand() if plan else {}
    handles = {n: lookup(n, namespace) for n in named_actors(namespace) if worker_index(n) is not None}
    records = {n: gcs_record(h) for n, h in handles.items() if h is not None}
    infos = ask_all({n: handles[n] for n, r in records.items() if r.get("State") == "ALIVE"}, "info")
    rows = []
    for name in sorted(records, key=worker_index):
        record = records[name]
        state = record.get("State", "UNKNOWN")
        pending = pending_reason(demand, ray.nodes(), ray.available_resources()) if state in PENDING_STATES and demand else ""
        rows.append(ActorRow(name, state, int(record.get("NumRestarts", 0)), int(record.get("Pid", 0)), infos.get(name),
                             pending))
    coordinator = lookup(COORDINATOR, namespace)
    return {
        "namespace": namespace,
        "plan": plan,
        "supervisor": supervisor is not None,
        "coordinator_actor": call(coordinator, "info") if coordinator is not None else None,
        "workers": [asdict(r) for r in rows],
        "rows": rows,
        "events": events or [],
    }


def print_status(status: dict[str, Any]) -> None:
    plan = status["plan"]
    wanted = f"{plan['workers']} wanted, coordinator {plan['coordinator']}" if plan else "no supervisor (nothing reconciles)"
    print(f"namespace {status['namespace']}: {len(status['rows'])} worker actors; {wanted}")
    if status["coordinator_actor"]:
        print(f"coordinator actor: {status['coordinator_actor']}")
    print(HEADER)
    for row in status["rows"]:
        print(row.line())
    for event in status["events"][-10:]:
        print(f"  {event}")


def ensure_supervisor(plan: LaunchPlan):
    """The supervisor of this plan: kept when it already runs it, else the old one is replaced."""
    import ray

    existing = lookup(SUPERVISOR, plan.namespace)
    if existing is not None:
        if call(existing, "plan") == asdict(plan):
            return existing
        call(existing, "halt", timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
        ray.kill(existing, no_restart=True)
        wait(lambda: lookup(SUPERVISOR, plan.namespace) is None, CALL_TIMEOUT_S)
    return ray.remote(Supervisor).options(
        name=SUPERVISOR, namespace=plan.namespace, lifetime="detached", get_if_exists=True, max_restarts=-1,
        num_cpus=0, max_concurrency=4,
    ).remote(asdict(plan))


def wait(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


def stop_all(namespace: str) -> list[str]:
    """Remove every rcswarm actor of the namespace: the supervisor first (it would start them again),
    then each worker after it Leaves, then the coordinator actor. One line per actor."""
    import ray

    lines = []
    supervisor = lookup(SUPERVISOR, namespace)
    if supervisor is not None:
        call(supervisor, "halt", timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
        ray.kill(supervisor, no_restart=True)
        lines.append(f"{SUPERVISOR}: stopped")
    handles = {n: lookup(n, namespace) for n in named_actors(namespace) if worker_index(n) is not None}
    pending = {n: h for n, h in handles.items() if h is not None and gcs_record(h).get("State") in PENDING_STATES}
    reports = ask_all({n: h for n, h in handles.items() if h is not None and n not in pending}, "stop", STOP_TIMEOUT_S,
                      timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
    for name in handles:
        if name not in pending:
            lines.append(f"{name}: {describe_stop(reports.get(name))}")
    for name, handle in handles.items():
        if handle is not None:
            ray.kill(handle, no_restart=True)
        if name in pending:
            lines.append(f"{name}: never started; removed")
    coordinator = lookup(COORDINATOR, namespace)
    if coordinator is not None:
        info = call(coordinator, "stop", timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
        ray.kill(coordinator, no_restart=True)
        lines.append(f"{COORDINATOR}: stopped ({info})")
    return lines


def joined(status: dict[str, Any], wanted: int) -> bool:
    """Every wanted worker actor runs and holds a membership (or its run already ended)."""
    rows = [r for r in status["rows"] if worker_index(r.name) < wanted]
    return len(rows) == wanted and all(
        r.info is not None and (r.info["worker_id"] or r.info["state"] not in (STARTING, TRAINING)) for r in rows)


def ended(status: dict[str, Any], wanted: int) -> bool:
    """Every wanted worker's loop has ended (the run finished, or it failed or was stopped); with none
    wanted, once the last worker actor is gone."""
    if wanted == 0:
        return not status["rows"]
    rows = [r for r in status["rows"] if worker_index(r.name) < wanted]
    return len(rows) == wanted and all(
        r.info is not None and r.info["state"] not in (STARTING, TRAINING) for r in rows)


def follow(plan: LaunchPlan, poll_s: float, stop: threading.Event) -> int:
    """Print each actor's line when it changes until every worker's run ended (then remove the actors)."""
    shown: dict[str, tuple] = {}
    print(HEADER, flush=True)
    while not stop.wait(poll_s):
        status = collect_status(plan.namespace)
        for row in status["rows"]:
            if shown.get(row.name) != row.key():
                shown[row.name] = row.key()
                print(row.line(), flush=True)
        if ended(status, plan.workers):
            finished = all(r.info["state"] == FINISHED for r in status["rows"] if worker_index(r.name) < plan.workers)
            print("every worker's run has ended; removing the actors", flush=True)
            for line in stop_all(plan.namespace):
                print(line, flush=True)
            return 0 if finished else 1
    print(f"the launcher stops; the actors keep training. Stop them with: {PROG} --address ADDRESS "
          f"--namespace {plan.namespace} --stop", flush=True)
    return 130


def parser() -> argparse.ArgumentParser:
    parser = new_parser(PROG, "Run rcswarm workers as detached Ray actors on an existing Ray cluster, one per "
                              "--gpus-per-worker GPUs; Ray restarts them when they die.")
    parser.add_argument("--address", default="auto", help="the Ray cluster (ray.init address: auto, HOST:PORT, ray://...)")
    parser.add_argument("--namespace", default="rcswarm", help="Ray namespace of this swarm's actors (one per run)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="print the namespace's actors, worker ids, restarts and "
                                                            "pending reasons, then exit")
    what.add_argument("--stop", action="store_true", help="each worker leaves the swarm, then every actor of the "
                                                          "namespace is removed")
    parser.add_argument("--json", action="store_true", help="with --status: print JSON")
    parser.add_argument("--coordinator", default="", help="HOST:PORT of the coordinator the workers join")
    parser.add_argument("--workers", type=int, default=None, help="worker actors to keep running")
    parser.add_argument("--gpus-per-worker", type=float, default=1.0, help="GPUs of each worker actor (0: CPU workers)")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs of each worker actor")
    parser.add_argument("--device", default="auto", help="worker device: auto (the actor's GPU when it has one), cpu, cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: --cpus-per-worker rounded up)")
    parser.add_argument("--tls-ca", default="", help="PEM CA of the coordinator, a path on every Ray node; enables TLS")
    parser.add_argument("--tls-cert", default="", help="PEM client certificate on every Ray node (mutual TLS)")
    parser.add_argument("--tls-key", default="", help="PEM key of --tls-cert on every Ray node")
    parser.add_argument("--patience-s", type=float, default=300.0, help="how long a worker retries an unreachable coordinator")
    parser.add_argument("--detach", action="store_true", help="return once every worker has joined (or --start-timeout-s)")
    parser.add_argument("--start-timeout-s", type=float, default=300.0, help="with --detach: how long to wait for the joins")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between status checks while following")
    coordinator = parser.add_argument_group("a coordinator on the Ray head (instead of --coordinator)")
    coordinator.add_argument("--with-coordinator", action="store_true",
                             help="run the coordinator as a detached actor on the head node (it dies with the head)")
    coordinator.add_argument("--config", type=Path, help="RUN.toml of the run (read here, sent to the actor)")
    coordinator.add_argument("--state-dir", default="", help="state dir on the head node's persistent storage")
    coordinator.add_argument("--coordinator-host", default="0.0.0.0",
                             help="address the coordinator binds on the head (a non-loopback one needs TLS or "
                                  "--coordinator-arg=--insecure)")
    coordinator.add_argument("--coordinator-port", type=int, default=50051, help="gRPC port of the coordinator (0: any)")
    coordinator.add_argument("--coordinator-cpus", type=float, default=1.0, help="CPUs reserved for the coordinator")
    coordinator.add_argument("--coordinator-arg", action="append", default=[], metavar="ARG",
                             help="an extra `rcswarm coordinator` argument, e.g. --coordinator-arg=--insecure "
                                  "or --coordinator-arg=--tls-cert=/certs/tls.crt (repeat for each)")
    return parser


def plan_of(args: argparse.Namespace, coordinator: str) -> LaunchPlan:
    if args.workers is None:
        raise ValueError("--workers N is required to launch (or --status / --stop)")
    return LaunchPlan(
        coordinator=coordinator, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
        cpus_per_worker=args.cpus_per_worker, namespace=args.namespace, device=args.device, threads=args.threads,
        tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, patience_s=args.patience_s,
    )


def check_arguments(args: argparse.Namespace) -> str | None:
    """The first usage problem of a launch, or None."""
    if not NAMESPACE.match(args.namespace):
        return f"--namespace {args.namespace!r}: expected letters, digits, '_', '.', '-' (at most 63)"
    if args.status or args.stop:
        return None
    if args.with_coordinator:
        if args.coordinator:
            return "--coordinator and --with-coordinator exclude each other"
        if args.config is None or not args.state_dir:
            return "--with-coordinator needs --config RUN.toml and --state-dir DIR"
        if not args.config.is_file():
            return f"--config {str(args.config)!r}: no such file"
    elif not args.coordinator:
        return "--coordinator HOST:PORT is required (or --with-coordinator)"
    for flag, value in (("--poll-s", args.poll_s), ("--start-timeout-s", args.start_timeout_s)):
        if not (math.isfinite(value) and value > 0):
            return f"{flag} {value}: expected a number of seconds > 0"
    try:
        plan_of(args, args.coordinator or "head:0")
    except ValueError as exc:
        return str(exc)
    return None


def connect(address: str, namespace: str) -> None:
    import ray

    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)


def launch(args: argparse.Namespace) -> int:
    coordinator = args.coordinator
    if args.with_coordinator:
        from rcswarm.config.runspec import RunSpec

        RunSpec.from_toml(args.config)
        coordinator = start_coordinator(args.namespace, args.config.read_text(), args.state_dir, args.coordinator_host,
                                        args.coordinator_port, args.coordinator_arg, args.coordinator_cpus)
        print(f"coordinator actor serving on {coordinator}", flush=True)
    plan = plan_of(args, coordinator)
    ensure_supervisor(plan)
    print(f"{PROG}: {plan.workers} workers ({_resources(plan.demand())} each) in namespace {plan.namespace}, "
          f"joining {plan.coordinator}", flush=True)
    if not args.detach:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        return follow(plan, args.poll_s, stop)
    started = wait(lambda: joined(collect_status(plan.namespace), plan.workers), args.start_timeout_s, args.poll_s)
    print_status(collect_status(plan.namespace))
    if not started:
        print(f"{PROG}: not every worker joined within {args.start_timeout_s:g}s (see pending and problem lines); "
              "the supervisor keeps trying", file=sys.stderr)
        return 1
    return 0


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
    problem = check_arguments(args)
    if problem is not None:
        return usage_error(PROG, problem)
    try:
        import ray  # noqa: F401
    except ImportError:
        return usage_error(PROG, RAY_EXTRA)
    try:
        connect(args.address, args.namespace)
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
