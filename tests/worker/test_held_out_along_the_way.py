"""Real workers measure the held-out loss along the way (`[run] eval_every`, issue #30): θ_v's loss on the fixed
held-out set rides on the pull's row to a real coordinator (gRPC on loopback), blocking and overlapped."""

import threading

import pytest
import torch

from rcswarm.train.round import RoundTrainer, held_out_seed
from rcswarm.worker import Worker, WorkerOptions
from tests.helpers.specs import TOKEN, tiny_spec


def run_one_worker(start_coordinator, spec):
    """A real coordinator for `spec` and one real worker that trains its 5 rounds; both, once it has returned."""
    local = start_coordinator(spec)
    worker = Worker(WorkerOptions(coordinator=local.target, device="cpu", name="solo"), TOKEN)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and local.service.version == 5
    return local, worker


@pytest.mark.parametrize("overlap", [False, True])
def test_a_worker_reports_the_held_out_loss_of_every_kth_version_it_pulls(start_coordinator, overlap):
    spec = tiny_spec(run={"rounds": 5, "eval_every": 2, "eval_batches": 2}, inner={"steps": 3},
                     sync={"codec": "fp32", "overlap": overlap, "min_reports": 1})
    local, worker = run_one_worker(start_coordinator, spec)
    held = local.service.store.held_out_losses()
    assert [r.version for r in held] == [0, 2, 4]
    assert all(r.seconds > 0 and r.worker_id == worker.worker_id for r in held)
    # θ_0's is the initial model's loss on the first 2 batches of the held-out stream, bit for bit.
    initial = RoundTrainer(torch.device("cpu"))
    initial.build(spec, model_seed=spec.run.seed)
    assert held[0].loss == initial.held_out_loss(2)
    assert held[-1].loss < held[0].loss


def test_with_a_rotating_set_a_worker_measures_each_version_on_that_versions_batches(start_coordinator):
    spec = tiny_spec(run={"rounds": 5, "eval_every": 2, "eval_batches": 2, "eval_set": "rotating"},
                     inner={"steps": 3}, sync={"codec": "fp32", "min_reports": 1})
    local, worker = run_one_worker(start_coordinator, spec)
    held = local.service.store.held_out_losses()
    assert [r.version for r in held] == [0, 2, 4]
    initial = RoundTrainer(torch.device("cpu"))
    initial.build(spec, model_seed=spec.run.seed)
    # θ_0 on version 0's own batches, bit for bit: not the fixed set's number.
    assert held[0].loss == initial.held_out_loss(2, seed=held_out_seed("rotating", 0))
    assert held[0].loss != initial.held_out_loss(2)
