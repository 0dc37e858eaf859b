"""A worker whose local training diverges (a non-finite Δ): one round is dropped and recovered from, a run of them
ends the worker with one ERROR line (`Worker._check_finite`, `Worker._recover`; docs/RELIABILITY.md)."""

import threading

import pytest
import torch

from rcswarm.worker import Worker, WorkerOptions
from rcswarm.worker.worker import MAX_DIVERGED_ROUNDS
from tests.helpers.specs import TOKEN, tiny_spec


class Diverging(Worker):
    """A real worker whose parameters turn NaN after the inner steps numbered in `at` (1-based)."""

    def __init__(self, *args, at, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at, self.steps = at, 0

    def _train_step(self):
        result = super()._train_step()
        self.steps += 1
        if self.at(self.steps):
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("nan")
        return result


def _run(worker: Worker) -> list:
    """Run `worker` on a thread, bounded; what `run` returned, or the exception it raised."""
    out: list = []

    def go() -> None:
        try:
            out.append(worker.run())
        except BaseException as exc:  # noqa: BLE001 (the test reports what escaped)
            out.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(timeout=90)
    worker.stop.set()
    assert not thread.is_alive(), "the worker did not end"
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_a_diverged_round_is_dropped_and_the_worker_recovers(start_coordinator, caplog, overlap):
    # The first step of round 1 turns θ NaN: ErrorFeedback.compress raised ValueError outside every handler and the
    # worker died with a traceback and no exit reason. Now the round is dropped (nothing sent, the residual as it
    # was), the inner optimizer starts afresh, θ is pulled again and the run completes with finite parameters.
    spec = tiny_spec(run={"rounds": 3, "workers": 1}, inner={"steps": 2}, sync={"codec": "int8", "overlap": overlap})
    local = start_coordinator(spec)
    worker = Diverging(WorkerOptions(coordinator=local.target, device="cpu", name="nan", threads=1), TOKEN,
                       at=lambda step: step == 3)
    with caplog.at_level("WARNING", logger="rcswarm.worker"):
        assert _run(worker) == [0], worker.exit_reason
    warnings = [r.getMessage() for r in caplog.records if "is not finite" in r.getMessage()]
    assert len(warnings) == 1 and "the round is dropped" in warnings[0], warnings
    assert local.service.version == 3
    assert all(bool(torch.isfinite(theta).all()) for theta in local.service.params.values())
    moments = [t for pair in worker.trainer.optimizer.moments.values() for t in pair]
    assert moments and all(bool(torch.isfinite(t).all()) for t in moments)


def test_a_worker_that_keeps_diverging_exits_with_its_reason(start_coordinator):
    spec = tiny_spec(run={"rounds": 5, "workers": 1}, inner={"steps": 2}, sync={"codec": "int8"})
    local = start_coordinator(spec)
    worker = Diverging(WorkerOptions(coordinator=local.target, device="cpu", name="nan", threads=1), TOKEN,
                       at=lambda step: True)
    assert _run(worker) == [1]
    assert f"diverged {MAX_DIVERGED_ROUNDS} rounds in a row" in worker.exit_reason, worker.exit_reason
    assert "is not finite" in worker.exit_reason and local.service.version == 0
