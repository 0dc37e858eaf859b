"""A hivemind peer's own ends, as the coordinator backend's worker has them (review of the hivemind path, 2026-11-29):
a diverged round is dropped with the inner optimizer started afresh and ends the peer after MAX_DIVERGED_ROUNDS in a
row (before: without error feedback its NaN Δ reached the all-reduce, with it the peer trained forever without a
version); a coordinator's assignment beyond the peer's step limit and CUDA's out of memory end it with one line and a
Leave saying why; run.rounds = 0 trains until stopped (before: nothing, exit 0 "finished").

The real HivemindWorker loop on its real RoundTrainer; only the peer-to-peer layer is a stand-in (`AlonePeer`: every
round averaged alone), which the swarm tests run for real."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.train.round import MAX_DIVERGED_ROUNDS, Diverged
from rcswarm.worker import hivemind_sync as hs
from rcswarm.worker import hivemind_worker
from rcswarm.worker.hivemind_worker import HivemindWorker
from tests.helpers.specs import hivemind_spec


class AlonePeer:
    """A HivemindPeer stand-in alone in its swarm: `average` records whether each Δ it was given is finite and
    returns None (no group), so the worker steps with its own Δ; `stop_after` rounds end the run (a stop)."""

    def __init__(self, *args: Any, stop: threading.Event | None = None, stop_after: int = 0, **kwargs: Any) -> None:
        self.timer, self.peer_id, self.sent = hs.RoundTimer(2.0), "me", []
        self.stop, self.stop_after = stop, stop_after

    def failure(self) -> str:
        return ""

    def average(self, deltas: list[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        self.sent.append(all(bool(torch.isfinite(delta).all()) for delta in deltas))
        if self.stop is not None and len(self.sent) >= self.stop_after:
            self.stop.set()

    def newest_declared_version(self) -> int:
        return 0

    def declared_versions(self) -> list[int]:
        return []

    def set_state_version(self, *args: Any, **kwargs: Any) -> None:
        pass

    def records(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def publish(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def shutdown(self) -> None:
        pass


class Control:
    """The control plane's two calls the loop makes (`assignment`, `report`) and the Leave's reason (`close`)."""

    def __init__(self, assignment: pb.TrainingAssignment | None = None) -> None:
        self._assignment, self.left = assignment, None

    def assignment(self) -> pb.TrainingAssignment | None:
        return self._assignment

    def report(self, metrics: list[pb.Metric]) -> None:
        pass

    def close(self, reason: str) -> None:
        self.left = reason


def poison(worker: HivemindWorker, steps: set[int], most: int = 200) -> None:
    """Make the inner steps numbered in `steps` (1, 2, ...) take a NaN gradient: AdamW's moments then hold NaN, and
    every later step of the same optimizer makes θ NaN. The `most`-th step sets the worker's stop (a loop that never
    ends fails its test instead of hanging it)."""
    inner_step, count = worker.trainer.inner_step, [0]

    def step():
        count[0] += 1
        if count[0] >= most:
            worker.stop.set()
        if count[0] not in steps:
            return inner_step()
        first = next(worker.model.parameters())
        hook = first.register_hook(lambda grad: torch.full_like(grad, float("nan")))
        try:
            return inner_step()
        finally:
            hook.remove()

    worker.trainer.inner_step = step


@pytest.mark.parametrize("error_feedback", [True, False])
def test_a_diverged_round_is_dropped_and_the_next_trains_from_a_fresh_optimizer(error_feedback: bool) -> None:
    spec = hivemind_spec(run={"rounds": 50}, sync={"backend": "hivemind", "codec": "int8", "error_feedback": error_feedback})
    worker = HivemindWorker(spec, hs.HivemindOptions.loopback(), data_seed=1)
    worker.peer = AlonePeer()
    poison(worker, {2})
    for _ in range(4):
        worker._round()
    # The diverged round sent nothing and took no version; the three after it trained on (before: with error
    # feedback none of them took a version, without it each sent a NaN Δ to its group).
    assert worker.peer.sent == [True, True, True] and worker.version == 3
    assert all(bool(torch.isfinite(p).all()) for p in worker.model.parameters())


def test_a_peer_whose_rounds_diverge_in_a_row_ends_with_one_line_and_says_so_in_its_leave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = hivemind_spec(run={"rounds": 50}, inner={"lr": 1e-2})
    stop = threading.Event()
    monkeypatch.setattr(hs, "HivemindPeer", lambda *args, **kwargs: AlonePeer(stop=stop, stop_after=50))
    control = Control()
    worker = HivemindWorker(spec, hs.HivemindOptions.loopback(), data_seed=1, stop=stop, control=control)
    poison(worker, set(range(1, 10_000)))
    assert worker.run() == 1
    assert worker.version == 0 and worker.peer.sent == []  # nothing was sent
    assert f"diverged {MAX_DIVERGED_ROUNDS} rounds in a row" in worker.exit_reason, worker.exit_reason
    assert "lower inner.lr" in worker.exit_reason and control.left == worker.exit_reason
    with pytest.raises(Diverged):  # the round itself says what diverged
        worker._diverged_rounds = 0
        for _ in range(MAX_DIVERGED_ROUNDS):
            worker._round()


def test_an_assignment_beyond_the_step_limit_ends_the_peer_before_it_allocates(monkeypatch: pytest.MonkeyPatch) -> None:
    ladder = {"policy": "adaptive", "seq_lens": [32, 64], "alpha_inf": 0.3, "tau": 100.0}
    spec = hivemind_spec(run={"rounds": 4}, curriculum=ladder)
    stop = threading.Event()
    monkeypatch.setattr(hs, "HivemindPeer", lambda *args, **kwargs: AlonePeer(stop=stop, stop_after=4))
    control = Control(pb.TrainingAssignment(seq_len=256, batch_size=1 << 22, reason="hostile", version=0))
    worker = HivemindWorker(spec, hs.HivemindOptions.loopback(), data_seed=1, stop=stop, control=control)

    def follow(seq_len: int, batch: int, seed: int) -> bool:
        raise AssertionError(f"the peer switched to windows of {seq_len} × {batch} beyond its limit")

    worker.trainer.follow = follow
    assert worker.run() == 1
    assert worker.version == 0
    assert "the coordinator's assignment for version 0: batch 4,194,304 × seq_len 256" in worker.exit_reason
    assert control.left == f"refused: {worker.exit_reason}"


def test_out_of_memory_in_a_round_ends_the_peer_with_one_line_and_a_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = hivemind_spec(run={"rounds": 4})
    monkeypatch.setattr(hs, "HivemindPeer", lambda *args, **kwargs: AlonePeer())
    control = Control()
    worker = HivemindWorker(spec, hs.HivemindOptions.loopback(), data_seed=1, control=control)

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")

    worker.trainer.inner_step = out_of_memory
    assert worker.run() == 1
    assert worker.exit_reason.endswith("out of memory on cpu at version 0, seq_len 32 × batch 4: CUDA out of memory. "
                                       "Tried to allocate 20.00 GiB"), worker.exit_reason
    assert control.left == f"refused: {worker.exit_reason}"


def test_rounds_zero_trains_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = hivemind_spec(run={"rounds": 0})
    stop = threading.Event()
    monkeypatch.setattr(hs, "HivemindPeer", lambda *args, **kwargs: AlonePeer(stop=stop, stop_after=3))
    control = Control()
    worker = HivemindWorker(spec, hs.HivemindOptions.loopback(), data_seed=1, stop=stop, control=control)
    settled: list[int] = []
    monkeypatch.setattr(worker, "_settle", lambda: settled.append(worker.version))
    assert worker.run() == 0
    # Two rounds applied; the third was cut by the stop during its averaging step (not applied); no settling at an
    # end that a run until stopped does not have.
    assert worker.version == 2 and worker.peer.sent == [True] * 3 and settled == []
    assert control.left == "stopped"
    assert hivemind_worker.HivemindWorker._last_reached(worker) is False
