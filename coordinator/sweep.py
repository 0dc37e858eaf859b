"""Runs in one coordinator: a sweep's runs, which differ in sequence length (and batch), or one run.

`RunGroup` is the one coordinator interface the gRPC server and the dashboard talk to. Each
run of `RunSpec.sweep_runs()` is a full `SwarmCoordinator` with its own global parameters,
outer optimizer, rounds and state directory: the state dir itself for a single run (a group
of one, which answers exactly as its run), `<state-dir>/run<i>-L<L>` for a sweep. The group
routes every RPC to the run its worker belongs to and schedules a sweep's workers across runs:

* Join assigns a worker to the unfinished run with room that has the fewest active workers (equal
  share of wall time by default), `decide_assignment`; with every unfinished run full the join is refused
  RESOURCE_EXHAUSTED with the place-retry trailer, and the worker waits for a place (`waiting` counts it);
  a worker joining again after a restart or an
  eviction names the run it trained for (JoinRequest.run_id) and goes back there while that run is
  unfinished and has room, unless the sweep itself moved it off that run (its previous membership
  is REASSIGNED there), so its round's update and metric rows still find their run. Both count only when the join
  names its previous membership with that membership's worker secret (`previous_worker_secret`, `RunGroup._claimed`);
  otherwise it is placed, and joins its run, as a worker naming none.
* A worker that cannot train the run it was placed in (its model or windows above the worker's limits, its
  dataset outside the worker's data root) leaves it and joins again naming it (JoinRequest.refused_run_ids):
  it is placed in none of the runs it names, nor moved toward one (`refused_runs`, `without`); a join whose
  refused runs are all the unfinished ones is refused FAILED_PRECONDITION, and the worker ends naming why.
  A group of one refuses the join of a worker that refused its run.
* A push to a run that finished or was stopped, while another goes on, moves its worker at once (NOT_FOUND),
  as a heartbeat or a long poll of it does.
* At a round boundary (right after a worker's update is accepted, or when its run has
  finished its rounds) `decide_move` may move it: the worker's membership in its run ends
  with state REASSIGNED, its next call gets NOT_FOUND, and it joins again, landing on the
  emptiest run. Its accepted update stays in the round it was sent to.
* The sweep is finished when every run is; only then do workers hear RUN_STATE_FINISHED.
* Forecasts (issue #30): the ticker refits each run's law when its version changes (`forecasts.forecast_record`,
  stored in its state dir, so they survive a restart); with `[sweep] prune` it then applies `decide_prune`:
  a pruned run is stopped (`SwarmCoordinator.stop`, finished from then on), so its workers move as a
  finished run's do, and every run's reason is a `prune` event in its store. The fractions decided are kept by value
  (`prune_decided`), so a restart with another `prune_at` decides only its fractions above the largest one decided.
* The wall-time budget (`[run] minutes`): the ticker ends a run whose budget is used as a pruned run is ended; a
  start whose spec's budget no longer ends a run so ended (raised or unset on the restart) lifts that stop
  (`forecasts.decide_budget_resume`, `SwarmCoordinator.lift_stop`), as a raised `run.rounds` resumes a finished run.
  The budget's clock is the time the run was served since its first round opened (`RunGroup._budget_elapsed`, the
  one reading of it, for the budget's end and its lifting, pruning at fractions of `run.minutes` and the
  forecasts' pace): the seconds served in earlier launches on its state dir (`served_before`, read at the start)
  plus those since the opening of the first round this launch closed (its first pull), so the time the coordinator
  was down, and a restarted one's wait for its first worker, count for nothing.

Identity: a worker id names one membership of one run (a sweep's ids carry the run's prefix),
so the group routes a call by its id and the run checks its worker secret (`SwarmCoordinator.
_authenticated`); a call without a secret is refused before routing. A worker moved to another
run joins again there and gets a new id and secret; its old run still takes the metrics of its
old membership under the old secret.

Both decisions are pure functions of the runs' loads returning a reason, like the rest of
the coordinator's decisions.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from rcswarm.config.runspec import MAX_RUN_ID_CHARS, RunSpec
from rcswarm.coordinator import decisions, forecasts
from rcswarm.coordinator.guards import call_time_left
from rcswarm.coordinator.intake import first_part, require_secret
from rcswarm.coordinator.records import Refusal, Reservation, Waiting
from rcswarm.coordinator.resume import lost_store_problem
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.observe.forecast import was_pruned
from rcswarm.observe.report import first_joins, served_periods
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import MAX_REFUSED_RUNS, REFUSED_RUNS_REFUSAL
from rcswarm.state.lock import StateDirLock
from rcswarm.state.records import ForecastRecord
from rcswarm.state.store import StateStore

# run_state: the budget's clock (`RunGroup._budget_elapsed`, seconds served) when the wall-time budget ended the run,
# stored with its stop: a start reads it as the least the run was served before (`served_before`), since a launch's
# served period ends at its last metric row, which may come before the stop.
SERVED_AT_STOP_KEY = "budget_served_s"
# A refused join names at most this many of the sweep's ended runs with why each ended (`decide_assignment`).
MAX_ENDED_NAMED = 8
# The words of a stop's reason a refused join quotes for one run, at most (`ended_why`).
ENDED_WHY_CHARS = 60


@dataclass(frozen=True)
class RunLoad:
    """A run as the sweep's decisions see it: its position, name, active workers (with those moved toward it that
    have not joined it yet), whether it finished, whether it is full, and why it was stopped ("": not stopped)."""

    index: int
    name: str
    active: int
    finished: bool
    full: bool = False
    stopped: str = ""


def decide_assignment(loads: Sequence[RunLoad], returning: int | None = None) -> tuple[int | None, str]:
    """The run a joining worker goes to: back to `returning` (the run it trained for, when it may go back)
    while that run is unfinished and not full, else the unfinished run with room that has the fewest active
    workers; None when every run finished or every unfinished run is full (the reason says which)."""
    unfinished = [load for load in loads if not load.finished]
    if not unfinished:
        return None, f"every run of the sweep has ended: {ended_runs(loads)}"
    candidates = [load for load in unfinished if not load.full]
    if not candidates:
        taken = ", ".join(f"{load.name} ({load.active} active)" for load in unfinished)
        return None, f"every unfinished run of the sweep is full: {taken}"
    if returning is not None:
        back = loads[returning]
        if not (back.finished or back.full):
            return back.index, f"back to {back.name}, the run it trained for ({back.active} active workers)"
    best = min(candidates, key=lambda load: (load.active, load.index))
    return best.index, f"assigned to {best.name} ({best.active} active workers, the fewest among unfinished runs)"


def ended_runs(loads: Sequence[RunLoad]) -> str:
    """The finished runs of `loads`, each with why it ended in a few words (`ended_why`), the first MAX_ENDED_NAMED
    named and the rest counted, so that a refused join says why the sweep has no run left for it (pure)."""
    ended = [ended_why(load) for load in loads if load.finished]
    more = f", and {len(ended) - MAX_ENDED_NAMED} more" if len(ended) > MAX_ENDED_NAMED else ""
    return ", ".join(ended[:MAX_ENDED_NAMED]) + more


def ended_why(load: RunLoad) -> str:
    """A finished run's name and why it ended, in at most ENDED_WHY_CHARS characters of its stop's reason: pruned
    with where (the reason up to its first ": "), its wall-time budget (up to its first " ("), or its rounds done."""
    if not load.stopped:
        return f"{load.name} finished its rounds"
    if was_pruned(load.stopped):
        return f"{load.name} pruned {_clipped(load.stopped.split(': ')[0])}"
    return f"{load.name} {_clipped(load.stopped.split(' (')[0])}"


def _clipped(text: str) -> str:
    """`text` cut to ENDED_WHY_CHARS characters, an ellipsis saying where."""
    return text if len(text) <= ENDED_WHY_CHARS else text[: ENDED_WHY_CHARS - 1] + "…"


def refused_runs(request: pb.JoinRequest, runs: Sequence[Any]) -> frozenset[int]:
    """The positions of `runs` (each with a `run_id`) that the joining worker names as refused
    (`request.refused_run_ids`; an id of no run here excludes nothing). INVALID_ARGUMENT for more than
    MAX_REFUSED_RUNS names or one longer than a run id can be: before, names past the 64th were dropped unsaid."""
    named = request.refused_run_ids
    if len(named) > MAX_REFUSED_RUNS:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"join refused: refused_run_ids names {len(named)} runs: "
                                                        f"expected at most {MAX_REFUSED_RUNS}")
    for position, run_id in enumerate(named):
        if len(run_id) > MAX_RUN_ID_CHARS:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"join refused: refused_run_ids[{position}] has "
                                                            f"{len(run_id)} characters: expected a run id of at most "
                                                            f"{MAX_RUN_ID_CHARS}")
    refused = set(named)
    return frozenset(index for index, run in enumerate(runs) if run.run_id in refused)


def without(loads: Sequence[RunLoad], refused: frozenset[int]) -> list[RunLoad]:
    """`loads` as a worker that refused the runs at `refused` sees them: those count as finished (it goes to none)."""
    return [dataclasses.replace(load, finished=True) if load.index in refused else load for load in loads]


def decide_move(loads: Sequence[RunLoad], current: int) -> tuple[bool, str]:
    """At a round boundary: leave `current` if it finished (the reason says why: stopped, with its stop's reason, or
    its rounds done), or if it has 2+ more workers than the emptiest run."""
    here, emptiest = loads[current], emptiest_other(loads, current)
    if emptiest is None:
        return False, f"{here.name}: no other unfinished run with room"
    if here.finished:
        why = f"was stopped ({here.stopped})" if here.stopped else "finished its rounds"
        return True, f"{here.name} {why}; moving toward {emptiest.name}"
    if here.active - emptiest.active >= 2:
        return True, f"{here.name} has {here.active} active workers, {emptiest.name} {emptiest.active}: rebalancing"
    return False, f"{here.name}: balanced ({here.active} vs {emptiest.active})"


def emptiest_other(loads: Sequence[RunLoad], current: int) -> RunLoad | None:
    """The unfinished run with room other than `current` with the fewest workers (the first of equals), or None (a
    worker moved toward a full run was placed back where it came from)."""
    others = [load for load in loads if not (load.finished or load.full) and load.index != current]
    return min(others, key=lambda load: (load.active, load.index)) if others else None


def run_state_dir(state_dir: Path, index: int, spec: RunSpec) -> Path:
    """The state dir of run `index` (of spec `spec`, one of `sweep_runs()`) of a sweep below `state_dir`."""
    return state_dir / f"run{index}-L{spec.data.seq_len}"


def run_state_dirs(spec: RunSpec, state_dir: Path) -> list[tuple[RunSpec, Path]]:
    """Each run of `spec.sweep_runs()` with its state dir: a single run's is `state_dir` itself, a
    sweep's run<i>-L<L> below it. The one place that knows the layout (the launcher reads it too)."""
    if not spec.is_sweep:
        return [(spec, Path(state_dir))]
    return [(run, run_state_dir(Path(state_dir), index, run)) for index, run in enumerate(spec.sweep_runs())]


