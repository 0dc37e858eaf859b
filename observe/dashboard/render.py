"""The dashboard's HTML page and PNG plots, rendered from the view dicts (`views.py`) and the fit.

One page over a list of runs: the run or sweep, its runs, every worker with its run, the fit
(α(s), crossovers and the three plots), and the rounds. No JavaScript; the page refreshes
itself. Plots use object-oriented matplotlib (no pyplot state), one render at a time.
"""

from __future__ import annotations

import html
import io
import math
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np

from rcswarm.observe import traffic
from rcswarm.observe.analysis import FitReport
from rcswarm.observe.fits import amplitude_from_points

PLOTS = ("loss_step", "loss_time", "alpha")
ROUNDS_SHOWN = 20
CLOCK_NOTES = {
    "worker": "Steps and times in the fit and plots below are the workers' own: each worker's step counter and "
              "wall time.",
    "run": "Steps and times in the fit and plots below are each run's own: step = the steps its rounds trained "
           "before the version + step in the round, time from the run's first metric.",
}


def _figure() -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.4), dpi=100)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot(1, 1, 1)


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _empty(axes: Any, message: str) -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


# A log axis gets at most about MAX_TICK_LABELS labels, and fewer than MIN_TICK_LABELS only when even
# tenths of a decade do not give them.
MAX_TICK_LABELS = 7
MIN_TICK_LABELS = 3


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


def _readable_log_axes(axes: Any) -> None:
    """Both log axes of `axes` (already plotted) labelled as plain numbers ("20", "0.5", never "2×10^1") at
    `log_ticks` of the view, minor ticks unlabelled: no overlapping labels from under a decade to many."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for axis, (low, high) in ((axes.xaxis, axes.get_xlim()), (axes.yaxis, axes.get_ylim())):
        axis.set_major_locator(FixedLocator(log_ticks(min(low, high), max(low, high))))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.15g}"))
        axis.set_minor_formatter(NullFormatter())


# matplotlib's text layout (mathtext tick labels on log axes) is not thread-safe: one render at a time.
_RENDER_LOCK = threading.Lock()


def render_plot(name: str, report: FitReport) -> bytes:
    """One of PLOTS as PNG bytes (object-oriented matplotlib, no pyplot state; serialized across threads)."""
    if name not in PLOTS:
        raise KeyError(name)
    with _RENDER_LOCK:
        return _png(plot_figure(name, report))


def plot_figure(name: str, report: FitReport) -> Any:
    """The matplotlib Figure of one of PLOTS (callers other than `render_plot` must serialize themselves)."""
    figure, axes = _figure()
    analysis = report.analysis
    positive = [c for c in report.curves if np.any(c.steps > 0)]
    if name == "loss_step":
        if not positive:
            _empty(axes, "no metrics yet")
        else:
            amplitude = amplitude_from_points(analysis.points) if analysis else None
            matched = np.array([p.step for p in analysis.points]) if analysis else None
            for curve in positive:
                keep = curve.steps > 0
                line, = axes.plot(curve.steps[keep], curve.losses[keep], alpha=0.7, label=f"L={curve.length:g}")
                if analysis is not None and amplitude is not None and matched is not None:
                    fitted = [math.exp(amplitude(s) - analysis.schedule.alpha(s) * math.log(curve.length)) for s in matched]
                    axes.plot(matched, fitted, "--", color=line.get_color())
            axes.set(xscale="log", yscale="log", xlabel="step", ylabel="loss",
                     title="loss vs step" + (" (dashed: fit)" if analysis else ""))
            _readable_log_axes(axes)
            axes.legend(fontsize="small")
    elif name == "loss_time":
        timed = [c for c in report.curves if np.any(c.times > 0)]
        if not timed:
            _empty(axes, "no metrics yet")
        else:
            for curve in timed:
                keep = curve.times > 0
                axes.plot(curve.times[keep], curve.losses[keep], label=f"L={curve.length:g}")
            if analysis is not None:
                for pair in analysis.crossovers:
                    if pair.observed is not None and pair.observed > 0:
                        axes.axvline(pair.observed, color="grey", linestyle=":", linewidth=1)
            axes.set(xscale="log", yscale="log", xlabel="wall time (s)", ylabel="loss",
                     title="loss vs wall time" + (" (dotted: observed crossovers)" if analysis else ""))
            _readable_log_axes(axes)
            axes.legend(fontsize="small")
    elif name == "alpha":
        if analysis is None:
            _empty(axes, report.message or "no fit")
        else:
            schedule = analysis.schedule
            matched = np.array([p.step for p in analysis.points])
            axes.plot(matched, [p.alpha for p in analysis.points], "o", label="α(s) at matched steps")
            grid = np.linspace(0.0, float(matched.max()), 200)
            axes.plot(grid, [schedule.alpha(s) for s in grid], "-",
                      label=f"α∞={schedule.alpha_inf:.3f}, τ={schedule.tau:.3g}")
            axes.set(xlabel="step", ylabel="α(s)", title="scaling exponent α(s) = α∞(1 − e^(−s/τ))")
            axes.legend(fontsize="small")
    else:
        raise KeyError(name)
    return figure


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[Any]], empty: str) -> str:
    parts = [f"<h2>{html.escape(title)}</h2>"]
    if not rows:
        parts.append(f"<p class=muted>{html.escape(empty)}</p>")
        return "\n".join(parts)
    parts.append("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; background: #fff; }
table { border-collapse: collapse; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; font-size: 0.9em; }
th { background: #eef; }
.muted { color: #777; }
.plots img { border: 1px solid #ddd; margin: 0.3em; max-width: 100%; }
.fit { font-size: 1.1em; background: #f4f8ee; padding: 0.5em; border: 1px solid #cdb; display: inline-block; }
"""


