"""A sweep: several runs in one coordinator that differ in sequence length (and batch).

Each run of `RunSpec.sweep_runs()` is a full `SwarmCoordinator` with its own global
parameters, outer optimizer, rounds and state directory (`<state-dir>/run<i>-L<L>`). The
sweep routes every RPC to the run its worker belongs to and schedules workers across runs:

* Join assigns a worker to the unfinished run with the fewest active workers (equal share
  of wall time by default), `decide_assignment`.
* At a round boundary (right after a worker's update is accepted, or when its run has
  finished its rounds) `decide_move` may move it: the worker's membership in its run ends
  with state REASSIGNED, its next call gets NOT_FOUND, and it joins again, landing on the
  emptiest run. Its accepted update stays in the round it was sent to.
* The sweep is finished when every run is; only then do workers hear RUN_STATE_FINISHED.

Both decisions are pure functions of the runs' loads returning a reason, like the rest of
the coordinator's decisions.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import grpc

from rcswarm.coordinator.service import Refusal, SwarmCoordinator
from rcswarm.coordinator.store import StateStore
from rcswarm.config.runspec import RunSpec
from rcswarm.protos.v1 import coordinator_pb2 as pb


@dataclass(frozen=True)
class RunLoad:
    index: int
    name: str
    active: int
    finished: bool


def decide_assignment(loads: Sequence[RunLoad]) -> tuple[int | None, str]:
    """The run a joining worker goes to: the unfinished one with the fewest active workers."""
    candidates = [load for load in loads if not load.finished]
    if not candidates:
        return None, "every run of the sweep has finished"
    best = min(candidates, key=lambda load: (load.active, load.index))
    return best.index, f"assigned to {best.name} ({best.active} active workers, the fewest among unfinished runs)"


def decide_move(loads: Sequence[RunLoad], current: int) -> tuple[bool, str]:
    """At a round boundary: leave `current` if it finished, or if it has 2+ more workers than the emptiest run."""
    here = loads[current]
    others = [load for load in loads if not load.finished and load.index != current]
    if not others:
        return False, f"{here.name}: no other unfinished run"
    emptiest = min(others, key=lambda load: (load.active, load.index))
    if here.finished:
        return True, f"{here.name} finished its rounds; moving toward {emptiest.name}"
    if here.active - emptiest.active >= 2:
        return True, f"{here.name} has {here.active} active workers, {emptiest.name} {emptiest.active}: rebalancing"
    return False, f"{here.name}: balanced ({here.active} vs {emptiest.active})"


def run_state_dir(state_dir: Path, index: int, spec: RunSpec) -> Path:
    return state_dir / f"run{index}-L{spec.data.seq_len}"


class SweepCoordinator:
    """The SwarmCoordinator interface over the runs of a sweep."""

    def __init__(self, spec: RunSpec, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        if not spec.is_sweep:
            raise ValueError("SweepCoordinator needs a spec with sweep.seq_lens")
        self.spec = spec
        self.runs: list[SwarmCoordinator] = []
        for index, run_spec in enumerate(spec.sweep_runs()):
            store = StateStore(
                run_state_dir(Path(state_dir), index, run_spec), run_spec.coordinator.keep_checkpoints,
                run_spec.coordinator.durable,
            )
            self.runs.append(SwarmCoordinator(run_spec, store, clock, worker_prefix=f"r{index}"))
        self._lock = threading.Lock()
        self._assignment: dict[str, int] = {}

    @property
    def run_id(self) -> str:
        return self.spec.run.name

    @property
    def version(self) -> int:
        return min(run.version for run in self.runs)

    @property
    def finished(self) -> bool:
        return all(run.finished for run in self.runs)

    def close(self) -> None:
        for run in self.runs:
            run.store.close()

    def _loads(self) -> list[RunLoad]:
        return [RunLoad(i, run.spec.run.name, run.active_workers(), run.finished) for i, run in enumerate(self.runs)]

    def _index_of(self, worker_id: str) -> int:
        with self._lock:
            index = self._assignment.get(worker_id)
        if index is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is unknown here; join again")
        return index

    def _sweep_state(self) -> int:
        return pb.RUN_STATE_FINISHED if self.finished else pb.RUN_STATE_RUNNING

    def _maybe_move(self, worker_id: str, index: int) -> None:
        """Move the worker off its run when `decide_move` says so; it then joins again."""
        with self._lock:
            move, reason = decide_move(self._loads(), index)
        if move:
            self.runs[index].reassign(worker_id, f"reassigned: {reason}")

    def _move_if_run_finished(self, worker_id: str, index: int) -> None:
        if self.runs[index].finished and not self.finished:
            self._maybe_move(worker_id, index)
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r}: its run finished; join again")

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        with self._lock:
            index, reason = decide_assignment(self._loads())
            if index is None:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"join refused: {reason}")
            response = self.runs[index].join(request)
            self._assignment[response.worker_id] = index
        self.runs[index].store.add_event(response.worker_id, "assign", reason)
        return response

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        index = self._index_of(request.worker_id)
        response = self.runs[index].heartbeat(request)
        self._move_if_run_finished(request.worker_id, index)
        response.run_state = self._sweep_state()
        return response

    def leave(self, request: pb.LeaveRequest) -> pb.LeaveResponse:
        return self.runs[self._index_of(request.worker_id)].leave(request)

    def pull(self, request: pb.PullParametersRequest) -> Iterator[pb.PullParametersResponse]:
        return self.runs[self._index_of(request.worker_id)].pull(request)

    def await_version(self, request: pb.AwaitVersionRequest, time_remaining: float) -> pb.AwaitVersionResponse:
        index = self._index_of(request.worker_id)
        response = self.runs[index].await_version(request, time_remaining)
        self._move_if_run_finished(request.worker_id, index)
        response.run_state = self._sweep_state()
        return response

    def push(self, requests: Iterator[pb.PushUpdateRequest]) -> pb.PushUpdateResponse:
        first = next(requests, None)
        if first is None or first.WhichOneof("part") != "meta":
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "PushUpdate stream: expected a meta message first")
        index = self._index_of(first.meta.worker_id)
        response = self.runs[index].push(itertools.chain([first], requests))
        self._maybe_move(first.meta.worker_id, index)
        return response

    def report_metrics(self, request: pb.ReportMetricsRequest) -> pb.ReportMetricsResponse:
        return self.runs[self._index_of(request.worker_id)].report_metrics(request)

    def status(self) -> pb.GetStatusResponse:
        statuses = [run.status() for run in self.runs]
        losses = [s.latest_loss for s in statuses if math.isfinite(s.latest_loss)]
        response = pb.GetStatusResponse(
            run_id=self.run_id, version=self.version, run_state=self._sweep_state(),
            target_rounds=self.spec.run.rounds, latest_loss=sum(losses) / len(losses) if losses else math.nan,
            tokens_per_second=sum(s.tokens_per_second for s in statuses),
            total_tokens=sum(s.total_tokens for s in statuses),
        )
        for run, status in zip(self.runs, statuses, strict=True):
            response.workers.extend(status.workers)
            response.rounds.extend(status.rounds[-3:])
            response.runs.append(run.summary(status))
        return response

    def tick(self) -> None:
        for run in self.runs:
            run.tick()
