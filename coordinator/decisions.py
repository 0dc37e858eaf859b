"""The coordinator's decisions as pure functions of (now, state, options).

Admission, eviction (a lease that expired, or a worker that keeps sending outliers),
forgetting ended memberships and round closing take plain immutable views of the state and a
time, and return a Decision (or the chosen workers) with a reason a person can read. The service applies them; tests
drive them with a fake clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    ok: bool
    reason: str


@dataclass(frozen=True)
class MembershipOptions:
    lease_s: float
    max_workers: int
    # Seconds an ended membership (left, evicted, reassigned) is kept in memory.
    forget_after_s: float = 300.0


@dataclass(frozen=True)
class RoundOptions:
    round_deadline_s: float
    # Before the deadline a round also waits until at least this many workers reported.
    min_reports: int = 1


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    last_seen: float
    # The version whose round the worker reports to next: the version current when it
    # joined or last pulled, or the next one once it has reported.
    base_version: int
    active: bool
    # When the membership ended (left, evicted, reassigned); None while active.
    ended_at: float | None = None


@dataclass(frozen=True)
class OutlierOptions:
    # Evict a worker flagged in this many of its last `window` rounds; 0 = never.
    evict_after: int
    window: int


@dataclass(frozen=True)
class OutlierView:
    """A worker's recent rounds as the aggregation saw them, oldest first: (version, flag), flag
    "" for an update kept as sent, else what happened to it ("clipped", "trimmed", "dropped")."""

    worker_id: str
    active: bool
    recent: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class RoundView:
    version: int
    opened_at: float
    reporters: frozenset[str]


def decide_admission(
    now: float, workers: Iterable[WorkerView], run_finished: bool, options: MembershipOptions
) -> Decision:
    """Admit a new worker unless the run is over or the swarm is full."""
    if run_finished:
        return Decision(False, "the run has finished its rounds")
    active = sum(1 for w in workers if w.active and now - w.last_seen <= options.lease_s)
    if active >= options.max_workers:
        return Decision(False, f"the swarm is full: {active} active of max_workers={options.max_workers}")
    return Decision(True, f"admitted as worker {active + 1} of at most {options.max_workers}")


def decide_evictions(
    now: float, workers: Iterable[WorkerView], options: MembershipOptions
) -> list[tuple[str, str]]:
    """The (worker_id, reason) pairs of active workers whose lease has expired."""
    evicted = []
    for worker in workers:
        silent = now - worker.last_seen
        if worker.active and silent > options.lease_s:
            evicted.append((worker.worker_id, f"lease expired: no heartbeat for {silent:.1f}s > lease {options.lease_s:.1f}s"))
    return evicted


def decide_outlier_evictions(workers: Iterable[OutlierView], options: OutlierOptions) -> list[tuple[str, str]]:
    """The (worker_id, reason) pairs of active workers flagged in at least `evict_after` of their
    last `window` rounds (rounds they sent an update in); none when `evict_after` is 0."""
    if options.evict_after <= 0:
        return []
    evicted = []
    for worker in workers:
        recent = worker.recent[-options.window:]
        flagged = [(version, flag) for version, flag in recent if flag]
        if worker.active and len(flagged) >= options.evict_after:
            rounds = ", ".join(f"{flag} in round {version}" for version, flag in flagged)
            evicted.append((worker.worker_id, (
                f"outlier in {len(flagged)} of its last {len(recent)} rounds ({rounds}); "
                f"sync.outlier_evict_after = {options.evict_after} of sync.outlier_window = {options.window}"
            )))
    return evicted


def decide_forgetting(
    now: float, ended: Iterable[WorkerView], options: MembershipOptions
) -> list[tuple[str, str]]:
    """The (worker_id, reason) pairs of ended memberships older than `forget_after_s`.

    `ended` lists ended memberships in the order they ended, so the answer is a prefix of it and
    the scan stops at the first one still within its grace period.
    """
    forgotten = []
    for worker in ended:
        if worker.ended_at is None or now - worker.ended_at <= options.forget_after_s:
            break
        forgotten.append((worker.worker_id, f"ended {now - worker.ended_at:.1f}s ago > forget_after_s {options.forget_after_s:.1f}s"))
    return forgotten


def expected_reporters(round_: RoundView, workers: Iterable[WorkerView]) -> frozenset[str]:
    """Active workers that trained from this round's version."""
    return frozenset(w.worker_id for w in workers if w.active and w.base_version == round_.version)


def decide_round_close(
    now: float, round_: RoundView, workers: Iterable[WorkerView], options: RoundOptions
) -> Decision:
    """Close when every active worker of the round's version reported (and at least
    min_reports did), or at the deadline with at least one report."""
    reported = len(round_.reporters)
    if reported == 0:
        return Decision(False, f"round {round_.version}: no reports yet")
    waiting = expected_reporters(round_, workers) - round_.reporters
    if not waiting and reported >= options.min_reports:
        return Decision(True, f"round {round_.version}: all {reported} active workers reported")
    age = now - round_.opened_at
    if age >= options.round_deadline_s:
        return Decision(
            True,
            f"round {round_.version}: deadline {options.round_deadline_s:.1f}s passed with "
            f"{reported} reports; {len(waiting)} active workers missing",
        )
    if not waiting:
        return Decision(False, f"round {round_.version}: {reported} reports, waiting for min_reports={options.min_reports}")
    return Decision(False, f"round {round_.version}: waiting for {len(waiting)} of {reported + len(waiting)} workers")
