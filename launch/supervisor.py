"""The supervisor of `rcswarm launch ray`: a detached actor that keeps the plan's worker actors running.

`Supervisor` reconciles every RECONCILE_S: it starts the missing `rcswarm-worker-<i>` for i < N (at
most once per RECREATE_BACKOFF_S per slot), replaces one made for another plan, and retires those
with i >= N (each Leaves, then is killed; a round's retirements, the replaced ones included, together: `retire_all`).
`ensure_supervisor` keeps the one that runs this plan, or replaces it (one another launch created at the same moment
too), so a restarted supervisor never goes back to an old count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict

from rcswarm.launch.actors import (
    CALL_TIMEOUT_S,
    PENDING_STATES,
    STOP_TIMEOUT_S,
    actor_record,
    call,
    describe_stop,
    gcs_record,
    lookup,
    named_actors,
    retire_all,
    start_worker,
    wait,
)
from rcswarm.launch.plan import SUPERVISOR, WORKER_PREFIX, LaunchPlan, resources, same_resources, worker_index

log = logging.getLogger("rcswarm.launch")
RECONCILE_S = 1.0
RECREATE_BACKOFF_S = 30.0


class Supervisor:
    """The detached actor reconciling the plan's worker count with the worker actors that exist.

    Threads: the reconcile loop runs on its own thread; `plan`, `events` and `halt` run on Ray's
    task threads (max_concurrency > 1). `_lock` guards `_events`; the other fields belong to the loop.
    """

    def __init__(self, plan: dict) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
        self._plan = LaunchPlan.from_dict(plan)
        self._lock = threading.Lock()
        self._events: deque[str] = deque(maxlen=50)
        self._retry_at: dict[int, float] = {}
        self._known: dict[int, str] = {}  # worker index -> actor id last seen (a dead one's record names its cause)
        self._checked: set[str] = set()  # actor ids whose worker config matches the plan
        self._started: set[str] = set()  # actor ids this supervisor created
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
        """One round: start the missing wanted workers, then retire together (`retire_all`: every stop asked at once,
        not one after another on this thread, each up to STOP_TIMEOUT_S + CALL_TIMEOUT_S) those made for another plan
        (`_keep`) and those beyond the plan's count."""
        plan = self._plan
        existing = {worker_index(n): n for n in named_actors(plan.namespace) if worker_index(n) is not None}
        replaced: dict[str, tuple[object, str]] = {}  # name -> (handle, why it is replaced)
        for index in range(plan.workers):
            if self._stop.is_set():
                return
            handle = lookup(existing[index], plan.namespace) if index in existing else None
            if handle is not None:
                reason = self._keep(index, handle)
                if reason is not None:
                    replaced[existing[index]] = (handle, reason)
                continue
            if time.monotonic() < self._retry_at.get(index, 0.0):
                continue
            self._retry_at[index] = time.monotonic() + RECREATE_BACKOFF_S
            self._note_death(index)
            handle = start_worker(plan, index)
            self._known[index] = handle._actor_id.hex()
            self._started.add(self._known[index])
            self._event(f"started {WORKER_PREFIX}{index}")
        extra = {name: lookup(name, plan.namespace) for index, name in sorted(existing.items()) if index >= plan.workers}
        going = {**{name: handle for name, (handle, _) in replaced.items()},
                 **{name: handle for name, handle in extra.items() if handle is not None}}
        if going and not self._stop.is_set():
            reports, _ = retire_all(going)
            for name in going:
                done = describe_stop(reports.get(name))
                self._event(f"replaced {name}, {replaced[name][1]}: {done}" if name in replaced
                            else f"retired {name} (--workers {plan.workers}): {done}")

    def _keep(self, index: int, handle) -> str | None:
        """An existing worker actor: why it is replaced (`replace_reason`: made for another plan, coordinator,
        device..., or waiting to start with another plan's resources), or None to keep it."""
        actor_id = handle._actor_id.hex()
        self._known[index] = actor_id
        if actor_id in self._checked:
            return None
        record = gcs_record(handle)
        info = call(handle, "info") if record.get("State") == "ALIVE" else None
        reason = replace_reason(self._plan, index, record, info, actor_id in self._started)
        if reason is None and info is not None:
            self._checked.add(actor_id)
        return reason

    def _note_death(self, index: int) -> None:
        """Record why the actor last started for this slot is gone (killed for good, or failed at creation)."""
        actor_id = self._known.pop(index, None)
        record = actor_record(actor_id) if actor_id else {}
        if record:
            cause = record.get("DeathCause", "").replace("\n", " ")[:300]
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


