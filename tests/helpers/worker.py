"""Workers in the test process: their options (the token is passed beside them), a worker that faults before its first push,
running a worker on a thread until a condition holds, and the plain local training one worker's DiLoCo reduces to."""

from __future__ import annotations

import threading

import torch

from rcswarm.models import registry
from rcswarm.train.inner import inner_step, make_inner_optimizer, make_sampler, worker_data_seed
from rcswarm.worker import Worker, WorkerOptions
from tests.helpers.specs import TOKEN
from tests.helpers.waiting import wait_for


def _options(target: str, **overrides) -> WorkerOptions:
    return WorkerOptions(coordinator=target, device="cpu", name="victim", threads=1, **overrides)


class FaultBeforeFirstPush(Worker):
    """The real worker, which calls `fault()` between its first training and its first push and
    records every push as (base version, delivered)."""

    def __init__(self, options: WorkerOptions, fault) -> None:
        super().__init__(options, TOKEN)
        self.fault = fault
        self.pushes: list[tuple[int, bool]] = []

    def _push(self, version: int, base: dict[str, torch.Tensor], tokens: int) -> bool:
        if not self.pushes:
            self.fault(self)
        delivered = super()._push(version, base, tokens)
        self.pushes.append((version, delivered))
        return delivered


def run_until(worker: Worker, done, timeout: float) -> int:
    """Run `worker` on a thread until done(worker) or `timeout`; stop it and return its exit code."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: done(worker) or not thread.is_alive(), timeout, "the worker's rounds")
    finally:
        worker.stop.set()
        thread.join(timeout=30)
    assert result, "the worker did not stop"
    return result[0]


def local_training(spec, steps: int) -> dict[str, torch.Tensor]:
    """θ after `steps` inner steps of plain local training from the run's initial θ, on the data stream of the first
    worker to join (data_seed 1)."""
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides, seed=spec.run.seed)
    optimizer = make_inner_optimizer(model, spec.inner)
    sampler = make_sampler(spec.data, worker_data_seed(spec.run.seed, 1))
    for _ in range(steps):
        inner_step(model, optimizer, sampler, spec.inner.grad_clip, torch.device("cpu"))
    return {name: p.detach().clone() for name, p in model.named_parameters()}
