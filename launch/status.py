"""What `rcswarm launch ray` shows and ends: the actors of a namespace (`collect_status`), `--stop`
(`stop_all`), and the launcher following its workers until their run ends (`follow`).

The decisions are pure functions of a status and the plan, each answering a `Verdict` (exit status and
reason) or None to go on: `joined` (is `--detach` done), `ended` (is the followed run over), each against the plan
the supervisor runs now (`running_plan`); `interrupted` and `interrupted_start` say what a launcher stopped by a
signal leaves behind."""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
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
    retire_all,
)
from rcswarm.launch.head import HeadWatch
from rcswarm.launch.plan import COORDINATOR, SUPERVISOR, WORKER_PREFIX, LaunchPlan, pending_reason, worker_index
from rcswarm.worker import FAILED, FINISHED, STOPPED, TRAINING

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
                info.get("problem"), info.get("retries", 0))

    def line(self) -> str:
        info = self.info or {}
        text = (f"{self.name:<20} {self.ray_state:<18} {self.restarts:>8}  {self.worker_state():<9} "
                f"{info.get('worker_id') or '—':<14} {info.get('step', 0):>6}  {info.get('device', '—'):<7} "
                f"{info.get('cuda_visible_devices') or '—':<6} {info.get('host', '—')}/{info.get('pid', self.pid)}")
        if self.pending:
            text += f"\n{'':<20} pending: {self.pending}"
        if info.get("problem"):
            text += f"\n{'':<20} problem: {info['problem']}"
        retries = info.get("retries", 0)
        if retries:  # the worker started again inside its actor (`RayWorker`), which Ray's restarts do not count
            text += (f"\n{'':<20} started again {retries} time{'' if retries == 1 else 's'} in this actor, the last "
                     f"after: {info.get('last_retry') or 'no reason given'}")
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
        asked = record.get("RequiredResources") or demand
        pending = (pending_reason(asked, ray.nodes(), ray.available_resources())
                   if state in PENDING_STATES and asked else "")
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


def coordinator_line(info: dict[str, Any]) -> str:
    """The coordinator actor's `info()` for people: where it serves, its process, its log, what stopped it."""
    code = info.get("exit_code")
    text = (f"{info.get('address') or 'not serving'}, pid {info.get('pid')}"
            + (f", exited with status {code}" if code is not None else "") + f"; log {info.get('log')}")
    return text + (f"\n  problem: {info['problem']}" if info.get("problem") else "")


def print_status(status: dict[str, Any]) -> None:
    plan = status["plan"]
    wanted = (f"{plan['workers']} wanted, coordinator {plan['worker']['coordinator']}" if plan
              else "no supervisor (nothing reconciles)")
    print(f"namespace {status['namespace']}: {len(status['rows'])} worker actors; {wanted}")
    if status["coordinator_actor"]:
        print(f"coordinator actor: {coordinator_line(status['coordinator_actor'])}")
    print(HEADER)
    for row in status["rows"]:
        print(row.line())
    for event in status["events"][-10:]:
        print(f"  {event}")


