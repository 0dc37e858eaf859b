"""A real worker process with two test hooks: a set pace (the heterogeneous swarm tests' slow device) and a hang
right before a push (a crash at a chosen point, without a race).

    python -m tests.helpers.paced_worker --factor 3 --floor-s 0.05 --coordinator HOST:PORT --name slow [worker flags]
    python -m tests.helpers.paced_worker --hang-from 2 --marker FILE --coordinator HOST:PORT --name doomed

`PacedWorker` is the real `Worker` with a sleep hook in `_train_step`: a step that took t seconds
is padded to factor × max(t, floor), so a worker with factor 3 runs at a third of the speed of one
with factor 1 and the same floor (the floor keeps the ratio when the model's own step time jitters
on a loaded machine). With `hang_from`, its `_push` of the first round trained from a version >= `hang_from`
writes that version to `marker` and then waits for a stop that never comes: the test kills the process there,
so that round's update never lands however loaded the machine (a kill timed from outside can land before or
after the push). Everything else (the wire, the pushes, the metrics) is the real worker's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import torch

from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.train.inner import StepResult
from rcswarm.worker import Worker, WorkerOptions


class PacedWorker(Worker):
    """The real worker, each inner step padded to `factor` × max(its time, `floor_s`); with `hang_from`, hanging
    before the push of the first round trained from a version >= `hang_from` (after writing it to `marker`)."""

    def __init__(self, options: WorkerOptions, token: str, factor: float = 1.0, floor_s: float = 0.0,
                 hang_from: int | None = None, marker: Path | None = None) -> None:
        super().__init__(options, token)
        self.factor, self.floor_s = factor, floor_s
        self.hang_from, self.marker = hang_from, marker

    def _train_step(self) -> StepResult:
        started = time.perf_counter()
        result = super()._train_step()
        took = time.perf_counter() - started
        time.sleep(max(0.0, self.factor * max(took, self.floor_s) - took))
        return result

    def _push(self, version, base, tokens) -> bool:
        if self.hang_from is None or version < self.hang_from:
            return super()._push(version, base, tokens)
        partial = self.marker.with_suffix(".partial")
        partial.write_text(str(version))
        os.replace(partial, self.marker)
        self.stop.wait()
        return False


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s paced-worker %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="paced_worker")
    parser.add_argument("--factor", type=float, default=1.0)
    parser.add_argument("--floor-s", type=float, default=0.0)
    parser.add_argument("--hang-from", type=int, default=None)
    parser.add_argument("--marker", type=Path, default=None)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if (args.hang_from is None) != (args.marker is None):
        parser.error("--hang-from and --marker go together")
    torch.set_num_threads(args.threads)
    options = WorkerOptions(coordinator=args.coordinator, name=args.name, threads=args.threads, device="cpu")
    worker = PacedWorker(options, os.environ.get(TOKEN_ENV, ""), args.factor, args.floor_s, args.hang_from, args.marker)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
