"""Scaling-law fits as pure functions: loss(L) ≈ A · L^(−α) by least squares in log–log space.

After Section 10.5 of "Recurrence-Complete Frame-based Action Models": at a matched step,
loss falls as a power law in the trained sequence length L. `fit_power_law` fits
log loss = log A − α log L, reports R² of that line, and a bootstrap confidence interval
for α (resampling the points with replacement, deterministic by seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

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