def held_runs(state_dir: Path) -> list[str]:
    """The runs a state dir holds, by where their state.sqlite is: "." (a single run's, the state dir itself) and
    each run<i>-L<L> below it (a sweep's)."""
    state_dir = Path(state_dir)
    held = ["."] if (state_dir / "state.sqlite").is_file() else []
    return held + sorted(db.parent.name for db in state_dir.glob("run*-L*/state.sqlite"))


def _described(runs: Sequence[str]) -> str:
    """Runs as `held_runs` names them, in words."""
    if list(runs) == ["."]:
        return "one run (state.sqlite in the state dir itself)"
    return f"a sweep's runs {', '.join(runs)}"


def layout_problem(spec: RunSpec, state_dir: Path) -> str | None:
    """Why `spec` cannot resume `state_dir`: the config describes other runs than the state dir holds (a sweep's
    lengths, or a sweep against a single run); None for a new state dir or the same runs (whose specs `resume`
    then compares key by key)."""
    held = held_runs(state_dir)
    wanted = ["." if path == Path(state_dir) else path.name for _, path in run_state_dirs(spec, state_dir)]
    if not held or held == wanted:
        return None
    changes = ""
    if "." not in held + wanted:
        gone = ", ".join(run for run in held if run not in wanted) or "none"
        new = ", ".join(run for run in wanted if run not in held) or "none"
        changes = f" (not in the config: {gone}; new in the config: {new})"
    return (f"state dir {state_dir} holds {_described(held)}, but the config describes {_described(wanted)}{changes}; "
            "use a new --state-dir, or the config the state dir was made with")


