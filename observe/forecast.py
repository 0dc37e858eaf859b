"""Forecasts of a run's final loss: the saturating law L(x) = E + A·x^(−β) fitted to its closed rounds.

x is the round (a version v's loss is the mean training loss of the steps trained from θ_v, placed at
x = v + 1); a run's budget is its `[run] rounds`, so the forecast of its final loss is the law at
x = rounds, and `rounds_to` the round at which it reaches a target. The loss forecast is the
*training* loss (the steps' mean loss, each measured on a batch before the step trains on it: close to the loss on
fresh data of the training distribution); a held-out loss along the
way is not measured (the launcher measures it once, at the end).

The fit: for a fixed β the law is linear in (E, A), so E and A are solved in closed form (weighted least squares,
round x weighing (x / last x)^WEIGHT_POWER, held at A ≥ 0 and E ≥ 0: a loss in nats does not rise with training and
is not negative) and β is the best point of a log grid (`BETAS`). The interval is a block bootstrap of the
residuals: `RESAMPLES` curves, each the fitted law plus the residuals resampled in BLOCKS blocks of consecutive
rounds (all curves fitted at once), refitted the same way, and the CONFIDENCE quantiles of their forecasts. Blocks
carry a stretch of rounds that lies above or below the law (a misfit, not only the batches' noise) into the
resamples; docs/RESULTS.md measures the coverage on recorded sweeps.

The first round is left out (FIRST_ROUND). Below a minimum the answer is "not enough data" (`Forecast.note`),
never a number: fewer than MIN_ROUNDS usable rounds, or a horizon more than MAX_EXTRAPOLATION times beyond the
last round. A loss that rises over the newest rounds (a diverging run) gets no forecast either: the law only falls,
and held at A ≥ 0 it fitted such a curve as a flat line at the curve's weighted mean, below its newest losses, with
an interval that only widened downwards (`check_falling`); its note comes with where the rising line ends
(`NotFalling`: `Forecast.level`, `level_low`), what the sweep's pruning compares. The interval's upper end is never below the point
forecast plus how far the newest RECENT_ROUNDS rounds lie above the law (`SaturatingFit.recent_gap`): a law that
undershoots the newest losses does not claim the final loss is below them with confidence.
Rows that are not finite positive losses (a diverged step, a garbage metric) are left out and counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from rcswarm.observe.fits import CONFIDENCE
from rcswarm.protos.wire import MAX_VAL_LOSS

MIN_ROUNDS = 6  # usable rounds before any forecast
# The first round (x = 1: the steps trained from the random initialization) is left out: its loss falls from the
# uniform guess within the round, a transient the law does not describe, and its weight pulled the forecasts of
# short curves towards an early floor (docs/RESULTS.md: median error 0.089 with it, 0.069 without, at 30 %).
FIRST_ROUND = 2
MAX_EXTRAPOLATION = 10.0  # the horizon may lie at most this many times beyond the last round fitted
# A loss above this is a garbage metric, not a point of the curve: one bound, the wire's (protos/wire.py), for the
# held-out losses a worker sends and the coordinator takes, the training losses it takes (coordinator/intake.py) and
# the step means a fit reads (observe/analysis.py).
MAX_LOSS = MAX_VAL_LOSS
RESAMPLES = 300
# Round x's weight in the fit, (x / last x)^WEIGHT_POWER: the rounds nearest the horizon count most (the law describes
# where the curve goes; its start bends differently). docs/RESULTS.md: median error 0.069 → 0.056 at 30 %.
WEIGHT_POWER = 2.0
# The bootstrap resamples the residuals in blocks of n / BLOCKS consecutive rounds, so a stretch of rounds above or
# below the law (the misfit) moves a resample's fit as it moved the data's: coverage 56 % → 80 % at 30 % (docs/RESULTS.md).
BLOCKS = 3
BETAS = np.geomspace(0.02, 4.0, 160)  # [g] the grid of β
# A forecast's upper end is at least the point forecast plus the mean residual of the newest RECENT_ROUNDS rounds.
RECENT_ROUNDS = 4
# A loss rises when the least-squares line over its newest rounds rises by more than Student's t quantile at
# (1 + CONFIDENCE) / 2 (one-sided) standard errors, by more than the rounds' own scatter about that line (round losses
# are not independent: a slowly falling loss with correlated noise drifts up for a while, and the standard error
# alone called 38 of 60 such curves rising) and by more than RISE_TOLERANCE of the loss (less is rounding).
RISE_Z = NormalDist().inv_cdf((1 + CONFIDENCE) / 2)
RISE_TOLERANCE = 1e-9
NOT_FALLING = "the loss is not falling"  # how the note of a loss that rises begins
# A rising loss's newest level is at least its line's end less this many times the rounds' scatter (`NotFalling`,
# what the sweep prunes on): with once the scatter, a slowly falling run under correlated noise (AR(1), ρ 0.7) whose
# newest rounds drifted up was pruned beside a flat run it would end below in 1 of 100 simulated sweeps
# (tests/coordinator/test_forecasts.py); with twice, in none.
LEVEL_SCATTERS = 2.0


class NotEnoughData(ValueError):
    """The rounds do not support a forecast; the message says why."""


class NotFalling(NotEnoughData):
    """The loss rises over the newest rounds (`check_falling`): no forecast, but where the rising line ends, `level`
    at the newest round, and `level_low`, the low end of its CONFIDENCE interval (below by at least the rounds'
    scatter): a diverging run's loss is at least about there now, whatever it does next."""

    def __init__(self, message: str, level: float, level_low: float) -> None:
        super().__init__(message)
        self.level = level
        self.level_low = level_low


