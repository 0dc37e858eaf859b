"""How a worker's loop ended (`Worker.end`, worker/worker.py), which decides whether a Ray worker actor starts it again
(`start_again_reason`, worker/ray_worker.py): each kind of end met for real, against an in-process coordinator on
loopback (real gRPC). Before, the actor could tell only a worker that gave up (`Worker.gave_up`) from the others, and
started no other end again (review of the Ray launcher, 2026-11-29).
"""

from __future__ import annotations

import grpc
import pytest
import torch

from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.models import registry
from rcswarm.worker import Worker
from rcswarm.worker.worker import MAX_DIVERGED_ROUNDS, End
from tests.helpers.coordinator import free_port
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import _options, run_until

# Seconds a worker is given to end on its own (`run_until` stops it then, and the test fails on its exit status).
END_S = 60


def ended(worker: Worker) -> int:
    """The exit status of `worker` run until it ends on its own (stopped after END_S: status 0 and `End.STOPPED`, which
    no test here expects of a worker left to end on its own)."""
    return run_until(worker, lambda w: False, END_S)


def test_a_finished_run_and_a_stop_end_with_0_and_say_which(start_coordinator):
    finishing = start_coordinator(tiny_spec(run={"rounds": 1, "workers": 1}, inner={"steps": 2}))
    worker = Worker(_options(finishing.target, patience_s=30.0), TOKEN)
    assert ended(worker) == 0 and worker.finished, worker.exit_reason
    assert worker.end is End.FINISHED and not worker.gave_up

    endless = start_coordinator(tiny_spec(run={"rounds": 0}, inner={"steps": 2}))
    worker = Worker(_options(endless.target, patience_s=30.0), TOKEN)
    assert run_until(worker, lambda w: w.step >= 1, END_S) == 0 and not worker.finished
    assert worker.end is End.STOPPED


def test_a_coordinator_silent_past_the_patience_is_given_up_on():
    worker = Worker(_options(f"127.0.0.1:{free_port()}", patience_s=0.5), TOKEN)
    assert ended(worker) == 1 and "gives up" in worker.exit_reason, worker.exit_reason
    assert worker.end is End.GAVE_UP and worker.gave_up


def test_a_refused_token_and_a_spec_this_worker_cannot_train_are_refusals(start_coordinator):
    """Ends a new start would meet again: the actor leaves them `failed` for good."""
    spec = tiny_spec(run={"rounds": 0})
    local = start_coordinator(spec)
    worker = Worker(_options(local.target, patience_s=5.0), "not-the-token")
    assert ended(worker) == 1 and "refused the join token" in worker.exit_reason, worker.exit_reason
    assert worker.end is End.REFUSED and not worker.gave_up

    count = registry.parameter_count_of(spec.model.name, spec.model.preset, spec.model.overrides)
    worker = Worker(_options(local.target, patience_s=5.0, max_params=count - 1), TOKEN)
    assert ended(worker) == 1 and "cannot train this run" in worker.exit_reason, worker.exit_reason
    assert worker.end is End.REFUSED


class RefusesPushes(SwarmCoordinator):
    """The real coordinator, refusing every push for good (INVALID_ARGUMENT: not the join token)."""

    def push(self, requests):
        for _ in requests:
            pass
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "update rejected: a test's refusal")


class Faulty(Worker):
    """A real worker whose first inner step raises (as a CUDA error would), out of its loop."""

    def _train_step(self):
        raise RuntimeError("a test's fault")


class Diverging(Worker):
    """A real worker whose parameters turn NaN after every inner step: every round's Δ is not finite."""

    def _train_step(self):
        result = super()._train_step()
        with torch.no_grad():
            next(self.model.parameters()).view(-1)[0] = float("nan")
        return result


def test_a_refused_request_diverged_training_and_an_exception_are_errors(start_coordinator):
    """Ends a new start might not meet again: the actor starts them again, a bounded number of times."""
    refusing = start_coordinator(tiny_spec(run={"rounds": 0}, inner={"steps": 2}), service=RefusesPushes)
    worker = Worker(_options(refusing.target, patience_s=30.0), TOKEN)
    assert ended(worker) == 1 and "INVALID_ARGUMENT" in worker.exit_reason, worker.exit_reason
    assert worker.end is End.ERROR

    local = start_coordinator(tiny_spec(run={"rounds": 5, "workers": 1}, inner={"steps": 2}))
    worker = Diverging(_options(local.target, patience_s=30.0), TOKEN)
    assert ended(worker) == 1 and f"diverged {MAX_DIVERGED_ROUNDS} rounds" in worker.exit_reason, worker.exit_reason
    assert worker.end is End.ERROR

    worker = Faulty(_options(local.target, patience_s=5.0), TOKEN)  # it raises at its first step, its calls bounded
    with pytest.raises(RuntimeError, match="^a test's fault$"):
        worker.run()
    assert worker.end is End.ERROR and not worker.exit_reason
