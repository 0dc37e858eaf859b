"""A real worker process that hangs right before it pushes a round: a crash at a chosen point, without a race.

    python -m tests.helpers.hanging_worker --hang-from 2 --marker FILE --coordinator HOST:PORT --name w

`HangingWorker` is the real `Worker` whose `_push` of the first round trained from a version >= `hang_from`
writes that version to `marker` and then waits for a stop that never comes; the test kills the process
there, so its update of that round never lands, however loaded the machine (a kill timed from outside
can land before or after the push). Everything else is the real worker's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch

from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.worker import Worker, WorkerOptions


class HangingWorker(Worker):
    """The real worker, hanging before the push of the first round trained from version >= `hang_from`."""

    def __init__(self, options: WorkerOptions, token: str, hang_from: int, marker: Path) -> None:
        super().__init__(options, token)
        self.hang_from, self.marker = hang_from, marker

    def _push(self, version, base, tokens) -> bool:
        if version >= self.hang_from:
            partial = self.marker.with_suffix(".partial")
            partial.write_text(str(version))
            os.replace(partial, self.marker)
            self.stop.wait()
            return False
        return super()._push(version, base, tokens)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hanging-worker %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="hanging_worker")
    parser.add_argument("--hang-from", type=int, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    options = WorkerOptions(coordinator=args.coordinator, name=args.name, threads=1, device="cpu")
    return HangingWorker(options, os.environ.get(TOKEN_ENV, ""), args.hang_from, args.marker).run()


if __name__ == "__main__":
    sys.exit(main())