def _fit_section(fits: dict[str, Any]) -> str:
    """With a fit: the fitted α(s), the crossover table (observed and Eq. 11) and the three plots. Without one:
    the one line saying what a fit needs, and the loss plots alone."""
    fit = fits["fit"]
    if fit is None:
        return f"""<h2>scaling law: loss(L | s) ≈ A(s)·L^(−α(s))</h2>
<p class=muted>{html.escape(fits['message'])}; {html.escape(NEEDED_FOR_FIT)}</p>
<div class=plots>
{_plot_img("loss_step")}
{_plot_img("loss_time")}
</div>"""
    crossing = [
        (f"{c['length_short']:g} → {c['length_long']:g}", _fmt(c["observed_s"]) + (" s" if c["observed_s"] else ""),
         _fmt(c["predicted_s"]) + (" s" if c["predicted_s"] else ""),
         "–" if c["predicted_s"] is None else f"{c['predicted_step_short']:.0f} / {c['predicted_step_long']:.0f}")
        for c in fit["crossovers"]
    ]
    return f"""<h2>scaling law: loss(L | s) ≈ A(s)·L^(−α(s)), α(s) = α∞·(1 − e^(−s/τ))</h2>
<p class=fit>α∞ = {fit['alpha_inf']:.4f}, τ = {fit['tau']:.4g} steps, R² = {fit['r_squared']:.4f}; per doubling of L at α∞:
×{fit['per_doubling']:.4f} ({1 - fit['per_doubling']:.1%} lower loss)</p>
{_table("wall-time crossovers (longer L below shorter L from then on)",
        ("L short → long", "observed", "predicted (Eq. 11)", "predicted steps short / long"), crossing, "no pairs")}
<div class=plots>
{"".join(_plot_img(name) for name in PLOTS)}
</div>"""


NEEDED_FOR_FIT = "to fit the loss against the trained length, train a sweep ([sweep] seq_lens in RUN.toml, as make demo does)"
PLOT_ALTS = {"loss_step": "loss against step per seq_len", "loss_time": "loss against wall time per seq_len",
             "alpha": "alpha(s) and its fit"}


def _plot_img(name: str) -> str:
    return f'<img src="/plot/{name}.png" alt="{PLOT_ALTS[name]}" width="640" height="440">'


