"""DiLoCo arithmetic end to end: one worker with outer lr 1 and momentum 0 is local training."""

import threading

import torch

from rcswarm.models import registry
from rcswarm.worker import Worker, WorkerOptions
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import local_training


def test_one_worker_with_lr_one_and_no_momentum_is_plain_local_training(start_coordinator):
    spec = tiny_spec(
        run={"rounds": 3}, inner={"steps": 7}, outer={"lr": 1.0, "momentum": 0.0}, sync={"codec": "fp32"}
    )
    local = start_coordinator(spec)
    worker = Worker(WorkerOptions(coordinator=local.target, device="cpu", name="solo"), TOKEN)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert local.service.version == 3
    expected = local_training(spec, steps=3 * 7)
    # θ_{v+1} = θ_v − (θ_v − θ_local) is θ_local up to one float32 rounding per round.
    for name, theta in local.service.params.items():
        torch.testing.assert_close(theta, expected[name], rtol=0, atol=1e-6)
    assert any(not torch.equal(theta, registry.build_model("lstm_lm", "tiny", seed=spec.run.seed).state_dict()[name])
               for name, theta in local.service.params.items())