def lock_state_dirs(spec: RunSpec, state_dir: Path) -> list[StateDirLock]:
    """Lock the state dir and each run's (`run_state_dirs`) for this process, so that no second coordinator opens
    any of them; StateDirBusy (nothing left locked) when another process holds one."""
    locks: list[StateDirLock] = []
    try:
        for path in dict.fromkeys([Path(state_dir), *(path for _, path in run_state_dirs(spec, state_dir))]):
            locks.append(StateDirLock.acquire(path))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def build_runs(spec: RunSpec, state_dir: Path, clock: Callable[[], float] = time.time) -> list[SwarmCoordinator]:
    """The coordinators of `spec.sweep_runs()` in their state dirs (`run_state_dirs`); ValueError when the state dir
    holds other runs than `spec` describes (`layout_problem`)."""
    problem = layout_problem(spec, state_dir)
    problems = [problem] + [lost_store_problem(run_dir) for _, run_dir in run_state_dirs(spec, state_dir)]
    problem = next((problem for problem in problems if problem is not None), None)
    if problem is not None:
        raise ValueError(problem)
    runs = []
    for index, (run_spec, run_dir) in enumerate(run_state_dirs(spec, state_dir)):
        prefix = f"r{index}" if spec.is_sweep else ""
        store = StateStore(run_dir, run_spec.coordinator.keep_checkpoints, run_spec.coordinator.durable)
        runs.append(SwarmCoordinator(run_spec, store, clock, worker_prefix=prefix))
    return runs


