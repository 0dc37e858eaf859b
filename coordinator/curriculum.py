"""The coordinator's curriculum: which (sequence length, batch size) each worker trains.

The coordinator is the one source of truth; workers follow the assignment it sends in
JoinResponse, HeartbeatResponse and AwaitVersionResponse at their next round boundary.

* Fixed schedule (`curriculum.schedule`): the row in force at the run step the version starts after
  (the steps the run's rounds trained before it, `analysis.run_steps`).
* Heterogeneous workers (`curriculum.worker_seq_lens`): a joining worker gets the length
  furthest below its share of the active workers (a length listed k times has k shares), ties
  to the earlier in the list (`decide_worker_length`).
* Adaptive (`curriculum.policy = "adaptive"`): the run climbs the ladder `seq_lens`. At each
  round close (with sync.backend = "hivemind", whose workers close rounds peer to peer: when their
  metrics first report the round's next version) `decide_lengthening` compares the current rung L
  with the next one L' under the fitted law of Section 10.5: loss(t, L) ≈ A(t/c_L) · L^(−α(t/c_L)),
  α(s) = α∞(1 − e^(−s/τ)) (Eq. 8, 9, 11 with s = t / c_L, c_L the measured seconds per step).
  It lengthens once the crossover that `fits.predicted_crossover` predicts lies within the
  budget and the run's wall time has reached it: from then on the longer length is predicted
  to be ahead. With `curriculum.forecast_gain` > 0 it also lengthens once the current rung has saturated
  by its own forecast (`decide_saturation`, issue #30).
* Per worker where paces differ (issue #30): a slower worker reaches Eq. 11's crossover later in wall time, so
  when two or more active workers have measured costs and their seconds per step at some length differ by
  PACE_SPREAD or more, `decide_worker_lengthening` decides each on its own rung and its own measured costs, and
  each worker's assignment is its own rung. Otherwise the run-wide rule above decides the run's rung (equal paces:
  one rung, as before). The run's rung (`CurriculumState.rung`, what GetStatus reports) is then the lowest rung a
  decided worker trains, and a worker not decided yet (one joining mid-run) trains it: its pace is unknown, and
  starting low costs a fast newcomer at most one round per rung to catch up (once it has measured a step it is
  decided on its own pace, one rung per round close), where starting high would lengthen a slow one before its
  own crossover. A worker is never shortened, and no active worker trains below the run's rung, which never falls:
  at every round close a worker below it is lifted onto it (a run-wide lengthening lifts those below the new rung and
  leaves those above it). A worker that joins again naming its previous membership (after an eviction or a
  coordinator restart) resumes its own rung and costs, lifted onto the run's rung if the run lengthened meanwhile.
  The forecast rule (`forecast_gain`) acts on the run-wide path only (its rounds mix every worker's rows).

The decisions are pure functions of (now, state, options) returning a Decision with a reason;
`CurriculumState` is what the coordinator persists (JSON in its state store) so the current
rung, the measured costs, each worker's own rung and costs, and the last decision survive a restart (a state
stored before the per-worker rungs loads with none). `CurriculumTracker` is one run's curriculum inside the
coordinator: it holds that state and the adaptive options, answers what a worker trains, measures each length's
cost from the workers' metrics, applies and records the adaptive decision at a round close, and resumes from the
stored state.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rcswarm.config.run_step import RunSteps
from rcswarm.config.runspec import CurriculumSection, RunSpec
from rcswarm.coordinator.decisions import Decision
from rcswarm.observe import analysis, fits, forecast
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore

# The run_state key holding the curriculum's state (CurriculumState as JSON).
CURRICULUM_KEY = "curriculum_state"
# Per-worker entries kept in that state (issue #30): beyond this many, those of the oldest ended memberships are
# dropped at a round close (a re-join names its previous membership and resumes its rung from its entry).
MAX_REMEMBERED_WORKERS = 256
# A law fitted from `curriculum.law_from` needs α∞ at least this (besides a fit without caveats): below it a longer
# length gains less than 0.07 % of the loss per doubling (2^(−0.001)), i.e. nothing a loss curve can show; an
# all-equal metrics file fits α∞ ≈ 1e-16 (round-off), under which the run never lengthens.
MIN_FITTED_ALPHA_INF = 1e-3

log = logging.getLogger("rcswarm.coordinator")


@dataclass(frozen=True)
class Law:
    """The fitted scaling law the adaptive policy predicts with."""

    schedule: fits.AlphaScheduleFit
    # log A(s); a constant cancels in the comparison of two lengths.
    log_amplitude: Callable[[float], float]
    source: str


def configured_law(curriculum: CurriculumSection) -> Law:
    """The law given in the config: α∞, τ and a constant amplitude A."""
    schedule = fits.AlphaScheduleFit(alpha_inf=curriculum.alpha_inf, tau=curriculum.tau, r_squared=math.nan)
    log_a = math.log(curriculum.amplitude)
    return Law(
        schedule, lambda step: log_a,
        f"configured: α∞ = {curriculum.alpha_inf:g}, τ = {curriculum.tau:g} steps, A = {curriculum.amplitude:g}",
    )


def fitted_law(path: str | Path) -> Law:
    """The law fitted (as `rcswarm fit` does) to a run directory or a metrics CSV/JSON-lines file.

    The fit must decide whether a longer length ever pays, or ValueError (so `rcswarm coordinator` and `rcswarm run`
    refuse the config before anything is served): no caveat of the fit (`analysis.Analysis.caveats`, what `rcswarm
    fit` prints as "not enough data") may leave α∞ unidentified (too few recorded steps per length, R² of α(s) below
    fits.MIN_SCHEDULE_R_SQUARED, τ beyond the last fitted step, α∞'s interval wider than α∞; fewer than 3 lengths
    fail the fit itself), and α∞ must be at least MIN_FITTED_ALPHA_INF. A caveat on τ alone (its interval, or τ
    below the first fitted step) leaves the decision's timing uncertain, not its direction: the law is used, the
    caveat logged as a WARNING and named in its `source` (GetStatus' curriculum law)."""
    path = Path(path)
    try:
        if path.is_dir():
            rows = analysis.read_state_dirs(path)
        else:
            columns = analysis.Columns(step="step", length="seq_len", loss="loss", time="wall_time", run="run_id")
            rows = analysis.read_metrics(path, columns)
        fitted = analysis.analyse(analysis.length_curves(path, rows))
    except ValueError as exc:
        raise ValueError(f"curriculum.law_from = {str(path)!r} is invalid: {exc}") from None
    except OSError as exc:  # a name too long for the OS, a file this user may not read: one line, not a traceback
        raise ValueError(f"curriculum.law_from = {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    schedule = fitted.schedule
    numbers = f"α∞ = {schedule.alpha_inf:.4g}, τ = {schedule.tau:.4g} steps (R² {schedule.r_squared:.3f})"
    problems = [caveat.text for caveat in fitted.caveats if "alpha_inf" in caveat.parameters]
    if not schedule.alpha_inf >= MIN_FITTED_ALPHA_INF:
        problems.append(f"α∞ = {schedule.alpha_inf:.3g} is below {MIN_FITTED_ALPHA_INF:g}: under this law a longer "
                        "length never overtakes a shorter one, so the run would never lengthen")
    if problems:
        raise ValueError(
            f"curriculum.law_from = {str(path)!r}: the fit ({numbers}) cannot decide a lengthening: "
            f"{'; '.join(problems)}; expected a fit whose α∞ `rcswarm fit` shows without caveats (at least "
            f"{analysis.MIN_STEPS_PER_LENGTH} recorded steps of each of 3 or more lengths in the steps they share, "
            f"R² of α(s) at least {fits.MIN_SCHEDULE_R_SQUARED:g}, τ within the fitted steps) and "
            f"α∞ ≥ {MIN_FITTED_ALPHA_INF:g}; give a longer run's metrics, or curriculum.alpha_inf and curriculum.tau"
        )
    source = f"fitted to {path}: {numbers}"
    uncertain = [caveat.text for caveat in fitted.caveats]  # those left leave τ alone unidentified
    if uncertain:
        log.warning("curriculum.law_from = %r: %s; the law is used, its crossovers' timing is uncertain",
                    str(path), "; ".join(uncertain))
        source += f"; {analysis.NOT_ENOUGH_DATA} for τ: {'; '.join(uncertain)}"
    return Law(schedule, fits.amplitude_from_points(fitted.points), source)


def law_of(curriculum: CurriculumSection) -> Law:
    return fitted_law(curriculum.law_from) if curriculum.law_from else configured_law(curriculum)


def _costs_json(costs: Mapping[int, tuple[float, int]]) -> dict[str, list[float | int]]:
    return {str(length): list(cost) for length, cost in costs.items()}


def _costs_from_json(data: Mapping[str, Sequence[float]]) -> dict[int, tuple[float, int]]:
    return {int(length): (float(seconds), int(steps)) for length, (seconds, steps) in data.items()}


def _add_cost(costs: Mapping[int, tuple[float, int]], seq_len: int, seconds: float,
              steps: int) -> dict[int, tuple[float, int]]:
    old_seconds, old_steps = costs.get(seq_len, (0.0, 0))
    return {**costs, seq_len: (old_seconds + seconds, old_steps + steps)}


@dataclass(frozen=True)
class WorkerCurriculum:
    """One worker's part of the adaptive curriculum (issue #30), keyed by its worker id in `CurriculumState.workers`."""

    # Its rung once the per-worker rule has decided it; None: it trains the run's rung.
    rung: int | None = None
    # seq_len -> (compute seconds, inner steps) over its own measured steps.
    costs: Mapping[int, tuple[float, int]] = field(default_factory=dict)
    # Its last per-worker decision's reason ("" before one).
    reason: str = ""


def _tokens_per_step(assignment: Assignment) -> int:
    return assignment.seq_len * assignment.batch_size


@dataclass(frozen=True)
class CurriculumState:
    """The adaptive curriculum's persistent state."""

    # The run's rung: while the workers' paces are equal, the rung every worker trains; once a round close decided
    # them per worker, the lowest rung a decided worker trains (where a joining worker starts). It never falls: no
    # active worker trains below it (`lift`).
    rung: int = 0
    # When training started (the first pull), on the coordinator's clock; None before.
    started_at: float | None = None
    # seq_len -> (compute seconds, inner steps) summed over every worker's measured steps.
    costs: Mapping[int, tuple[float, int]] = field(default_factory=dict)
    reason: str = "starting at the first rung of curriculum.seq_lens"
    decided_version: int = -1
    # The first version trained at the current rung (issue #30: the rounds its forecast is fitted to).
    rung_version: int = 0
    # Issue #30: worker id -> its own rung and costs (adaptive policy only; the oldest ended memberships' are dropped
    # beyond MAX_REMEMBERED_WORKERS).
    workers: Mapping[str, WorkerCurriculum] = field(default_factory=dict)

    def seconds_per_step(self) -> dict[int, float]:
        return {length: seconds / steps for length, (seconds, steps) in sorted(self.costs.items()) if steps > 0}

    def measured(self, seq_len: int, seconds: float, steps: int = 1, worker_id: str = "") -> CurriculumState:
        """The run's cost at `seq_len` plus these steps, and with a `worker_id` that worker's own cost too."""
        workers = self.workers
        if worker_id:
            own = workers.get(worker_id, WorkerCurriculum())
            workers = {**workers, worker_id: replace(own, costs=_add_cost(own.costs, seq_len, seconds, steps))}
        return replace(self, costs=_add_cost(self.costs, seq_len, seconds, steps), workers=workers)

    def rung_of(self, worker_id: str) -> int:
        """The rung `worker_id` trains: its own once decided, else the run's."""
        own = self.workers.get(worker_id)
        return self.rung if own is None or own.rung is None else own.rung

    def to_json(self) -> str:
        return json.dumps({
            "rung": self.rung, "started_at": self.started_at, "reason": self.reason,
            "decided_version": self.decided_version, "rung_version": self.rung_version,
            "costs": _costs_json(self.costs),
            "workers": {worker_id: {"rung": own.rung, "costs": _costs_json(own.costs), "reason": own.reason}
                        for worker_id, own in self.workers.items()},
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CurriculumState:
        """The stored state; one stored before issue #30's per-worker rungs (no "workers") loads with none."""
        data = json.loads(text)
        workers = {
            str(worker_id): WorkerCurriculum(None if own["rung"] is None else int(own["rung"]),
                                             _costs_from_json(own["costs"]), str(own["reason"]))
            for worker_id, own in data.get("workers", {}).items()
        }
        return cls(
            rung=int(data["rung"]), started_at=data["started_at"], reason=str(data["reason"]),
            decided_version=int(data["decided_version"]), rung_version=int(data.get("rung_version", 0)),
            costs=_costs_from_json(data["costs"]), workers=workers,
        )


@dataclass(frozen=True)
class AdaptiveOptions:
    seq_lens: tuple[int, ...]
    budget_seconds: float
    law: Law
    # Tokens per inner step (L × batch) at each rung, what an unmeasured cost is extrapolated in;
    # empty: proportional to L (a constant batch).
    tokens_per_step: tuple[int, ...] = ()
    # Issue #30: curriculum.forecast_gain (0: off) and the inner steps of a round, what turns the measured seconds
    # per step into the rounds left in the budget.
    forecast_gain: float = 0.0
    inner_steps: int = 1

    def tokens_at(self, seq_len: int) -> int:
        if not self.tokens_per_step:
            return seq_len
        return self.tokens_per_step[self.seq_lens.index(seq_len)]


def estimate_seconds_per_step(
    measured: Mapping[int, float], seq_len: int, tokens_at: Callable[[int], int] = lambda length: length,
) -> tuple[float, str] | None:
    """Seconds per step at `seq_len`: measured, else extrapolated linearly in tokens per step; with a note.

    `tokens_at(L)` is the tokens of one step at L (L × its batch; by default L, a constant
    batch). From one measured length, or lengths that all have the same tokens per step, the
    cost is taken proportional to tokens per step from the nearest (in tokens, then in L);
    from two or more distinct ones, the least-squares line c = a + b·tokens through them
    (proportional again if that line is not positive at `seq_len`). None without any measurement.
    """
    if seq_len in measured:
        return measured[seq_len], f"c({seq_len}) = {measured[seq_len]:.4g} s/step measured"
    if not measured:
        return None
    lengths = sorted(measured)
    target = tokens_at(seq_len)
    nearest = min(lengths, key=lambda length: (abs(tokens_at(length) - target), abs(length - seq_len)))
    estimate = measured[nearest] * target / tokens_at(nearest)
    tokens = [tokens_at(length) for length in lengths]
    if len(set(tokens)) >= 2:
        slope, intercept = np.polyfit(tokens, [measured[length] for length in lengths], 1)
        line = float(intercept + slope * target)
        if line > 0:
            estimate = line
    return estimate, (f"c({seq_len}) = {estimate:.4g} s/step extrapolated linearly in tokens per step "
                      f"({target} at L = {seq_len}) from L = {lengths}")


def decide_lengthening(now: float, state: CurriculumState, options: AdaptiveOptions) -> Decision:
    """Lengthen to the next rung once Eq. 11 predicts it ahead of the current one, within the budget.

    ok = lengthen. The predicted crossover T (wall time from the start of training after which
    the longer length's loss stays below the current one's) is searched up to the budget; the
    run lengthens when T exists and the elapsed wall time has reached it.
    """
    lengths = options.seq_lens
    current = lengths[state.rung]
    if state.rung + 1 >= len(lengths):
        return Decision(False, f"stays at L = {current}: the last rung of the ladder {list(lengths)}")
    longer = lengths[state.rung + 1]
    if state.started_at is None:
        return Decision(False, f"stays at L = {current}: training has not started")
    elapsed = now - state.started_at
    budget = options.budget_seconds
    if elapsed >= budget:
        return Decision(False, f"stays at L = {current}: the budget of {budget:g} s is spent ({elapsed:.1f} s elapsed)")
    # A cost of 0 (a state saved before measure refused such steps) is no measurement: the law divides by it.
    measured = {length: cost for length, cost in state.seconds_per_step().items() if length in lengths and cost > 0}
    if current not in measured:
        return Decision(False, f"stays at L = {current}: no seconds per step measured at L = {current} yet")
    cost_current, _ = estimate_seconds_per_step(measured, current, options.tokens_at)
    cost_longer, cost_note = estimate_seconds_per_step(measured, longer, options.tokens_at)
    costs = f"c({current}) = {cost_current:.4g} s/step, {cost_note}"
    crossover = fits.predicted_crossover(
        options.law.schedule, current, cost_current, longer, cost_longer,
        log_amplitude=options.law.log_amplitude, max_time=budget,
    )
    if crossover is None:
        return Decision(
            False, f"stays at L = {current}: Eq. 11 predicts no crossover of L = {longer} below L = {current} "
            f"within the budget of {budget:g} s ({costs})",
        )
    if crossover.time > elapsed:
        return Decision(
            False, f"stays at L = {current}: Eq. 11 predicts L = {longer} below L = {current} from "
            f"{crossover.time:.4g} s on, within the budget of {budget:g} s but not reached ({elapsed:.1f} s elapsed; {costs})",
        )
    return Decision(
        True, f"lengthens L = {current} -> {longer}: Eq. 11 predicts L = {longer} below L = {current} from "
        f"{crossover.time:.4g} s on (step {crossover.step_short:.0f} at L = {current}), reached at {elapsed:.1f} s "
        f"of the budget of {budget:g} s ({costs})",
    )


def decide_saturation(now: float, state: CurriculumState, options: AdaptiveOptions,
                       rung_losses: Sequence[tuple[int, float]]) -> Decision:
    """Issue #30: lengthen once the current rung has saturated by its own forecast. ok = lengthen.

    `rung_losses` are (round at the rung from 1, mean training loss) of its complete rounds. The law
    E + A·x^(−β) fitted to them (observe/forecast.py) predicts the loss at the round the rest of the budget
    reaches at the rung's measured pace (its seconds per step × `inner_steps`, compute only, so the rounds left
    are if anything overcounted and the rule lengthens late); the gain from the last round to it, taken at the
    interval's optimistic end (the fit now minus the band's low end), below `forecast_gain` nats lengthens. The fit
    does not test for a rising loss (`forecast.check_falling`, which `forecast_at` applies for forecasts and
    pruning): a rung's lengthening is for good, and lengthening on that test's "no forecast" lengthened slowly
    falling rungs whose correlated round losses drifted up for a while (a review: 38 of 60 simulated ones).
    """
    lengths = options.seq_lens
    current = lengths[state.rung]
    if options.forecast_gain <= 0:
        return Decision(False, "curriculum.forecast_gain = 0: no forecast rule")
    if state.rung + 1 >= len(lengths) or state.started_at is None:
        return Decision(False, f"stays at L = {current}: the last rung, or training has not started")
    left = options.budget_seconds - (now - state.started_at)
    cost = state.seconds_per_step().get(current)
    if left <= 0 or cost is None or not cost > 0:
        return Decision(False, f"stays at L = {current}: no budget left or no cost measured at L = {current}")
    try:
        fit = forecast.fit_saturating([x for x, _ in rung_losses], [loss for _, loss in rung_losses])
    except forecast.NotEnoughData as reason:
        return Decision(False, f"stays at L = {current}: its forecast has {reason}")
    horizon = fit.last_x + left / (cost * options.inner_steps)
    if horizon > forecast.MAX_EXTRAPOLATION * fit.last_x:
        return Decision(False, f"stays at L = {current}: the budget's round {horizon:.0f} is more than "
                               f"{forecast.MAX_EXTRAPOLATION:g}× beyond its round {fit.last_x:g}, too far to forecast")
    low, _ = fit.band(horizon)
    gain = fit.predict(fit.last_x) - low
    what = (f"the forecast at L = {current} gains at most {gain:.4f} nats from round {fit.last_x:g} to round "
            f"{horizon:.0f}, the end of the budget at {cost:.4g} s/step")
    if gain < options.forecast_gain:
        return Decision(True, f"lengthens L = {current} -> {lengths[state.rung + 1]}: {what}, below "
                              f"curriculum.forecast_gain = {options.forecast_gain:g}")
    return Decision(False, f"stays at L = {current}: {what}, not below curriculum.forecast_gain = "
                           f"{options.forecast_gain:g}")


@dataclass(frozen=True)
class WorkerPace:
    """A worker as the per-worker rule sees it (issue #30): its rung of the ladder and its own measured costs,
    seq_len -> (compute seconds, inner steps) over its steps at that length."""

    worker_id: str
    rung: int
    costs: Mapping[int, tuple[float, int]]


# Paces closer than this ratio (slowest / fastest seconds per step at a length) count as equal: one run-wide rung.
PACE_SPREAD = 1.25


def pace_spread(workers: Sequence[WorkerPace]) -> float:
    """The largest ratio of the slowest to the fastest worker's seconds per step at one length (1.0 when no length
    has two workers' measurements)."""
    paces: dict[int, list[float]] = {}
    for worker in workers:
        for length, (seconds, steps) in worker.costs.items():
            if steps > 0 and seconds > 0:
                paces.setdefault(length, []).append(seconds / steps)
    return max((max(p) / min(p) for p in paces.values() if len(p) >= 2), default=1.0)


def decide_worker_lengthening(now: float, state: CurriculumState, options: AdaptiveOptions,
                              workers: Sequence[WorkerPace]) -> dict[str, Decision]:
    """Issue #30: per worker where paces differ, whether it lengthens (ok) from its own rung, with a reason.

    Eq. 11's crossover is in wall time through s = t / c_L, so a worker k times slower than another reaches the
    same step, and the crossover, k times later: the run-wide rule (`decide_lengthening` on every worker's costs
    summed) lengthens a slow worker too early and a fast one too late. Each worker is decided by the same rule on
    its own rung and its own measured seconds per step (a length it has not trained extrapolated from its own as
    the run's are), the run's start and budget. A worker without a measurement at its rung takes the run's costs,
    and where every worker's pace at a length lies within PACE_SPREAD of the others' the paces count as equal:
    the run-wide decision applies to every worker (one rung, as before).
    """
    spread = pace_spread(workers)
    if spread < PACE_SPREAD:
        shared = decide_lengthening(now, state, options)
        why = (f"paces within {PACE_SPREAD:g}× of each other (slowest/fastest {spread:.3g}): the run-wide rule: "
               f"{shared.reason}")
        return {worker.worker_id: Decision(shared.ok, why) for worker in workers}
    decisions = {}
    for worker in workers:
        own = {length: cost for length, cost in worker.costs.items() if cost[1] > 0 and cost[0] > 0}
        current = options.seq_lens[min(worker.rung, len(options.seq_lens) - 1)]
        costs, whose = (own, "its own") if current in own else (state.costs, "the run's (none of its own at its rung)")
        decision = decide_lengthening(now, replace(state, rung=worker.rung, costs=costs), options)
        decisions[worker.worker_id] = Decision(
            decision.ok, f"worker {worker.worker_id} (paces differ up to {spread:.3g}×; {whose} costs): "
                         f"{decision.reason}")
    return decisions


def lift(own: WorkerCurriculum, rung: int, lengths: Sequence[int], why: str) -> WorkerCurriculum:
    """`own` on `rung` (the run's) at least: a worker whose own rung lies below it is lifted onto it, its reason naming
    both lengths and `why`; one on `rung` or above, or without a rung of its own (it trains the run's), is returned
    as it is (a worker is never shortened)."""
    if own.rung is None or own.rung >= rung:
        return own
    return replace(own, rung=rung, reason=f"lifted L = {lengths[own.rung]} -> {lengths[rung]}, the run's rung: {why}")


def lifted_onto(count: int, length: int) -> str:
    """A round's words for the `count` workers it lifted onto the run's rung (`lift`), whose length is `length`."""
    return f"{count} lifted onto the run's rung L = {length}"


def decide_worker_length(active_lengths: Sequence[int], worker_seq_lens: Sequence[int]) -> tuple[int, str]:
    """The length a joining worker trains: the one furthest below its share of the active workers.

    A length listed k times gets k shares; the pick minimises (active workers at it) / k, ties
    going to the earlier in the list, which is round-robin in join order while nobody leaves.
    """
    shares = {length: worker_seq_lens.count(length) for length in worker_seq_lens}
    counts = {length: 0 for length in shares}
    for length in active_lengths:
        if length in counts:
            counts[length] += 1
    best = min(shares, key=lambda length: (counts[length] / shares[length], worker_seq_lens.index(length)))
    return best, (
        f"curriculum.worker_seq_lens: L = {best} is the furthest below its share "
        f"(active workers by length {sorted(counts.items())})"
    )


@dataclass(frozen=True)
class Assignment:
    """What a worker trains and why; seq_len and batch_size 0 when the run assigns them per worker."""

    seq_len: int
    batch_size: int
    reason: str


def adaptive_options(spec: RunSpec) -> AdaptiveOptions:
    """The adaptive policy's ladder, budget, law and tokens per step at each rung."""
    section = spec.curriculum
    law = law_of(section)
    tokens = tuple(length * section.batch_for(length, spec.data.batch_size) for length in section.seq_lens)
    log.info("adaptive curriculum over L = %s, law %s", section.seq_lens, law.source)
    return AdaptiveOptions(tuple(section.seq_lens), section.budget_seconds, law, tokens, section.forecast_gain,
                           spec.inner.steps)


class CurriculumTracker:
    """One run's curriculum: what each worker trains, the measured costs, the adaptive ladder.

    It owns the persisted `CurriculumState` (under CURRICULUM_KEY in the run's store) and the
    adaptive options, and records its decisions in the store's `events`: one run-wide row per decided round, plus
    one row of the worker's own for each per-worker lengthening and for each lift onto the run's rung (at a close, or
    a re-join's, which its join's transaction stores: `rejoin`); a worker that stays adds no row. It holds no lock
    of its own: `SwarmCoordinator` calls every method with its lock held (or from its constructor), and passes
    `advance` the ids of its active memberships read under that lock (the tracker keeps no membership table).

    Writes. Alone (a test, a tool) it writes its saves and event rows to the store at once. Inside a coordinator
    (`post` and `post_event`, the coordinator's `_post` and `_post_event`) it posts them to the coordinator's
    outbox instead, with the state's JSON taken when posted (under the coordinator's lock), and the coordinator
    writes them once its lock is released (`SwarmCoordinator.flush`), so a slow disk stalls no heartbeat for a
    round close's curriculum step, a first pull's start or a hivemind run's steps. A posted save that fails (or a
    crash before it is written) is one WARNING and leaves the state stored last: a restart resumes from it, as it
    did after a save that failed under the lock (the decision was already in memory then too, and served).
    `saves` counts the saves made or posted: a join that wrote the state with its own transaction (`rejoin`)
    compares it to know whether a save made meanwhile may have been overwritten by its older copy.
    """

    def __init__(self, spec: RunSpec, store: StateStore,
                 post: Callable[[str | None, Callable[[], None]], None] | None = None,
                 post_event: Callable[[str, str, str, float], None] | None = None) -> None:
        self.spec = spec
        self.store = store
        self.post = post
        self.post_event = post_event
        self.saves = 0
        section = spec.curriculum
        self.adaptive = adaptive_options(spec) if section.adaptive else None
        stored = store.get(CURRICULUM_KEY)
        self.state = CurriculumState.from_json(stored) if stored else CurriculumState()
        if section.adaptive and not 0 <= self.state.rung < len(section.seq_lens):
            raise RuntimeError(f"state dir {store.state_dir}: curriculum rung {self.state.rung} is off the ladder {section.seq_lens}")
        off = {key: own.rung for key, own in self.state.workers.items()
               if own.rung is not None and not 0 <= own.rung < len(section.seq_lens)}
        if section.adaptive and off:
            raise RuntimeError(f"state dir {store.state_dir}: workers' curriculum rungs {off} are off the ladder "
                               f"{section.seq_lens}")
        # worker_id -> the cumulative compute seconds of its last metric (a step's cost is the difference), the longest
        # silent first; at most max(MAX_REMEMBERED_WORKERS, 2 × coordinator.max_workers) entries (`measure`).
        self._last_compute: dict[str, float] = {}
        # (the newest version asked, the run's steps as the store held them then) of the fixed-schedule lookups: the
        # rounds before that version are closed, so their steps answer every older version too.
        self._run_steps: tuple[int, RunSteps] | None = None

    def _rung_assignment(self, rung: int, reason: str) -> Assignment:
        section = self.spec.curriculum
        length = section.seq_lens[rung]
        return Assignment(length, section.batch_for(length, self.spec.data.batch_size),
                          f"adaptive rung {rung} of {section.seq_lens}: {reason}")

    def run_assignment(self, version: int) -> Assignment:
        """What the run trains from `version` on; seq_len 0 when it is per worker."""
        section, data = self.spec.curriculum, self.spec.data
        if section.adaptive:
            return self._rung_assignment(self.state.rung, self.state.reason)
        if section.schedule:
            if self._run_steps is None or self._run_steps[0] < version:
                self._run_steps = (version, analysis.run_steps(self.store, self.spec.inner.steps))
            step = self._run_steps[1].before(version)
            length, batch = section.at(step, (data.seq_len, data.batch_size))
            return Assignment(length, batch, f"curriculum.schedule at step {step} (version {version})")
        if section.worker_seq_lens:
            return Assignment(0, 0, f"curriculum.worker_seq_lens = {section.worker_seq_lens}: assigned per worker at join")
        return Assignment(data.seq_len, data.batch_size, "data.seq_len and data.batch_size (no curriculum)")

    def worker_assignment(self, version: int, worker_id: str) -> Assignment:
        """What `worker_id` trains from `version`: under the adaptive policy its own rung once the per-worker rule
        decided it (issue #30), else the run's assignment."""
        own = self.state.workers.get(worker_id) if self.adaptive is not None else None
        if own is None or own.rung is None:
            return self.run_assignment(version)
        return self._rung_assignment(own.rung, f"this worker's own pace: {own.reason}")

    def assignment(self, version: int, own: Assignment | None, worker_id: str = "") -> pb.TrainingAssignment:
        """What a worker trains from `version`: its `own` assignment if it has one, else `worker_assignment`."""
        chosen = own or self.worker_assignment(version, worker_id)
        return pb.TrainingAssignment(seq_len=chosen.seq_len, batch_size=chosen.batch_size, reason=chosen.reason, version=version)

    def largest_assignment(self, version: int, since: int | None = None) -> Assignment:
        """The assignment with the most tokens per step a worker may have trained from any version of `since` ..
        `version` (`since` None: `version` alone; a late update was trained from an older version, under its
        assignment): the run's, or under the adaptive policy the largest of the run's rung and every worker's own (an
        ended membership's too: its worker may push the update it trained there after a re-join) as they are now,
        and with `since` before `version` of every rung up to the highest of them. No rung falls, but one may rise by
        more than one rung between two versions (a worker below the run's rung is lifted onto it at a re-join or a
        close; the run's rung rises to the lowest a decided worker trains when the lowest one leaves), so a rung
        below one held now may have been trained by any of its holders; with `curriculum.constant_tokens` the
        rounding of the batch can give a shorter rung more tokens per step."""
        since = version if since is None else max(0, min(since, version))
        if self.adaptive is None:
            return max((self.run_assignment(v) for v in range(since, version + 1)), key=_tokens_per_step)
        rungs = {own.rung for own in self.state.workers.values() if own.rung is not None} | {self.state.rung}
        if since < version:
            rungs = set(range(max(rungs) + 1))
        earlier = rungs - {self.state.rung}
        choices = [self.run_assignment(version), *(self._rung_assignment(rung, "a worker's own rung, or one trained "
                                                                          f"since version {since}") for rung in earlier)]
        return max(choices, key=_tokens_per_step)

    def rejoin(self, worker_id: str, previous_worker_id: str) -> tuple[dict[str, str], str]:
        """A worker joined again naming its ended membership `previous_worker_id` (after an eviction or a coordinator
        restart) with that membership's worker secret, which the coordinator checked (service.py `_claimed`: "" for a
        join that named another's membership, and nothing moves): under the adaptive policy its entry (own rung and
        costs) moves to `worker_id`, in memory, lifted onto the run's rung if the run lengthened past its own rung
        meanwhile (never shortened: a rung above the run's stays). Returns
        the run_state values to store with the join (`saved`; empty when nothing moved) and the lift's reason ("" when
        it was not lifted): the caller writes both in the join's transaction (`StateStore.record_join`, made without
        the coordinator's lock; the reason as a "curriculum" event of `worker_id`, so a join that fails to be stored
        leaves no word of a lift) and puts `state` back if that fails (`unjoin` when the state moved on meanwhile)."""
        own = self.state.workers.get(previous_worker_id) if previous_worker_id and self.adaptive is not None else None
        if own is None or previous_worker_id == worker_id:
            return {}, ""
        workers = {key: value for key, value in self.state.workers.items() if key != previous_worker_id}
        resumed = lift(own, self.state.rung, self.spec.curriculum.seq_lens,
                       f"it joined again (as {previous_worker_id} before) after the run lengthened without it")
        lifted = "" if resumed is own else resumed.reason
        if lifted:
            log.info("curriculum: worker %s %s", worker_id, lifted)
        self.state = replace(self.state, workers={**workers, worker_id: resumed})
        return self.saved(), lifted

    def unjoin(self, worker_id: str, previous_worker_id: str) -> None:
        """Undo `rejoin(worker_id, previous_worker_id)` whose join failed after the state moved on (a round close's
        decision, a measurement): the entry goes back to `previous_worker_id`, unless it is gone (dropped by
        `_forget_ended`) or `previous_worker_id` holds one again. The caller saves the state if a save was made
        meanwhile (`saves`)."""
        own = self.state.workers.get(worker_id)
        if own is None or previous_worker_id in self.state.workers:
            return
        workers = {key: value for key, value in self.state.workers.items() if key != worker_id}
        self.state = replace(self.state, workers={**workers, previous_worker_id: own})

    def worker_length(self, active_lengths: Sequence[int]) -> Assignment | None:
        """A joining worker's own length under curriculum.worker_seq_lens (its reason is the join's "assign" event),
        else None (pure)."""
        section = self.spec.curriculum
        if not section.worker_seq_lens:
            return None
        length, reason = decide_worker_length(active_lengths, section.worker_seq_lens)
        return Assignment(length, section.batch_for(length, self.spec.data.batch_size), reason)

    def start(self, now: float) -> None:
        """At a pull: the first one starts the budget's clock, saved now (inside a coordinator: posted, written once
        its lock is released) so a restart before the first round close keeps it. A failed save (a full disk) does
        not fail the pull: one WARNING, and the next save (a round close's decision) holds the start."""
        if self.state.started_at is None:
            self.state = replace(self.state, started_at=now)
            try:
                self.save()
            except StoreError as exc:
                log.warning("the curriculum's start was not saved (%s): a restart before the next round close "
                            "starts its budget's clock again", exc)

    def measure(self, worker_id: str, metric: pb.Metric) -> None:
        """Add a training step's compute seconds to the cost of its length: the run's, and under the adaptive
        policy the worker's own too (issue #30)."""
        last = self._last_compute.get(worker_id)
        # Under the adaptive policy only the ladder's lengths are costed (an older worker may report another).
        on_ladder = self.adaptive is None or metric.seq_len in self.adaptive.seq_lens
        if (on_ladder and metric.tokens > 0 and metric.seq_len > 0 and last is not None
                and 0 < metric.compute_seconds - last < math.inf):  # a step of no compute time measured nothing
            own = worker_id if self.adaptive is not None else ""
            self.state = self.state.measured(metric.seq_len, metric.compute_seconds - last, worker_id=own)
        if math.isfinite(metric.compute_seconds):
            self._last_compute.pop(worker_id, None)  # re-inserted: the dict runs from the longest silent reporter
            self._last_compute[worker_id] = metric.compute_seconds
            if len(self._last_compute) > max(MAX_REMEMBERED_WORKERS, 2 * self.spec.coordinator.max_workers):
                del self._last_compute[next(iter(self._last_compute))]  # an ended membership's, by far the likeliest

    def status(self, now: float, version: int) -> pb.CurriculumStatus:
        """The curriculum as GetStatus reports it at `version`."""
        section = self.spec.curriculum
        current = self.run_assignment(version)
        started = self.state.started_at
        status = pb.CurriculumStatus(
            policy=section.policy, seq_len=current.seq_len, batch_size=current.batch_size, reason=current.reason,
            ladder=section.seq_lens, rung=self.state.rung if section.adaptive else 0,
            budget_seconds=section.budget_seconds if section.adaptive else 0.0,
            elapsed_seconds=now - started if started is not None else 0.0, decided_version=self.state.decided_version,
            law=self.adaptive.law.source if self.adaptive is not None else "",
        )
        status.seconds_per_step.update(self.state.seconds_per_step())
        return status

    def advance(self, now: float, closed_version: int, active: Collection[str] = ()) -> None:
        """At a round close: the adaptive decision, applied from the new version on, saved and recorded as events.

        `active` are the worker ids of the active memberships. When two or more of them have measured costs and
        their paces differ (`pace_spread` ≥ PACE_SPREAD), each is decided on its own rung and costs
        (`decide_worker_lengthening`; issue #30); otherwise the run-wide rule decides the run's rung."""
        if self.adaptive is None:
            return
        paces = [WorkerPace(worker_id, self.state.rung_of(worker_id), own.costs) for worker_id in active
                 if (own := self.state.workers.get(worker_id)) is not None and own.costs]
        spread = pace_spread(paces)
        if len(paces) >= 2 and spread >= PACE_SPREAD:
            self._advance_per_worker(now, closed_version, paces, spread)
        else:
            self._advance_run_wide(now, closed_version, active)
        self._forget_ended(active)
        self.save()

    def _advance_run_wide(self, now: float, closed_version: int, active: Collection[str]) -> None:
        """The run-wide rule (Eq. 11 on the run's summed costs, then the forecast rule) on the run's rung; at every
        close, lengthened or not, each active worker whose own rung lies below the run's (new) rung is lifted onto it
        (none is ever shortened): each lift is an event of its worker, the round one run-wide event that counts them."""
        assert self.adaptive is not None
        decision = decide_lengthening(now, self.state, self.adaptive)
        if not decision.ok and self.adaptive.forecast_gain > 0:
            saturated = decide_saturation(now, self.state, self.adaptive, self._rung_losses(closed_version))
            decision = saturated if saturated.ok else Decision(False, f"{decision.reason}; {saturated.reason}")
        rung = self.state.rung + int(decision.ok)
        why = decision.reason if decision.ok else f"round {closed_version}: no active worker trains below it"
        workers = dict(self.state.workers)
        lifted = []
        for worker_id in active:
            own = workers.get(worker_id)
            if own is not None:
                workers[worker_id] = self._lifted(worker_id, own, rung, why)
                if workers[worker_id] is not own:
                    lifted.append(worker_id)
                    self._event(worker_id, "curriculum", f"round {closed_version}: {workers[worker_id].reason}", now)
        reason = decision.reason + (f"; {lifted_onto(len(lifted), self.adaptive.seq_lens[rung])}" if lifted else "")
        self.state = replace(
            self.state, rung=rung, reason=reason, decided_version=closed_version,
            rung_version=closed_version + 1 if decision.ok else self.state.rung_version, workers=workers,
        )
        self._event("", "curriculum", f"round {closed_version}: {reason}", now)
        log.log(logging.INFO if decision.ok or lifted else logging.DEBUG, "round %d: curriculum %s", closed_version,
                reason)

    def _advance_per_worker(self, now: float, closed_version: int, paces: Sequence[WorkerPace], spread: float) -> None:
        """Each worker of `paces` decided on its own rung and costs, then lifted onto the run's rung if still below
        it (one that re-joined before re-joins were lifted); each lengthening or lift is an event of its worker, the
        round one run-wide event that counts both; the run's rung becomes the lowest a decided worker trains, so it
        never falls."""
        assert self.adaptive is not None
        decisions = decide_worker_lengthening(now, self.state, self.adaptive, paces)
        workers = dict(self.state.workers)
        lifted = 0
        for pace in paces:
            decision = decisions[pace.worker_id]
            decided = replace(workers[pace.worker_id], rung=pace.rung + int(decision.ok), reason=decision.reason)
            own = self._lifted(pace.worker_id, decided, self.state.rung,
                               f"round {closed_version}: no active worker trains below it (its own rule: "
                               f"{decision.reason})")
            workers[pace.worker_id] = own
            lifted += own is not decided
            if decision.ok or own is not decided:
                self._event(pace.worker_id, "curriculum", f"round {closed_version}: {own.reason}", now)
                log.info("round %d: curriculum %s", closed_version, own.reason)
        rungs = [workers[pace.worker_id].rung for pace in paces]
        rung = min(rung for rung in rungs if rung is not None)
        lengths = self.adaptive.seq_lens
        by_length = {lengths[r]: rungs.count(r) for r in sorted({r for r in rungs if r is not None})}
        lengthened = sum(decision.ok for decision in decisions.values())
        lifts = f", {lifted_onto(lifted, lengths[self.state.rung])}" if lifted else ""
        reason = (f"per worker, paces differ up to {spread:.3g}×: {lengthened} of {len(paces)} lengthened{lifts}, "
                  f"workers by L {by_length}; the run's rung is the lowest they train, L = {lengths[rung]}")
        self.state = replace(
            self.state, rung=rung, reason=reason, decided_version=closed_version, workers=workers,
            rung_version=closed_version + 1 if rung != self.state.rung else self.state.rung_version,
        )
        self._event("", "curriculum", f"round {closed_version}: {reason}", now)
        log.debug("round %d: curriculum %s", closed_version, reason)

    def _lifted(self, worker_id: str, own: WorkerCurriculum, rung: int, why: str) -> WorkerCurriculum:
        """`lift` of `worker_id`'s entry onto `rung` at a round close, logged when it moves."""
        assert self.adaptive is not None
        lifted = lift(own, rung, self.adaptive.seq_lens, why)
        if lifted is not own:
            log.info("curriculum: worker %s %s", worker_id, lifted.reason)
        return lifted

    def _forget_ended(self, active: Collection[str]) -> None:
        """Beyond MAX_REMEMBERED_WORKERS entries, drop the oldest of workers not in `active`."""
        excess = len(self.state.workers) - MAX_REMEMBERED_WORKERS
        if excess <= 0:
            return
        ended = set([key for key in self.state.workers if key not in active][:excess])
        self.state = replace(self.state, workers={key: value for key, value in self.state.workers.items()
                                                  if key not in ended})

    def _rung_losses(self, closed_version: int) -> list[tuple[int, float]]:
        """(round at the current rung from 1, mean training loss) of its rounds whose rows are complete (trained from
        versions before `closed_version`: the rows of the round just closed may still be arriving)."""
        first = self.state.rung_version
        length = self.spec.curriculum.seq_lens[self.state.rung]
        return [(version - first + 1, loss) for version, loss in self.store.round_losses(length)
                if first <= version < closed_version]

    def advance_through(self, now: float, first: int, last: int, active: Collection[str] = ()) -> None:
        """Rounds `first` .. `last` closed at once (a hivemind swarm's, learned from its workers' metrics): `advance`
        for each while a rung climbs (the run's or a worker's); once no rung moves, the rounds after it would repeat
        the decision (the same now, state and options), so one decision at `last` stands for them (at most
        rungs × workers + 1 decisions)."""
        version = first
        while True:
            rungs = self._rungs()
            self.advance(now, version, active)
            if version >= last:
                return
            version = version + 1 if self._rungs() != rungs else last

    def _rungs(self) -> tuple[int, dict[str, int | None]]:
        return self.state.rung, {worker_id: own.rung for worker_id, own in self.state.workers.items()}

    def saved(self) -> dict[str, str]:
        """The run_state values that store `state`."""
        return {CURRICULUM_KEY: self.state.to_json()}

    def save(self) -> None:
        """Store `state`: posted (its JSON taken now) with an outbox, else written at once (which may raise
        StoreError)."""
        self.saves += 1
        values = self.saved()
        if self.post is None:
            self.store.set_many(values)
        else:
            self.post(CURRICULUM_KEY, lambda: self._write_saved(values))

    def _write_saved(self, values: Mapping[str, str]) -> None:
        """Write a posted save (the coordinator's `flush`), best effort: a failure is a WARNING, the state stored
        last stays (a restart resumes from it) and the next save holds this one's state."""
        try:
            self.store.set_many(values)
        except StoreError as exc:
            log.warning("the curriculum's state was not saved (%s): a restart before the next save resumes the one "
                        "saved last", exc)

    def _event(self, worker_id: str, kind: str, reason: str, now: float) -> None:
        """Record an events row: posted with an outbox (written best effort), else written at once."""
        if self.post_event is None:
            self.store.add_event(worker_id, kind, reason, now)
        else:
            self.post_event(worker_id, kind, reason, now)
