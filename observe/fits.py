"""Scaling-law fits as pure functions: loss(L) ≈ A · L^(−α) by least squares in log–log space.

After Section 10.5 of "Recurrence-Complete Frame-based Action Models": at a matched step,
loss falls as a power law in the trained sequence length L. `fit_power_law` fits
log loss = log A − α log L, reports R² of that line, and a bootstrap confidence interval
for α (resampling the points with replacement, deterministic by seed).

Section 10.5.1: fitted at many matched steps (`fit_alpha_over_steps`), the exponent follows
α(s) = α∞ (1 − e^(−s/τ)) (`fit_alpha_schedule`, Eq. 9). Wall time (Eq. 11): a run of length L
at wall time t has taken s = t / c_L steps, c_L its measured seconds per step (γt/L when
c_L = L/γ); `predicted_crossover` finds when the longer length's predicted loss stays below
the shorter's, `observed_crossover` the same on recorded curves (after `smooth_losses`, a
centred moving average over steps, since one step's loss is noisy; `ema_smooth` is the
dashboard's display smoothing, TensorBoard's debiased exponential moving average).

Every fit says whether its data identify it (`caveats`, empty when they do): the rules are the
constants below and docs/RESULTS.md ("When a fit is not identified") lists them. An observed
crossover counts only after both curves have left their initial plateau and only where the gap
between them is larger than its noise (`observed_crossover`, `plateau_end`, `gap_noise`).

Bad data are a ValueError naming them, as bad input is, never an OverflowError: a law whose amplitude or per
doubling lies beyond a float's range (losses hundreds of orders of magnitude apart: a stored garbage metric) is
refused by the fit that would return it (`fit_power_law`, `fit_alpha_schedule`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The rules of `caveats`: a fit whose data break one of them is shown as "not enough data".
# R² below these: the points do not follow the fitted curve closely enough to read its parameters.
MIN_LAW_R_SQUARED = 0.8  # loss ≈ A·L^(−α) across lengths
MIN_SCHEDULE_R_SQUARED = 0.7  # α(s) = α∞(1 − e^(−s/τ)) across matched steps
CONFIDENCE = 0.9  # the bootstrap intervals' coverage
RESAMPLES = 400  # bootstrap resamples of the α(s) schedule (fit_power_law takes its own count)
# An error message shows at most this many values of an array (a curve of 100,000 steps must not become a
# megabyte of /api/status).
SHOWN_VALUES = 6
# Wall time increases with step only where the fitted rise over the recorded steps exceeds this fraction of the
# largest time: below it, a constant wall time's least-squares slope is rounding error (4e-18), not a pace.
MIN_RELATIVE_RISE = 1e-9


def shown(values: Sequence[float] | np.ndarray) -> str:
    """`values` for an error message: all of them up to SHOWN_VALUES, else the first and last few and the count."""
    items = [float(v) for v in np.asarray(values, dtype=float).reshape(-1)]
    if len(items) <= SHOWN_VALUES:
        return f"[{', '.join(f'{v:g}' for v in items)}]"
    half = SHOWN_VALUES // 2
    return (f"[{', '.join(f'{v:g}' for v in items[:half])}, …, {', '.join(f'{v:g}' for v in items[-half:])}] "
            f"({len(items)} values)")


@dataclass(frozen=True)
class PowerLawFit:
    amplitude: float
    alpha: float
    r_squared: float
    alpha_low: float
    alpha_high: float
    points: int

    @property
    def per_doubling(self) -> float:
        """Loss ratio per doubling of L: 2^(−α)."""
        return per_doubling(self.alpha)

    def predict(self, length: float) -> float:
        """A·L^(−α) at `length`; inf where that is beyond a float's range, as the product itself overflows (the
        law of garbage metrics drawn beyond its lengths: Python's `**` raised OverflowError there)."""
        try:
            return self.amplitude * length ** (-self.alpha)
        except OverflowError:
            return math.inf

    def formula(self, digits: int = 3) -> str:
        """"A·L^(−α)" with the numbers, signed as they fall: a negative α (loss rising with L) reads L^(+|α|)."""
        sign = "−" if self.alpha >= 0 else "+"
        return f"{self.amplitude:.{digits}g}·L^({sign}{abs(self.alpha):.{digits}f})"

    def caveats(self) -> list[str]:
        """Why the points do not identify α (empty when they do): an interval wider than α, or a low R²."""
        out = []
        if not (self.alpha_high - self.alpha_low <= abs(self.alpha)):
            out.append(f"α's {CONFIDENCE:.0%} interval [{self.alpha_low:.3g}, {self.alpha_high:.3g}] is wider than "
                       f"α = {self.alpha:.3g}")
        if not self.r_squared >= MIN_LAW_R_SQUARED:
            out.append(f"R² = {self.r_squared:.2f} is below {MIN_LAW_R_SQUARED:g}: the losses do not fall as a power "
                       "law in L")
        return out


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares y = a + b x; returns (a, b, R²)."""
    b, a = np.polyfit(x, y, 1)
    residual = y - (a + b * x)
    total = y - y.mean()
    denominator = float(total @ total)
    r_squared = 1.0 - float(residual @ residual) / denominator if denominator > 0 else 1.0
    return float(a), float(b), r_squared


def _power_law_points(lengths: Sequence[float], losses: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(log L, log loss) of at least 3 distinct positive lengths with positive finite losses."""
    x_raw, y_raw = np.asarray(lengths, dtype=float), np.asarray(losses, dtype=float)
    if x_raw.shape != y_raw.shape or x_raw.ndim != 1:
        raise ValueError(f"lengths {x_raw.shape} and losses {y_raw.shape}: expected two 1-D sequences of one length")
    if len(np.unique(x_raw)) < 3:
        raise ValueError(f"lengths {shown(x_raw)}: expected at least 3 distinct values")
    if not (np.all(x_raw > 0) and np.all(y_raw > 0) and np.all(np.isfinite(y_raw))):
        raise ValueError(f"lengths {shown(x_raw)} and losses {shown(y_raw)}: expected positive finite values")
    return np.log(x_raw), np.log(y_raw)


