"""The coordinator's own clock: monotonic time that skips the coordinator's stalls (issue #31).

Leases and round deadlines are measured on it, so a coordinator that was frozen (SIGSTOP, a paused VM,
an overloaded host that did not schedule it) or whose wall clock was stepped does not charge its
workers for the time it did not run. A thread beats every BEAT_S; a gap between two beats longer than
STALL_S is a stall, and everything beyond STALL_S of it is not counted (`decide_beat`, pure). Between
beats the clock counts at most STALL_S past the latest beat (`alive_seconds`, pure), so a call served
right after the coordinator woke up, before the beat thread ran, does not see the stall either. The
reading is `origin + alive seconds`, epoch-like seconds (the wall clock at start, then monotonic), so the
times the coordinator records (rounds, events, metrics) stay readable as dates.

After a stall `SwarmCoordinator.tick` gives every member not heard since a grace period
(`decisions.decide_evictions`' `resumed_at`): its heartbeats may have failed while the coordinator was
frozen and be waiting out their backoff. A stall on the coordinator's own lock (a slow write under it)
is not this clock's to see: the coordinator runs, its calls wait. `SwarmCoordinator.tick` measures it (the
longest hold of the lock, its own wait for it) and gives the same grace (`_note_lock_stall`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("rcswarm.coordinator")

# Seconds between beats, and the gap between two beats that counts as a stall (a loaded host delays a
# thread by far less; a SIGSTOP or a paused VM by far more).
BEAT_S = 0.1
STALL_S = 2.0


@dataclass(frozen=True)
class Beat:
    """The latest beat (time.monotonic), the seconds of stalls not counted so far, how many stalls, the latest's reason."""

    at: float
    stalled_s: float = 0.0
    stalls: int = 0
    reason: str = ""


def decide_beat(previous: Beat, now: float, stall_s: float) -> Beat:
    """The beat at `now` after `previous` (pure): a gap longer than `stall_s` is a stall, whose time beyond
    `stall_s` is added to the seconds not counted, with a reason."""
    gap = now - previous.at
    if gap <= stall_s:
        return dataclasses.replace(previous, at=now)
    skipped = gap - stall_s
    reason = (f"the coordinator did not run for {gap:.1f} s (stopped, paused or starved); {skipped:.1f} s of it "
              f"are not counted against leases and round deadlines")
    return Beat(now, previous.stalled_s + skipped, previous.stalls + 1, reason)


def alive_seconds(beat: Beat, now: float, stall_s: float) -> float:
    """Monotonic seconds the coordinator ran, at `now` after `beat` (pure): without the stalls, and counting
    at most `stall_s` past the latest beat. Continuous and non-decreasing across beats."""
    return now - beat.stalled_s - max(0.0, now - beat.at - stall_s)


class LivenessClock:
    """A clock for leases and deadlines that skips the coordinator's stalls; call it for the time.

    Threads: the beat thread (`start`) replaces `_beat` whole every BEAT_S; any thread may call the clock
    or read `stalls` (one reference read, no lock). `start` and `stop` run on the owner's thread.
    """

    def __init__(
        self, stall_s: float = STALL_S, beat_s: float = BEAT_S, monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < beat_s < stall_s:
            raise ValueError(f"beat_s = {beat_s!r}, stall_s = {stall_s!r}: expected 0 < beat_s < stall_s")
        self.stall_s = stall_s
        self.beat_s = beat_s
        self._monotonic = monotonic
        started = monotonic()
        self._origin = wall() - started
        self._beat = Beat(started)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self) -> float:
        """The time: the wall clock at construction plus the seconds the coordinator ran since."""
        return self._origin + alive_seconds(self._beat, self._monotonic(), self.stall_s)

    @property
    def stalls(self) -> Beat:
        """The latest beat: its count of stalls and the latest one's reason."""
        return self._beat

    def beat(self) -> Beat:
        """Beat now (the beat thread, or a test with a fake monotonic clock); logs a stall as one WARNING line."""
        previous = self._beat
        self._beat = decide_beat(previous, self._monotonic(), self.stall_s)
        if self._beat.stalls > previous.stalls:
            log.warning("%s", self._beat.reason)
        return self._beat

    def start(self) -> LivenessClock:
        """Start the beat thread."""
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the beat thread and wait for it (at most a second)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        """The beat thread: beats every `beat_s` until stopped. A beat that raises is logged with its traceback once
        per distinct error and the thread goes on (before, it ended and the clock froze `stall_s` past its last
        beat for good); the beats it missed read as a stall once it beats again."""
        failed = None
        while not self._stop.wait(self.beat_s):
            try:
                self.beat()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != failed:
                    log.exception("the liveness clock's beat failed; it tries again every %g s", self.beat_s)
                failed = error
            else:
                failed = None