@dataclass(frozen=True)
class SaturatingFit:
    """L(x) = E + A·x^(−β), with the bootstrap resamples' parameters (`resampled`, [k, 3]: E, A, β) and how far
    the newest RECENT_ROUNDS rounds lie above the law on average (`recent_gap`, ≥ 0)."""

    floor: float  # E
    amplitude: float  # A
    beta: float
    points: int
    last_x: float
    resampled: np.ndarray = field(repr=False, compare=False)
    recent_gap: float = 0.0

    def predict(self, x: float) -> float:
        """The law's loss at round x."""
        return self.floor + self.amplitude * x ** (-self.beta)

    def band(self, x: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The `confidence` interval of the law at x over the bootstrap resamples (beyond the last round, its upper
        end at least the law plus `recent_gap`)."""
        low, high = self.band_over([x], confidence)
        return float(low[0]), float(high[0])

    def band_over(self, xs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
        """The pointwise `confidence` band of the law at every x of `xs`: (low, high), each [m]; from the last round
        on, the upper end is at least the law plus `recent_gap`."""
        x = np.asarray(xs, dtype=float)  # [m]
        e, a, b = (column[:, None] for column in self.resampled.T)  # [k, 1] each
        values = e + a * x[None, :] ** (-b)  # [k, m]
        tail = (1.0 - confidence) / 2.0
        low, high = np.quantile(values, [tail, 1.0 - tail], axis=0)  # [m] each
        point = self.floor + self.amplitude * x ** (-self.beta)
        ahead = np.where(x >= self.last_x, point + self.recent_gap, point)
        return np.minimum(low, point), np.maximum(high, ahead)

    def rounds_to(self, target: float, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
        """(x, low, high) at which the law reaches `target` (inf: never, the floor E is above it)."""
        def reach(e: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
            gap = target - e
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                x = np.where(gap > 0, (a / np.where(gap > 0, gap, 1.0)) ** (1.0 / b), np.inf)
            return np.maximum(x, 1.0)
        point = float(reach(np.array([self.floor]), np.array([self.amplitude]), np.array([self.beta]))[0])
        values = reach(*self.resampled.T)  # [k], inf where a resample's floor is above the target
        tail = (1.0 - confidence) / 2.0
        low, high = np.quantile(values, [tail, 1.0 - tail], method="inverted_cdf")
        return point, float(min(low, point)), float(max(high, point))


@dataclass(frozen=True)
class Forecast:
    """The loss the law predicts at x = `at` with its interval, or why there is none (`note`, NaN values)."""

    at: float
    loss: float = math.nan
    low: float = math.nan
    high: float = math.nan
    points: int = 0
    note: str = ""
    # The round at which the law reaches the target loss asked for, with its interval (NaN: none asked; inf: never).
    target_round: float = math.nan
    target_low: float = math.nan
    target_high: float = math.nan
    # A rising loss's newest level and its interval's low end (`NotFalling`; NaN otherwise).
    level: float = math.nan
    level_low: float = math.nan

    @property
    def ok(self) -> bool:
        return not self.note


def usable_points(xs: Sequence[float], losses: Sequence[float]) -> tuple[np.ndarray, np.ndarray, int]:
    """The (x, loss) pairs with a finite x ≥ FIRST_ROUND and a finite loss in (0, MAX_LOSS], and how many of the
    others were left out (the first round's is not counted)."""
    try:
        x = np.asarray(xs, dtype=float).reshape(-1)
        y = np.asarray(losses, dtype=float).reshape(-1)
    except (TypeError, ValueError) as error:
        raise ValueError(f"rounds and losses: expected numbers ({error})") from None
    if x.shape != y.shape:
        raise ValueError(f"rounds {x.shape} and losses {y.shape}: expected one loss per round")
    first = np.isfinite(x) & (x < FIRST_ROUND)
    keep = np.isfinite(x) & np.isfinite(y) & (x >= FIRST_ROUND) & (y > 0) & (y <= MAX_LOSS)
    return x[keep], y[keep], int(len(x) - keep.sum() - first.sum())


def _fit_grid(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[k, 3] (E, A, β) of the weighted least-squares fit for each of k weightings ([k, n]) of the points, of one
    curve y ([n]) or of k curves ([k, n])."""
    basis = x[None, :] ** (-BETAS[:, None])  # [g, n]
    wy = weights * y  # [k, n]
    sw = weights.sum(axis=1)[:, None]  # [k, 1]
    sb = weights @ basis.T  # [k, g]
    sbb = weights @ (basis * basis).T  # [k, g]
    sy = wy.sum(axis=1)[:, None]  # [k, 1]
    sby = wy @ basis.T  # [k, g]
    syy = (wy * y).sum(axis=1)[:, None]  # [k, 1]
    det = sw * sbb - sb * sb  # [k, g]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(det > 0, (sw * sby - sb * sy) / np.where(det > 0, det, 1.0), 0.0)
        e = (sy - a * sb) / sw
        # The constraints: A < 0 → a flat line at the mean; E < 0 → through the origin.
        flat = a < 0
        a, e = np.where(flat, 0.0, a), np.where(flat, sy / sw, e)
        origin = e < 0
        a, e = np.where(origin, sby / np.where(sbb > 0, sbb, 1.0), a), np.where(origin, 0.0, e)
    sse = syy - 2 * e * sy - 2 * a * sby + e * e * sw + 2 * e * a * sb + a * a * sbb  # [k, g]
    sse = np.where(np.isfinite(sse), sse, np.inf)
    best = np.argmin(sse, axis=1)  # [k]
    rows = np.arange(len(weights))
    return np.stack([e[rows, best], a[rows, best], BETAS[best]], axis=1)


class Line(NamedTuple):
    """The least-squares line of y over x (`line`): its rise from the first x to the last, that rise's standard
    error, the standard deviation of y about the line, the line's value at the last x and that value's standard
    error."""

    rise: float
    error: float
    scatter: float
    end: float
    end_error: float


def line(x: np.ndarray, y: np.ndarray) -> Line:
    """The least-squares line of y over x (x sorted): rise 0 and errors 0 when x does not vary, infinite errors and
    scatter with fewer than 3 points. x is scaled to [0, 1] first: no overflow."""
    span = float(x[-1] - x[0])
    if not span > 0:
        return Line(0.0, 0.0, 0.0, float(y.mean()), 0.0)
    u = (x - x[0]) / span  # [n] in [0, 1]
    du = u - u.mean()  # [n]
    suu = float(du @ du)
    slope = float(du @ (y - y.mean())) / suu
    end = float(y.mean()) + slope * (1.0 - float(u.mean()))
    residuals = y - y.mean() - slope * du  # [n]
    dof = len(x) - 2
    if dof <= 0:
        return Line(slope, math.inf, math.inf, end, math.inf)
    scatter = math.sqrt(float(residuals @ residuals) / dof)
    end_error = scatter * math.sqrt(1.0 / len(x) + (1.0 - float(u.mean())) ** 2 / suu)
    return Line(slope, scatter / math.sqrt(suu), scatter, end, end_error)


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile at `p` with `dof` degrees of freedom (≥ 1), by the Cornish–Fisher expansion about the
    normal's (Abramowitz & Stegun 26.7.5; within 0.3 % of the exact 2.132 at p = 0.95, dof = 4, exact as dof grows)."""
    z = NormalDist().inv_cdf(p)
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))


def check_falling(x: np.ndarray, y: np.ndarray) -> None:
    """NotFalling when the loss rises over the newest half of the rounds (at least MIN_ROUNDS of them; x sorted):
    the least-squares line's rise over them above Student's t quantile (one-sided, (1 + CONFIDENCE) / 2) standard
    errors, above the rounds' scatter about that line and more than rounding. The law E + A·x^(−β) with A ≥ 0 only
    falls or stays flat: it cannot say where a rising loss ends (`forecast_at`; the curriculum's rule fits without it,
    as a rung whose loss rises has nothing more to gain there). The exception carries the line's newest level and
    its low end: the line's value at the newest round less the same t quantile of its standard error, and at least
    LEVEL_SCATTERS times the rounds' scatter (correlated round losses, as above)."""
    newest = max(MIN_ROUNDS, len(x) // 2)
    x, y = x[-newest:], y[-newest:]
    fitted = line(x, y)
    t = t_quantile((1 + CONFIDENCE) / 2, max(len(x) - 2, 1))
    up = fitted.rise
    if up > t * fitted.error and up > fitted.scatter and up > RISE_TOLERANCE * float(np.abs(y).mean()):
        level_low = fitted.end - max(t * fitted.end_error, LEVEL_SCATTERS * fitted.scatter)
        raise NotFalling(f"{NOT_FALLING} over rounds {x[0]:g}..{x[-1]:g}: it rises by {up:.3g} "
                         f"(standard error {fitted.error:.2g}) to {fitted.end:.4g}, a forecast needs a loss that "
                         f"falls or stays flat: no forecast", fitted.end, level_low)


def fit_saturating(xs: Sequence[float], losses: Sequence[float], *, resamples: int = RESAMPLES,
                   seed: int = 0, falling: bool = False) -> SaturatingFit:
    """Fit L(x) = E + A·x^(−β) to the usable points; NotEnoughData below MIN_ROUNDS distinct rounds, and with
    `falling` when the loss rises over its newest rounds (`check_falling`)."""
    x, y, dropped = usable_points(xs, losses)
    distinct = len(np.unique(x))
    if distinct < MIN_ROUNDS:
        left = f" ({dropped} rows left out: not finite positive losses)" if dropped else ""
        raise NotEnoughData(f"not enough data: {distinct} usable rounds{left}, a forecast needs {MIN_ROUNDS}")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if falling:
        check_falling(x, y)
    weights = (x / x.max()) ** WEIGHT_POWER  # [n]
    e, a, b = _fit_grid(x, y, weights[None, :])[0]
    law = e + a * x ** (-b)  # [n]
    # The residuals, rescaled for the 3 parameters fitted, resampled in blocks of consecutive rounds.
    n = len(x)
    residuals = (y - law) * np.sqrt(n / max(n - 3, 1))  # [n]
    size = max(1, n // BLOCKS)
    starts = np.random.default_rng(seed).integers(0, n - size + 1, (resamples, -(-n // size)))  # [k, blocks]
    picks = (starts[:, :, None] + np.arange(size)[None, None, :]).reshape(resamples, -1)[:, :n]  # [k, n]
    curves = law[None, :] + residuals[picks]  # [k, n]
    resampled = _fit_grid(x, curves, np.broadcast_to(weights, curves.shape))
    recent_gap = max(0.0, float(np.mean((y - law)[-RECENT_ROUNDS:])))
    return SaturatingFit(float(e), float(a), float(b), len(x), float(x.max()), resampled, recent_gap)


def forecast_at(xs: Sequence[float], losses: Sequence[float], horizon: float, *, target: float = math.nan,
                confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> Forecast:
    """The loss at x = horizon with its interval (and with a positive `target`, the round it is reached at), or a
    Forecast whose note says why not: it raises only on malformed input, never on what the losses are."""
    if not (math.isfinite(horizon) and horizon >= 1):
        return Forecast(horizon, note=f"no budget to forecast at (horizon {horizon:g}): [run] rounds or minutes sets "
                                      f"one (minutes once a round closed)")
    try:
        fit = fit_saturating(xs, losses, resamples=resamples, seed=seed, falling=True)
    except NotFalling as reason:
        return Forecast(horizon, note=str(reason), level=reason.level, level_low=reason.level_low)
    except NotEnoughData as reason:
        return Forecast(horizon, note=str(reason))
    if horizon > MAX_EXTRAPOLATION * fit.last_x:
        return Forecast(horizon, points=fit.points,
                        note=f"not enough data: round {fit.last_x:g} is more than {MAX_EXTRAPOLATION:g}× short of "
                             f"the budget's {horizon:g}")
    low, high = fit.band(horizon, confidence)
    reach = fit.rounds_to(target, confidence) if target > 0 else (math.nan,) * 3
    return Forecast(horizon, fit.predict(horizon), low, high, fit.points, "", *reach)


@dataclass(frozen=True)
class ForecastCurve:
    """One run as the dashboard's forecast panel draws it: its round losses, and the law from its first round to
    its budget with the band (empty with a `note` when the rounds do not support a fit)."""

    label: str
    xs: np.ndarray  # [n] rounds (v + 1)
    losses: np.ndarray  # [n]
    horizon: float
    law_x: np.ndarray  # [m]
    law: np.ndarray  # [m]
    low: np.ndarray  # [m]
    high: np.ndarray  # [m]
    note: str = ""


def forecast_curve(label: str, round_losses: Sequence[tuple[int, float]], horizon: float,
                   points: int = 60) -> ForecastCurve:
    """A run's ForecastCurve from its (version, mean loss) rounds and its budget's round (`horizon`)."""
    xs, losses, _ = usable_points([v + 1 for v, _ in round_losses], [loss for _, loss in round_losses])
    empty = np.zeros(0)
    try:
        fit = fit_saturating(xs, losses)
    except NotEnoughData as reason:
        return ForecastCurve(label, xs, losses, horizon, empty, empty, empty, empty, str(reason))
    end = max(horizon, fit.last_x) if math.isfinite(horizon) and horizon >= 1 else fit.last_x
    law_x = np.geomspace(1.0, end, points)  # [m]
    low, high = fit.band_over(law_x)
    return ForecastCurve(label, xs, losses, horizon, law_x, np.array([fit.predict(x) for x in law_x]), low, high)


# How the reason of a run ended at its wall-time budget (`[run] minutes`, coordinator/forecasts.py) begins: such a run
# was not pruned.
BUDGET_ENDED = "ended at its wall-time budget"


def was_pruned(stopped: str | None) -> bool:
    """Whether a run stopped for `stopped` (its stored reason) was pruned by its sweep, not ended at its budget."""
    return bool(stopped) and not stopped.startswith(BUDGET_ENDED)


def describe(loss: float, low: float, high: float, at_round: int, note: str = "", stopped: str = "",
             target_loss: float = math.nan, target_seconds: float = math.nan) -> str:
    """A forecast in words, as `rcswarm status`, `rcswarm fit` and the dashboard show it: "1.234 [1.2, 1.3] at round
    40; 1.3 at 812 s", or the note saying why there is none, or why a sweep stopped the run."""
    if stopped:
        return f"pruned: {stopped}" if was_pruned(stopped) else stopped
    if note:
        return note
    text = f"{loss:.4g} [{low:.4g}, {high:.4g}] at round {at_round}"
    if math.isfinite(target_loss) and target_loss > 0:
        reach = "never (above the law's floor)" if target_seconds == math.inf else f"at {target_seconds:.0f} s"
        text += f"; {target_loss:.4g} {reach}" if math.isfinite(target_seconds) or target_seconds == math.inf else ""
    return text