def replace_reason(plan: LaunchPlan, index: int, record: dict, info: dict | None, started_here: bool) -> str | None:
    """Why the supervisor of `plan` replaces worker actor `index`, or None to keep it (pure). `record` is its GCS
    record (`gcs_record`), `info` its answer when ALIVE, `started_here` whether this supervisor created it.

    A running actor made for another plan is replaced; one that has not answered yet is kept for now. A pending
    actor (Ray has not started it) cannot say what it was made for: it is replaced when the resources it waits
    for are not the plan's (an infeasible request waits forever), or, when Ray recorded none, unless this
    supervisor started it."""
    state = record.get("State")
    if state in PENDING_STATES:
        asked = record.get("RequiredResources")
        if asked:
            return None if same_resources(asked, plan.demand()) else (
                f"waiting for {resources(asked)} where the plan asks {resources(plan.demand())}")
        return None if started_here else "waiting to start for an earlier supervisor's plan"
    if state != "ALIVE" or info is None or plan.made(index, info):
        return None
    return "made for another plan"


# How many times `ensure_supervisor` replaces a supervisor of another plan before it gives up (launches racing on).
ENSURE_ATTEMPTS = 3


def _remove_supervisor(existing, namespace: str) -> None:
    """Halt and kill the supervisor `existing` (of another plan) and wait for its name to go: while it is still
    registered, get_if_exists would hand the dying supervisor back, leaving no supervisor at all."""
    import ray

    call(existing, "halt", timeout_s=STOP_TIMEOUT_S + CALL_TIMEOUT_S)
    ray.kill(existing, no_restart=True)
    if not wait(lambda: lookup(SUPERVISOR, namespace) is None, CALL_TIMEOUT_S):
        raise RuntimeError(f"the supervisor of another plan in namespace {namespace} was killed but its "
                           f"name is still registered after {CALL_TIMEOUT_S:g}s; run the launch again")


def ensure_supervisor(plan: LaunchPlan):
    """The supervisor of this plan: kept when it already runs it, else the old one is replaced.

    The one Ray hands back is asked for its plan too: another launch that created its own at the same moment (both
    found none) wins `get_if_exists`, and this launch got its plan silently, then exited 1 saying its workers had not
    joined (review of the Ray launcher, 2026-11-29). It is replaced as a later launch replaces an earlier one's, up to
    ENSURE_ATTEMPTS times (RuntimeError naming the plan that runs: launches keep racing). A new supervisor that does
    not answer yet (Ray is still starting it) is kept."""
    import ray

    wanted = asdict(plan)
    running = None
    for _ in range(ENSURE_ATTEMPTS):
        existing = lookup(SUPERVISOR, plan.namespace)
        if existing is not None:
            if call(existing, "plan") == wanted:
                return existing
            _remove_supervisor(existing, plan.namespace)
        handle = ray.remote(Supervisor).options(
            name=SUPERVISOR, namespace=plan.namespace, lifetime="detached", get_if_exists=True, max_restarts=-1,
            num_cpus=0, max_concurrency=4,
        ).remote(wanted)
        running = call(handle, "plan")
        if running is None or running == wanted:
            return handle
    raise RuntimeError(f"another launch keeps starting the supervisor of namespace {plan.namespace} with another plan "
                       f"({LaunchPlan.from_dict(running).describe()}) as this one replaces it, {ENSURE_ATTEMPTS} "
                       "times; run one launch at a time")