def stop_all(namespace: str) -> list[str]:
    """Remove every rcswarm actor of the namespace: the supervisor first (it would start them again),
    then each worker after it Leaves, then the coordinator actor. One line per actor.

    The workers' records are read once before the supervisor is touched: a driver that cannot read them
    fails before it leaves the workers without a supervisor."""
    import ray

    workers = {n: lookup(n, namespace) for n in named_actors(namespace) if worker_index(n) is not None}
    for handle in workers.values():
        if handle is not None:
            gcs_record(handle)
    lines = []
    supervisor = lookup(SUPERVISOR, namespace)
    if supervisor is not None:
        call(supervisor, "halt", timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
        ray.kill(supervisor, no_restart=True)
        lines.append(f"{SUPERVISOR}: stopped")
    handles = {n: lookup(n, namespace) for n in named_actors(namespace) if worker_index(n) is not None}
    reports, never = retire_all({n: h for n, h in handles.items() if h is not None})
    lines += [f"{name}: {describe_stop(reports.get(name))}" for name in handles if name not in never]
    lines += [f"{name}: never started; removed" for name in handles if name in never]
    coordinator = lookup(COORDINATOR, namespace)
    if coordinator is not None:
        info = call(coordinator, "stop", timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
        ray.kill(coordinator, no_restart=True)
        lines.append(f"{COORDINATOR}: stopped ({coordinator_line(info) if info else 'it did not answer; killed'})")
    return lines


@dataclass(frozen=True)
class Verdict:
    """A decision of the launcher about its workers: the exit status it leads to and why, in one line."""

    status: int
    reason: str


def running_plan(status: dict[str, Any], plan: LaunchPlan) -> LaunchPlan:
    """The plan the namespace's supervisor runs now (`status["plan"]`), else `plan` (pure): with no supervisor to ask,
    the plan last known. Another launch in the namespace replaces the plan (docs/DEPLOY.md: "scale: the same command,
    another N"), so a launcher's own plan may no longer be the one its actors are kept to."""
    return LaunchPlan.from_dict(status["plan"]) if status.get("plan") else plan


def replaced(status: dict[str, Any], plan: LaunchPlan) -> str | None:
    """What runs instead of `plan` when another launch replaced it (pure), in words; None while `plan` runs."""
    running = running_plan(status, plan)
    if running == plan:
        return None
    return (f"another launch replaced this plan: the supervisor of namespace {plan.namespace} now runs "
            f"{running.describe()}")


def _current(status: dict[str, Any], plan: LaunchPlan) -> dict[int, ActorRow]:
    """The wanted slots' actors that answer and were made for `plan` (an actor of another plan is being replaced)."""
    rows = {worker_index(r.name): r for r in status["rows"]}
    return {i: r for i, r in rows.items() if i < plan.workers and r.info is not None and plan.made(i, r.info)}


def _failures(rows: dict[int, ActorRow]) -> str:
    return "; ".join(f"{r.name} {r.info['state']}" + (f": {r.info['problem']}" if r.info.get("problem") else "")
                     for _, r in sorted(rows.items()))


def joined(status: dict[str, Any], plan: LaunchPlan) -> Verdict | None:
    """Whether `--detach` is done (pure): every wanted worker actor runs `plan` and holds a membership, or its run
    already finished (status 0); a worker of `plan` that failed or was stopped never joins (status 1, naming
    it); None while some are still starting, pending or being replaced. A plan another launch replaced meanwhile
    never joins either (status 1, naming the plan that runs: `replaced`); before, the launcher waited out
    --start-timeout-s and said its workers had not joined (review of the Ray launcher, 2026-11-29)."""
    other = replaced(status, plan)
    if other is not None:
        return Verdict(1, other)
    if plan.workers == 0:
        return Verdict(0, "no worker is wanted")
    current = _current(status, plan)
    failed = {i: r for i, r in current.items() if r.info["state"] in (FAILED, STOPPED)}
    if failed:
        return Verdict(1, f"a worker will not join: {_failures(failed)}")
    done = [i for i, r in current.items() if r.info["state"] == FINISHED
            or (r.info["state"] == TRAINING and r.info["worker_id"])]
    if len(done) == plan.workers:
        return Verdict(0, f"every worker joined ({plan.workers})")
    return None


def ended(status: dict[str, Any], plan: LaunchPlan) -> Verdict | None:
    """Whether the launcher's run is over (pure): every worker actor of `plan` that started has ended (its run
    finished, failed or was stopped) and every other wanted slot holds an actor Ray never started (pending: the
    ended ones may hold the resources it waits for, and a run that finished needs no more workers); status 0
    when every started worker finished. With no worker wanted, once the last worker actor is gone. None while a
    worker trains, starts, restarts, is missing or runs another plan (the supervisor replaces it).

    `plan` is the one the supervisor runs now (`running_plan`): after another launch scaled the run, the follower of
    the earlier plan never saw it end, and its actors stayed, holding their resources (review of the Ray launcher,
    2026-11-29)."""
    plan = running_plan(status, plan)
    if plan.workers == 0:
        return None if status["rows"] else Verdict(0, "no worker is wanted and none is left")
    current = _current(status, plan)
    over = {i: r for i, r in current.items() if r.info["state"] in (FINISHED, FAILED, STOPPED)}
    pending = sorted(worker_index(r.name) for r in status["rows"]
                     if worker_index(r.name) < plan.workers and r.ray_state in PENDING_STATES)
    if not over or len(over) + len(pending) < plan.workers:
        return None
    never = f"; never started: {', '.join(f'{WORKER_PREFIX}{i}' for i in pending)}" if pending else ""
    failed = {i: r for i, r in over.items() if r.info["state"] != FINISHED}
    if failed:
        return Verdict(1, f"every worker's run has ended, not every one finished: {_failures(failed)}{never}")
    return Verdict(0, f"every worker's run has ended, each {'started ' if pending else ''}one finished{never}")


def removed(status: dict[str, Any], plan: LaunchPlan) -> Verdict | None:
    """Whether the launcher's actors were removed from under it (pure): workers are wanted, and neither the
    supervisor nor a wanted worker actor (`rcswarm-worker-<i>`, i < N) is left (another driver's `--stop`, as the
    interrupt message advises). Before, `ended` waited for worker rows that would never come, and the launcher polled
    for ever; so it did while an actor of a slot beyond the plan was left, which no supervisor replaces by a wanted
    one (review of the Ray launcher, 2026-11-29). `plan`: the last one the supervisor ran (`follow` keeps it)."""
    plan = running_plan(status, plan)
    if plan.workers == 0 or status["supervisor"] or any(worker_index(r.name) < plan.workers for r in status["rows"]):
        return None
    return Verdict(1, f"the supervisor and every wanted worker actor of namespace {plan.namespace} are gone: removed "
                      "by another driver (`rcswarm launch ray --stop`?) or with the Ray cluster's state")


def stop_command(address: str, namespace: str) -> str:
    """The command that removes the namespace's actors, to print."""
    return f"{PROG} --address {shlex.quote(address)} --namespace {namespace} --stop"


def interrupted(status: dict[str, Any], plan: LaunchPlan, address: str, signal_name: str) -> str:
    """What a launcher stopped by a signal leaves behind, in words (pure): the detached actors stay, so say which."""
    plan = running_plan(status, plan)
    rows = status["rows"]
    states = [r.info["state"] if r.info else r.ray_state for r in rows]
    where = f"in namespace {plan.namespace}"
    actors = f"the {len(rows)} worker actor{'' if len(rows) == 1 else 's'}"
    if not rows and not status.get("supervisor"):
        return f"the launcher stops ({signal_name}); no rcswarm actor is left {where}"
    if not rows:
        left = f"no worker actor runs {where} yet, but its supervisor stays and starts {plan.workers}"
    elif all(state in (FINISHED, FAILED, STOPPED) for state in states):
        left = f"{actors} {where} have ended their runs but stay, holding their resources"
    else:
        training = sum(state == TRAINING for state in states)
        left = f"{actors} {where} stay ({training} training), kept by their supervisor"
    return f"the launcher stops ({signal_name}); {left}. Remove them with: {stop_command(address, plan.namespace)}"


def interrupted_start(names: list[str], namespace: str, address: str, signal_name: str, step: str) -> str:
    """What a launcher stopped by a signal while `step` (starting the coordinator actor, the supervisor) leaves
    behind, in words (pure; `names`: the namespace's named actors, `named_actors`): the detached actors made so far
    stay, and go on starting, so say which and how to remove them. Before, SIGTERM there ended the launcher with Ray's
    own dump and SIGINT with "interrupted", the coordinator actor left running unsaid (review of the Ray launcher,
    2026-11-29)."""
    workers = sum(worker_index(name) is not None for name in names)
    left = [name for name in (COORDINATOR, SUPERVISOR) if name in names]
    where = f"in namespace {namespace}"
    if not left and not workers:
        return f"the launcher stops ({signal_name}) while {step}; no rcswarm actor is left {where}"
    stay = "stays" if len(left) + workers == 1 else "stay"
    left += [f"{workers} worker actor{'' if workers == 1 else 's'}"] if workers else []
    return (f"the launcher stops ({signal_name}) while {step}; {' and '.join(left)} {stay} {where} (detached: what "
            f"was starting goes on). Remove them with: {stop_command(address, namespace)}")


def follow(plan: LaunchPlan, poll_s: float, stop: threading.Event, watch: HeadWatch | None = None) -> Verdict | None:
    """Print each actor's line when it changes, and the supervisor's new events, until the run is over (`ended`:
    then remove the actors and return the verdict) or `stop` is set (None: the actors stay, see `interrupted`).
    With `watch`, every poll runs under it: HeadLost once the Ray head answers nothing (launch/head.py), instead of
    Ray ending the process a minute later with its own message.

    The run is judged by the plan the supervisor runs now (`running_plan`): once another launch replaced `plan` (a
    scale, docs/DEPLOY.md), the follower says so once and follows the new plan to its end."""
    shown: dict[str, tuple] = {}
    seen: set[str] = set()
    gone = 0  # polls in a row that found no wanted actor left (`removed`): two, so a supervisor Ray restarts is no end

    def watched(poll: Callable[[], Any]) -> Any:
        return poll() if watch is None else watch.run(poll, stop)

    print(HEADER, flush=True)
    while not stop.wait(poll_s):
        status = watched(lambda: collect_status(plan.namespace))
        if status is None:  # stopped while a poll waited
            return None
        other = replaced(status, plan)
        if other is not None:
            plan = running_plan(status, plan)
            print(f"{other}: following it", flush=True)
        lost = removed(status, plan)
        gone = gone + 1 if lost is not None else 0
        if lost is not None and gone >= 2:
            print(lost.reason, flush=True)
            return lost
        for row in status["rows"]:
            if shown.get(row.name) != row.key():
                shown[row.name] = row.key()
                print(row.line(), flush=True)
        for event in status["events"]:
            if event not in seen:
                seen.add(event)
                print(f"  supervisor: {event}", flush=True)
        verdict = ended(status, plan)
        if verdict is not None:
            print(f"{verdict.reason}; removing the actors", flush=True)
            for line in watched(lambda: stop_all(plan.namespace)) or []:
                print(line, flush=True)
            return verdict
    return None
