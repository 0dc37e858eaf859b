"""A fake-clock swarm that feeds the adaptive curriculum's tracker (coordinator/curriculum.py) metrics as real workers
report them, for the tests of its per-worker and re-join rules."""

from __future__ import annotations

from rcswarm.coordinator import curriculum as curricula
from rcswarm.protos.v1 import coordinator_pb2 as pb

# The ladder of these tests (a fast law: τ = 100 steps) and the round's length on the fake clock.
LADDER = {"policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 0.3, "tau": 100.0, "budget_seconds": 1e6}
ROUND_S = 2.0


class Swarm:
    """Workers training on a fake clock: each reports one metric per inner step at its assigned length, costing its
    pace × L / 4 compute seconds (cumulative, as real workers report), and a round closes every ROUND_S seconds."""

    def __init__(self, tracker: curricula.CurriculumTracker, paces: dict[str, float]) -> None:
        self.tracker, self.paces, self.now, self.version = tracker, dict(paces), 0.0, 0
        self.compute = {worker_id: 0.0 for worker_id in paces}
        self.lengthened: dict[str, list[float]] = {worker_id: [] for worker_id in paces}
        tracker.start(0.0)
        for worker_id in paces:
            self.report(worker_id, 0.0, tokens=0)

    def add(self, worker_id: str, pace: float) -> None:
        self.paces[worker_id], self.compute[worker_id] = pace, 0.0
        self.lengthened[worker_id] = []
        self.report(worker_id, 0.0, tokens=0)

    def report(self, worker_id: str, seconds: float, tokens: int, seq_len: int = 4) -> None:
        self.compute[worker_id] += seconds
        self.tracker.measure(worker_id, pb.Metric(version=self.version, seq_len=seq_len, batch=4, tokens=tokens,
                                                  compute_seconds=self.compute[worker_id], loss=5.0))

    def length(self, worker_id: str) -> int:
        return self.tracker.assignment(self.version, None, worker_id).seq_len

    def round(self) -> None:
        before = {worker_id: self.length(worker_id) for worker_id in self.paces}
        for worker_id, pace in self.paces.items():
            cost = pace * before[worker_id] / 4
            for _ in range(max(1, round(ROUND_S / cost))):
                self.report(worker_id, cost, tokens=4 * before[worker_id], seq_len=before[worker_id])
        self.now += ROUND_S
        self.tracker.advance(self.now, self.version, list(self.paces))
        self.version += 1
        for worker_id in self.paces:
            if self.length(worker_id) != before[worker_id]:
                self.lengthened[worker_id].append(self.now)

    def run_until(self, seconds: float) -> None:
        while self.now < seconds:
            self.round()
