"""A real worker process whose inner steps take a set pace: the heterogeneous swarm tests' slow device.

    python -m tests.helpers.paced_worker --factor 3 --floor-s 0.05 --coordinator HOST:PORT --name slow [worker flags]

`PacedWorker` is the real `Worker` with a sleep hook in `_train_step`: a step that took t seconds
is padded to factor × max(t, floor), so a worker with factor 3 runs at a third of the speed of one
with factor 1 and the same floor (the floor keeps the ratio when the model's own step time jitters
on a loaded machine). Everything else (the wire, the pushes, the metrics) is the real worker's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch

from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.train.inner import StepResult
from rcswarm.worker import Worker, WorkerOptions


class PacedWorker(Worker):
    """The real worker, each inner step padded to `factor` × max(its time, `floor_s`)."""

    def __init__(self, options: WorkerOptions, token: str, factor: float, floor_s: float) -> None:
        super().__init__(options, token)
        self.factor, self.floor_s = factor, floor_s

    def _train_step(self) -> StepResult:
        started = time.perf_counter()
        result = super()._train_step()
        took = time.perf_counter() - started
        time.sleep(max(0.0, self.factor * max(took, self.floor_s) - took))
        return result


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s paced-worker %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="paced_worker")
    parser.add_argument("--factor", type=float, required=True)
    parser.add_argument("--floor-s", type=float, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    options = WorkerOptions(coordinator=args.coordinator, name=args.name, threads=args.threads, device="cpu")
    return PacedWorker(options, os.environ.get(TOKEN_ENV, ""), args.factor, args.floor_s).run()


if __name__ == "__main__":
    sys.exit(main())