def _document(title: str, refresh_s: int, body: str, metrics_link: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{int(refresh_s)}">
<title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body>
{body}
<p class=muted>JSON: <a href="/api/status">/api/status</a>, <a href="{metrics_link}">{html.escape(metrics_link)}</a>;
Prometheus: <a href="/metrics">/metrics</a>. Rendered {time.strftime('%Y-%m-%d %H:%M:%S')}; refreshes every {int(refresh_s)} s.</p>
</body></html>
"""


def _curriculum_cell(curriculum: dict[str, Any] | None) -> str:
    """The run's curriculum in one line: policy, current L × batch (or per worker), last decision."""
    if not curriculum:
        return "–"
    length, batch = curriculum.get("seq_len", 0), curriculum.get("batch_size", 0)
    current = "L per worker" if not length else f"L {length} × batch {batch}"
    reason = curriculum.get("reason", "")
    return f"{curriculum.get('policy', '')}: {current}" + (f"; {reason}" if reason else "")


def _assignment_cell(worker: dict[str, Any]) -> str:
    assignment = worker.get("assignment")
    return "–" if assignment is None else f"{assignment['seq_len']} × {assignment['batch_size']}"


def _overview_rows(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """The run's or sweep's fields: state, runs, version (a sweep's lowest), workers, loss, tokens, curriculum."""
    lengths = ", ".join(f"{x:g}" for x in data["fits"]["lengths"]) or "none yet"
    return [
        (data["kind"], data["run_id"]), ("state", data["run_state"]), ("runs", len(data["runs"])),
        ("version", f"{data['version']} / {data['target_rounds'] or '∞'}"),
        ("workers active", sum(1 for w in data["workers"] if w["state"] == "active")),
        ("latest loss", _fmt(data["latest_loss"])), ("tokens", data["total_tokens"]),
        ("tokens applied", data.get("applied_tokens", 0)), ("pace", data.get("pace") or "–"),
        ("tokens/s", _fmt(data["tokens_per_second"])), ("seq_len with data", lengths),
        ("curriculum", _curriculum_cell(data.get("curriculum"))),
        ("traffic per worker per round", _traffic_cell(data["runs"])),
    ]


def _traffic_cell(runs: list[dict[str, Any]]) -> str:
    """Each run's mean bytes per worker per round, up and down, with the ratio to fp32 (issue #28)."""
    cells = []
    for r in runs:
        t = r.get("traffic") or {}
        line = traffic.describe(t.get("fp32_bytes") or 0, t.get("bytes_up_per_round") or 0,
                                t.get("bytes_down_per_round") or 0)
        cells.append(line if len(runs) == 1 else f"L={r['seq_len']}: {line}")
    return "; ".join(cells) or "–"


def _run_rows(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (r["run_id"], r["seq_len"], r["batch_size"], r["run_state"], f"{r['version']} / {r['target_rounds'] or '∞'}",
         ", ".join(w["name"] for w in r["workers"]) or "–", _fmt(r["tokens_per_second"]), r["total_tokens"],
         _fmt(r["latest_loss"]), _fmt(r["metrics"]["last_step"], ".0f"), _fmt(r["metrics"]["last_loss"]),
         (r["param_sha256"] or "")[:16] + "…")
        for r in data["runs"]
    ]


def _worker_rows(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Active workers first, then by run; a worker no longer active shows no run."""
    ordered = sorted(data["workers"], key=lambda w: (w["state"] != "active", w["run_index"]))
    return [
        (w["name"], w["worker_id"], w["run_id"] if w["state"] == "active" else "–", _fmt(w["run_seq_len"], "d"),
         w["state"], w["device"], w["base_version"], _fmt(w["seconds_since_heartbeat"], ".1f"), _assignment_cell(w),
         _fmt(w["tokens_per_second"], ".4g"), w["tokens"], _fmt(w["loss"]), _fmt(w["seq_len"], "d"),
         _fmt(w["last_step"], "d"), w["bytes_sent"], w["bytes_received"],
         f"{w['late_updates']} / {w['stale_updates']} / {w['clipped_updates']} / {w['dropped_updates']}",
         f"{w['trained_tokens']} / {w['applied_tokens']}", _pace_cell(w), w["outlier"] or "–", w["reason"])
        for w in ordered
    ]


def _pace_cell(worker: dict[str, Any]) -> str:
    """A worker's assigned steps (or its time budget) and its measured seconds per step."""
    seconds = _fmt(worker.get("step_seconds"), ".3g")
    if worker.get("round_seconds"):
        return f"{worker['round_seconds']:.3g} s budget, {seconds} s/step"
    steps = worker.get("inner_steps")
    return f"{steps if steps else '–'} × {seconds} s"


def _round_rows(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The open rounds, then the newest closed, ROUNDS_SHOWN at most."""
    newest = sorted(data["rounds"], key=lambda r: -(r["closed_at"] or math.inf))[:ROUNDS_SHOWN]
    return [
        (r["run_id"], r["version"], "open" if r["open"] else "closed", r["reports"], r["tokens"],
         _fmt(r["duration_s"], ".3g"), r["close_reason"], _fmt(r["update_norm"]), r["clipped"], r["dropped"],
         r["aggregation"] or "–")
        for r in newest
    ]


def render_page(data: dict[str, Any], refresh_s: int) -> str:
    """The page of a run or a sweep (`views.status_dict`): overview, runs, workers, fit and plots, rounds."""
    title = f"rcswarm {data['kind']} {data['run_id']}"
    body = f"""<h1>{html.escape(title)}</h1>
{_table(data["kind"], ("field", "value"), _overview_rows(data), "")}
{_table("runs", ("run", "L", "batch", "state", "version", "workers assigned", "tokens/s", "tokens", "latest loss",
                 "step", "loss at step", "θ sha256"), _run_rows(data), "no runs")}
{_table("workers (memberships; a worker moved to another run joins it under a new id)",
        ("name", "id", "assigned run", "L", "state", "device", "base version", "since heartbeat (s)",
         "assigned L × batch", "tokens/s", "tokens", "loss", "seq_len", "step", "bytes sent", "bytes received",
         "updates late (merged) / stale (refused) / clipped / dropped", "tokens trained / applied",
         "steps × s/step", "latest outlier flag", "reason"), _worker_rows(data), "no workers have joined")}
<p class=muted>{html.escape(CLOCK_NOTES[data["clock"]])}</p>
{_fit_section(data["fits"])}
{_table(f"rounds (open, then newest closed; {ROUNDS_SHOWN} at most)",
        ("run", "version", "state", "reports", "tokens", "duration (s)", "close reason", "update norm", "clipped",
         "dropped", "aggregation"), _round_rows(data), "no rounds")}"""
    first = quote(data["runs"][0]["run_id"], safe="") if data["runs"] else ""
    return _document(title, refresh_s, body, f"/api/metrics?run={first}&since=0")
