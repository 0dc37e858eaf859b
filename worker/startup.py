"""Where a worker's start-up goes: seconds since its process started, and the marks of its way to the first step.

A restarted worker costs the swarm the time until it trains again; `StartupMarks` records when each stage ended,
counted from the process's start (Linux /proc; from the first mark where that is unreadable), and the worker logs
them once, when its first round starts: "trains version 7, 1.9 s after its process started (imports 1.4 s,
...)". benchmarks/worker_startup_bench.py reads that line. Light: the standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0.0 where that is unreadable)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def process_started() -> float:
    """time.monotonic() when this process started (from `process_age_s`)."""
    return time.monotonic() - process_age_s()


class StartupMarks:
    """The process's age at the end of each stage of a worker's start-up (one thread: the worker's loop)."""

    def __init__(self) -> None:
        # The process's age now, against time.monotonic(): /proc's clock ticks are 10 ms.
        self._origin = process_started()
        self.marks: list[tuple[str, float]] = []
        self.reported = False

    def mark(self, stage: str) -> None:
        """`stage` ended now."""
        self.marks.append((stage, time.monotonic() - self._origin))

    def describe(self) -> str:
        """'A.A s after its process started (stage B.B s, stage C.C s, ...)': each stage's own seconds."""
        total = self.marks[-1][1] if self.marks else 0.0
        previous, parts = 0.0, []
        for stage, at in self.marks:
            parts.append(f"{stage} {at - previous:.2f}s")
            previous = at
        return f"{total:.2f}s after its process started ({', '.join(parts)})"
