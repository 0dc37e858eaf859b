"""Forecasts of each run's final loss as its rounds close, and the sweep's pruning on them (issue #30).

`forecast_record` turns a run's losses into the forecast stored at its version (observe/forecast.py
fits the law; of the held-out losses measured along the way, `[run] eval_every`, once they support a fit, else of
the round training losses; this adds the run's clock: the seconds it was served since its first round opened, the
wall-time budget's clock (coordinator/sweep.py `RunGroup._budget_elapsed`), and its measured seconds per round to turn
"the round the target is reached at" into wall time). Only rounds whose metric rows are
complete are fitted: those trained from versions up to the current one minus 2 (the rows of the round that
just closed are still arriving when its close is seen).

`decide_prune` is the sweep's rule, a pure function of (now, the runs as `RunView`s, `PruneOptions`)
returning a `PruneDecision` with a reason for every run: at each fraction of the budget in
`[sweep] prune_at` (of run.rounds, or of run.minutes' wall time: whichever every run still in the sweep reached
first), a run whose forecast is
above the best run's at 90 % confidence (`confidently_worse`: the intervals narrowed to what the difference's
one-sided test needs, and apart) is stopped, and so is a run whose loss rises (no forecast: observe/forecast.py
`check_falling`) with its newest level's low end above the best forecast's upper end (`diverging_worse`; such runs
first), at most half of the runs still in at each fraction (successive halving's bound) and never the last one. A
run without a forecast for another reason (not enough data), a rising one not above the best, or one that has
completed its rounds, is kept. The group applies it (coordinator/sweep.py). Which fraction is next is said by the
values of the fractions decided (`fractions_decided`): a restart with another `prune_at` decides only its fractions
above the largest one decided, never one again.

`decide_budget_end` is the wall-time budget's rule (`[run] minutes`), pure in (now, the budget clock's origin, the
budget): the reason to end the run once it is used; the group ends it as a pruned run is ended.
`decide_budget_resume` is its other side at a start: the reason to undo such a stop when the restarted spec's budget
no longer ends the run (`run.minutes` raised or unset on a restart, as `run.rounds` may be raised). The budget's
clock is the time the run was served since its first round opened, over every launch on its state dir (the group's
`RunGroup._budget_elapsed`): these rules, `forecast_record` and `decide_prune` (`RunView.elapsed`) take it as its
origin (`started_at`: now minus the seconds served, the first round's opening had the run been served without a
break) or as the seconds themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from rcswarm.observe.fits import CONFIDENCE
from rcswarm.observe.forecast import BUDGET_ENDED, NOT_FALLING, forecast_at
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import ForecastRecord
from rcswarm.state.store import StateStore

# A forecast interval's half-width narrowed to the one whose disjointness from another's says the difference of two
# equally spread normal forecasts is positive at CONFIDENCE, one-sided: z(CONFIDENCE) / (√2 · z((1 + CONFIDENCE) / 2)),
# 0.551 at 90 %.
NARROW = NormalDist().inv_cdf(CONFIDENCE) / (math.sqrt(2) * NormalDist().inv_cdf((1 + CONFIDENCE) / 2))
# The rounds whose metric rows may still be arriving when a close is seen: the newest `ROWS_LAG` versions.
ROWS_LAG = 2


MAX_BUDGET_ROUND = 2**62  # the horizon of a pace beyond any run (SQLite's INTEGER is 64-bit)


def budget_round(version: int, elapsed: float, rounds: int, budget_s: float = 0.0) -> int:
    """The round at which the run's budget ends (pure): `rounds`, or with a wall-time budget of `budget_s` seconds the
    last round its pace so far (`version` rounds in `elapsed` seconds) completes by then, whichever comes first; 0
    with neither (a run until stopped, or a time budget before its first round closed)."""
    if budget_s <= 0:
        return max(rounds, 0)
    if not (version > 0 and elapsed > 0):
        return 0
    paced = math.floor(min(version * budget_s / elapsed, MAX_BUDGET_ROUND))  # an int SQLite holds, even at 1 µs elapsed
    return min(rounds, paced) if rounds > 0 else paced


def forecast_record(version: int, now: float, started_at: float | None, rounds: int,
                    round_losses: Sequence[tuple[int, float]], target_loss: float = 0.0,
                    seed: int = 0, held_out: Sequence[tuple[int, float]] = (), budget_s: float = 0.0) -> ForecastRecord:
    """The forecast of a run at `version` (pure): its loss at the end of its budget (`budget_round`: round `rounds`,
    or the round its pace reaches at `budget_s` seconds from `started_at`, the budget clock's origin: now minus the
    seconds the run was served since its first round opened; None before its first round closed). Of the held-out
    loss when the losses measured along the way (`held_out`: (v, loss of θ_v), x = v) support one; else of the
    training loss, x = v + 1 for the steps trained from version v, fitted to the versions up to `version` − ROWS_LAG.
    A held-out loss that rises (overfitting) is no forecast of the held-out basis, not a reason to forecast the
    falling training loss."""
    elapsed = now - started_at if started_at is not None else math.nan
    horizon = budget_round(version, elapsed, rounds, budget_s)
    measured = [(v, loss) for v, loss in held_out if v <= version]
    forecast, basis = forecast_at([x for x, _ in measured], [loss for _, loss in measured], float(horizon),
                                  target=target_loss, seed=seed), "held-out"
    if not forecast.ok and not forecast.note.startswith(NOT_FALLING):
        complete = [(v + 1, loss) for v, loss in round_losses if v <= version - ROWS_LAG]
        forecast, basis = forecast_at([x for x, _ in complete], [loss for _, loss in complete], float(horizon),
                                      target=target_loss, seed=seed), "training"
    per_round = elapsed / version if version > 0 and elapsed > 0 else math.nan
    return ForecastRecord(
        version=version, made_at=now, at_seconds=elapsed, at_round=horizon, loss=forecast.loss, low=forecast.low,
        high=forecast.high, target_loss=target_loss if target_loss > 0 else math.nan,
        target_seconds=forecast.target_round * per_round, target_low_s=forecast.target_low * per_round,
        target_high_s=forecast.target_high * per_round, note=forecast.note, basis=basis, level=forecast.level,
        level_low=forecast.level_low,
    )


@dataclass(frozen=True)
class PruneOptions:
    """`[sweep] prune` and `prune_at`: the fractions of the budget at which losers are stopped: of `rounds` or of
    `seconds` (`[run] minutes`' wall time), whichever comes first; 0 = that budget is not set."""

    enabled: bool
    fractions: tuple[float, ...]
    rounds: int
    seconds: float = 0.0


@dataclass(frozen=True)
class RunView:
    """A run of the sweep as pruning sees it: its name, version, whether it was stopped, its newest forecast, and the
    seconds it was served since its first round opened (the budget's clock; NaN before one closed)."""

    index: int
    name: str
    version: int
    stopped: bool
    forecast: ForecastRecord | None
    elapsed: float = math.nan


def _due(fraction: float, alive: Sequence[RunView], options: PruneOptions) -> str | None:
    """Where the budget's `fraction` is, once every run still in has reached it (None before): that fraction of
    `rounds` or of `seconds`, whichever every run reached first."""
    due_round = math.ceil(fraction * options.rounds)
    if options.rounds > 0 and all(run.version >= due_round for run in alive):
        return f"round {due_round}"
    due_s = fraction * options.seconds
    if options.seconds > 0 and all(run.elapsed >= due_s for run in alive):
        return f"{due_s:.0f} s"
    return None


@dataclass(frozen=True)
class PruneDecision:
    """What a fraction of the budget decided: the runs to stop and every run's reason."""

    checkpoint: int  # index into PruneOptions.fractions
    now: float
    stop: tuple[int, ...]
    reasons: tuple[tuple[int, str], ...]


def confidently_worse(run: ForecastRecord, best: ForecastRecord) -> bool:
    """Whether `run`'s final loss is above `best`'s at CONFIDENCE (one-sided): the two forecasts taken as independent
    normals whose CONFIDENCE intervals are the stored ones, each interval's half-width narrowed by NARROW (its low end
    for `run`, its high end for `best`), and the narrowed ends apart. With equal spreads that is the difference's
    one-sided test at CONFIDENCE; with unequal ones a stricter test (σ₁ + σ₂ ≥ √(σ₁² + σ₂²))."""
    return run.loss - NARROW * (run.loss - run.low) > best.loss + NARROW * (best.high - best.loss)


def diverging_worse(run: ForecastRecord, best: ForecastRecord) -> bool:
    """Whether `run`, whose loss rises (no forecast: its note says NOT_FALLING), is worse than `best`'s forecast:
    the low end of its newest level is above the upper end of `best`'s interval. Stricter than `confidently_worse`
    (whole intervals, not narrowed), and a rising loss that stopped rising now would end at about that level: the
    rule assumes no more than that it does not fall below it by the budget's end."""
    return (run.note.startswith(NOT_FALLING) and run.basis == best.basis and math.isfinite(run.level_low)
            and run.level_low > best.high)


def _worse(run: RunView, bests: dict[str, RunView]) -> bool:
    """Whether `run` is worse than the best forecast of its basis: confidently worse, or diverging above it."""
    best = bests.get(run.forecast.basis) if run.forecast is not None else None
    if best is None or run is best:
        return False
    if run.forecast.note:
        return diverging_worse(run.forecast, best.forecast)
    return confidently_worse(run.forecast, best.forecast)


def _interval(record: ForecastRecord) -> str:
    return f"{record.loss:.4f} [{record.low:.4f}, {record.high:.4f}]"


def _completed(run: RunView, options: PruneOptions) -> bool:
    """Whether `run` has completed its rounds budget (a time budget ends every run at once: never early)."""
    return options.rounds > 0 and run.version >= options.rounds


def fractions_decided(fractions: Sequence[float], decided: Sequence[float]) -> int:
    """How many of `fractions` (`[sweep] prune_at`, increasing) need no decision (pure): those up to the largest
    fraction decided (`decided`: their values, whichever `prune_at` they were decided from), so that `decide_prune`
    decides the first one above it. A restart from prune_at [0.5] (decided) to [0.25, 0.5] decides nothing more,
    where the count of fractions decided, read against the new list, decided 50% again."""
    if not decided:
        return 0
    largest = max(decided)
    return sum(1 for fraction in fractions if fraction <= largest)


def decide_prune(now: float, runs: Sequence[RunView], options: PruneOptions, done: int) -> PruneDecision | None:
    """The decision at the next fraction of the budget (the first `done` of `options.fractions` need none:
    `fractions_decided`), or None while it is not due: pruning off, every fraction decided, or a run still in the
    sweep short of that fraction's rounds."""
    if not options.enabled or done >= len(options.fractions) or (options.rounds <= 0 and options.seconds <= 0):
        return None
    fraction = options.fractions[done]
    alive = [run for run in runs if not run.stopped]
    due = _due(fraction, alive, options) if alive else None
    if due is None:
        return None
    where = f"at {fraction:.0%} of the budget ({due})"
    forecasts = [run for run in alive if run.forecast is not None and not run.forecast.note]
    if not forecasts:
        return PruneDecision(done, now, (), tuple((run.index, f"{where}: no run has a forecast yet; all kept")
                                                  for run in alive))
    # A forecast is of the held-out loss or of the training loss (its basis): only forecasts of one basis compare,
    # or a run a round ahead, whose forecast turned held-out, looks worse by the generalization gap.
    bests = {}
    for run in sorted(forecasts, key=lambda run: (run.forecast.loss, run.index)):
        bests.setdefault(run.forecast.basis, run)
    # Diverging runs first (their loss rises), then the confidently worse ones, highest forecast first.
    worse = sorted((run for run in alive if _worse(run, bests) and not _completed(run, options)),
                   key=lambda run: (not run.forecast.note, -(run.forecast.level_low if run.forecast.note
                                                            else run.forecast.loss), run.index))
    stop = worse[: len(alive) // 2]
    reasons = []
    for run in alive:
        best = bests.get(run.forecast.basis) if run.forecast is not None else None
        of = f"{run.forecast.basis} forecast" if len(bests) > 1 and run.forecast is not None else "forecast"
        if run is best:
            reasons.append((run.index, f"{where}: {run.name} has the best {of} {_interval(run.forecast)}; kept"))
        elif run in stop and run.forecast.note:
            reasons.append((run.index, f"{where}: {run.name} pruned: its loss is not falling and its newest level "
                                       f"{run.forecast.level:.4f} (low end {run.forecast.level_low:.4f}) is above "
                                       f"{best.name}'s {of} {_interval(best.forecast)}"))
        elif run in worse and run.forecast.note:
            reasons.append((run.index, f"{where}: {run.name} kept: its loss is not falling above {best.name}'s "
                                       f"{of}, but at most half of the {len(alive)} runs are pruned at once"))
        elif run.forecast is None or run.forecast.note:
            note = run.forecast.note if run.forecast is not None else "no forecast yet"
            reasons.append((run.index, f"{where}: {run.name} kept: {note}"))
        elif _completed(run, options):
            reasons.append((run.index, f"{where}: {run.name} kept: it has completed its {options.rounds} rounds"))
        elif run in stop:
            reasons.append((run.index, f"{where}: {run.name} pruned: its {of} {_interval(run.forecast)} is above "
                                       f"{best.name}'s {_interval(best.forecast)} at {CONFIDENCE:.0%} confidence"))
        elif run in worse:
            reasons.append((run.index, f"{where}: {run.name} kept: confidently worse than {best.name}, but at most "
                                       f"half of the {len(alive)} runs are pruned at once"))
        else:
            reasons.append((run.index, f"{where}: {run.name} kept: its {of} {_interval(run.forecast)} is not above "
                                       f"{best.name}'s {_interval(best.forecast)} at {CONFIDENCE:.0%} confidence"))
    return PruneDecision(done, now, tuple(run.index for run in stop), tuple(reasons))


def forecast_status(record: ForecastRecord | None, stopped: str | None) -> pb.ForecastStatus:
    """A run's newest forecast for GetStatus (an empty one with a note before its first)."""
    if record is None:
        return pb.ForecastStatus(note="no forecast yet", stopped=stopped or "", loss=math.nan, low=math.nan,
                                 high=math.nan, target_seconds=math.nan, target_low_s=math.nan, target_high_s=math.nan)
    return pb.ForecastStatus(
        made_at_version=record.version, at_round=record.at_round, loss=record.loss, low=record.low, high=record.high,
        note=record.note, target_loss=record.target_loss, target_seconds=record.target_seconds,
        target_low_s=record.target_low_s, target_high_s=record.target_high_s, stopped=stopped or "",
        basis=record.basis,
    )


def newest_held_out(store: StateStore) -> tuple[float, int]:
    """(loss, version) of the run's newest held-out loss measured along the way; (NaN, −1) before any."""
    newest = store.held_out_losses(newest_only=True)
    return (newest[0].loss, newest[0].version) if newest else (math.nan, -1)


def decide_budget_end(now: float, started_at: float | None, budget_s: float) -> str | None:
    """The reason to end a run whose wall-time budget (`budget_s` seconds served from its first round's opening; the
    budget clock's origin `started_at`: now minus the seconds served) is used, or None: no budget, no round closed
    yet, or time left."""
    if budget_s <= 0 or started_at is None or now - started_at < budget_s:
        return None
    return f"{BUDGET_ENDED} of {budget_s / 60:g} minutes ({now - started_at:.0f} s served since its first round opened)"


def decide_budget_resume(now: float, started_at: float | None, budget_s: float, stopped: str | None) -> str | None:
    """At a start: the reason to undo the stop of a run ended at its wall-time budget (`stopped`, its stored stop
    reason, begins with BUDGET_ENDED) that the budget of the spec it restarts with (`budget_s` seconds served from its
    first round's opening, on the clock whose origin is `started_at`, as `decide_budget_end`'s; 0: none) no longer
    ends, or None: not stopped, stopped for another reason (pruned), or the budget still used. The clock is the
    budget's: the seconds the run was served, never the time the coordinator was down."""
    if stopped is None or not stopped.startswith(BUDGET_ENDED):
        return None
    if decide_budget_end(now, started_at, budget_s) is not None:
        return None
    if budget_s <= 0:
        return f"resumed at a restart: it has no wall-time budget now (run.minutes = 0); it was {stopped}"
    since = "" if started_at is None else f" ({now - started_at:.0f} s served since its first round opened)"
    return f"resumed at a restart: its wall-time budget is now {budget_s / 60:g} minutes{since}; it was {stopped}"