def _bootstrap_lines(x: np.ndarray, y: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """[k, 2] (intercept, slope) of the lines fitted to resamples of the points drawn with replacement (those
    with at least 2 distinct x), deterministic by seed."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(resamples):
        pick = rng.integers(0, len(x), len(x))
        if len(np.unique(x[pick])) >= 2:
            lines.append(_line(x[pick], y[pick])[:2])
    return np.array(lines, dtype=float).reshape(-1, 2)


def fit_power_law(
    lengths: Sequence[float], losses: Sequence[float], *, confidence: float = CONFIDENCE, resamples: int = 2000,
    seed: int = 0,
) -> PowerLawFit:
    """Fit loss ≈ A · L^(−α) over at least 3 distinct positive lengths."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: expected a number in (0, 1)")
    x, y = _power_law_points(lengths, losses)
    intercept, slope, r_squared = _line(x, y)
    amplitude = _law_amplitude(intercept, slope, lengths, losses)
    alphas = -_bootstrap_lines(x, y, resamples, seed)[:, 1]
    tail = (1.0 - confidence) / 2.0
    low, high = (np.quantile(alphas, [tail, 1.0 - tail]) if len(alphas) else (math.nan, math.nan))
    return PowerLawFit(
        amplitude=amplitude, alpha=-slope, r_squared=r_squared,
        alpha_low=float(low), alpha_high=float(high), points=len(x),
    )


def _law_amplitude(intercept: float, slope: float, lengths: Sequence[float], losses: Sequence[float]) -> float:
    """A = e^intercept of the line fitted in log–log space, with A and the per doubling 2^(−α) = 2^slope inside a
    float's range (A > 0 and finite, 2^slope finite); else ValueError naming the losses. Losses hundreds of orders of
    magnitude apart (a stored garbage metric such as 1.7e308) put them outside it, where `math.exp` raised
    OverflowError, which no caller of a fit catches."""
    try:
        amplitude, doubling = math.exp(intercept), 2.0 ** slope
    except OverflowError:
        amplitude = doubling = math.inf
    if not (0 < amplitude < math.inf and doubling < math.inf):
        raise ValueError(f"lengths {shown(lengths)} and losses {shown(losses)}: the fitted law A·L^(−α) (log A = "
                         f"{intercept:.4g}, α = {-slope:.4g}) is beyond a float's range: expected losses that are "
                         "not hundreds of orders of magnitude apart")
    return amplitude


