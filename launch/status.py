"""What `rcswarm launch ray` shows and ends: the actors of a namespace (`collect_status`), `--stop`
(`stop_all`), and the launcher following its workers until their run ends (`follow`)."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

from rcswarm.launch.actors import (
    CALL_TIMEOUT_S,
    PENDING_STATES,
    STOP_TIMEOUT_S,
    ask_all,
    call,
    describe_stop,
    gcs_record,
    lookup,
    named_actors,
)
from rcswarm.launch.plan import COORDINATOR, SUPERVISOR, LaunchPlan, pending_reason, worker_index
from rcswarm.worker import FINISHED, STARTING, TRAINING

PROG = "rcswarm launch ray"


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
        return (self.ray_state, self.restarts, self.worker_state(), info.get("worker_id"), self.pending,
                info.get("problem"))

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
    demand = LaunchPlan.from_dict(plan).demand() if plan else {}
    handles = {n: lookup(n, namespace) for n in named_actors(namespace) if worker_index(n) is not None}
    records = {n: gcs_record(h) for n, h in handles.items() if h is not None}
    infos = ask_all({n: handles[n] for n, r in records.items() if r.get("State") == "ALIVE"}, "info")
    rows = []
    for name in sorted(records, key=worker_index):
        record = records[name]
        state = record.get("State", "UNKNOWN")
        pending = (pending_reason(demand, ray.nodes(), ray.available_resources())
                   if state in PENDING_STATES and demand else "")
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
    wanted = (f"{plan['workers']} wanted, coordinator {plan['worker']['coordinator']}" if plan
              else "no supervisor (nothing reconciles)")
    print(f"namespace {status['namespace']}: {len(status['rows'])} worker actors; {wanted}")
    if status["coordinator_actor"]:
        print(f"coordinator actor: {status['coordinator_actor']}")
    print(HEADER)
    for row in status["rows"]:
        print(row.line())
    for event in status["events"][-10:]:
        print(f"  {event}")


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
    """Every wanted worker actor runs the current plan and holds a membership (or its run already ended): an actor
    made for another plan, ending while the supervisor replaces it, is not one of them."""
    plan = LaunchPlan.from_dict(status["plan"]) if status.get("plan") else None
    rows = [r for r in status["rows"] if worker_index(r.name) < wanted]

    return len(rows) == wanted and all(
        r.info is not None and (plan is None or plan.made(worker_index(r.name), r.info))
        and (r.info["worker_id"] or r.info["state"] not in (STARTING, TRAINING)) for r in rows)


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
