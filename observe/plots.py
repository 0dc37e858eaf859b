"""The plots of a fit, drawn on given matplotlib axes: fit.png (`rcswarm fit`, `rcswarm run`) and the dashboard's PNGs.

Four panels: loss against step per length with the fitted A(s)·L^(−α(s)) (`draw_loss_step`), the
exponent α(s) with its fit α∞(1 − e^(−s/τ)) (`draw_alpha`), loss against wall time with the
labelled crossovers (`draw_loss_time`), and the law across lengths, loss against L with the fitted
A·L^(−α) and its bootstrap band (`draw_law`). The styles keep the pieces apart: a length's raw losses
faint and thin, its smoothed losses solid, every fit thick and dashed on a white halo (so it is not
lost on data of its own colour); observed crossovers dotted grey, predicted ones dash-dotted purple,
each labelled with its pair. A fit whose data do not identify it (its caveats) is labelled
"not enough data" with the reasons. Log axes read as plain numbers ("20", "0.5", never "2×10¹")
at `log_ticks`. The callers own the figures (and serialize matplotlib's text layout themselves).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rcswarm.observe.analysis import NOT_ENOUGH_DATA, Analysis, LengthCurve, LengthLaw
from rcswarm.observe.fits import CONFIDENCE, amplitude_from_points, power_law_band
from rcswarm.observe.forecast import ForecastCurve

# A log axis gets at most about MAX_TICK_LABELS labels, and fewer than MIN_TICK_LABELS only when even
# tenths of a decade do not give them.
MAX_TICK_LABELS = 7
MIN_TICK_LABELS = 3
RAW = {"alpha": 0.2, "linewidth": 0.6}
SMOOTHED = {"linewidth": 1.4}
OBSERVED_CROSSOVER = {"color": "0.35", "linestyle": ":", "linewidth": 1.3}
PREDICTED_CROSSOVER = {"color": "tab:purple", "linestyle": "-.", "linewidth": 1.1}
CAVEAT_COLOUR = "firebrick"
# Smooths one length's losses (in step order) for display; its label names how.
Smoother = Callable[[np.ndarray], np.ndarray]


def _roundness(mantissa: float) -> int:
    """0 for 1, 1 for 2 and 5, 2 for the other digits, 3 for halves (2.5), 4 for tenths (1.2): lower is rounder."""
    if mantissa == 1:
        return 0
    if mantissa in (2, 5):
        return 1
    if mantissa == int(mantissa):
        return 2
    return 3 if mantissa * 2 == int(mantissa * 2) else 4


def log_ticks(low: float, high: float) -> list[float]:
    """Tick positions for a log axis over [low, high] (0 < low < high): numbers m·10^k (m in steps of 0.1), the
    roundest first (`_roundness`, admitting less round ones only while fewer than MIN_TICK_LABELS are kept),
    each kept only if at least 1/MAX_TICK_LABELS of the axis away from every tick already kept, so that no
    two labels crowd each other however many decades the axis spans (or however few)."""
    span = math.log10(high / low)
    candidates = sorted(
        (_roundness(m), value)
        for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        for m in (round(1 + k / 10, 1) for k in range(90))
        if low <= (value := float(f"{m}e{e}")) <= high
    )
    kept: list[float] = []
    for position, (rank, value) in enumerate(candidates):
        if position and rank != candidates[position - 1][0] and len(kept) >= MIN_TICK_LABELS:
            break
        if all(abs(math.log10(value / other)) >= span / MAX_TICK_LABELS for other in kept):
            kept.append(value)
    if len(kept) < 2:  # narrower than a tenth of its decade: three ticks, rounded to the fewest digits that differ
        inner = [low * (high / low) ** (i / 4) for i in (1, 2, 3)]
        digits = next((d for d in range(3, 16) if len({f"{v:.{d}g}" for v in inner}) == 3), 16)
        kept = [float(f"{v:.{digits}g}") for v in inner]
    return sorted(kept)


def readable_log_axes(axes: Any, x_ticks: Sequence[float] | None = None) -> None:
    """The log axes of `axes` (already plotted) labelled as plain numbers ("20", "0.5", never "2×10^1") at
    `log_ticks` of the view (or at `x_ticks` on x), minor ticks unlabelled: no overlapping labels from under a
    decade to many."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for axis, (low, high) in ((axes.xaxis, axes.get_xlim()), (axes.yaxis, axes.get_ylim())):
        if axis.get_scale() != "log":
            continue
        given = axis is axes.xaxis and x_ticks is not None
        ticks = list(x_ticks) if given else log_ticks(min(low, high), max(low, high))
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.15g}"))
        axis.set_minor_formatter(NullFormatter())


def _fit_line(axes: Any, x: Any, y: Any, color: Any, label: str | None = None) -> None:
    """A fitted curve: thick and dashed on a white halo, drawn above the data."""
    from matplotlib import patheffects

    axes.plot(x, y, color=color, linestyle=(0, (6, 3)), linewidth=1.8, label=label, zorder=4,
              path_effects=[patheffects.withStroke(linewidth=3.6, foreground="white")])