def power_law_band(
    lengths: Sequence[float], losses: Sequence[float], at: Sequence[float], *, confidence: float = CONFIDENCE,
    resamples: int = 2000, seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The pointwise `confidence` band of the fitted A·L^(−α) at the lengths `at`: (low, high), each [len(at)],
    from the same bootstrap resamples as `fit_power_law` with the same seed."""
    x, y = _power_law_points(lengths, losses)
    lines = _bootstrap_lines(x, y, resamples, seed)  # [k, 2]
    log_at = np.log(np.asarray(at, dtype=float))  # [m]
    if not len(lines):
        nan = np.full(log_at.shape, math.nan)
        return nan, nan
    predicted = lines[:, :1] + lines[:, 1:] * log_at[None, :]  # [k, m]
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(predicted, [tail, 1.0 - tail], axis=0)  # [m] each
    return np.exp(low), np.exp(high)


@dataclass(frozen=True)
class Caveat:
    """Why the data do not identify a fit: the reason, and the parameters it leaves unidentified (of
    SCHEDULE_PARAMETERS)."""

    text: str
    parameters: tuple[str, ...]

    def __str__(self) -> str:
        return self.text


SCHEDULE_PARAMETERS = ("alpha_inf", "tau")


@dataclass(frozen=True)
class AlphaScheduleFit:
    """α(s) = α∞ · (1 − e^(−s/τ)) fitted by least squares (Section 10.5.1, Eq. 9).

    From `fit_alpha_schedule` it also holds the bootstrap intervals of α∞ and τ, the steps its points
    spanned and whether τ ended at the edge of its search range; a law given by hand has none of those
    (NaN) and no caveats.
    """

    alpha_inf: float
    tau: float
    r_squared: float
    alpha_inf_low: float = math.nan
    alpha_inf_high: float = math.nan
    tau_low: float = math.nan
    tau_high: float = math.nan
    first_step: float = math.nan
    last_step: float = math.nan
    tau_at_bound: bool = False

    def alpha(self, step: float) -> float:
        return self.alpha_inf * (1.0 - math.exp(-step / self.tau))

    @property
    def per_doubling(self) -> float:
        """Loss ratio per doubling of L at the plateau: 2^(−α∞)."""
        return per_doubling(self.alpha_inf)

    def caveats(self) -> list[Caveat]:
        """Why the fitted points do not identify α∞ or τ (empty when they do, or for a law given by hand):
        τ beyond the last fitted step (α(s) has not levelled off, so α∞ is an extrapolation; the search
        range's upper edge is beyond it too) or R² below MIN_SCHEDULE_R_SQUARED (neither parameter); τ
        below the first fitted step (α(s) is flat over the data, so τ is only bounded; so is the lower
        edge) or τ's interval wider than τ (τ); α∞'s interval wider than α∞ (α∞)."""
        if math.isnan(self.last_step):
            return []
        both, tau, alpha_inf = SCHEDULE_PARAMETERS, ("tau",), ("alpha_inf",)
        out = []
        edge = " (at the edge of its search range)" if self.tau_at_bound else ""
        if self.tau > self.last_step:
            out.append(Caveat(f"τ = {self.tau:.3g} steps{edge} lies beyond the data's last common step "
                              f"{self.last_step:.3g}: α(s) has not levelled off, so α∞ is an extrapolation", both))
        elif self.tau < self.first_step:
            out.append(Caveat(f"τ = {self.tau:.3g} steps{edge} lies below the first matched step "
                              f"{self.first_step:.3g}: α(s) is flat over the data, so τ is only bounded", tau))
        if not (self.alpha_inf_high - self.alpha_inf_low <= abs(self.alpha_inf)):
            out.append(Caveat(f"α∞'s {CONFIDENCE:.0%} interval [{self.alpha_inf_low:.3g}, "
                              f"{self.alpha_inf_high:.3g}] is wider than α∞ = {self.alpha_inf:.3g}", alpha_inf))
        if not (self.tau_high - self.tau_low <= self.tau):
            out.append(Caveat(f"τ's {CONFIDENCE:.0%} interval [{self.tau_low:.3g}, {self.tau_high:.3g}] is wider "
                              f"than τ = {self.tau:.3g}", tau))
        if not self.r_squared >= MIN_SCHEDULE_R_SQUARED:
            out.append(Caveat(f"R² = {self.r_squared:.2f} of α(s) is below {MIN_SCHEDULE_R_SQUARED:g}: α(s) does "
                              "not follow α∞(1 − e^(−s/τ)) closely", both))
        return out


@dataclass(frozen=True)
class AlphaPoint:
    """The power law loss(L | s) ≈ A(s) · L^(−α(s)) fitted across lengths at one matched step."""

    step: float
    alpha: float
    amplitude: float
    r_squared: float


@dataclass(frozen=True)
class Crossover:
    """When the longer run's loss falls below the shorter run's, in wall time and in each run's steps."""

    time: float
    step_short: float
    step_long: float


def per_doubling(alpha: float) -> float:
    """Loss ratio per doubling of L under a power law with exponent α: 2^(−α); ValueError for an α whose 2^(−α) is
    beyond a float's range (the fits refuse such a law, `fit_power_law`, `fit_alpha_schedule`)."""
    if not math.isfinite(alpha):
        raise ValueError(f"alpha={alpha}: expected a finite number")
    try:
        return 2.0 ** (-alpha)
    except OverflowError:
        raise ValueError(f"alpha={alpha:.6g}: 2^(−α) is beyond a float's range; expected α > −1024") from None


def _schedule_residual(steps: np.ndarray, alphas: np.ndarray, log_tau: float) -> tuple[float, float]:
    """For a fixed τ = e^log_tau the best α∞ is closed-form; returns (sum of squared residuals, α∞)."""
    basis = -np.expm1(-steps / math.exp(log_tau))
    alpha_inf = float(basis @ alphas) / float(basis @ basis)
    residual = alphas - alpha_inf * basis
    return float(residual @ residual), alpha_inf


def _schedule_profile(steps: np.ndarray, alphas: np.ndarray, log_taus: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`_schedule_residual` weighted, at every log τ of a grid, for k weightings of the points at once:
    [k, g] sums of squared residuals, α∞ in closed form (Σ w·b·α / Σ w·b²) at each τ."""
    basis = -np.expm1(-steps[None, :] / np.exp(log_taus)[:, None])  # [g, n]
    cross = weights @ (basis * alphas[None, :]).T  # [k, g]: Σ w·b·α
    norm = weights @ (basis * basis).T  # [k, g]: Σ w·b²
    return (weights @ (alphas * alphas))[:, None] - cross * cross / norm  # [k, g]


def _bootstrap_schedules(steps: np.ndarray, alphas: np.ndarray, log_taus: np.ndarray, resamples: int,
                         seed: int) -> np.ndarray:
    """[k, 2] (α∞, τ) fitted to `resamples` bootstrap resamples of the points (those with 3+ distinct steps),
    deterministic by seed, all at once: a resample is a weight per point (how often it was drawn), the
    weighted sum of squared residuals is profiled over the grid of log τ (α∞ in closed form), and each
    resample's best grid point is refined by the vertex of the parabola through it and its neighbours."""
    counts = np.random.default_rng(seed).multinomial(len(steps), np.full(len(steps), 1.0 / len(steps)),
                                                     size=resamples).astype(float)  # [r, n]
    distinct = np.unique(steps, return_inverse=True)[1].reshape(-1)  # [n]
    drawn = np.zeros((resamples, distinct.max() + 1))  # [r, u]
    np.add.at(drawn.T, distinct, counts.T)
    counts = counts[np.count_nonzero(drawn, axis=1) >= 3]  # [k, n]
    errors = _schedule_profile(steps, alphas, log_taus, counts)  # [k, g]
    rows = np.arange(len(counts))
    argmin = np.argmin(errors, axis=1)  # [k]
    best = np.clip(argmin, 1, len(log_taus) - 2)  # [k]
    low, middle, high = errors[rows, best - 1], errors[rows, best], errors[rows, best + 1]  # [k] each
    curvature = low - 2.0 * middle + high
    step = log_taus[1] - log_taus[0]
    shift = np.where(curvature > 0, 0.5 * step * (low - high) / np.where(curvature > 0, curvature, 1.0), 0.0)
    at_end = np.isin(argmin, (0, len(log_taus) - 1))
    refined_log_tau = log_taus[best] + np.clip(shift, -step, step)  # [k]
    log_tau = np.where(at_end, log_taus[argmin], refined_log_tau)  # [k]
    refined = -np.expm1(-steps[None, :] / np.exp(log_tau)[:, None])  # [k, n]
    alpha_inf = (counts * refined * alphas).sum(axis=1) / (counts * refined * refined).sum(axis=1)  # [k]
    return np.stack([alpha_inf, np.exp(log_tau)], axis=1)


def fit_alpha_schedule(
    steps: Sequence[float], alphas: Sequence[float], *, grid: int = 400, resamples: int = RESAMPLES, seed: int = 0,
) -> AlphaScheduleFit:
    """Fit α(s) = α∞ (1 − e^(−s/τ)) to at least 3 points at distinct positive steps.

    The sum of squared residuals is profiled over τ: α∞ is solved in closed form for each τ,
    log τ is searched on a grid spanning [min(s)/100, 100·max(s)], and the best bracket is
    refined by golden-section search. R² is 1 − SSE/SST of α against its mean. The CONFIDENCE
    intervals of α∞ and τ come from `resamples` bootstrap resamples of the points
    (`_bootstrap_schedules`, deterministic by seed), widened to hold the fit itself; τ's best grid
    point at either end of the grid is `tau_at_bound`.
    """
    s, a = np.asarray(steps, dtype=float), np.asarray(alphas, dtype=float)
    if s.shape != a.shape or s.ndim != 1:
        raise ValueError(f"steps {s.shape} and alphas {a.shape}: expected two 1-D sequences of one length")
    if len(np.unique(s)) < 3:
        raise ValueError(f"steps {shown(s)}: expected at least 3 distinct values")
    if not (np.all(s > 0) and np.all(np.isfinite(s)) and np.all(np.isfinite(a))):
        raise ValueError(f"steps {shown(s)} and alphas {shown(a)}: expected positive finite steps and finite alphas")
    if grid < 3:
        raise ValueError(f"grid={grid}: expected at least 3 points")
    log_taus = np.linspace(math.log(s.min() / 100.0), math.log(s.max() * 100.0), grid)  # [grid]
    errors = _schedule_profile(s, a, log_taus, np.ones((1, len(s))))[0]  # [grid]
    best = int(np.argmin(errors))
    low, high = log_taus[max(best - 1, 0)], log_taus[min(best + 1, grid - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    inner_low, inner_high = high - ratio * (high - low), low + ratio * (high - low)
    while high - low > 1e-10:
        if _schedule_residual(s, a, inner_low)[0] < _schedule_residual(s, a, inner_high)[0]:
            high, inner_high = inner_high, inner_low
            inner_low = high - ratio * (high - low)
        else:
            low, inner_low = inner_low, inner_high
            inner_high = low + ratio * (high - low)
    log_tau = (low + high) / 2.0
    error, alpha_inf = _schedule_residual(s, a, log_tau)
    total = float(((a - a.mean()) ** 2).sum())
    r_squared = 1.0 - error / total if total > 0 else 1.0
    try:
        per_doubling(alpha_inf)
    except ValueError as error:
        raise ValueError(f"steps {shown(s)} and alphas {shown(a)}: the fitted α∞ has no per doubling "
                         f"({error})") from None
    resampled = _bootstrap_schedules(s, a, log_taus, resamples, seed)  # [k, 2]
    bounds = np.full((2, 2), math.nan)  # [low/high, α∞/τ]
    if len(resampled):
        tail = (1.0 - CONFIDENCE) / 2.0
        bounds = np.quantile(resampled, [tail, 1.0 - tail], axis=0)
        # Resamples of exact data land within the parabola's refinement of the fit, not on it: hold it.
        estimate = np.array([alpha_inf, math.exp(log_tau)])  # [2]
        bounds = np.stack([np.minimum(bounds[0], estimate), np.maximum(bounds[1], estimate)])
    return AlphaScheduleFit(
        alpha_inf=alpha_inf, tau=math.exp(log_tau), r_squared=r_squared,
        alpha_inf_low=float(bounds[0, 0]), alpha_inf_high=float(bounds[1, 0]),
        tau_low=float(bounds[0, 1]), tau_high=float(bounds[1, 1]),
        first_step=float(s.min()), last_step=float(s.max()), tau_at_bound=best in (0, grid - 1),
    )


def _curve(name: str, xs: Sequence[float], ys: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Validate one curve and return it sorted by x, with values at a repeated x averaged."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"{name}: x {x.shape} and y {y.shape}: expected two 1-D sequences of one length, at least 2")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError(f"{name}: expected finite x and positive finite losses")
    unique, inverse = np.unique(x, return_inverse=True)
    if len(unique) < 2:
        raise ValueError(f"{name}: x {shown(x)}: expected at least 2 distinct values")
    return unique, np.bincount(inverse, weights=y) / np.bincount(inverse)


def fit_alpha_over_steps(
    runs: Mapping[float, tuple[Sequence[float], Sequence[float]]],
    steps: Sequence[float] | None = None,
    *,
    max_points: int = 40,
) -> list[AlphaPoint]:
    """Fit loss(L | s) ≈ A(s) · L^(−α(s)) at matched steps s across runs {L: (steps, losses)}.

    Each run's log loss is interpolated linearly in step at the common steps, which must lie
    inside every run's recorded range. Without `steps`, up to `max_points` log-spaced steps
    are taken over the common range (starting no lower than 1/1000 of its end). Needs at least 3 distinct lengths.
    """
    if len(runs) < 3:
        raise ValueError(f"runs with lengths {shown(sorted(runs))}: expected at least 3 distinct lengths")
    curves = {float(length): _curve(f"run L={length}", *curve) for length, curve in runs.items()}
    first = max(float(x[0]) for x, _ in curves.values())
    last = min(float(x[-1]) for x, _ in curves.values())
    if not first < last:
        raise ValueError(f"common step range [{first}, {last}]: expected steps shared by every run")
    if steps is None:
        if max_points < 2 or last <= 0:
            raise ValueError(f"max_points={max_points}, last common step {last}: expected at least 2 and a positive step")
        matched = np.unique(np.geomspace(max(first, last / 1000.0), last, max_points))
    else:
        matched = np.asarray(steps, dtype=float)
        outside = matched[(matched < first) | (matched > last)]
        if matched.ndim != 1 or len(outside):
            raise ValueError(f"steps {shown(outside)}: expected steps inside the common range [{first}, {last}]")
    lengths = list(curves)
    losses_at = np.exp(np.stack([np.interp(matched, x, np.log(y)) for x, y in curves.values()]))  # [lengths, steps]
    points = []
    for step, losses in zip(matched, losses_at.T):
        fit = fit_power_law(lengths, losses, resamples=0)
        points.append(AlphaPoint(step=float(step), alpha=fit.alpha, amplitude=fit.amplitude, r_squared=fit.r_squared))
    return points


def smooth_losses(losses: Sequence[float], window: int) -> np.ndarray:
    """Centred moving average over `window` consecutive steps, the window shrinking at both ends.

    Centred rather than trailing so a curve is not shifted later in time: a trailing mean would
    lag a slow run (more seconds per step) more than a fast one and bias crossovers late. A window
    wider than 2n + 1 steps is taken as 2n + 1 (`covering_window`), which changes no value.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: expected a positive number of steps")
    values = np.asarray(losses, dtype=np.float64)  # [n]
    if values.ndim != 1:
        raise ValueError(f"losses of shape {values.shape}: expected one dimension")
    window = covering_window(window, len(values))
    before, after = (window - 1) // 2, window // 2
    index = np.arange(len(values))
    low = np.maximum(index - before, 0)
    high = np.minimum(index + after + 1, len(values))
    return _window_sums(values, window)[after:after + len(values)] / (high - low)


def covering_window(window: int, count: int) -> int:
    """`window`, or 2·count + 1 when it is wider: a centred window of 2·count + 1 steps already holds every one of
    `count` values at each of them, so a wider one averages the same values, and its sums would cost 8 bytes a
    step of the window whatever the data (`rcswarm fit --smooth 1000000000` allocated gigabytes for 40 steps)."""
    return min(window, 2 * count + 1)


def _window_sums(values: np.ndarray, window: int) -> np.ndarray:
    """[n + window − 1] the sums of every `window` consecutive values, partial windows at both ends included
    (np.convolve's "full" mode). Each window is summed on its own: a running sum's differences would cancel
    catastrophically after one huge value, leaving the windows that do not hold it at 0."""
    if len(values) == 0:
        return values
    return np.convolve(values, np.ones(window), mode="full")


def ema_smooth(values: Sequence[float], weight: float) -> np.ndarray:
    """TensorBoard's scalar smoothing: an exponential moving average with smoothing weight w in [0, 1),
    debiased by 1 − w^k after k values so that the start is not pulled towards zero (0: the raw values).

    last_k = w · last_(k−1) + (1 − w) · x_k and smoothed_k = last_k / (1 − w^k), after TensorBoard's
    scalar dashboard; it trails (a larger w lags more), so it is for display: crossovers use the
    centred `smooth_losses`.
    """
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < 1:
        raise ValueError(f"smoothing weight {weight!r}: expected a number in [0, 1)")
    values = np.asarray(values, dtype=np.float64)  # [n]
    if values.ndim != 1:
        raise ValueError(f"values of shape {values.shape}: expected one dimension")
    out = np.empty_like(values)  # [n]
    last = 0.0
    for index, value in enumerate(values):
        last = weight * last + (1.0 - weight) * value
        out[index] = last / (1.0 - weight ** (index + 1))
    return out


# The crossover rule: a crossing counts only once both curves have left their initial plateau, i.e.
# from the time both smoothed losses stay below (1 − PLATEAU_DROP) of their first smoothed value, and
# not within the first EARLY_FRACTION of the common time range (`counting_start`); and only when the
# longer run ends below the shorter by more than the gap's noise, NOISE_SIGMAS standard deviations
# of the difference of two smoothed values (`gap_noise`).
PLATEAU_DROP = 0.1
EARLY_FRACTION = 0.1
NOISE_SIGMAS = 2.0


def plateau_end(times: Sequence[float], smoothed: Sequence[float], drop: float = PLATEAU_DROP) -> float | None:
    """The time from which a smoothed loss curve (in step order) stays below (1 − drop) × its first value; None
    while it has not got there for good."""
    t, y = np.asarray(times, dtype=float), np.asarray(smoothed, dtype=float)
    if t.shape != y.shape or t.ndim != 1 or len(t) < 1:
        raise ValueError(f"times {t.shape} and losses {y.shape}: expected two non-empty 1-D sequences of one length")
    if not 0 < drop < 1:
        raise ValueError(f"drop={drop}: expected a fraction in (0, 1)")
    above = np.nonzero(y >= (1.0 - drop) * y[0])[0]
    last = int(above[-1])
    return None if last == len(y) - 1 else float(t[last + 1])


def counting_start(plateau_ends: Sequence[float], first: float, last: float) -> float:
    """Where crossovers start to count on a common time range [first, last]: after every curve's plateau end
    and after the first EARLY_FRACTION of the range."""
    return max(*plateau_ends, first + EARLY_FRACTION * (last - first))


def step_noise(losses: Sequence[float]) -> float:
    """The standard deviation of one step's loss about its trend, from the median absolute deviation of the
    differences between neighbouring steps (robust to the trend and to outliers): 1.4826 · MAD / √2."""
    differences = np.diff(np.asarray(losses, dtype=float))  # [n - 1]
    if len(differences) == 0:
        return 0.0
    return 1.4826 * float(np.median(np.abs(differences - np.median(differences)))) / math.sqrt(2.0)


def gap_noise(losses_short: Sequence[float], losses_long: Sequence[float], window: int) -> float:
    """NOISE_SIGMAS standard deviations of the difference of two `window`-step means of the raw losses, each
    step's noise being `step_noise` (steps taken as independent); a mean holds at most the steps a curve has, so a
    window wider than the shorter curve counts as that many steps (`rcswarm fit --smooth` far above the steps gave a
    noise of almost zero)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: expected a positive number of steps")
    steps = max(1, min(window, len(losses_short), len(losses_long)))
    # hypot, not the squares' sum: a step noise above 1e154 (garbage metrics) squared raised OverflowError.
    return NOISE_SIGMAS * math.hypot(step_noise(losses_short), step_noise(losses_long)) / math.sqrt(steps)


@dataclass(frozen=True)
class ObservedCrossover:
    """When the longer run's loss went below the shorter's for good (None: not observed), and why not."""

    time: float | None
    note: str  # "" with a time; otherwise why there is none


def observed_crossover(
    times_short: Sequence[float], losses_short: Sequence[float],
    times_long: Sequence[float], losses_long: Sequence[float],
    *, counted_from: float | None = None, noise: float = 0.0,
) -> ObservedCrossover:
    """The time after which the longer run's loss stays below the shorter run's, over their common range
    from `counted_from` on (`counting_start`).

    Both curves are interpolated onto the union of their times inside that range. Unless the longer
    run ends below the shorter one by more than `noise` there is no crossover; if it is below
    throughout the range, none is observed either (the crossing, if any, came before counting began);
    otherwise it is the last sign change of the difference, located by linear interpolation. Runs whose
    times do not overlap have no crossover to observe (the note says so).
    """
    t_short, y_short = _curve("shorter run", times_short, losses_short)
    t_long, y_long = _curve("longer run", times_long, losses_long)
    first, last = max(t_short[0], t_long[0]), min(t_short[-1], t_long[-1])
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise={noise}: expected a finite number >= 0")
    if not first < last:
        return ObservedCrossover(None, f"the two runs' times do not overlap ([{t_short[0]:.3g}, {t_short[-1]:.3g}] s "
                                       f"and [{t_long[0]:.3g}, {t_long[-1]:.3g}] s): unobservable")
    start = first if counted_from is None else max(first, counted_from)
    if not start < last:
        return ObservedCrossover(None, f"counting starts at {start:.3g} s, after the common time range ends")
    grid = np.unique(np.concatenate([t_short, t_long, [start, last]]))
    grid = grid[(grid >= start) & (grid <= last)]
    gap = np.interp(grid, t_long, y_long) - np.interp(grid, t_short, y_short)
    if gap[-1] >= 0:
        return ObservedCrossover(None, "the longer L ends above")
    if gap[-1] >= -noise:
        return ObservedCrossover(None, f"the longer L ends below by {-gap[-1]:.2g}, within the noise {noise:.2g}")
    above = np.nonzero(gap >= 0)[0]
    if len(above) == 0:
        return ObservedCrossover(None, f"the longer L is below from {start:.3g} s on, where counting starts")
    i = int(above[-1])
    return ObservedCrossover(float(grid[i] + (grid[i + 1] - grid[i]) * gap[i] / (gap[i] - gap[i + 1])), "")


def amplitude_from_points(points: Sequence[AlphaPoint]) -> Callable[[float], float]:
    """log A(s) interpolated linearly in log s between fitted points, held at the end values outside them; takes
    a step (a float back) or an array of steps (an array back)."""
    if not points:
        raise ValueError("points=[]: expected at least one fitted point")
    log_steps = np.log([p.step for p in points])
    log_amps = np.log([p.amplitude for p in points])
    order = np.argsort(log_steps)
    log_steps, log_amps = log_steps[order], log_amps[order]
    def log_amplitude(step: Any) -> Any:
        values = np.interp(np.log(np.maximum(step, 1e-12)), log_steps, log_amps)
        return float(values) if np.ndim(values) == 0 else values

    return log_amplitude


def _on_steps(log_amplitude: Callable[[float], float], steps: np.ndarray) -> np.ndarray:
    """log A at every step of `steps` ([n]): one call on the array (a constant broadcasts), or one call per step
    for a function of a single float."""
    try:
        values = np.asarray(log_amplitude(steps), dtype=float)  # type: ignore[arg-type]
        return np.broadcast_to(values, steps.shape)
    except (TypeError, ValueError):
        return np.array([log_amplitude(float(step)) for step in steps], dtype=float)


# The refinement of a predicted crossover: each round samples this many times inside the bracket, narrowing it
# by as much; a dozen rounds reach a float's precision from the first grid's spacing.
REFINE_POINTS = 64
REFINE_ROUNDS = 12


def predicted_crossover(
    schedule: AlphaScheduleFit,
    length_short: float, seconds_per_step_short: float,
    length_long: float, seconds_per_step_long: float,
    *,
    log_amplitude: Callable[[float], float] | None = None,
    max_time: float | None = None,
    samples: int = 4000,
) -> Crossover | None:
    """Predicted wall time after which the longer run's loss stays below the shorter run's (Eq. 11).

    Eq. 11 reads loss(t, L) ≈ A(γt/L) · L^(−α(γt/L)): a run of length L has taken s = γt/L steps
    at wall time t. With each run's measured seconds per step c_L the step count is s = t / c_L,
    which is exactly γt/L when c_L = L/γ (the paper's linear-cost assumption) and uses the
    measured costs when they are not exactly proportional. α(s) is the fitted schedule (Eq. 9);
    log A(s) is `log_amplitude` (constant when None, so it cancels in the comparison). The
    difference log loss(t, L_long) − log loss(t, L_short) (Eq. 13) is sampled on a log grid of t
    up to `max_time` (default: 1000·τ·max(c)), all samples at once, and its last sign change is refined
    on finer log grids inside the bracket until it is as narrow as a float allows. `log_amplitude` is
    called on arrays of steps (`amplitude_from_points` takes them; a constant is broadcast). None when
    the longer run is not below at `max_time`.
    """
    if not 0 < length_short < length_long:
        raise ValueError(f"lengths {length_short}, {length_long}: expected 0 < shorter < longer")
    if not (seconds_per_step_short > 0 and seconds_per_step_long > 0):
        raise ValueError(f"seconds per step {seconds_per_step_short}, {seconds_per_step_long}: expected positive values")
    amplitude = log_amplitude if log_amplitude is not None else (lambda step: 0.0)
    horizon = max_time if max_time is not None else 1000.0 * schedule.tau * max(seconds_per_step_short, seconds_per_step_long)
    if not horizon > 0:
        raise ValueError(f"max_time={max_time}: expected a positive time")

    log_short, log_long = math.log(length_short), math.log(length_long)

    def gaps(times: np.ndarray) -> np.ndarray:
        """[n] times -> [n] log loss(t, L_long) − log loss(t, L_short), each log A(s) − α(s)·log L (Eq. 8)."""
        steps_long, steps_short = times / seconds_per_step_long, times / seconds_per_step_short
        alpha_long = schedule.alpha_inf * -np.expm1(-steps_long / schedule.tau)
        alpha_short = schedule.alpha_inf * -np.expm1(-steps_short / schedule.tau)
        return ((_on_steps(amplitude, steps_long) - alpha_long * log_long)
                - (_on_steps(amplitude, steps_short) - alpha_short * log_short))

    times = np.geomspace(horizon * 1e-9, horizon, samples)  # [samples]
    sampled = gaps(times)
    if sampled[-1] >= 0:
        return None
    above = np.nonzero(sampled >= 0)[0]
    if len(above) == 0:
        time = float(times[0])
    else:
        # The gap is >= 0 at `low` and < 0 at `high`: narrow the bracket to the last sign change inside it.
        low, high = float(times[above[-1]]), float(times[above[-1] + 1])
        for _ in range(REFINE_ROUNDS):
            if not high > low * (1.0 + 4.0 * np.finfo(float).eps):
                break
            inner = np.geomspace(low, high, REFINE_POINTS + 2)[1:-1]  # [REFINE_POINTS]
            inside = np.nonzero(gaps(inner) >= 0)[0]
            if len(inside):
                low = float(inner[inside[-1]])
            following = inside[-1] + 1 if len(inside) else 0
            high = float(inner[following]) if following < len(inner) else high
        time = high
    return Crossover(time=time, step_short=time / seconds_per_step_short, step_long=time / seconds_per_step_long)


def seconds_per_step(steps: Sequence[float], wall_times: Sequence[float]) -> float:
    """A run's measured seconds per step: the least-squares slope of wall time against step, which must rise over
    the recorded steps by more than MIN_RELATIVE_RISE of the largest time (ValueError otherwise: a constant wall
    time has no pace, whatever sign its slope's rounding error takes)."""
    s, t = np.asarray(steps, dtype=float), np.asarray(wall_times, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or len(np.unique(s)) < 2:
        raise ValueError(f"steps {s.shape} and wall times {t.shape}: expected 1-D sequences of one length, 2+ distinct steps")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        raise ValueError("steps and wall times: expected finite values")
    slope = float(np.polyfit(s, t, 1)[0])
    rise = slope * float(s.max() - s.min())
    if not rise > MIN_RELATIVE_RISE * float(np.abs(t).max()) or not slope > 0:
        raise ValueError(f"seconds per step {slope:.3g} over wall times {shown(t)}: expected wall time to increase "
                         "with step")
    return slope
