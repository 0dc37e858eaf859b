"""The coordinator's decisions as pure functions of (now, state, options).

Admission, eviction (a lease that expired, or a worker that keeps sending outliers),
forgetting ended memberships and round closing take plain immutable views of the state and a
time, and return a Decision (or the chosen workers) with a reason a person can read. The service applies them; tests
drive them with a fake clock.

Heterogeneous swarms (issue #15). `decide_pace` says how much each worker trains from a version:
step-boxed rounds of inner.steps, adaptive step counts (each worker gets the steps it does in the
time the fastest needs for inner.steps, at least sync.min_steps), or time-boxed rounds whose budget
is sync.round_seconds, raised so that the slowest worker still completes sync.min_steps steps, but by
at most sync.round_deadline_s: a member claiming slow steps stretches a round by no more than one
that pulls and never pushes makes it wait (its deadline). Step times it is given are the coordinator's
measurements (`WorkerRecord.check_steps`); one of no time, or not a number, counts as not measured.
`decide_staleness` says whether a late update (trained from an older version than the one served)
is merged, and with which weight: staleness s = current version − base version, merged while
s <= sync.max_staleness with its tokens multiplied by

    w(s) = (1 + s)^(−a),   a = sync.staleness_exponent (0.5: w(1) ≈ 0.71, w(2) ≈ 0.58),

the polynomial staleness function of FedAsync (Xie, Koyejo & Gupta, "Asynchronous Federated
Optimization", 2019, arXiv:1903.03934, s(t − τ) = (t − τ + 1)^(−a)); asynchronous local-SGD for
language models (Liu et al., "Asynchronous Local-SGD Training for Language Modeling", 2024,
arXiv:2401.09135) applies late pseudo-gradients to the newer parameters in the same way, as
delayed outer gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
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
    # After the coordinator itself stalled (liveness.py), a member not heard since has lease_s plus this long
    # from the resume: its calls failed while the coordinator was frozen and may be waiting out their backoff.
    stall_grace_s: float = 10.0


# Ended memberships kept in memory per place (`decide_forgetting`): at most this many × max_workers, the oldest
# forgotten first even within forget_after_s.
ENDED_KEPT_PER_PLACE = 16


@dataclass(frozen=True)
class RoundOptions:
    round_deadline_s: float
    # Before the deadline a round also waits until at least this many workers reported.
    min_reports: int = 1
    # What happens to the update of a worker the deadline leaves training (for the reason only).
    max_staleness: int = 0
    # Adaptive step counts: the deadline does not leave behind a worker whose speed is not measured yet
    # (its first round is as long as it is slow; it is paced from the next one on), for one more
    # round_deadline_s at most: a member that never reports a step is never measured.
    wait_unmeasured: bool = False


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
    # Whether its seconds per inner step have been measured (adaptive pacing needs them).
    measured: bool = True


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
    # A time-boxed round's budget in seconds (0: step-boxed); its deadline comes that much later.
    budget_s: float = 0.0


@dataclass(frozen=True)
class PaceOptions:
    # "steps" or "time" (sync.round).
    mode: str
    inner_steps: int
    # The most steps one worker trains in a round (sync.step_cap).
    step_cap: int
    round_seconds: float
    min_steps: int
    adaptive_steps: bool
    # A round's deadline after its budget (sync.round_deadline_s): a time-boxed budget grows beyond round_seconds by
    # at most this much. inf: not capped.
    round_deadline_s: float = math.inf


@dataclass(frozen=True)
class Pace:
    """How much every worker trains from one version: a time budget (0: step-boxed) and step counts."""

    round_seconds: float
    default_steps: int
    # (worker_id, steps) for workers whose count differs from default_steps.
    steps: tuple[tuple[str, int], ...]
    reason: str

    def steps_for(self, worker_id: str) -> int:
        return dict(self.steps).get(worker_id, self.default_steps)


@dataclass(frozen=True)
class StalenessOptions:
    max_staleness: int
    exponent: float


@dataclass(frozen=True)
class MetricOptions:
    # Rows one worker may store while one version is current (coordinator.max_metrics_per_round, resolved).
    per_round: int
    # Rows per second a worker's time budget refills with (coordinator.metric_rows_per_s; 0 = no time budget),
    # up to `per_round` rows.
    rows_per_s: float


@dataclass(frozen=True)
class MetricBudget:
    """A worker's metric rows: those counted at the version current when it last reported (`version`,
    `in_round`), and its time budget: `left` rows at time `at` (None before its first report: a full budget)."""

    version: int = -1
    in_round: int = 0
    left: float = 0.0
    at: float | None = None


@dataclass(frozen=True)
class Lateness:
    """Whether an update is merged: its staleness in versions, its weight w(s) and why."""

    ok: bool
    staleness: int
    weight: float
    reason: str


def decide_place(
    now: float, workers: Iterable[WorkerView], holders: Collection[str], version: int,
    options: MembershipOptions, taking_over: str | None = None,
) -> Decision:
    """Whether a joining worker finds a place once the places held in the open round of `version` are counted: every
    live active membership (as `decisions.decide_admission` counts them) and every other membership in `holders`,
    those that delivered an update to the open round and ended (or whose lease lapsed) before it closed. `taking_over`:
    the ended holder the joiner names as its previous membership, whose place it takes (not counted twice)."""
    live = {w.worker_id for w in workers if w.active and now - w.last_seen <= options.lease_s}
    held = set(holders) - live - ({taking_over} if taking_over else set())
    if len(live) + len(held) >= options.max_workers:
        return Decision(False, (
            f"the swarm is full: {len(live)} active and {len(held)} ended memberships whose updates are in the open "
            f"round {version}, of max_workers={options.max_workers}; their places free when round {version} closes"))
    takes = f", taking over the place of {taking_over}, whose update is in round {version}" if taking_over else ""
    holding = f"; {len(held)} places held by ended memberships' updates in round {version}" if held else ""
    return Decision(True, f"admitted as worker {len(live) + 1} of at most {options.max_workers}{takes}{holding}")


def decide_admission(
    now: float, workers: Iterable[WorkerView], run_finished: bool, options: MembershipOptions, ended: str = ""
) -> Decision:
    """Admit a new worker unless the run is over or the swarm is full. `ended`: why a finished run ended, in words
    (its stop's reason: pruned, its wall-time budget; "" says it finished its rounds)."""
    if run_finished:
        return Decision(False, ended or "the run has finished its rounds")
    active = sum(1 for w in workers if w.active and now - w.last_seen <= options.lease_s)
    if active >= options.max_workers:
        return Decision(False, f"the swarm is full: {active} active of max_workers={options.max_workers}")
    return Decision(True, f"admitted as worker {active + 1} of at most {options.max_workers}")


def place_retry_s(options: MembershipOptions) -> float:
    """How long a worker refused for want of a place waits before it asks again: a third of the lease (a place
    frees at the latest a lease after its holder was last heard), between 1 and 10 seconds."""
    return min(10.0, max(1.0, options.lease_s / 3))


def decide_evictions(
    now: float, workers: Iterable[WorkerView], options: MembershipOptions, resumed_at: float | None = None
) -> list[tuple[str, str]]:
    """The (worker_id, reason) pairs of active workers whose lease has expired. `now` and `last_seen` are on the
    coordinator's own clock (liveness.py: its stalls are not counted). `resumed_at`: when the coordinator last
    resumed from a stall; a worker not heard since has lease_s + stall_grace_s from then."""
    evicted = []
    for worker in workers:
        silent = now - worker.last_seen
        if not worker.active or silent <= options.lease_s:
            continue
        if resumed_at is not None and worker.last_seen < resumed_at:
            since = now - resumed_at
            if since <= options.lease_s + options.stall_grace_s:
                continue
            evicted.append((worker.worker_id, (
                f"lease expired: no heartbeat for {since:.1f}s since the coordinator resumed from a stall > lease "
                f"{options.lease_s:.1f}s + grace {options.stall_grace_s:.1f}s")))
            continue
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
    now: float, ended: Iterable[WorkerView], options: MembershipOptions, count: int | None = None
) -> list[tuple[str, str]]:
    """The (worker_id, reason) pairs of ended memberships older than `forget_after_s`, and of the oldest beyond the
    newest ENDED_KEPT_PER_PLACE × max_workers whatever their age: a join token's holder joining and leaving in a loop
    (~800 a second on 2 cores) kept ~5 KB a membership for forget_after_s (0.5 GB at 300 s).

    `ended` lists ended memberships in the order they ended, `count` of them (None: counted here), so the answer is
    a prefix of it and the scan stops at the first one still within its grace period and the cap.
    """
    if count is None:
        ended = list(ended)
        count = len(ended)
    keep = ENDED_KEPT_PER_PLACE * options.max_workers
    forgotten = []
    for index, worker in enumerate(ended):
        if count - index > keep:
            forgotten.append((worker.worker_id, f"more than {keep} ended memberships kept "
                                                f"({ENDED_KEPT_PER_PLACE} × max_workers {options.max_workers})"))
        elif worker.ended_at is None or now - worker.ended_at <= options.forget_after_s:
            break
        else:
            forgotten.append((worker.worker_id,
                              f"ended {now - worker.ended_at:.1f}s ago > forget_after_s {options.forget_after_s:.1f}s"))
    return forgotten


