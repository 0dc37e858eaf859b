"""A pruned sweep with real worker processes (issue #30): the pruned length's worker moves to the length still
training, and no closed round or metric row of the pruned run is lost.

Which length loses is set by the test: the sweep's forecasts are replaced once a run has closed 2 rounds (L = 16
confidently worse), so the decision is due at a known round whatever the machine's speed; the decision, the stop,
the move and the stores are the real ones. The budget (1000 rounds) cannot be reached in the test's time, so both
runs are still training when the decision is due."""

from __future__ import annotations

import math

import pytest

from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.sweep import SweepCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import ForecastRecord
from tests.helpers.processes import logs_of
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for


class SetForecasts(SweepCoordinator):
    """The real sweep, whose forecasts say L = 16 is confidently worse once a run has closed 2 rounds."""

    def _forecast(self) -> None:
        super()._forecast()
        for index, run in enumerate(self.runs):
            if run.version >= 2:
                loss = 1.0 if index == 0 else 3.0
                self.latest[index] = ForecastRecord(run.version, run.clock(), math.nan, run.spec.run.rounds, loss,
                                                    loss - 0.1, loss + 0.1, math.nan, math.nan, math.nan, math.nan, "")


@pytest.mark.wide
def test_pruning_moves_the_losers_worker_without_losing_a_round_or_a_metric(tmp_path, spawn_worker):
    base = tiny_spec(run={"rounds": 1000}, inner={"steps": 3}, coordinator={"lease_s": 120.0})
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16], "prune": True, "prune_at": [0.002]}})
    sweep = SetForecasts(spec, tmp_path / "state")
    running = RunningCoordinator(sweep, TOKEN, http_port=0).start()
    try:
        procs = [spawn_worker(f"127.0.0.1:{running.port}", f"w{i}") for i in range(2)]
        kept, pruned = sweep.runs
        wait_for(lambda: pruned.stopped is not None, 240, "the L = 16 run to be pruned at round 2")
        assert "pruned" in pruned.stopped and "round 2" in pruned.stopped

        def moved() -> bool:
            names = {w.name for w in kept.status().workers if w.state == pb.WORKER_STATE_ACTIVE}
            return names == {"w0", "w1"}
        wait_for(moved, 240, "the pruned run's worker to train the L = 8 run")
        left = [w for w in pruned.status().workers if w.state == pb.WORKER_STATE_REASSIGNED]
        assert len(left) == 1 and left[0].reason.startswith("reassigned"), logs_of(procs)
        # Every round the pruned run closed kept the rows trained for it (the last one's arrive after its close).
        closed = pruned.version

        def rows_of_every_round() -> bool:
            versions = {row.version for row in pruned.store.metric_rows() if row.tokens > 0}
            return versions >= set(range(closed))
        wait_for(rows_of_every_round, 60, "the metric rows of every round the pruned run closed")
        assert [r.version for r in pruned.store.rounds()] == list(range(closed))
        assert all(proc.poll() is None for proc in procs), logs_of(procs)
        assert kept.version > 2 and not kept.finished
        assert [e.reason for e in pruned.store.events("prune")] == [pruned.stopped]
    finally:
        running.stop(grace=0.5)