def _caveat(axes: Any, caveats: Sequence[object], corner: str = "left", width: int = 60) -> None:
    """"not enough data" and the reasons (each its first clause, up to its colon), wrapped, in a lower corner
    ("left" or "right") of the axes."""
    if not caveats:
        return
    reasons = [str(caveat).split(": ")[0] for caveat in caveats]
    text = "\n".join(textwrap.fill(line, width) for line in (f"{NOT_ENOUGH_DATA}:", *reasons))
    axes.text(0.02 if corner == "left" else 0.98, 0.03, text, transform=axes.transAxes, fontsize="x-small",
              color=CAVEAT_COLOUR, va="bottom", ha=corner, zorder=6,
              bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": CAVEAT_COLOUR})


def empty_panel(axes: Any, message: str) -> None:
    axes.text(0.5, 0.5, textwrap.fill(message, 60), ha="center", va="center", transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _loss_curves(axes: Any, curves: Sequence[LengthCurve], field: str, smoother: Smoother) -> list[tuple[Any, Any]]:
    """Each length's losses against its `field` ("steps" or "times") where that is positive, raw (faint) and
    smoothed (solid, labelled L=...): [(curve, its smoothed line)]; "no metrics yet" when there is none."""
    drawn = []
    for curve in curves:
        x = getattr(curve, field)
        keep = x > 0
        if np.any(keep):
            raw, = axes.plot(x[keep], curve.losses[keep], **RAW)
            drawn.append((curve, axes.plot(x[keep], smoother(curve.losses)[keep], color=raw.get_color(),
                                           label=f"L={curve.length:g}", **SMOOTHED)[0]))
    if not drawn:
        empty_panel(axes, "no metrics yet")
    return drawn


def draw_loss_step(axes: Any, curves: Sequence[LengthCurve], analysis: Analysis | None, smoother: Smoother,
                   smooth_label: str) -> None:
    """Loss against step per length (raw faint, smoothed solid) with the fitted A(s)·L^(−α(s)) dashed."""
    drawn = _loss_curves(axes, curves, "steps", smoother)
    if not drawn:
        return
    if analysis is not None:
        amplitude = amplitude_from_points(analysis.points)
        matched = np.array([p.step for p in analysis.points])
        for curve, line in drawn:
            fitted = [math.exp(amplitude(s) - analysis.schedule.alpha(s) * math.log(curve.length)) for s in matched]
            _fit_line(axes, matched, fitted, line.get_color())
    axes.set(xscale="log", yscale="log", xlabel="step", ylabel="loss",
             title=f"loss vs step ({smooth_label}" + (r"; dashed: fitted $A(s)\,L^{-\alpha(s)}$)" if analysis else ")"))
    readable_log_axes(axes)
    axes.legend(fontsize="small")


def _crossover_lines(axes: Any, analysis: Analysis, low: float, high: float) -> list[Any]:
    """Observed crossovers (dotted) and, for a fit with no caveats, predicted ones (dash-dotted) inside
    [low, high], each labelled with its pair at the top; returns legend handles for the kinds drawn."""
    from matplotlib.lines import Line2D

    drawn = {}
    for pair in analysis.crossovers:
        name = f"{pair.length_short:g}→{pair.length_long:g}"
        marks = [(pair.observed, OBSERVED_CROSSOVER, name, "observed crossover")]
        if analysis.valid and pair.predicted is not None:
            marks.append((pair.predicted.time, PREDICTED_CROSSOVER, f"{name} predicted", "predicted by Eq. 11"))
        for time, style, text, kind in marks:
            if time is None or not low <= time <= high:
                continue
            axes.axvline(time, zorder=3, **style)
            axes.text(time, 0.98, f"{text} ", transform=axes.get_xaxis_transform(), rotation=90, va="top",
                      ha="right", fontsize="small", color=style["color"])
            drawn[kind] = Line2D([], [], label=kind, **style)
    return list(drawn.values())


def draw_loss_time(axes: Any, curves: Sequence[LengthCurve], analysis: Analysis | None, smoother: Smoother,
                   smooth_label: str) -> None:
    """Loss against wall time per length (raw faint, smoothed solid) with the labelled crossovers."""
    drawn = _loss_curves(axes, curves, "times", smoother)
    if not drawn:
        return
    handles = [line for _, line in drawn]
    axes.set(xscale="log", yscale="log", xlabel="wall time (s)", ylabel="loss",
             title=f"loss vs wall time ({smooth_label})")
    if analysis is not None:
        low, high = axes.get_xlim()
        marks = _crossover_lines(axes, analysis, low, high)
        if not marks:
            predicted = "" if analysis.valid else "; none predicted: the fit has caveats"
            axes.text(0.02, 0.03, f"no crossover observed under the rule{predicted}", transform=axes.transAxes,
                      fontsize="x-small", color="0.35", va="bottom", ha="left")
        handles += marks
        axes.set_xlim(low, high)
    readable_log_axes(axes)
    axes.legend(handles=handles, fontsize="small")


def schedule_text(analysis: Analysis) -> str:
    """α∞ and τ with their intervals and R², in one line."""
    s = analysis.schedule
    return (f"α∞ = {s.alpha_inf:.3f} [{s.alpha_inf_low:.3f}, {s.alpha_inf_high:.3f}], τ = {s.tau:.3g} "
            f"[{s.tau_low:.3g}, {s.tau_high:.3g}] steps, R² {s.r_squared:.2f}")


def draw_alpha(axes: Any, analysis: Analysis | None, message: str = "no fit") -> None:
    """α(s) at the matched steps, the fitted α∞(1 − e^(−s/τ)) and α∞'s interval; "not enough data" and the
    caveats when the data do not identify it."""
    if analysis is None:
        empty_panel(axes, message)
        return
    schedule = analysis.schedule
    matched = np.array([p.step for p in analysis.points])
    axes.plot(matched, [p.alpha for p in analysis.points], "o", markersize=4, label="α(s) at matched steps")
    grid = np.linspace(0.0, float(matched.max()), 200)
    _fit_line(axes, grid, [schedule.alpha(s) for s in grid], "tab:orange", label=r"$\alpha_\infty(1 - e^{-s/\tau})$")
    if analysis.identified("alpha_inf") and math.isfinite(schedule.alpha_inf_low + schedule.alpha_inf_high):
        axes.axhspan(schedule.alpha_inf_low, schedule.alpha_inf_high, color="tab:orange", alpha=0.12,
                     label=f"α∞ {CONFIDENCE:.0%} interval")
    axes.set(xlabel="step", ylabel="α(s)", title=textwrap.fill(schedule_text(analysis), 64), xlim=(0, None))
    axes.title.set_fontsize("medium")
    axes.legend(fontsize="small", loc="upper left")
    _caveat(axes, analysis.caveats, corner="right")


def law_text(law: LengthLaw) -> str:
    fit = law.fit
    return (f"{law.what}: ≈ {fit.formula()}, R² {fit.r_squared:.2f}, "
            f"α {CONFIDENCE:.0%} interval [{fit.alpha_low:.3f}, {fit.alpha_high:.3f}]")


def draw_law(axes: Any, law: LengthLaw | None, message: str = "no fit across lengths") -> None:
    """Loss against L (log-log) with the fitted A·L^(−α) and its bootstrap band."""
    if law is None:
        empty_panel(axes, message)
        return
    lengths = np.array(law.lengths)
    grid = np.geomspace(lengths.min() / 1.15, lengths.max() * 1.15, 100)  # [100]
    low, high = power_law_band(law.lengths, law.losses, grid)
    axes.fill_between(grid, low, high, color="tab:blue", alpha=0.15, label=f"{CONFIDENCE:.0%} band of the fit")
    _fit_line(axes, grid, [law.fit.predict(x) for x in grid], "tab:blue", label=r"fitted $A\,L^{-\alpha}$")
    axes.plot(lengths, law.losses, "o", color="black", markersize=5, zorder=5, label="measured")
    axes.set(xscale="log", yscale="log", xlabel="trained sequence length L", ylabel="loss",
             title=textwrap.fill(law_text(law), 64))
    axes.title.set_fontsize("medium")
    readable_log_axes(axes, x_ticks=sorted(set(law.lengths)))
    axes.legend(fontsize="small", loc="upper right")
    _caveat(axes, law.fit.caveats())


def draw_forecast(axes: Any, curves: Sequence[ForecastCurve]) -> None:
    """Issue #30: each run's mean training loss per round, the law E + A·x^(−β) fitted to it continued to the end of
    its budget (dashed), and the bootstrap band ahead of the last round (shaded)."""
    if not curves or all(len(c.xs) == 0 for c in curves):
        empty_panel(axes, "no closed rounds yet")
        return
    notes = []
    for index, curve in enumerate(curves):
        color = f"C{index % 10}"
        axes.plot(curve.xs, curve.losses, "o", ms=3, color=color, label=curve.label)
        if curve.note:
            notes.append(f"{curve.label} ({curve.note.removeprefix('not enough data: ').replace(': ', ', ')})")
            continue
        axes.plot(curve.law_x, curve.law, "--", color=color, lw=1)
        ahead = curve.law_x >= (curve.xs.max() if len(curve.xs) else 1.0)
        axes.fill_between(curve.law_x[ahead], curve.low[ahead], curve.high[ahead], color=color, alpha=0.2, lw=0)
        if math.isfinite(curve.horizon):
            axes.axvline(curve.horizon, color="0.6", lw=0.8, ls=":")
    axes.set_xscale("log")
    axes.set_xlabel("round")
    axes.set_ylabel("mean training loss of the round")
    axes.set_title("forecast: L = E + A·round^(−β), 90% band to the budget")
    axes.legend(fontsize=8)
    if notes:
        _caveat(axes, notes)
