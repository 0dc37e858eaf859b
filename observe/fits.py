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
centred moving average over steps, since one step's loss is noisy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


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
        return 2.0 ** (-self.alpha)

    def predict(self, length: float) -> float:
        return self.amplitude * length ** (-self.alpha)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares y = a + b x; returns (a, b, R²)."""
    b, a = np.polyfit(x, y, 1)
    residual = y - (a + b * x)
    total = y - y.mean()
    denominator = float(total @ total)
    r_squared = 1.0 - float(residual @ residual) / denominator if denominator > 0 else 1.0
    return float(a), float(b), r_squared


def fit_power_law(
    lengths: Sequence[float], losses: Sequence[float], *, confidence: float = 0.9, resamples: int = 2000, seed: int = 0
) -> PowerLawFit:
    """Fit loss ≈ A · L^(−α) over at least 3 distinct positive lengths."""
    x_raw, y_raw = np.asarray(lengths, dtype=float), np.asarray(losses, dtype=float)
    if x_raw.shape != y_raw.shape or x_raw.ndim != 1:
        raise ValueError(f"lengths {x_raw.shape} and losses {y_raw.shape}: expected two 1-D sequences of one length")
    if len(np.unique(x_raw)) < 3:
        raise ValueError(f"lengths {list(x_raw)}: expected at least 3 distinct values")
    if not (np.all(x_raw > 0) and np.all(y_raw > 0) and np.all(np.isfinite(y_raw))):
        raise ValueError(f"lengths {list(x_raw)} and losses {list(y_raw)}: expected positive finite values")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: expected a number in (0, 1)")
    x, y = np.log(x_raw), np.log(y_raw)
    intercept, slope, r_squared = _line(x, y)
    rng = np.random.default_rng(seed)
    alphas = []
    for _ in range(resamples):
        pick = rng.integers(0, len(x), len(x))
        if len(np.unique(x[pick])) >= 2:
            alphas.append(-_line(x[pick], y[pick])[1])
    tail = (1.0 - confidence) / 2.0
    low, high = (np.quantile(alphas, [tail, 1.0 - tail]) if alphas else (math.nan, math.nan))
    return PowerLawFit(
        amplitude=math.exp(intercept), alpha=-slope, r_squared=r_squared,
        alpha_low=float(low), alpha_high=float(high), points=len(x),
    )


@dataclass(frozen=True)
class AlphaScheduleFit:
    """α(s) = α∞ · (1 − e^(−s/τ)) fitted by least squares (Section 10.5.1, Eq. 9)."""

    alpha_inf: float
    tau: float
    r_squared: float

    def alpha(self, step: float) -> float:
        return self.alpha_inf * (1.0 - math.exp(-step / self.tau))

    @property
    def per_doubling(self) -> float:
        """Loss ratio per doubling of L at the plateau: 2^(−α∞)."""
        return per_doubling(self.alpha_inf)


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
    """Loss ratio per doubling of L under a power law with exponent α: 2^(−α)."""
    if not math.isfinite(alpha):
        raise ValueError(f"alpha={alpha}: expected a finite number")
    return 2.0 ** (-alpha)


def _schedule_residual(steps: np.ndarray, alphas: np.ndarray, log_tau: float) -> tuple[float, float]:
    """For a fixed τ = e^log_tau the best α∞ is closed-form; returns (sum of squared residuals, α∞)."""
    basis = -np.expm1(-steps / math.exp(log_tau))
    alpha_inf = float(basis @ alphas) / float(basis @ basis)
    residual = alphas - alpha_inf * basis
    return float(residual @ residual), alpha_inf


def fit_alpha_schedule(steps: Sequence[float], alphas: Sequence[float], *, grid: int = 400) -> AlphaScheduleFit:
    """Fit α(s) = α∞ (1 − e^(−s/τ)) to at least 3 points at distinct positive steps.

    The sum of squared residuals is profiled over τ: α∞ is solved in closed form for each τ,
    log τ is searched on a grid spanning [min(s)/100, 100·max(s)], and the best bracket is
    refined by golden-section search. R² is 1 − SSE/SST of α against its mean.
    """
    s, a = np.asarray(steps, dtype=float), np.asarray(alphas, dtype=float)
    if s.shape != a.shape or s.ndim != 1:
        raise ValueError(f"steps {s.shape} and alphas {a.shape}: expected two 1-D sequences of one length")
    if len(np.unique(s)) < 3:
        raise ValueError(f"steps {list(s)}: expected at least 3 distinct values")
    if not (np.all(s > 0) and np.all(np.isfinite(s)) and np.all(np.isfinite(a))):
        raise ValueError(f"steps {list(s)} and alphas {list(a)}: expected positive finite steps and finite alphas")
    if grid < 3:
        raise ValueError(f"grid={grid}: expected at least 3 points")
    log_taus = np.linspace(math.log(s.min() / 100.0), math.log(s.max() * 100.0), grid)
    errors = [_schedule_residual(s, a, value)[0] for value in log_taus]
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
    return AlphaScheduleFit(alpha_inf=alpha_inf, tau=math.exp(log_tau), r_squared=r_squared)


def _curve(name: str, xs: Sequence[float], ys: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Validate one curve and return it sorted by x, with values at a repeated x averaged."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"{name}: x {x.shape} and y {y.shape}: expected two 1-D sequences of one length, at least 2")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError(f"{name}: expected finite x and positive finite losses")
    unique, inverse = np.unique(x, return_inverse=True)
    if len(unique) < 2:
        raise ValueError(f"{name}: x {list(x)}: expected at least 2 distinct values")
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
        raise ValueError(f"runs with lengths {sorted(runs)}: expected at least 3 distinct lengths")
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
            raise ValueError(f"steps {list(outside)}: expected steps inside the common range [{first}, {last}]")
    lengths = list(curves)
    points = []
    for step in matched:
        losses = [math.exp(float(np.interp(step, x, np.log(y)))) for x, y in curves.values()]
        fit = fit_power_law(lengths, losses, resamples=0)
        points.append(AlphaPoint(step=float(step), alpha=fit.alpha, amplitude=fit.amplitude, r_squared=fit.r_squared))
    return points


def smooth_losses(losses: Sequence[float], window: int) -> np.ndarray:
    """Centred moving average over `window` consecutive steps, the window shrinking at both ends.

    Centred rather than trailing so a curve is not shifted later in time: a trailing mean would
    lag a slow run (more seconds per step) more than a fast one and bias crossovers late.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: expected a positive number of steps")
    values = np.asarray(losses, dtype=np.float64)  # [n]
    if values.ndim != 1:
        raise ValueError(f"losses of shape {values.shape}: expected one dimension")
    before, after = (window - 1) // 2, window // 2
    sums = np.concatenate([[0.0], np.cumsum(values)])  # [n + 1]
    index = np.arange(len(values))
    low = np.maximum(index - before, 0)
    high = np.minimum(index + after + 1, len(values))
    return (sums[high] - sums[low]) / (high - low)


