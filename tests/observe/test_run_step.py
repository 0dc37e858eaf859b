"""The run step (issue #27): one counter, config/run_step.py `RunSteps`, fed with the steps each round trained.

A coordinator records in each round the most inner steps among its on-time updates (`rounds.steps`);
`observe.analysis.run_steps` counts a row trained from version v at step k within its round as
Σ_{u<v} steps_u + k + 1. Time-boxed and adaptive rounds, which train more or fewer than inner.steps,
get monotone, gap-free run steps where version × inner.steps + k + 1 overlapped or left gaps; the
fixed curriculum schedule switches at the same run step; step-boxed rounds count as before.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.config.run_step import RunSteps
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.observe import analysis
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from tests.helpers.coordinator import creds
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state


def test_run_steps_count_the_steps_each_round_recorded() -> None:
    steps = RunSteps(10, {1: 25, 3: 4})
    assert [steps.before(v) for v in range(6)] == [0, 10, 35, 45, 49, 59]
    assert steps.run_step(2, 0) == 36 and steps.run_step(0, 9) == 10
    assert [RunSteps(10).run_step(v, k) for v in range(3) for k in range(10)] == list(range(1, 31))
    with pytest.raises(ValueError, match="inner_steps=0"):
        RunSteps(0)
    with pytest.raises(ValueError, match=r"recorded\[2\]=0"):
        RunSteps(10, {2: 0})


class Swarm:
    """An in-process coordinator and its members, each training as many steps per round as a test says."""

    def __init__(self, spec: Any, state_dir: Path) -> None:
        self.now = [1000.0]
        self.coordinator = SwarmCoordinator(spec, StateStore(state_dir), clock=lambda: self.now[0])
        self.members = {name: self.coordinator.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b")}
        self.step = {name: 0 for name in self.members}

    def train(self, name: str, steps: int) -> None:
        """Pull, report `steps` training rows (the worker's own step counter goes on), push an update of `steps`."""
        coordinator, member = self.coordinator, self.members[name]
        list(coordinator.pull(pb.PullParametersRequest(**creds(member))))
        version = coordinator.version
        assignment = coordinator.heartbeat(pb.HeartbeatRequest(**creds(member))).assignment
        for _ in range(steps):  # one report a step, each received at its own time
            self.step[name] += 1
            self.now[0] += 0.1
            row = pb.Metric(version=version, step=self.step[name], seq_len=assignment.seq_len, batch=assignment.batch_size,
                            loss=3.0 - 0.01 * self.step[name], tokens=assignment.seq_len * assignment.batch_size,
                            wall_time=self.now[0], compute_seconds=0.1 * self.step[name])
            coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[row]))
        deltas = {name: torch.full(shape, 1e-3) for name, shape in coordinator.shapes.items()}
        header, chunks = tensor_stream.build_payload(deltas, codec=pb.CODEC_FP32, run_id=coordinator.run_id, version=version)
        meta = pb.UpdateMeta(**creds(member), base_version=version, tokens=steps * assignment.seq_len * assignment.batch_size,
                             inner_steps=steps)
        assert coordinator.push(iter([pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header),
                                      *(pb.PushUpdateRequest(chunk=c) for c in chunks)])).accepted

    def leave(self, name: str) -> None:
        self.coordinator.leave(pb.LeaveRequest(**creds(self.members[name]), reason="done"))


def run_rounds(spec: Any, state_dir: Path, plan: list[dict[str, int]]) -> Swarm:
    """Each round of `plan`: the steps each worker trains (a worker missing from a round has left)."""
    swarm = Swarm(spec, state_dir)
    for version, trained in enumerate(plan):
        for name in [n for n in swarm.members if n not in trained and version > 0 and n in plan[version - 1]]:
            swarm.leave(name)
        for name, steps in trained.items():
            swarm.train(name, steps)
        assert swarm.coordinator.version == version + 1
    return swarm


def assert_monotone_and_gap_free(state_dir: Path, plan: list[dict[str, int]]) -> list[Any]:
    """Every worker's run steps rise in the order it trained them, and together they cover 1..the steps trained."""
    rows = analysis.read_state_dirs(state_dir)
    by_worker: dict[str, list[float]] = {}
    for row, stored in zip(rows, read_state(state_dir, lambda store: store.training_rows())):
        by_worker.setdefault(stored[0], []).append(row.step)
    assert all(steps == sorted(steps) and len(set(steps)) == len(steps) for steps in by_worker.values()), by_worker
    total = sum(max(trained.values()) for trained in plan)
    assert sorted({row.step for row in rows}) == [float(s) for s in range(1, total + 1)]
    return rows