class RunGroup:
    """The coordinator interface over the runs of a sweep, or over one run (a group of one).

    A group of one answers exactly as its run (its run id, its status); a sweep's group assigns
    joining workers, moves them between runs at round boundaries, and reports the sweep's
    aggregate status with one RunSummary per run.

    Threads and locks: the RPC methods are called from gRPC handler threads, `tick` from the
    server's ticker thread, `status` also from the dashboard's. `waiting` (the workers refused a place
    lately) has its own lock, a leaf: nothing taken while it is held. `_lock` orders the placements of joins and
    move decisions, so two joins never both count a run as the emptiest (a join placed but not seated holds its
    place, `_placing`); it is taken before a run's own lock (the group calls `load` of its runs while holding it),
    never while a run's lock is held, and never held across a store write: a run's `join` (which writes its store
    between two holds of the run's lock) runs after the group lock is released. Routing a call (`_index_of`,
    `owns_credential`) and checking the membership a join names (`_claimed`) take neither the group's lock nor a
    run's (the runs' snapshots; `_claimed` may read a run's store). Every other method routes the call to its run
    without the group's lock; the run takes its own (see SwarmCoordinator). The forecasts (`_forecast`, `_prune`)
    are the ticker's alone: it replaces `latest[i]` whole, which `status` reads as a snapshot from any thread.
    """

    def __init__(self, spec: RunSpec, runs: Sequence[SwarmCoordinator]) -> None:
        """Group `runs`, one per `spec.sweep_runs()` in that order."""
        expected = len(spec.sweep_runs())
        if len(runs) != expected:
            raise ValueError(f"a run group of {spec.run.name!r} got {len(runs)} runs: expected {expected}, one per sweep run")
        self.spec = spec
        self.runs = list(runs)
        # A sweep's group places workers among its runs and reports their aggregate; a group of one is its run.
        self.sweep = spec.is_sweep
        self._lock = threading.Lock()
        # Workers refused a place lately (their joins; any thread, its own lock), for `status`.
        self.waiting = Waiting()
        # Each run's newest forecast (restored from its store) and the version it was made at.
        self.latest: list[ForecastRecord | None] = [(run.store.forecasts() or [None])[-1] for run in self.runs]
        self._forecast_at = [-1 if record is None else record.version for record in self.latest]
        self.prune_options = forecasts.PruneOptions(spec.sweep.prune, tuple(spec.sweep.prune_at), spec.run.rounds,
                                                    spec.run.minutes * 60.0)
        # The wall-time budget's clock (`_budget_elapsed`), read once now: the seconds each run was served in earlier
        # launches on its state dir, whether it closed a round then, and the version of its first round this launch
        # (its open round), whose opening is read once that round closed (`_opened_this_launch`).
        self._served_before = [served_before(run.store) for run in self.runs]
        self._closed_before = [run.store.rounds_summary().count > 0 for run in self.runs]
        self._launch_version = [run.round.version for run in self.runs]
        self._launch_opened: list[float | None] = [None] * len(self.runs)
        # How many pruning decisions were taken (each run's store keeps the count: the number of the newest, which
        # marks its application, `prune_applied`), and the fractions of the budget they decided, by value
        # (`prune_decided`; `forecasts.fractions_decided` reads them against the `prune_at` in use).
        self.prune_done = max(int(run.store.get("prune_done") or 0) for run in self.runs)
        self.prune_decided = decided_fractions(self.runs, spec.sweep.prune_at)
        # Workers moved off a run toward another (worker id → (that run's index, until when it counts there)), and
        # the joins placed in a run whose `join` has not returned (`join`; each counted there until its membership is
        # seated, `SwarmCoordinator.load`); the group lock guards both lists (a reservation's `seated`, the run's lock).
        self._arriving: dict[str, tuple[int, float]] = {}
        self._placing: list[Reservation] = []
        # The runs each membership's worker refused (worker id → their positions; its join's `refused_run_ids`), so
        # that no move sends it to one; kept while some run knows the id. The group lock guards it.
        self._refused: dict[str, frozenset[int]] = {}
        # The `prune_done` whose decision every run has applied (-1: not checked since the start; `_apply_prune`).
        self._prune_applied = -1
        self._lift_lapsed_budget_stops()

    @classmethod
    def of(cls, coordinator: SwarmCoordinator | RunGroup) -> RunGroup:
        """`coordinator` itself if it is a group, else the group of that one run."""
        return coordinator if isinstance(coordinator, RunGroup) else cls(coordinator.spec, [coordinator])

    @property
    def run_id(self) -> str:
        """The run's id for a group of one, the sweep's name for a sweep (any thread)."""
        return self.spec.run.name if self.sweep else self.runs[0].run_id

    @property
    def version(self) -> int:
        """The lowest version of the runs (any thread)."""
        return min(run.version for run in self.runs)

    @property
    def finished(self) -> bool:
        """Whether every run finished (any thread)."""
        return all(run.finished for run in self.runs)

    def versions_text(self) -> str:
        """Every run with its version, for log lines: "run R at version V, ..." (any thread)."""
        return ", ".join(f"run {run.run_id} at version {run.shown_version}" for run in self.runs)

    def close(self) -> None:
        """Close every run's store; once the server and the ticker have stopped."""
        for run in self.runs:
            run.close()

    def _loads(self, taking_over: str = "") -> list[RunLoad]:
        """Every run's load, counting the workers moved toward it that have not joined yet and the joins placed there
        whose membership is not seated yet (group lock held; takes each run's lock in turn): without them a second
        worker was moved off a run only to be sent back to it. A run is full when its places are. A join's place,
        the run's members and its places are read under one hold of the run's lock (`SwarmCoordinator.load`): before,
        a member seated and its place, dropped only once its `join` returned, were both counted meanwhile, and a
        placement near `coordinator.max_workers` was refused for a moment. `taking_over`: the membership the join
        being placed names with its secret (`_claimed`), whose held place it takes over, not counted against it."""
        now = self.runs[0].clock()
        self._arriving = {worker: (index, until) for worker, (index, until) in self._arriving.items() if until > now}
        self._placing = [held for held in self._placing if held.until > now]
        loads = []
        for i, run in enumerate(self.runs):
            active, places, placing = run.load([held for held in self._placing if held.run == i], taking_over)
            arriving = sum(1 for index, _ in self._arriving.values() if index == i) + placing
            # Full counts the places ended memberships' updates hold in the open round too (`decide_place`): a join
            # sent there would be refused until that round closes while another run has room.
            full = places + arriving >= run.spec.coordinator.max_workers
            loads.append(RunLoad(i, run.spec.run.name, active + arriving, run.finished, full, run.stopped or ""))
        return loads

    def owns_credential(self, worker_id: str, secret: bytes) -> bool:
        """Whether some run has `worker_id` as an active member with the worker secret `secret` (a handler
        thread, from the server's guard; takes no lock: each run's `owns_credential` reads a snapshot, so a run whose
        lock is held, a slow write under it, stalls no call of another run's worker)."""
        return any(run.owns_credential(worker_id, secret) for run in self.runs)

    def _index_of(self, what: str, worker_id: str, secret: bytes) -> int:
        """The run `worker_id` joined (no lock: each run's `knows` reads a snapshot); UNAUTHENTICATED without a worker
        secret, NOT_FOUND if no run knows the id. The run itself checks that the secret is the id's."""
        require_secret(what, worker_id, secret)
        for index, run in enumerate(self.runs):
            if run.knows(worker_id):
                return index
        raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is unknown here; join again")

    def _group_state(self) -> int:
        """The state workers hear: finished once every run is (any thread)."""
        return pb.RUN_STATE_FINISHED if self.finished else pb.RUN_STATE_RUNNING

    def _claimed(self, request: pb.JoinRequest) -> str:
        """The membership `request` names when a run vouches for it (`SwarmCoordinator.claim`: named with its own
        worker secret), else "" (no lock: each run reads a snapshot of one entry and its store's read connection,
        which waits for no commit; the digest of an id never changes, so the answer stays true while the join is
        placed). The run the join says it trained for (`run_id`) is asked first. The run that knows the id logs a
        refused name."""
        if not request.previous_worker_id:
            return ""
        named_first = sorted(self.runs, key=lambda run: run.run_id != request.run_id)  # the run it says it trained for
        return next((previous for run in named_first if (previous := run.claim(request))), "")

    def _reservation_s(self) -> float:
        """How long a sweep's join placed in a run counts there at most (`Reservation.until`): two leases, or the
        time left to the join call's deadline if longer (a join may wait that long for the run's other joins, a close
        or its write; its `finally` drops it when it ends, this bounds one stuck for good) (any thread)."""
        return max(2 * self.spec.coordinator.lease_s, call_time_left() or 0.0)

    def _returning(self, request: pb.JoinRequest, previous: str) -> int | None:
        """The run a re-joining worker may go back to (group lock held; no run's lock, `membership_state`): the one
        whose id it names, when it named its previous membership with that membership's secret (`previous`, from
        `_claimed`), unless that run moved it off (that membership is REASSIGNED there)."""
        if not previous:
            return None
        for index, run in enumerate(self.runs):
            if request.run_id and run.run_id == request.run_id:
                moved = run.membership_state(previous) == pb.WORKER_STATE_REASSIGNED
                return None if moved else index
        return None

    def _place(self, request: pb.JoinRequest, refused: frozenset[int], previous: str) -> tuple[int, str]:
        """The run a joining worker goes to and why (group lock held). A group of one sends every join
        to its run, whose admission alone decides (reason ""); a sweep refuses once every run finished, or every
        unfinished run is one the worker refused (`refused`, its `refused_run_ids`: it cannot train them).
        `previous`: the membership the join named with its secret (`_claimed`), or "": only then is a moved worker's
        place toward its run handed over, is it sent back to the run it names, and does the place its ended
        membership's update holds there count as its own (a full run takes it back)."""
        if not self.sweep:
            if refused:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{REFUSED_RUNS_REFUSAL}run {self.runs[0].run_id}, the only one here")
            return 0, ""
        if previous:
            self._arriving.pop(previous, None)  # a moved worker arriving: placed as one of the others
        loads = without(self._loads(previous), refused)
        index, reason = decide_assignment(loads, self._returning(request, previous))
        if index is None and refused and all(load.finished for load in loads) and not self.finished:
            names = ", ".join(self.runs[i].spec.run.name for i in sorted(refused))
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{REFUSED_RUNS_REFUSAL}{names}, and the sweep has no other unfinished run")
        if index is None and all(load.finished for load in loads):
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"join refused: {reason}")
        if index is None:
            wait_s = min(decisions.place_retry_s(run.membership) for run in self.runs)
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"join refused: {reason}", place_retry_s=wait_s)
        return index, reason

    def _maybe_move(self, worker_id: str, index: int) -> str:
        """Move the worker off its run when `decide_move` says so; it then joins again (takes the group lock, then
        releases it). Why it stays ("" when it moved)."""
        with self._lock:
            loads = without(self._loads(), self._refused.get(worker_id, frozenset()))
            move, reason = decide_move(loads, index)
            target = emptiest_other(loads, index) if move else None
            if target is not None:  # counted there until it joins, or for two leases if it never does
                self._arriving[worker_id] = (target.index, self.runs[0].clock() + 2 * self.spec.coordinator.lease_s)
        if move:
            self.runs[index].reassign(worker_id, f"reassigned: {reason}")
            return ""
        return reason

    def _move_if_run_finished(self, worker_id: str, index: int) -> None:
        """A worker of a finished (or stopped) run, while another run goes on, is moved and told to join again; its
        membership ends here even when no other run takes it (every one left is a run it refused: its join then
        hears so), rather than staying active, its lease renewed by the heartbeats told to join again."""
        run = self.runs[index]
        if run.finished and not self.finished:
            why = f"was stopped ({run.stopped})" if run.stopped is not None else "finished"
            stays = self._maybe_move(worker_id, index)
            if stays:
                run.reassign(worker_id, f"its run {why}, and no other run takes it: {stays}")
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r}: its run {why}; join again", moved=True)

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        """Admit a worker to the run `_place` picks (handler thread; takes the group lock to place it, then the
        run's without the group's); a join refused for want of a place counts its worker as waiting (`waiting`, its
        own lock). The run's join writes its store (`SwarmCoordinator.join`: without the run's lock, its joins one
        at a time), so the group lock is not held across it: a slow disk of one run does not hold up the joins
        placed in another. A sweep's join holds its place meanwhile (a `Reservation` in `_placing`), so that joins
        placed at once are still spread as if one after the other; the run marks it when the membership is seated,
        from when it no longer counts, and it is dropped when the run's join ends. A sweep's join naming a membership
        without that membership's secret (`_claimed`) is placed, and reaches its run, as one naming none."""
        name = request.worker_name[:128]
        try:
            refused = refused_runs(request, self.runs)
            previous = self._claimed(request) if self.sweep else ""
            if self.sweep and previous != request.previous_worker_id:
                request = _naming_none(request)
            held: Reservation | None = None
            with self._lock:
                index, reason = self._place(request, refused, previous)
                if self.sweep:
                    held = Reservation(index, self.runs[0].clock() + self._reservation_s())
                    self._placing.append(held)
            try:
                response = self.runs[index].join(request, placed=reason, reservation=held)
            finally:
                if held is not None:
                    with self._lock:
                        self._placing = [other for other in self._placing if other is not held]
        except Refusal as refusal:
            if refusal.place_retry_s > 0:
                self.waiting.asked(name, time.monotonic(), refusal.place_retry_s)
            raise
        with self._lock:
            self._refused = {worker: runs for worker, runs in self._refused.items()
                             if any(run.knows(worker) for run in self.runs)}
            if refused:
                self._refused[response.worker_id] = refused
        self.waiting.seated(name)
        return response

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        """Renew a lease in the worker's run (handler thread)."""
        index = self._index_of("Heartbeat", request.worker_id, request.worker_secret)
        response = self.runs[index].heartbeat(request)
        self._move_if_run_finished(request.worker_id, index)
        response.run_state = self._group_state()
        return response

    def leave(self, request: pb.LeaveRequest) -> pb.LeaveResponse:
        """End a membership in the worker's run (handler thread)."""
        return self.runs[self._index_of("Leave", request.worker_id, request.worker_secret)].leave(request)

    def pull(self, request: pb.PullParametersRequest) -> Iterator[pb.PullParametersResponse]:
        """The worker's run's θ or step (handler thread; a generator, see SwarmCoordinator.pull)."""
        return self.runs[self._index_of("PullParameters", request.worker_id, request.worker_secret)].pull(request)

    def await_version(self, request: pb.AwaitVersionRequest, time_remaining: float) -> pb.AwaitVersionResponse:
        """Long poll on the worker's run (handler thread; no group lock while it waits)."""
        index = self._index_of("AwaitVersion", request.worker_id, request.worker_secret)
        response = self.runs[index].await_version(request, time_remaining)
        self._move_if_run_finished(request.worker_id, index)
        response.run_state = self._group_state()
        return response

    def push(self, requests: Iterator[pb.PushUpdateRequest]) -> pb.PushUpdateResponse:
        """An update to the worker's run, then perhaps a move (handler thread). An update to a run that finished or
        was stopped while others go on moves its worker before a byte more is read: refused stale instead, the worker
        pulled, trained and pushed again in a loop, never told to join the run it should move to."""
        first = first_part(requests, "meta")
        index = self._index_of("PushUpdate", first.meta.worker_id, first.meta.worker_secret)
        if self.runs[index].owns_credential(first.meta.worker_id, first.meta.worker_secret):  # else the run refuses it
            self._move_if_run_finished(first.meta.worker_id, index)
        response = self.runs[index].push(itertools.chain([first], requests))
        self._maybe_move(first.meta.worker_id, index)
        return response

    def report_metrics(self, request: pb.ReportMetricsRequest) -> pb.ReportMetricsResponse:
        """Metrics into the worker's run (handler thread)."""
        return self.runs[self._index_of("ReportMetrics", request.worker_id, request.worker_secret)].report_metrics(request)

    def status(self) -> pb.GetStatusResponse:
        """A group of one's run status; a sweep's aggregate with one RunSummary per run (any thread; takes each run's lock in turn)."""
        if not self.sweep:
            response = self.runs[0].status()
            response.forecast.CopyFrom(forecasts.forecast_status(self.latest[0], self.runs[0].stopped))
            response.val_loss, response.val_version = forecasts.newest_held_out(self.runs[0].store)
            response.waiting_for_place = self.waiting.count(time.monotonic())
            return response
        statuses = [run.status() for run in self.runs]
        losses = [s.latest_loss for s in statuses if math.isfinite(s.latest_loss)]
        response = pb.GetStatusResponse(
            run_id=self.run_id, version=self.version, run_state=self._group_state(),
            target_rounds=self.spec.run.rounds, latest_loss=sum(losses) / len(losses) if losses else math.nan,
            tokens_per_second=sum(s.tokens_per_second for s in statuses),
            total_tokens=sum(s.total_tokens for s in statuses), applied_tokens=sum(s.applied_tokens for s in statuses),
            pace=statuses[0].pace, waiting_for_place=self.waiting.count(time.monotonic()),
        )
        for index, (run, status) in enumerate(zip(self.runs, statuses, strict=True)):
            response.workers.extend(status.workers)
            response.rounds.extend(status.rounds[-3:])
            response.runs.append(run.summary(status))
            response.runs[-1].forecast.CopyFrom(forecasts.forecast_status(self.latest[index], run.stopped))
            response.runs[-1].val_loss, response.runs[-1].val_version = forecasts.newest_held_out(run.store)
        return response

    def tick(self) -> None:
        """Evictions and deadlines in every run, then forecasts and pruning (the ticker thread). Each step runs
        whatever the others did: a run whose close keeps failing (its own state dir cannot be written) stops neither
        the other runs' deadlines and evictions nor the sweep's budget; the first error is raised once all ran, for
        the server's health record."""
        errors: list[BaseException] = []
        for step in [*(run.tick for run in self.runs), self._forecast, self._prune, self._end_spent_budgets]:
            try:
                step()
            except Exception as error:  # the others still run; raised below
                errors.append(error)
        if errors:
            raise errors[0]

    def _budget_elapsed(self, index: int, now: float) -> float | None:
        """The wall-time budget's clock of run `index` at `now`, the one reading of it (the budget's end and its
        lifting, pruning at fractions of `run.minutes`, the forecasts' pace): the seconds the run was served since its
        first round opened. Those of its earlier launches (`_served_before`) plus `now` minus when this launch began
        serving it: the opening of the first round it closed (`_opened_this_launch`: its first pull, as the first
        launch's clock started at its first round's opening; neither the time the coordinator was down nor a
        restarted one's wait for its first worker counts). Until that round closed the clock stands at the seconds
        served before (a launch's clock starts at its first close, as the first launch's did), and a run that never
        closed a round has none (None). A first launch's clock is the seconds since its first round opened, as it
        was (the constructor; the ticker)."""
        opened = self._opened_this_launch(index)
        if opened is None:
            return self._served_before[index] if self._closed_before[index] else None
        return self._served_before[index] + max(0.0, now - opened)

    def _opened_this_launch(self, index: int) -> float | None:
        """When the first round run `index` closed this launch opened: its round at the start (`_launch_version`),
        read from its store until it closed (None before; cached after)."""
        if self._launch_opened[index] is None:
            self._launch_opened[index] = self.runs[index].store.round_opened_at(self._launch_version[index])
        return self._launch_opened[index]

    def _lift_lapsed_budget_stops(self) -> None:
        """At a start: lift the stop of every run ended at its wall-time budget that this spec's budget (`[run]
        minutes`, raised or unset on the restart) no longer ends (`forecasts.decide_budget_resume`, on the budget's
        clock: `_budget_elapsed`, the seconds served before this launch), so it trains on as a finished run does after
        a restart that raises `run.rounds`; a pruned run stays stopped (the constructor, before any thread calls the
        group)."""
        budget_s = self.spec.run.minutes * 60.0
        for index, run in enumerate(self.runs):
            now = run.clock()
            reason = forecasts.decide_budget_resume(now, _origin(now, self._budget_elapsed(index, now)), budget_s,
                                                    run.stopped)
            if reason is not None:
                run.lift_stop(reason)

    def _end_spent_budgets(self) -> None:
        """End every run still going whose wall-time budget (`[run] minutes`) is used, on the budget's clock
        (`_budget_elapsed`), which is stored with the stop (`SERVED_AT_STOP_KEY`) (the ticker)."""
        budget_s = self.spec.run.minutes * 60.0
        if budget_s <= 0:
            return
        for index, run in enumerate(self.runs):
            if run.finished:
                continue
            now = run.clock()
            elapsed = self._budget_elapsed(index, now)
            reason = forecasts.decide_budget_end(now, _origin(now, elapsed), budget_s)
            if reason is not None:
                run.stop(reason, kind="budget", saved={SERVED_AT_STOP_KEY: repr(elapsed)})

    def _forecast(self) -> None:
        """Refit the law of every run whose version changed since its last forecast, and store it (the ticker)."""
        for index, run in enumerate(self.runs):
            version = run.version
            if version == self._forecast_at[index] or run.spec.sync.backend == "hivemind":
                continue
            self._forecast_at[index] = version
            now = run.clock()
            record = forecasts.forecast_record(
                version, now, _origin(now, self._budget_elapsed(index, now)), run.spec.run.rounds,
                run.store.round_losses(), run.spec.run.target_loss, seed=version,
                held_out=[(record.version, record.loss) for record in run.store.held_out_losses()],
                budget_s=run.spec.run.minutes * 60.0,
            )
            run.store.add_forecast(record)
            self.latest[index] = record

    def _prune(self) -> None:
        """Apply `decide_prune` when a fraction of the budget is due, the first of `prune_at` above the largest one
        decided (`forecasts.fractions_decided`): the decision is stored in every run's store first (its number
        `prune_done` and the fractions decided `prune_decided`, in one write), then applied run by run
        (`_apply_prune`), so a failed write or a crash between two runs finishes that decision at the next tick or
        after the restart instead of deciding the fraction again over the runs still in (which pruned more than half
        at one point) (the ticker)."""
        self._apply_prune()
        now = self.runs[0].clock()
        views = [forecasts.RunView(i, f"L={run.spec.data.seq_len}", run.version, run.stopped is not None,
                                   self.latest[i], _or_nan(self._budget_elapsed(i, now)))
                 for i, run in enumerate(self.runs)]
        done = forecasts.fractions_decided(self.prune_options.fractions, self.prune_decided)
        decision = forecasts.decide_prune(now, views, self.prune_options, done)
        if decision is None:
            return
        fraction, number = self.prune_options.fractions[decision.checkpoint], self.prune_done + 1
        decided = (*self.prune_decided, fraction)
        stored = json.dumps({"checkpoint": decision.checkpoint, "fraction": fraction, "number": number,
                             "now": decision.now, "stop": list(decision.stop),
                             "reasons": [list(pair) for pair in decision.reasons]})
        for run in self.runs:
            run.store.set_many({"prune_decision": stored, "prune_done": str(number),
                                "prune_decided": json.dumps(decided)})
        self.prune_done, self.prune_decided = number, decided
        self._apply_prune()

    def _apply_prune(self) -> None:
        """Apply the newest stored pruning decision to every run that has not applied it yet: stop a loser, record a
        kept run's reason, then mark the run's store (`prune_applied`); a no-op once every run has (the ticker)."""
        if self._prune_applied == self.prune_done:
            return
        stored = [json.loads(text) for text in (run.store.get("prune_decision") for run in self.runs) if text]
        if stored:
            decision = max(stored, key=decision_number)
            mark, reasons = str(decision_number(decision)), {index: reason for index, reason in decision["reasons"]}
            for index, run in enumerate(self.runs):
                if run.store.get("prune_applied") == mark or index not in reasons:
                    continue
                if index not in decision["stop"]:
                    run.store.add_event("", "prune", reasons[index], decision["now"])
                elif run.stopped is None:
                    run.stop(reasons[index])
                run.store.set_many({"prune_applied": mark})
        self._prune_applied = self.prune_done