def expected_reporters(round_: RoundView, workers: Iterable[WorkerView]) -> frozenset[str]:
    """Active workers that trained from this round's version."""
    return frozenset(w.worker_id for w in workers if w.active and w.base_version == round_.version)


def decide_round_close(
    now: float, round_: RoundView, workers: Iterable[WorkerView], options: RoundOptions
) -> Decision:
    """Close when every active worker of the round's version reported (and at least
    min_reports did), or at the deadline with at least one report: `round_deadline_s` after the
    round opened, after its budget for a time-boxed round (with `wait_unmeasured`, a worker whose
    speed is not measured yet is waited for one more `round_deadline_s`). The reason says what the
    workers the deadline leaves behind are doing (still training) and what becomes of their updates."""
    reported = len(round_.reporters)
    if reported == 0:
        return Decision(False, f"round {round_.version}: no reports yet")
    waiting = expected_reporters(round_, workers) - round_.reporters
    budget = f"budget {round_.budget_s:.1f}s used: " if round_.budget_s > 0 else ""
    if not waiting and reported >= options.min_reports:
        return Decision(True, f"round {round_.version}: {budget}all {reported} active workers reported")
    deadline = round_.budget_s + options.round_deadline_s
    unmeasured = [w for w in workers if w.worker_id in waiting and not w.measured] if options.wait_unmeasured else []
    extended = deadline + options.round_deadline_s
    if deadline <= now - round_.opened_at < extended and unmeasured:
        return Decision(False, (
            f"round {round_.version}: deadline {deadline:.1f}s reached; waiting for {len(unmeasured)} worker(s) "
            f"whose speed is not measured yet, until {extended:.1f}s (sync.adaptive_steps paces them from their "
            "next round)"
        ))
    if now - round_.opened_at >= deadline:
        return Decision(True, (
            f"round {round_.version}: {budget}deadline {deadline:.1f}s reached with {reported} reports; "
            f"{_still_training(len(waiting), options.max_staleness)}"
        ))
    if not waiting:
        return Decision(False, f"round {round_.version}: {reported} reports, waiting for min_reports={options.min_reports}")
    return Decision(False, f"round {round_.version}: waiting for {len(waiting)} of {reported + len(waiting)} workers")