def old_run_steps(state_dir: Path, inner_steps: int) -> list[int]:
    """version × inner.steps + k + 1 of every training row, the count before issue #27."""
    return [version * inner_steps + k + 1 for _, version, k, *_ in read_state(state_dir, lambda store: store.training_rows())]


def test_time_boxed_rounds_get_monotone_gap_free_run_steps(tmp_path: Path) -> None:
    spec = tiny_spec(run={"rounds": 5}, inner={"steps": 5}, sync={"codec": "fp32", "round": "time", "round_seconds": 1.0,
                                                                  "max_steps": 20})
    plan = [{"a": 7, "b": 4}, {"a": 12, "b": 15}, {"a": 3, "b": 2}]
    swarm = run_rounds(spec, tmp_path, plan)
    try:
        assert [r.steps for r in swarm.coordinator.store.rounds()] == [7, 15, 3]
        means = analysis.run_step_means(swarm.coordinator.store, spec.inner.steps)
    finally:
        swarm.coordinator.close()
    assert_monotone_and_gap_free(tmp_path, plan)
    assert [step for _, step, _, _ in means] == [float(s) for s in range(1, 26)]
    old = old_run_steps(tmp_path, spec.inner.steps)
    assert len(set(old)) < len(old), "version × inner.steps overlaps for these rounds; the test would show nothing"


def test_adaptive_rounds_get_gap_free_run_steps(tmp_path: Path) -> None:
    spec = tiny_spec(run={"rounds": 5}, inner={"steps": 8}, sync={"codec": "fp32", "adaptive_steps": True})
    # The fast worker trains inner.steps, the slow one fewer; after the fast one leaves, rounds train 3 steps.
    plan = [{"a": 8, "b": 3}, {"b": 3}, {"b": 3}]
    run_rounds(spec, tmp_path, plan).coordinator.close()
    assert [r.steps for r in read_state(tmp_path, lambda store: store.rounds())] == [8, 3, 3]
    assert_monotone_and_gap_free(tmp_path, plan)
    assert max(old_run_steps(tmp_path, spec.inner.steps)) == 2 * 8 + 3, "version × inner.steps leaves gaps here"


def test_the_fixed_schedule_switches_at_the_run_step(tmp_path: Path) -> None:
    spec = tiny_spec(run={"rounds": 5}, inner={"steps": 5}, sync={"codec": "fp32", "round": "time", "max_steps": 20},
                     curriculum={"schedule": [[0, 16, 4], [20, 32, 2]]})
    swarm = run_rounds(spec, tmp_path, [{"a": 7, "b": 4}, {"a": 12, "b": 15}, {"a": 3, "b": 2}])
    try:
        # 7 + 15 = 22 steps before version 2 (version × inner.steps would say 10: still the first row).
        lengths = {row.version: (row.seq_len, row.batch) for row in swarm.coordinator.store.metric_rows() if row.tokens}
        assert lengths == {0: (16, 4), 1: (16, 4), 2: (32, 2)}
        reason = swarm.coordinator.heartbeat(pb.HeartbeatRequest(**creds(swarm.members["a"]))).assignment.reason
        assert reason == "curriculum.schedule at step 25 (version 3)"
    finally:
        swarm.coordinator.close()


def test_step_boxed_rounds_keep_version_times_inner_steps(tmp_path: Path) -> None:
    spec = tiny_spec(run={"rounds": 5}, inner={"steps": 5}, sync={"codec": "fp32"})
    plan = [{"a": 5, "b": 5}] * 3
    run_rounds(spec, tmp_path, plan).coordinator.close()
    assert [r.steps for r in read_state(tmp_path, lambda store: store.rounds())] == [5, 5, 5]
    rows = assert_monotone_and_gap_free(tmp_path, plan)
    assert [row.step for row in rows] == [float(s) for s in old_run_steps(tmp_path, spec.inner.steps)]
    assert not any(math.isnan(row.loss) for row in rows)