def decision_number(decision: dict[str, Any]) -> int:
    """The number of a stored pruning decision among the sweep's (1 for the first): its `number`, or for one an
    older rcswarm stored, its fraction's index + 1 (the count of decisions then, as that version numbered them)."""
    return int(decision.get("number", decision["checkpoint"] + 1))


def decided_fractions(runs: Sequence[SwarmCoordinator], prune_at: Sequence[float]) -> tuple[float, ...]:
    """The fractions of the budget the sweep's pruning decided, by value, as the store of the run with the most
    decisions (`prune_done`) keeps them (`prune_decided`). A state dir of an older rcswarm keeps only their count:
    read as the first that many fractions of `prune_at`, the spec this start uses (right unless that start changed
    `prune_at`), until the next decision stores their values."""
    newest = max(runs, key=lambda run: int(run.store.get("prune_done") or 0)).store
    stored = newest.get("prune_decided")
    if stored is not None:
        return stored_fractions(newest, stored)
    return tuple(prune_at[: int(newest.get("prune_done") or 0)])


def stored_fractions(store: StateStore, stored: str) -> tuple[float, ...]:
    """The fractions decided as `store` keeps them (`stored`, its `prune_decided`: a JSON list, one number in (0, 1)
    per decision). RuntimeError naming the state dir, the key and the value for anything else (written by another
    program, or damaged): read as none decided, or as a guess, the sweep would decide a fraction again and prune
    more than half of its runs at one point."""
    try:
        fractions = json.loads(stored)
    except ValueError:
        fractions = None
    if isinstance(fractions, list) and fractions and all(_is_fraction(fraction) for fraction in fractions):
        return tuple(float(fraction) for fraction in fractions)
    raise RuntimeError(f"state dir {store.state_dir}: run_state prune_decided = {_shown(stored)} is not the fractions "
                       "of the budget the sweep's pruning decided: expected a JSON list of numbers in (0, 1)")