def _still_training(waiting: int, max_staleness: int) -> str:
    """What a close leaves behind: the workers still training and the fate of their updates."""
    if waiting == 0:
        return "no worker still training"
    who = f"{waiting} worker{'s' if waiting != 1 else ''} still training"
    if max_staleness > 0:
        return f"{who}: merged late into the next round (sync.max_staleness = {max_staleness})"
    return f"{who}: refused as stale when it arrives (sync.max_staleness = 0)"


def staleness_weight(staleness: int, exponent: float) -> float:
    """w(s) = (1 + s)^(−exponent): FedAsync's polynomial staleness function (module docstring)."""
    return float((1 + staleness) ** -exponent)


def decide_staleness(base_version: int, version: int, pulled: int, options: StalenessOptions) -> Lateness:
    """Whether an update trained from `base_version` is taken into the round of `version`.

    On time (`base_version` = `version`) it is, with weight 1. A late one is merged when this
    membership pulled that version (`pulled`: it trained from it) and it lags by at most
    max_staleness versions, weighted by `staleness_weight`; otherwise refused, naming both versions.
    """
    staleness = version - base_version
    if staleness <= 0:
        return Lateness(True, 0, 1.0, f"on time for round {version}")
    refused = f"stale update: trained from version {base_version} but the global version is {version}"
    if base_version != pulled:
        return Lateness(False, staleness, 0.0, f"{refused}; this worker did not pull version {base_version}: pull and re-sync")
    if staleness > options.max_staleness:
        return Lateness(False, staleness, 0.0, (
            f"{refused}: {staleness} version{'s' if staleness != 1 else ''} behind > sync.max_staleness = {options.max_staleness}; pull and re-sync"
        ))
    weight = staleness_weight(staleness, options.exponent)
    return Lateness(True, staleness, weight, (
        f"late update from version {base_version} merged into round {version}: stale by {staleness}, "
        f"weight (1 + {staleness})^-{options.exponent:g} = {weight:.3f}"
    ))


