"""The dashboard's HTML page and PNG plots, rendered from the view dicts (`views.py`) and the fit.

One page over a list of runs: the run or sweep, its runs, every worker with its run, the fit
(α(s) with its intervals, R² and caveats, the crossovers under their rule, and the four plots of
`observe/plots.py`), and the rounds. No JavaScript; the page refreshes itself. It fits the window
from about 1,000 px wide: tables wrap their cells and scroll inside their own box, never the page.
Curves are drawn raw (faint) and smoothed as TensorBoard smooths them (`fits.ema_smooth`, a
debiased exponential moving average with the weight `?smoothing=` picks among SMOOTHING_CHOICES).
Plots use object-oriented matplotlib (no pyplot state), one render at a time.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from rcswarm.observe import traffic
from rcswarm.observe.analysis import (
    CROSSOVER_RULE,
    NOT_ENOUGH_DATA,
    FitReport,
    crossover_rows,
    fit_rows,
    law_at_last_step,
)
from rcswarm.observe.fits import ema_smooth
from rcswarm.observe.forecast import ForecastCurve, describe
from rcswarm.observe.plots import draw_alpha, draw_forecast, draw_law, draw_loss_step, draw_loss_time, empty_panel

PLOTS = ("loss_step", "loss_time", "alpha", "law")
# Issue #30: the forecast panel, drawn from each run's rounds rather than the fit's curves (`render_forecast`).
FORECAST_PLOT = "forecast"
FORECAST_ALT = "each run's training loss per round, the fitted law to the end of its budget and the band ahead"
ROUNDS_SHOWN = 20
# The TensorBoard smoothing weights the page offers (`?smoothing=`), and the one it starts with.
SMOOTHING_CHOICES = (0.0, 0.6, 0.8, 0.9, 0.95, 0.99)
DEFAULT_SMOOTHING = 0.9
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
    import io

    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


# matplotlib's text layout (mathtext tick labels on log axes) is not thread-safe: one render at a time.
_RENDER_LOCK = threading.Lock()


def render_plot(name: str, report: FitReport, smoothing: float = DEFAULT_SMOOTHING) -> bytes:
    """One of PLOTS as PNG bytes (object-oriented matplotlib, no pyplot state; serialized across threads)."""
    if name not in PLOTS:
        raise KeyError(name)
    with _RENDER_LOCK:
        return _png(plot_figure(name, report, smoothing))


def render_forecast(curves: Sequence[ForecastCurve]) -> bytes:
    """The forecast panel (issue #30) as PNG bytes: each run's rounds, its law to the budget and the band ahead."""
    with _RENDER_LOCK:
        figure, axes = _figure()
        draw_forecast(axes, curves)
        return _png(figure)


def plot_figure(name: str, report: FitReport, smoothing: float = DEFAULT_SMOOTHING) -> Any:
    """The matplotlib Figure of one of PLOTS (callers other than `render_plot` must serialize themselves)."""
    figure, axes = _figure()
    analysis = report.analysis
    label = f"smoothing {smoothing:g}"
    smoother = lambda losses: ema_smooth(losses, smoothing)  # noqa: E731
    if name == "loss_step":
        draw_loss_step(axes, report.curves, analysis, smoother, label)
    elif name == "loss_time":
        draw_loss_time(axes, report.curves, analysis, smoother, label)
    elif name == "alpha":
        draw_alpha(axes, analysis, report.message or "no fit")
    elif name == "law":
        if analysis is None:
            empty_panel(axes, report.message or "no fit")
        else:
            draw_law(axes, law_at_last_step(analysis))
    else:
        raise KeyError(name)
    return figure


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


class Cell:
    """A table cell with more than its text: a tooltip (`title`) and a CSS class."""

    def __init__(self, text: Any, title: str = "", css: str = "") -> None:
        self.text, self.title, self.css = text, title, css

    def html(self) -> str:
        title = f' title="{html.escape(self.title)}"' if self.title else ""
        css = f' class="{self.css}"' if self.css else ""
        return f"<td{css}{title}>{html.escape(str(self.text))}</td>"


def _cell(value: Any) -> str:
    return value.html() if isinstance(value, Cell) else f"<td>{html.escape(str(value))}</td>"


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[Any]], empty: str, caption: str = "",
           text_columns: Sequence[int] = ()) -> str:
    """A titled table in a box that scrolls sideways by itself when the window is narrower than the table; the
    cells of `text_columns` (indices) are prose, left-aligned and wrapped."""
    parts = [f"<h2>{html.escape(title)}</h2>"]
    if not rows:
        parts.append(f"<p class=muted>{html.escape(empty)}</p>")
        return "\n".join(parts)
    parts.append("<div class=scroll><table>")
    if caption:
        parts.append(f"<caption>{html.escape(caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(_cell(Cell(cell, css="text") if i in text_columns and not isinstance(cell, Cell)
                                            else cell) for i, cell in enumerate(row)) + "</tr>")
    parts.append("</tbody></table></div>")
    return "\n".join(parts)


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; background: #fff; }
.scroll { overflow-x: auto; max-width: 100%; margin-bottom: 1em; }
table { border-collapse: collapse; }
caption { caption-side: bottom; text-align: left; color: #777; font-size: 0.85em; padding-top: 0.3em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; font-size: 0.85em; }
th { background: #eef; }
td.text { text-align: left; max-width: 28em; }
.muted { color: #777; }
.plots img { border: 1px solid #ddd; margin: 0.3em; max-width: 100%; height: auto; }
.fit { background: #f4f8ee; padding: 0.3em 0.6em; border: 1px solid #cdb; display: inline-block; max-width: 100%; }
.fit table { margin: 0.3em 0; }
.caveat { color: #a00; }
.logout { float: right; }
"""


def _fit_section(fits: dict[str, Any], kind: str, smoothing: float) -> str:
    """With a fit: α∞ and τ with their intervals, R² and the caveats (`analysis.fit_rows`: "not enough data"
    where a caveat leaves a parameter unidentified), the crossovers under their rule, and the four plots.
    Without one: the line saying why (and, for a single run, what a fit needs), and the loss plots alone."""
    fit = fits["fit"]
    if fit is None:
        needed = f"; {NEEDED_FOR_FIT}" if kind == "run" else ""
        return f"""<h2>scaling law: loss(L | s) ≈ A(s)·L^(−α(s))</h2>
<p class=muted>{html.escape(fits['message'])}{html.escape(needed)}</p>
{_smoothing_links(smoothing)}
<div class=plots>
{_plot_img("loss_step", smoothing)}
{_plot_img("loss_time", smoothing)}
</div>"""
    quantities = "".join(f"<tr><th>{html.escape(name)}</th><td>{html.escape(value)}</td></tr>"
                         for name, value in fit_rows(fit))
    caveats = "".join(f"<li>{html.escape(text)}</li>" for text in fit["caveats"])
    verdict = ("<p>The data identify the fit: no caveats.</p>" if fit["valid"] else
               f"<div class=caveat><p>{html.escape(NOT_ENOUGH_DATA)}: the data do not identify what is marked so, "
               f"because</p><ul>{caveats}</ul></div>")
    return f"""<h2>scaling law: loss(L | s) ≈ A(s)·L^(−α(s)), α(s) = α∞·(1 − e^(−s/τ))</h2>
<div class=fit><table>{quantities}</table>
{verdict}</div>
{_table("wall-time crossovers (longer L below shorter L from then on)", ("L short → long", "observed",
        "predicted (Eq. 11)"), crossover_rows(fit), "no pairs", caption=CROSSOVER_RULE.format(smooth=fit["smooth"]))}
{_smoothing_links(smoothing, crossovers=True)}
<div class=plots>
{"".join(_plot_img(name, smoothing) for name in PLOTS)}
</div>"""


def _smoothing_links(smoothing: float, crossovers: bool = False) -> str:
    """The TensorBoard smoothing weights to choose from, the current one in bold."""
    links = " · ".join(f"<b>{w:g}</b>" if w == smoothing else f'<a href="/?smoothing={w:g}">{w:g}</a>'
                       for w in SMOOTHING_CHOICES)
    rule = " Crossovers use the centred means of the rule above." if crossovers else ""
    return (f"<p class=muted>Curves: raw (faint) and smoothed as TensorBoard does, an exponential moving average "
            f"with weight w (debiased at the start; 0: raw): w = {links}.{rule}</p>")


NEEDED_FOR_FIT = "to fit the loss against the trained length, train a sweep ([sweep] seq_lens in RUN.toml, as make demo does)"
PLOT_ALTS = {"loss_step": "loss against step per seq_len", "loss_time": "loss against wall time per seq_len",
             "alpha": "alpha(s) and its fit", "law": "loss against L at the last matched step, and its fit"}


def _plot_img(name: str, smoothing: float) -> str:
    query = f"?smoothing={smoothing:g}" if name in ("loss_step", "loss_time") else ""
    return f'<img src="/plot/{name}.png{query}" alt="{PLOT_ALTS[name]}" width="640" height="440">'


LOGOUT_FORM = ('<form method="post" action="/logout" class=logout><input type="submit" value="Log out"></form>')


def _document(title: str, refresh_s: int, body: str, metrics_link: str, logout: bool = False) -> str:
    """The page around `body`; with `logout`, a button that ends the session (POST /logout)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{int(refresh_s)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body>
{LOGOUT_FORM if logout else ""}{body}
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


def _versions(data: dict[str, Any]) -> str:
    """A run's version of its target; a sweep's runs each at their own version ("L=2: 155, L=16: 36 of 100")."""
    if data["kind"] != "sweep":
        return f"{data['version']} / {data['target_rounds'] or '∞'}"
    targets = {r["target_rounds"] for r in data["runs"]}
    target = f" of {targets.pop() or '∞'}" if len(targets) == 1 else ""
    return ", ".join(f"L={r['seq_len']}: {r['version']}" for r in data["runs"]) + target


def _overview_rows(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """The run's or sweep's fields: state, runs, version (per run for a sweep), workers, loss, tokens, curriculum."""
    lengths = ", ".join(f"{x:g}" for x in data["fits"]["lengths"]) or "none yet"
    return [
        (data["kind"], data["run_id"]), ("state", data["run_state"]), ("runs", len(data["runs"])),
        ("versions" if data["kind"] == "sweep" else "version", _versions(data)),
        ("workers active", sum(1 for w in data["workers"] if w["state"] == "active")),
        ("waiting for a place", data.get("waiting_for_place", 0)),
        ("latest loss", _fmt(data["latest_loss"])), ("tokens", data["total_tokens"]),
        ("tokens applied", data.get("applied_tokens", 0)), ("pace", data.get("pace") or "–"),
        ("tokens/s", _fmt(data["tokens_per_second"])), ("seq_len with data", lengths),
        ("curriculum", Cell(_curriculum_cell(data.get("curriculum")), css="text")),
        ("traffic per worker per round", Cell(_traffic_cell(data["runs"]), css="text")),
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


def forecast_text(forecast: dict[str, Any] | None) -> str:
    """A run's newest forecast in words (issue #30, `forecast.describe`; its JSON has null for NaN)."""
    if forecast is None:
        return "–"
    number = {key: math.nan if forecast[key] is None else forecast[key]
              for key in ("loss", "low", "high", "target_loss", "target_seconds")}
    held_out = "held-out: " if forecast.get("loss_kind") == "held-out" and not forecast["note"] else ""
    return held_out + describe(at_round=forecast["at_round"], note=forecast["note"], stopped=forecast["stopped"] or "",
                               **number)


def _run_rows(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (r["run_id"], r["seq_len"], r["batch_size"], r["run_state"], f"{r['version']} / {r['target_rounds'] or '∞'}",
         ", ".join(w["name"] for w in r["workers"]) or "–",
         Cell(str(r["refused_by"]), title=r["last_refusal"]) if r.get("refused_by") else "–",
         _fmt(r["tokens_per_second"]), r["total_tokens"],
         _fmt(r["latest_loss"]), _fmt(r["metrics"]["last_step"], ".0f"), _fmt(r["metrics"]["last_loss"]),
         forecast_text(r.get("forecast")), Cell((r["param_sha256"] or "")[:12] + "…", title=r["param_sha256"] or ""))
        for r in data["runs"]
    ]


WORKER_COLUMNS = ("name", "run", "L", "state", "device", "base version", "heartbeat (s ago)", "assigned L × batch",
                  "steps × s/step", "tokens/s", "tokens trained / applied", "loss @ step", "MB sent / received",
                  "updates late / stale / clipped / dropped", "outlier flag; reason")


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.3g}"


def _worker_rows(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Active workers first, then by run; a worker no longer active shows no run. The id is the name's tooltip
    (and in /api/status); late updates were merged, stale ones refused."""
    ordered = sorted(data["workers"], key=lambda w: (w["state"] != "active", w["run_index"]))
    return [
        (Cell(w["name"], title=f"worker id {w['worker_id']}"), w["run_id"] if w["state"] == "active" else "–",
         _fmt(w["run_seq_len"], "d"), w["state"], w["device"], w["base_version"],
         _fmt(w["seconds_since_heartbeat"], ".1f"), _assignment_cell(w), _pace_cell(w),
         _fmt(w["tokens_per_second"], ".4g"), f"{w['trained_tokens']} / {w['applied_tokens']}",
         f"{_fmt(w['loss'])} @ {_fmt(w['last_step'], 'd')}",
         f"{_megabytes(w['bytes_sent'])} / {_megabytes(w['bytes_received'])}",
         f"{w['late_updates']} / {w['stale_updates']} / {w['clipped_updates']} / {w['dropped_updates']}",
         Cell("; ".join(part for part in (w["outlier"], w["reason"]) if part) or "–", css="text"))
        for w in ordered
    ]


def _pace_cell(worker: dict[str, Any]) -> str:
    """A worker's assigned steps (or its time budget), its measured seconds per step and its compute utilization."""
    seconds = _fmt(worker.get("step_seconds"), ".3g")
    utilization = worker.get("utilization")
    busy = f", {utilization:.0%} busy" if utilization else ""
    if worker.get("round_seconds"):
        return f"{worker['round_seconds']:.3g} s budget, {seconds} s/step{busy}"
    steps = worker.get("inner_steps")
    return f"{steps if steps else '–'} × {seconds} s{busy}"


def _round_rows(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The open rounds, then the newest closed, ROUNDS_SHOWN at most."""
    newest = sorted(data["rounds"], key=lambda r: -(r["closed_at"] or math.inf))[:ROUNDS_SHOWN]
    return [
        (r["run_id"], r["version"], "open" if r["open"] else "closed", r["reports"], r["tokens"],
         _fmt(r["duration_s"], ".3g"), r["close_reason"], _fmt(r["update_norm"]), r["clipped"], r["dropped"],
         r["aggregation"] or "–")
        for r in newest
    ]


def render_page(data: dict[str, Any], refresh_s: int, smoothing: float = DEFAULT_SMOOTHING, logout: bool = False) -> str:
    """The page of a run or a sweep (`views.status_dict`): overview, runs, workers, fit and plots, rounds; with
    `logout` (a viewer logged in with a session cookie), a button to log out."""
    title = f"rcswarm {data['kind']} {data['run_id']}"
    body = f"""<h1>{html.escape(title)}</h1>
{_table(data["kind"], ("field", "value"), _overview_rows(data), "")}
{_table("runs", ("run", "L", "batch", "state", "version", "workers assigned", "refused by", "tokens/s", "tokens",
                 "latest loss", "step", "loss at step", "forecast of the final loss (90%)", "θ sha256"), _run_rows(data),
        "no runs", text_columns=(12,))}
<div class=plots><img src="/plot/forecast.png" alt="{FORECAST_ALT}" width="640" height="440"></div>
{_table("workers (memberships; a worker moved to another run joins it under a new id)", WORKER_COLUMNS,
        _worker_rows(data), "no workers have joined")}
<p class=muted>{html.escape(CLOCK_NOTES[data["clock"]])}</p>
{_fit_section(data["fits"], data["kind"], smoothing)}
{_table(f"rounds (open, then newest closed; {ROUNDS_SHOWN} at most)",
        ("run", "version", "state", "reports", "tokens", "duration (s)", "close reason", "update norm", "clipped",
         "dropped", "aggregation"), _round_rows(data), "no rounds", text_columns=(6, 10))}"""
    first = quote(data["runs"][0]["run_id"], safe="") if data["runs"] else ""
    return _document(title, refresh_s, body, f"/api/metrics?run={first}&since=0", logout)