def _is_fraction(value: object) -> bool:
    """Whether a decoded JSON value is a number in (0, 1) (a boolean is none; NaN is not in it)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1


def _naming_none(request: pb.JoinRequest) -> pb.JoinRequest:
    """A copy of `request` that names no previous membership (nor its secret)."""
    copy = pb.JoinRequest()
    copy.CopyFrom(request)
    copy.ClearField("previous_worker_id")
    copy.ClearField("previous_worker_secret")
    return copy


def _origin(now: float, elapsed: float | None) -> float | None:
    """Where the budget's clock reads 0 on the coordinator's clock, `now` minus the seconds served (`elapsed`): the
    opening of the run's first round had it been served without a break since (the `started_at` of the rules in
    coordinator/forecasts.py); None when the clock does not run yet."""
    return None if elapsed is None else now - elapsed


def _or_nan(elapsed: float | None) -> float:
    """The budget's clock as `forecasts.RunView` takes it: NaN when it does not run yet."""
    return math.nan if elapsed is None else elapsed


class _RoundTimes(NamedTuple):
    """A closed round's opening and close, as observe/report.py `served_periods` reads a round (`RoundSpan`)."""

    opened_at: float | None
    closed_at: float | None


def served_before(store: StateStore) -> float:
    """The seconds the run `store` holds was served in the launches on its state dir so far (read at a start): the
    periods observe/report.py `served_periods` finds in its rows (the end-of-run summary's: one per launch, a launch on
    the same state dir starting a new one), summed; and at least the budget's clock stored when its wall-time budget
    ended it (`_served_at_stop`): a period ends at its launch's last metric row, which may come before the stop.
    0 for a new run. RuntimeError naming the state dir, the key and the value for a stored clock that is not a
    number of seconds."""
    rounds = [_RoundTimes(*times) for times in store.round_times()]
    periods = served_periods(store.worker_usage(), first_joins(store), rounds)
    return max(sum(end - start for start, end in periods), _served_at_stop(store))