def observed_crossover(
    times_short: Sequence[float], losses_short: Sequence[float],
    times_long: Sequence[float], losses_long: Sequence[float],
) -> float | None:
    """The time after which the longer run's loss stays below the shorter run's, over their common range.

    Both curves are interpolated onto the union of their times inside the common range. If the
    longer run ends above (or level with) the shorter one there is no crossover (None); if it is
    below throughout, the start of the common range is returned; otherwise the last sign change
    of the difference, located by linear interpolation.
    """
    t_short, y_short = _curve("shorter run", times_short, losses_short)
    t_long, y_long = _curve("longer run", times_long, losses_long)
    first, last = max(t_short[0], t_long[0]), min(t_short[-1], t_long[-1])
    if not first < last:
        raise ValueError(f"times [{first}, {last}]: expected the two runs' times to overlap")
    grid = np.unique(np.concatenate([t_short, t_long, [first, last]]))
    grid = grid[(grid >= first) & (grid <= last)]
    gap = np.interp(grid, t_long, y_long) - np.interp(grid, t_short, y_short)
    if gap[-1] >= 0:
        return None
    above = np.nonzero(gap >= 0)[0]
    if len(above) == 0:
        return float(grid[0])
    i = int(above[-1])
    return float(grid[i] + (grid[i + 1] - grid[i]) * gap[i] / (gap[i] - gap[i + 1]))


def _log_loss_at(schedule: AlphaScheduleFit, log_amplitude: Callable[[float], float], step: float, length: float) -> float:
    """log of Eq. 8: log A(s) − α(s) · log L."""
    return log_amplitude(step) - schedule.alpha(step) * math.log(length)


def amplitude_from_points(points: Sequence[AlphaPoint]) -> Callable[[float], float]:
    """log A(s) interpolated linearly in log s between fitted points, held at the end values outside them."""
    if not points:
        raise ValueError("points=[]: expected at least one fitted point")
    log_steps = np.log([p.step for p in points])
    log_amps = np.log([p.amplitude for p in points])
    order = np.argsort(log_steps)
    log_steps, log_amps = log_steps[order], log_amps[order]
    return lambda step: float(np.interp(math.log(max(step, 1e-12)), log_steps, log_amps))


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
    up to `max_time` (default: 1000·τ·max(c)), and its last sign change is refined by bisection.
    None when the longer run is not below at `max_time`.
    """
    if not 0 < length_short < length_long:
        raise ValueError(f"lengths {length_short}, {length_long}: expected 0 < shorter < longer")
    if not (seconds_per_step_short > 0 and seconds_per_step_long > 0):
        raise ValueError(f"seconds per step {seconds_per_step_short}, {seconds_per_step_long}: expected positive values")
    amplitude = log_amplitude if log_amplitude is not None else (lambda step: 0.0)
    horizon = max_time if max_time is not None else 1000.0 * schedule.tau * max(seconds_per_step_short, seconds_per_step_long)
    if not horizon > 0:
        raise ValueError(f"max_time={max_time}: expected a positive time")

    def gap(time: float) -> float:
        return _log_loss_at(schedule, amplitude, time / seconds_per_step_long, length_long) - _log_loss_at(
            schedule, amplitude, time / seconds_per_step_short, length_short
        )

    times = np.geomspace(horizon * 1e-9, horizon, samples)
    gaps = np.array([gap(float(t)) for t in times])
    if gaps[-1] >= 0:
        return None
    above = np.nonzero(gaps >= 0)[0]
    if len(above) == 0:
        time = float(times[0])
    else:
        low, high = float(times[above[-1]]), float(times[above[-1] + 1])
        for _ in range(100):
            middle = math.sqrt(low * high)
            low, high = (middle, high) if gap(middle) >= 0 else (low, middle)
        time = high
    return Crossover(time=time, step_short=time / seconds_per_step_short, step_long=time / seconds_per_step_long)


def seconds_per_step(steps: Sequence[float], wall_times: Sequence[float]) -> float:
    """A run's measured seconds per step: the least-squares slope of wall time against step."""
    s, t = np.asarray(steps, dtype=float), np.asarray(wall_times, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or len(np.unique(s)) < 2:
        raise ValueError(f"steps {s.shape} and wall times {t.shape}: expected 1-D sequences of one length, 2+ distinct steps")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        raise ValueError("steps and wall times: expected finite values")
    slope = float(np.polyfit(s, t, 1)[0])
    if not slope > 0:
        raise ValueError(f"seconds per step {slope}: expected wall time to increase with step")
    return slope