def decide_pace(step_seconds: Mapping[str, float], options: PaceOptions) -> Pace:
    """How much each worker trains from the next version, from the active workers' measured seconds per
    inner step (`step_seconds`, only those measured; a time <= 0 or not finite counts as not measured). See the
    module docstring for the three modes."""
    step_seconds = {worker_id: s for worker_id, s in step_seconds.items() if 0.0 < s < math.inf}
    if options.mode == "time":
        return _time_pace(step_seconds, options)
    if not options.adaptive_steps:
        return Pace(0.0, options.inner_steps, (), f"step-boxed: inner.steps = {options.inner_steps}")
    if not step_seconds:
        return Pace(0.0, options.inner_steps, (), f"adaptive steps: no step measured yet, inner.steps = {options.inner_steps}")
    fastest = min(step_seconds.values())
    target = options.inner_steps * fastest
    steps = tuple(sorted(
        (worker_id, max(options.min_steps, min(options.inner_steps, round(target / seconds))))
        for worker_id, seconds in step_seconds.items()
    ))
    counts = ", ".join(f"{worker_id} {n}" for worker_id, n in steps)
    return Pace(0.0, options.inner_steps, tuple((w, n) for w, n in steps if n != options.inner_steps), (
        f"adaptive steps: {target:.2f}s a round (inner.steps = {options.inner_steps} at the fastest worker's "
        f"{fastest:.3f}s/step), at least sync.min_steps = {options.min_steps}: {counts}"
    ))


