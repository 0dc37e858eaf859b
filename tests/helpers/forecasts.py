"""What the forecast tests share (issue #30): a two-length sweep with pruning, driven through real rounds in-process
(metric rows of a known law, then an update per round), on a settable clock; `served`: that sweep behind its
dashboard (a fixture)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.sweep import SweepCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import creds, deltas_of, push
from tests.helpers.dashboard import Clock
from tests.helpers.specs import TOKEN, tiny_spec

ROUNDS = 16


def pruning_spec(**sweep: object) -> RunSpec:
    """A sweep over L = 8 and 16 of ROUNDS rounds, closing a round on one report."""
    base = tiny_spec(run={"rounds": ROUNDS}, sync={"min_reports": 1})
    return RunSpec.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16], **sweep}})


def good_loss(x: float) -> float:
    return 1.0 + 2.0 * x ** -0.5


def bad_loss(x: float) -> float:
    return 2.0 + 2.0 * x ** -0.5


def train_round(run: Any, member: pb.JoinResponse, loss: float, clock: Clock) -> None:
    """One real round of `member` in `run`: its metric rows of the current version, then its update."""
    version = run.version
    rows = [pb.Metric(version=version, step=version * 5 + k, seq_len=run.spec.data.seq_len, batch=4, loss=loss,
                      tokens=4 * run.spec.data.seq_len, wall_time=float(version), compute_seconds=float(version))
            for k in range(1, 4)]
    assert run.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=rows, run_id=member.run_id)).stored == 3
    push(run, member, deltas_of(run, 0.0), tokens=128)
    clock.now += 1.0
    run.tick()
    assert run.version == version + 1


def pruned_sweep(state_dir: Path, clock: Clock, rounds: int = 8,
                 losing: Callable[[float], float] = bad_loss) -> tuple[SweepCoordinator, pb.JoinResponse,
                                                                      pb.JoinResponse]:
    """The sweep of `pruning_spec(prune=True, prune_at=[0.5])` after `rounds` rounds of each length (the group
    ticked after each): L = 8 follows `good_loss`, L = 16 `losing`; returns it with both workers' joins."""
    sweep = SweepCoordinator(pruning_spec(prune=True, prune_at=[0.5]), state_dir, clock)
    good, bad = (sweep.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b"))
    assert [good.run_id, bad.run_id] == [run.run_id for run in sweep.runs]
    for round_ in range(rounds):
        train_round(sweep.runs[0], good, good_loss(round_ + 1.0), clock)
        train_round(sweep.runs[1], bad, losing(round_ + 1.0), clock)
        sweep.tick()
    return sweep, good, bad


@pytest.fixture
def served(tmp_path: Path) -> Any:
    """The pruned sweep of `pruned_sweep` (in tmp_path/state) served with its dashboard: (sweep, dashboard URL)."""
    from rcswarm.coordinator.server import RunningCoordinator

    sweep, _, _ = pruned_sweep(tmp_path / "state", Clock(1000.0))
    running = RunningCoordinator(sweep, TOKEN, http_port=0).start()
    yield sweep, running.dashboard.url
    running.stop(grace=0.5)
