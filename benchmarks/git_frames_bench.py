"""Git histories to frames: actions per second and compression against 40 bits per cell.

Converts each repository's first-parent history with `build_git_frames` (replay, rendering,
delta + block encoding; one core) and reports actions/s of replay plus encoding, the whole
conversion's seconds (tokenizer training included), and the compression ratio of the .rcf
frame files against the naive encoding of every cell as a 32-bit code point plus an 8-bit
style (5 bytes per cell). Anchors from Section 10.1 of the frame paper: its C++ generator
reaches 200,000 actions/s and about 300× compression. actions/s is wall clock; actions/CPU-s
divides by the CPU time of the conversion process and its git children (user + system), the
figure to read on a shared machine, where wall clock also counts other jobs' time slices.

    python benchmarks/git_frames_bench.py REPO [REPO ...] [--rows 48 --cols 160] [--max-commits N]

A repository can be any local clone, e.g. `git clone --no-local /path/to/rcswarm /tmp/rcswarm`.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rcswarm.data.frames.git_frames import build_git_frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", type=Path, nargs="+")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--cols", type=int, default=160)
    parser.add_argument("--max-commits", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    console = Console(width=160)
    table = Table(title=f"git histories to frames, {args.rows}×{args.cols}, one core")
    for column in ("repository", "commits", "files", "actions", "actions/s", "actions/CPU-s", "seconds", "raw MB", "rcf MB", "ratio"):
        table.add_column(column, justify="right")
    for repo in args.repos:
        with tempfile.TemporaryDirectory() as out:
            try:
                summary = build_git_frames(repo, Path(out) / "frames", rows=args.rows, cols=args.cols,
                                           vocab_size=args.vocab_size, max_commits=args.max_commits, console=console)
            except ValueError as exc:  # not a repository, no commits: one line, not a traceback
                raise SystemExit(f"git_frames_bench: {exc}") from None
        table.add_row(
            repo.name, f"{summary['commits']:,}", f"{summary['files']:,}", f"{summary['actions']:,}",
            f"{summary['actions_per_second']:,.0f}", f"{summary['actions_per_cpu_second']:,.0f}", f"{summary['seconds']:.1f}",
            f"{summary['raw_bytes'] / 1e6:,.1f}", f"{summary['compressed_bytes'] / 1e6:,.2f}", f"{summary['ratio']:,.0f}×",
        )
    console.print(table)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
                  f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