def _time_pace(step_seconds: Mapping[str, float], options: PaceOptions) -> Pace:
    """A time-boxed round: sync.round_seconds, or longer so that the slowest worker does sync.min_steps, at most
    sync.round_seconds + sync.round_deadline_s."""
    budget, why = options.round_seconds, f"sync.round_seconds = {options.round_seconds:g}"
    if step_seconds:
        slowest = max(step_seconds, key=lambda worker_id: (step_seconds[worker_id], worker_id))
        needed = options.min_steps * step_seconds[slowest]
        if needed > budget:
            budget = needed
            why = (f"sync.min_steps = {options.min_steps} of the slowest worker {slowest} at "
                   f"{step_seconds[slowest]:.3f}s/step (> sync.round_seconds = {options.round_seconds:g})")
            limit = options.round_seconds + options.round_deadline_s
            if budget > limit:
                budget = limit
                why += (f", capped at sync.round_seconds + sync.round_deadline_s = {options.round_seconds:g} + "
                        f"{options.round_deadline_s:g}")
    return Pace(budget, options.step_cap, (), f"time-boxed: {budget:.2f}s a round ({why}), at most {options.step_cap} steps")


def decide_metric_rows(
    now: float, version: int, budget: MetricBudget, rows: int, options: MetricOptions
) -> tuple[Decision, MetricBudget]:
    """Whether a worker may store `rows` more metric rows at `version`, and its budget afterwards: at most
    `per_round` rows while one version is current, and a token bucket over time, `rows_per_s` rows a second up
    to `per_round` at once, so that rounds closing fast do not multiply what one worker stores. A refusal leaves
    the budget as it was (refilled to `now`)."""
    in_round = budget.in_round if budget.version == version else 0
    left = float(options.per_round) if budget.at is None else min(
        float(options.per_round), budget.left + max(now - budget.at, 0.0) * options.rows_per_s)
    refilled = MetricBudget(version, in_round, left, now)
    if in_round + rows > options.per_round:
        return Decision(False, (f"reported {in_round} metric rows at version {version}; {rows} more exceed "
                                f"coordinator.max_metrics_per_round = {options.per_round}")), refilled
    if options.rows_per_s > 0 and rows > left:
        wait = (rows - left) / options.rows_per_s
        return Decision(False, (f"{rows} metric rows exceed the {int(left)} its time budget holds now "
                                f"(coordinator.metric_rows_per_s = {options.rows_per_s:g}, at most "
                                f"{options.per_round} at once); retry in {wait:.1f} s")), refilled
    return Decision(True, f"{rows} rows stored"), dataclasses.replace(
        refilled, in_round=in_round + rows, left=left - rows if options.rows_per_s > 0 else left)


def refund_metric_rows(budget: MetricBudget, version: int, rows: int, options: MetricOptions) -> MetricBudget:
    """The budget after `rows` counted at `version` were not stored after all (the store refused them)."""
    in_round = max(budget.in_round - rows, 0) if budget.version == version else budget.in_round
    left = min(float(options.per_round), budget.left + rows) if options.rows_per_s > 0 else budget.left
    return dataclasses.replace(budget, in_round=in_round, left=left)


@dataclass(frozen=True)
class RoundProgress:
    """A run's open round as the health service sees it: seconds since it opened (the previous close, or the
    first pull after a start), its deadline (sync.round_deadline_s plus a time-boxed round's budget), the
    updates waiting in it, and coordinator.health_round_deadlines."""

    run_id: str
    open_s: float
    deadline_s: float
    reports: int
    multiple: float


def decide_progress(rounds: Iterable[RoundProgress]) -> Decision:
    """Whether rounds close (pure): not when updates wait in a round that has been open for more than
    `multiple` round deadlines (a close that fails or hangs, pushes that cannot land); an idle round is fine."""
    for r in rounds:
        limit = r.multiple * r.deadline_s
        if r.reports > 0 and r.open_s > limit:
            return Decision(False, (
                f"run {r.run_id}: {r.reports} update{'s' if r.reports != 1 else ''} waiting in a round open for "
                f"{r.open_s:.1f} s, more than coordinator.health_round_deadlines = {r.multiple:g} × its deadline "
                f"{r.deadline_s:g} s: no round closes"))
    return Decision(True, "rounds close")