# The most seconds a stored budget clock may read (100 years): more is a damaged value.
MAX_SERVED_S = 100 * 365.25 * 86400.0
# The seconds an older rcswarm's budget stop names, its clock when the budget ended the run (`_served_at_stop`).
_OLDER_STOP_SECONDS = re.compile(r"\((\d+(?:\.\d+)?) s since its first round opened\)")


def _served_at_stop(store: StateStore) -> float:
    """The budget's clock stored with a stop at the wall-time budget (`SERVED_AT_STOP_KEY`), 0 without one;
    RuntimeError naming the state dir, the key and the value for one that is not a finite number of seconds in
    [0, MAX_SERVED_S]. A budget stop of an older rcswarm, stored without it, names the seconds its clock read in its
    reason ("(N s since its first round opened)"): those are taken, so a relaunch with the same budget keeps it
    ended (before, the periods, which end at the launch's last metric row, read less and the stop was lifted)."""
    stored = store.get(SERVED_AT_STOP_KEY)
    if stored is None:
        stopped = store.get("stopped") or ""
        older = _OLDER_STOP_SECONDS.search(stopped) if stopped.startswith(forecasts.BUDGET_ENDED) else None
        return float(older.group(1)) if older else 0.0
    try:
        seconds = float(stored)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SERVED_S):
        raise RuntimeError(f"state dir {store.state_dir}: run_state {SERVED_AT_STOP_KEY} = {_shown(stored)} is not the "
                           "seconds the run was served when its wall-time budget ended it: expected a finite number "
                           f"in [0, {MAX_SERVED_S:.0f}]")
    return seconds


def _shown(stored: str) -> str:
    """A stored value as an error quotes it: its repr, cut to 200 characters."""
    text = repr(stored)
    return text if len(text) <= 200 else text[:199] + "…"


class SweepCoordinator(RunGroup):
    """The group of a sweep's runs, each in its own state dir below `state_dir`."""

    def __init__(self, spec: RunSpec, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        """Open (or resume) every run of the sweep `spec`; a spec without sweep.seq_lens is refused."""
        if not spec.is_sweep:
            raise ValueError("SweepCoordinator needs a spec with sweep.seq_lens")
        super().__init__(spec, build_runs(spec, Path(state_dir), clock))


def open_group(spec: RunSpec, state_dir: Path, clock: Callable[[], float] = time.time) -> RunGroup:
    """The coordinator of `spec`: a group of one run in `state_dir`, or a sweep's group over its runs."""
    return RunGroup(spec, build_runs(spec, Path(state_dir), clock))
