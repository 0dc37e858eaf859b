"""Workers in the test process: their options (the token is passed beside them), a worker that faults before its first push, and
running a worker on a thread until a condition holds."""

from __future__ import annotations

import threading

import torch

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
