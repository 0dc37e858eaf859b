"""A read-only HTTP dashboard next to the coordinator's gRPC server, for a run or a sweep.

    rcswarm coordinator --config RUN.toml --state-dir DIR --http-port 8080   (loopback by default)

Endpoints (GET only; everything is rendered on the server, no JavaScript):

    /                      HTML: run, workers, rounds, fits, crossovers and the three plots; for a
                           sweep, its runs (L, batch, version, workers assigned, tokens/s, loss) too
    /plot/loss_step.png    loss against step per seq_len, log axes, with the fitted curves
    /plot/loss_time.png    loss against wall time per seq_len, log axes, observed crossovers
    /plot/alpha.png        α(s) at matched steps with the fitted α∞(1 − e^(−s/τ))
    /api/status            JSON: GetStatus plus per-worker totals and the fit summary; for a
                           sweep also `runs`, one entry per run, and each worker's and round's run
    /api/metrics?since=ROWID[&limit=N]   JSON: metric rows with rowid > ROWID, oldest first
                           (a sweep: &run=RUN_ID, since each run has its own store)
    /metrics               Prometheus text exposition (prometheus_client, custom collector);
                           every sample labelled with its run_id, one set per run of a sweep
    /healthz               "ok"

Unknown paths answer 404, bad query values 400 with a message. Every connection has a
socket timeout; the server runs in daemon threads and never reaches outside the host.
The fits reuse coordinator/fit_cli.py's `analyse` on the metrics grouped by seq_len: a single
run's by each worker's step and wall time, a sweep's by each run's own step (version ×
inner.steps + the step within the round) and time since the run's first metric, the way
`rcswarm fit` reads state dirs, because a worker that moves between runs keeps its counters.
"""

from __future__ import annotations

import html
import io
import ipaddress
import itertools
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import numpy as np
from google.protobuf import json_format

from rcswarm.coordinator.analysis import STATE_QUERY, Analysis, LengthCurve, analyse
from rcswarm.coordinator.fits import amplitude_from_points, seconds_per_step
from rcswarm.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("rcswarm.dashboard")

REQUEST_TIMEOUT_S = 10.0
METRICS_PAGE_DEFAULT = 1000
METRICS_PAGE_MAX = 10_000
# Rows read for the fits and plots: the newest this many.
ANALYSIS_MAX_ROWS = 500_000
ROUND_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
PLOTS = ("loss_step", "loss_time", "alpha")

Query = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]


class BadRequest(ValueError):
    """A query value the endpoint cannot use; answered with 400 and this message."""


class NotFound(Exception):
    """A path the dashboard does not serve; answered with 404 and this message."""




@dataclass(frozen=True)
class FitReport:
    """The curves per seq_len and, when at least 3 lengths allow it, the fitted schedule."""

    curves: list[LengthCurve]
    analysis: Analysis | None
    message: str  # why there is no fit ("" when there is one)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "lengths": [c.length for c in self.curves],
            "fit": None,
            "message": self.message,
        }
        if self.analysis is not None:
            s = self.analysis.schedule
            out["fit"] = {
                "alpha_inf": s.alpha_inf, "tau": s.tau, "r_squared": s.r_squared,
                "per_doubling": s.per_doubling,
                "points": [{"step": p.step, "alpha": p.alpha, "amplitude": p.amplitude, "r_squared": p.r_squared}
                           for p in self.analysis.points],
                "crossovers": [
                    {"length_short": c.length_short, "length_long": c.length_long, "observed_s": c.observed,
                     "predicted_s": None if c.predicted is None else c.predicted.time,
                     "predicted_step_short": None if c.predicted is None else c.predicted.step_short,
                     "predicted_step_long": None if c.predicted is None else c.predicted.step_long}
                    for c in self.analysis.crossovers
                ],
            }
        return out


def fit_report(query: Query, run_id: str | None = None) -> FitReport:
    """Group the metrics table by seq_len (mean loss and wall time per step) and fit when possible."""
    where = "loss > 0 AND seq_len > 0 AND step > 0"
    params: tuple[Any, ...] = ()
    if run_id:
        where += " AND run_id = ?"
        params = (run_id,)
    rows = query(
        f"SELECT seq_len, step, AVG(loss), AVG(wall_time) FROM (SELECT seq_len, step, loss, wall_time FROM metrics "
        f"WHERE {where} ORDER BY rowid DESC LIMIT {ANALYSIS_MAX_ROWS}) GROUP BY seq_len, step ORDER BY seq_len, step",
        params,
    )
    return fit_step_means(rows)


# A sweep's run on its own clock, as `rcswarm fit` reads state dirs: step = version × inner.steps + the
# step within the round, time from the run's first metric on the coordinator's clock. Workers that move
# between runs keep their own step counters and clocks, which would mix runs.
RUN_STEP_QUERY = (
    f"SELECT seq_len, version * ? + k + 1 AS run_step, AVG(loss), AVG(t) FROM ({STATE_QUERY}) "
    "WHERE loss > 0 AND seq_len > 0 GROUP BY seq_len, run_step ORDER BY seq_len, run_step"
)


def run_step_means(query: Query, inner_steps: int) -> list[tuple[float, float, float, float]]:
    """(seq_len, run step, mean loss, mean seconds since the run's first metric) of one run's metrics table."""
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
        raise ValueError(f"inner_steps={inner_steps!r}: expected a positive integer")
    return [
        (float(length), float(step), float(loss), float(t))
        for length, step, loss, t in query(RUN_STEP_QUERY, (inner_steps,))
        if loss is not None and t is not None
    ]


def fit_step_means(rows: Iterable[Sequence[Any]]) -> FitReport:
    """Curves per seq_len from (seq_len, step, mean loss, mean wall time) rows, and the fit when possible.

    Rows from several runs may repeat a (seq_len, step): those are averaged.
    """
    merged: dict[tuple[float, float], list[tuple[float, float]]] = {}
    for length, step, loss, wall in rows:
        if loss is not None and wall is not None and math.isfinite(loss) and math.isfinite(wall):
            merged.setdefault((float(length), float(step)), []).append((float(loss), float(wall)))
    by_length: dict[float, list[tuple[float, float, float]]] = {}
    for (length, step), values in sorted(merged.items()):
        loss, wall = (sum(v) / len(values) for v in zip(*values))
        by_length.setdefault(length, []).append((step, loss, wall))
    curves, skipped = [], []
    for length, points in sorted(by_length.items()):
        steps = np.array([p[0] for p in points])
        losses = np.array([p[1] for p in points])
        times = np.array([p[2] for p in points])
        try:
            rate = seconds_per_step(steps, times)
        except ValueError:
            if len(steps) < 2:
                skipped.append(f"L={length:g} has fewer than 2 steps")
                continue
            rate = math.nan
        curves.append(LengthCurve(length=length, runs=(), steps=steps, losses=losses, times=times, seconds_per_step=rate))
    lengths = len(curves)
    if lengths < 3:
        note = f" ({'; '.join(skipped)})" if skipped else ""
        return FitReport(curves, None, f"not enough lengths for a fit: {lengths} distinct seq_len with 2+ steps, "
                                       f"need at least 3{note}")
    # The crossovers need each length's measured seconds per step: lengths without one are left out.
    curves_for_fit = [c for c in curves if c.seconds_per_step > 0]
    if len(curves_for_fit) < 3:
        return FitReport(curves, None, "not enough lengths for a fit: wall time does not increase with step "
                                       f"for {lengths - len(curves_for_fit)} of {lengths} lengths")
    try:
        analysis = analyse(curves_for_fit)
    except ValueError as error:
        return FitReport(curves, None, f"no fit: {error}")
    return FitReport(curves, analysis, "")




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


# matplotlib's text layout (mathtext tick labels on log axes) is not thread-safe: one render at a time.
_RENDER_LOCK = threading.Lock()


def render_plot(name: str, report: FitReport) -> bytes:
    """One of PLOTS as PNG bytes (object-oriented matplotlib, no pyplot state; serialized across threads)."""
    if name not in PLOTS:
        raise KeyError(name)
    with _RENDER_LOCK:
        return _render_plot(name, report)


def _render_plot(name: str, report: FitReport) -> bytes:
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
    return _png(figure)




def _enum_names(enum: Any, prefix: str) -> dict[int, str]:
    """{value: "active"} for WORKER_STATE_ACTIVE etc.; follows the proto as states are added."""
    names = {number: name.removeprefix(prefix).lower() for name, number in enum.items()}
    names[0] = "unknown"
    return names


STATE_NAMES = _enum_names(pb.WorkerState, "WORKER_STATE_")
RUN_STATE_NAMES = _enum_names(pb.RunState, "RUN_STATE_")


@dataclass(frozen=True)
class WorkerTotals:
    worker_id: str
    tokens: int
    bytes_sent: int
    bytes_received: int
    tokens_per_second: float
    last_step: int
    last_seq_len: int
    last_loss: float
    rows: int


def worker_totals(query: Query, run_id: str) -> dict[str, WorkerTotals]:
    """Per worker: tokens, cumulative bytes, tokens per second of wall time, and its newest row."""
    totals = query(
        "SELECT worker_id, SUM(MAX(tokens, 0)), MAX(bytes_sent), MAX(bytes_received), MIN(wall_time), MAX(wall_time), "
        "COUNT(*), MAX(rowid) FROM metrics WHERE run_id = ? GROUP BY worker_id",
        (run_id,),
    )
    out = {}
    for worker_id, tokens, sent, received, first, last, count, newest in totals:
        latest = query("SELECT step, seq_len, loss FROM metrics WHERE rowid = ?", (newest,))
        step, seq_len, loss = latest[0] if latest else (0, 0, math.nan)
        span = (last or 0.0) - (first or 0.0)
        out[worker_id] = WorkerTotals(
            worker_id=worker_id, tokens=int(tokens or 0), bytes_sent=int(sent or 0), bytes_received=int(received or 0),
            tokens_per_second=(tokens or 0) / span if span > 0 else 0.0, last_step=int(step or 0),
            last_seq_len=int(seq_len or 0), last_loss=float(loss) if loss is not None else math.nan, rows=int(count),
        )
    return out


def _finite(value: Any) -> Any:
    """JSON cannot carry NaN or infinity: those become null, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _worker_dict(w: pb.WorkerStatus, totals: dict[str, WorkerTotals]) -> dict[str, Any]:
    t = totals.get(w.worker_id)
    return {
        "worker_id": w.worker_id, "name": w.name, "state": STATE_NAMES.get(w.state, "unknown"),
        "base_version": w.base_version, "seconds_since_heartbeat": w.seconds_since_heartbeat, "device": w.device,
        "reason": w.reason, "tokens": t.tokens if t else 0, "tokens_per_second": t.tokens_per_second if t else 0.0,
        "bytes_sent": t.bytes_sent if t else 0, "bytes_received": t.bytes_received if t else 0,
        "last_step": t.last_step if t else None, "seq_len": t.last_seq_len if t else None,
        "loss": t.last_loss if t else None,
        "assignment": ({"seq_len": w.assignment.seq_len, "batch_size": w.assignment.batch_size,
                        "reason": w.assignment.reason} if w.HasField("assignment") else None),
    }


def _assignment_cell(worker: dict[str, Any]) -> str:
    assignment = worker.get("assignment")
    return "–" if assignment is None else f"{assignment['seq_len']} × {assignment['batch_size']}"


def _round_dict(r: pb.RoundStatus) -> dict[str, Any]:
    return {"version": r.version, "reports": r.reports, "tokens": r.tokens, "opened_at": r.opened_at,
            "closed_at": r.closed_at or None, "close_reason": r.close_reason, "update_norm": r.update_norm,
            "duration_s": (r.closed_at - r.opened_at) if r.closed_at else None, "open": not r.closed_at}


def status_dict(status: pb.GetStatusResponse, totals: dict[str, WorkerTotals], fits: FitReport | None) -> dict[str, Any]:
    out = json_format.MessageToDict(status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    # MessageToDict writes int64 as strings and NaN as "NaN"; use plain numbers.
    out["version"], out["target_rounds"], out["total_tokens"] = status.version, status.target_rounds, status.total_tokens
    out["latest_loss"] = status.latest_loss
    out["run_state"] = RUN_STATE_NAMES.get(status.run_state, "unknown")
    out["kind"] = "run"
    out["workers"] = [_worker_dict(w, totals) for w in status.workers]
    out["rounds"] = [_round_dict(r) for r in status.rounds]
    if fits is not None:
        out["fits"] = fits.summary()
    return _finite(out)


@dataclass(frozen=True)
class RunView:
    """One run as read for one request: its coordinator, GetStatus, one-line summary and per-worker totals."""

    index: int
    coordinator: Any
    status: pb.GetStatusResponse
    summary: pb.RunSummary
    totals: dict[str, WorkerTotals]


def read_run(index: int, coordinator: Any) -> RunView:
    status = coordinator.status()
    return RunView(index, coordinator, status, coordinator.summary(status),
                   worker_totals(coordinator.store.query, status.run_id))


def run_dict(view: RunView, means: Sequence[tuple[float, float, float, float]]) -> dict[str, Any]:
    """One run of a sweep: its summary, the workers assigned to it, and its metrics on the run's own steps."""
    s = view.summary
    assigned = [w for w in view.status.workers if w.state == pb.WORKER_STATE_ACTIVE]
    last = max(means, key=lambda row: row[1]) if means else None
    return {
        "index": view.index, "run_id": s.run_id, "seq_len": s.seq_len, "batch_size": s.batch_size,
        "run_state": RUN_STATE_NAMES.get(s.run_state, "unknown"), "version": s.version,
        "target_rounds": s.target_rounds, "active_workers": s.active_workers,
        "workers": [{"worker_id": w.worker_id, "name": w.name} for w in assigned],
        "tokens_per_second": s.tokens_per_second, "latest_loss": s.latest_loss, "total_tokens": s.total_tokens,
        "param_sha256": view.status.param_sha256, "state_dir": str(view.coordinator.store.state_dir),
        "metrics": {
            "steps": len(means), "last_step": last[1] if last else None, "last_loss": last[2] if last else None,
            "seconds": last[3] if last else None,
            "seq_lens": sorted({row[0] for row in means}),
        },
    }


def sweep_status_dict(status: pb.GetStatusResponse, views: Sequence[RunView],
                      means: Sequence[Sequence[tuple[float, float, float, float]]], fits: FitReport) -> dict[str, Any]:
    """The sweep's GetStatus with every run's data; each worker and round names its run."""
    out = status_dict(status, {}, fits)
    out["kind"] = "sweep"
    out["runs"] = [run_dict(view, rows) for view, rows in zip(views, means, strict=True)]
    out["workers"], out["rounds"] = [], []
    for view in views:
        labels = {"run_id": view.summary.run_id, "run_index": view.index, "run_seq_len": view.summary.seq_len}
        out["workers"].extend({**_worker_dict(w, view.totals), **labels} for w in view.status.workers)
        out["rounds"].extend({**_round_dict(r), **labels} for r in view.status.rounds)
    return _finite(out)




class CoordinatorCollector:
    """Reads the coordinator's live state at every scrape (prometheus_client custom collector).

    Every sample carries the run_id of its run; a sweep's runs each give their own samples, the
    fit (over all of a sweep's runs) carries the sweep's name.
    """

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        d = self.dashboard
        run_gauges = {
            "version": ("rcswarm_version", "Current global parameter version"),
            "target": ("rcswarm_target_rounds", "Configured number of rounds (0 = unbounded)"),
            "finished": ("rcswarm_run_finished", "1 once the configured rounds are done"),
            "seq_len": ("rcswarm_run_seq_len", "The run's configured sequence length"),
            "batch": ("rcswarm_run_batch_size", "The run's configured batch size"),
            "active": ("rcswarm_workers_active", "Workers holding a lease"),
            "loss": ("rcswarm_loss", "Mean of the workers' latest training loss"),
            "tps": ("rcswarm_tokens_per_second", "Tokens per second since the first metric"),
            "last_round": ("rcswarm_last_round_duration_seconds", "Duration of the newest closed round"),
        }
        runs = {key: GaugeMetricFamily(name, doc, labels=["run_id"]) for key, (name, doc) in run_gauges.items()}
        workers_by_state = GaugeMetricFamily("rcswarm_workers", "Workers known to the coordinator by state",
                                             labels=["run_id", "state"])
        tokens = CounterMetricFamily("rcswarm_tokens", "Tokens reported by all workers", labels=["run_id"])
        closed = CounterMetricFamily("rcswarm_rounds_closed", "Rounds closed (outer steps applied)", labels=["run_id"])
        histogram = HistogramMetricFamily("rcswarm_round_duration_seconds", "Seconds from a round's opening to its close",
                                          labels=["run_id"])
        labels = ["run_id", "worker_id", "name"]
        worker_families = {
            "loss": GaugeMetricFamily("rcswarm_worker_loss", "The worker's latest reported loss", labels=labels),
            "heartbeat": GaugeMetricFamily("rcswarm_worker_seconds_since_heartbeat", "Seconds since the worker was last seen", labels=labels),
            "base": GaugeMetricFamily("rcswarm_worker_base_version", "The version the worker trains from", labels=labels),
            "up": GaugeMetricFamily("rcswarm_worker_active", "1 while the worker holds a lease", labels=labels),
            "tps": GaugeMetricFamily("rcswarm_worker_tokens_per_second", "The worker's tokens per second of wall time", labels=labels),
            "seq": GaugeMetricFamily("rcswarm_worker_seq_len", "The sequence length of the worker's latest step", labels=labels),
            "tokens": CounterMetricFamily("rcswarm_worker_tokens", "Tokens the worker reported", labels=labels),
            "sent": CounterMetricFamily("rcswarm_worker_bytes_sent", "Bytes the worker sent on the wire", labels=labels),
            "received": CounterMetricFamily("rcswarm_worker_bytes_received", "Bytes the worker received on the wire", labels=labels),
        }
        for view in d.views():
            status, run = view.status, view.status.run_id
            by_state = {name: 0 for name in ("active", "left", "evicted")}
            for w in status.workers:
                name = STATE_NAMES.get(w.state, "unknown")
                by_state[name] = by_state.get(name, 0) + 1
            values = {
                "version": status.version, "target": status.target_rounds,
                "finished": 1.0 if status.run_state == pb.RUN_STATE_FINISHED else 0.0,
                "seq_len": view.summary.seq_len, "batch": view.summary.batch_size, "active": by_state["active"],
                "loss": status.latest_loss, "tps": status.tokens_per_second,
            }
            for key, value in values.items():
                runs[key].add_metric([run], value)
            for name, count in sorted(by_state.items()):
                workers_by_state.add_metric([run, name], count)
            tokens.add_metric([run], status.total_tokens)
            for w in status.workers:
                key = [run, w.worker_id, w.name]
                t = view.totals.get(w.worker_id)
                worker_families["heartbeat"].add_metric(key, w.seconds_since_heartbeat)
                worker_families["base"].add_metric(key, w.base_version)
                worker_families["up"].add_metric(key, 1.0 if w.state == pb.WORKER_STATE_ACTIVE else 0.0)
                if t is not None:
                    worker_families["loss"].add_metric(key, t.last_loss)
                    worker_families["tps"].add_metric(key, t.tokens_per_second)
                    worker_families["seq"].add_metric(key, t.last_seq_len)
                    worker_families["tokens"].add_metric(key, t.tokens)
                    worker_families["sent"].add_metric(key, t.bytes_sent)
                    worker_families["received"].add_metric(key, t.bytes_received)
            durations = [r[0] for r in view.coordinator.store.query(
                "SELECT closed_at - opened_at FROM rounds WHERE closed_at IS NOT NULL AND opened_at IS NOT NULL", ())]
            durations = [x for x in durations if x is not None and math.isfinite(x)]
            closed.add_metric([run], len(durations))
            buckets = [(f"{edge:g}", float(sum(1 for x in durations if x <= edge))) for edge in ROUND_BUCKETS]
            buckets.append(("+Inf", float(len(durations))))
            histogram.add_metric([run], buckets, sum_value=float(sum(durations)))
            if durations:
                runs["last_round"].add_metric([run], durations[-1])
        yield from (runs[key] for key in run_gauges if key != "last_round")
        yield workers_by_state
        yield tokens
        yield from worker_families.values()
        yield closed
        yield histogram
        yield runs["last_round"]
        fits = d.fits()
        g = GaugeMetricFamily("rcswarm_fit_alpha_inf", "Fitted α∞ of α(s) = α∞(1 − e^(−s/τ)) (absent without a fit)", labels=["run_id"])
        if fits.analysis is not None:
            g.add_metric([d.coordinator.run_id], fits.analysis.schedule.alpha_inf)
        yield g




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
    """The fitted α(s), the crossover table (observed and Eq. 11) and the three plots."""
    fit = fits["fit"]
    if fit is not None:
        fit_html = (
            f"<p class=fit>α∞ = {fit['alpha_inf']:.4f}, τ = {fit['tau']:.4g} steps, R² = {fit['r_squared']:.4f}; "
            f"per doubling of L at α∞: ×{fit['per_doubling']:.4f} "
            f"({1 - fit['per_doubling']:.1%} lower loss)</p>"
        )
        crossing = [
            (f"{c['length_short']:g} → {c['length_long']:g}", _fmt(c["observed_s"]) + (" s" if c["observed_s"] else ""),
             _fmt(c["predicted_s"]) + (" s" if c["predicted_s"] else ""),
             "–" if c["predicted_s"] is None else f"{c['predicted_step_short']:.0f} / {c['predicted_step_long']:.0f}")
            for c in fit["crossovers"]
        ]
        cross_html = _table("wall-time crossovers (longer L below shorter L from then on)",
                            ("L short → long", "observed", "predicted (Eq. 11)", "predicted steps short / long"),
                            crossing, "no pairs")
    else:
        fit_html = f"<p class=fit>{html.escape(fits['message'])}</p>"
        cross_html = "<h2>wall-time crossovers</h2><p class=muted>" + html.escape(fits["message"]) + "</p>"
    return f"""<h2>scaling law: loss(L | s) ≈ A(s)·L^(−α(s)), α(s) = α∞·(1 − e^(−s/τ))</h2>
{fit_html}
{cross_html}
<div class=plots>
<img src="/plot/loss_step.png" alt="loss against step per seq_len" width="640" height="440">
<img src="/plot/loss_time.png" alt="loss against wall time per seq_len" width="640" height="440">
<img src="/plot/alpha.png" alt="alpha(s) and its fit" width="640" height="440">
</div>"""


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


def render_page(data: dict[str, Any], refresh_s: int) -> str:
    workers = [
        (w["name"], w["worker_id"], w["state"], w["device"], w["base_version"], _fmt(w["seconds_since_heartbeat"], ".1f"),
         _assignment_cell(w), _fmt(w["tokens_per_second"], ".4g"), w["tokens"], _fmt(w["loss"]), _fmt(w["seq_len"], "d"),
         _fmt(w["last_step"], "d"), w["bytes_sent"], w["bytes_received"], w["reason"])
        for w in data["workers"]
    ]
    rounds = [
        (r["version"], "open" if r["open"] else "closed", r["reports"], r["tokens"], _fmt(r["duration_s"], ".3g"),
         r["close_reason"], _fmt(r["update_norm"]))
        for r in reversed(data["rounds"])
    ]
    fits = data["fits"]
    lengths = ", ".join(f"{x:g}" for x in fits["lengths"]) or "none yet"
    run = (
        ("run", data["run_id"]), ("state", data["run_state"]),
        ("version", f"{data['version']} / {data['target_rounds'] or '∞'}"),
        ("workers active", sum(1 for w in data["workers"] if w["state"] == "active")),
        ("latest loss", _fmt(data["latest_loss"])), ("tokens", data["total_tokens"]),
        ("tokens/s", _fmt(data["tokens_per_second"])), ("θ sha256", (data["param_sha256"] or "")[:16] + "…"),
        ("seq_len with data", lengths),
        ("curriculum", _curriculum_cell(data.get("curriculum"))),
    )
    body = f"""<h1>rcswarm run {html.escape(data['run_id'])}</h1>
{_table("run", ("field", "value"), run, "")}
{_table("workers", ("name", "id", "state", "device", "base version", "since heartbeat (s)", "assigned L × batch",
                    "tokens/s", "tokens",
                    "loss", "seq_len", "step", "bytes sent", "bytes received", "reason"), workers, "no workers have joined")}
{_fit_section(fits)}
{_table("rounds (newest first)", ("version", "state", "reports", "tokens", "duration (s)", "close reason", "update norm"),
        rounds, "no rounds")}"""
    return _document(f"rcswarm {data['run_id']}", refresh_s, body, "/api/metrics?since=0")


def render_sweep_page(data: dict[str, Any], refresh_s: int) -> str:
    """A sweep on one page: its runs, every worker with the run it trains, the fit over all runs' lengths."""
    runs = [
        (r["run_id"], r["seq_len"], r["batch_size"], r["run_state"], f"{r['version']} / {r['target_rounds'] or '∞'}",
         ", ".join(w["name"] for w in r["workers"]) or "–", _fmt(r["tokens_per_second"]), r["total_tokens"],
         _fmt(r["latest_loss"]), _fmt(r["metrics"]["last_step"], ".0f"), _fmt(r["metrics"]["last_loss"]))
        for r in data["runs"]
    ]
    ordered = sorted(data["workers"], key=lambda w: (w["state"] != "active", w["run_index"]))
    workers = [
        (w["name"], w["worker_id"], w["run_id"] if w["state"] == "active" else "–", _fmt(w["run_seq_len"], "d"),
         w["state"], w["device"], _fmt(w["seconds_since_heartbeat"], ".1f"), _fmt(w["tokens_per_second"], ".4g"),
         w["tokens"], _fmt(w["loss"]), w["reason"])
        for w in ordered
    ]
    rounds = [
        (r["run_id"], r["version"], "open" if r["open"] else "closed", r["reports"], r["tokens"],
         _fmt(r["duration_s"], ".3g"), r["close_reason"], _fmt(r["update_norm"]))
        for r in sorted(data["rounds"], key=lambda r: -(r["closed_at"] or math.inf))[:20]
    ]
    sweep = (
        ("sweep", data["run_id"]), ("state", data["run_state"]), ("runs", len(data["runs"])),
        ("lowest version", f"{data['version']} / {data['target_rounds'] or '∞'}"),
        ("workers active", sum(1 for w in data["workers"] if w["state"] == "active")),
        ("tokens", data["total_tokens"]), ("tokens/s", _fmt(data["tokens_per_second"])),
        ("seq_len with data", ", ".join(f"{x:g}" for x in data["fits"]["lengths"]) or "none yet"),
    )
    body = f"""<h1>rcswarm sweep {html.escape(data['run_id'])}</h1>
{_table("sweep", ("field", "value"), sweep, "")}
{_table("runs", ("run", "L", "batch", "state", "version", "workers assigned", "tokens/s", "tokens", "latest loss",
                 "run step", "loss at run step"), runs, "no runs")}
{_table("workers (memberships; a moved worker joins its new run under a new id)",
        ("name", "id", "assigned run", "L", "state", "device", "since heartbeat (s)", "tokens/s", "tokens", "loss",
         "reason"), workers, "no workers have joined")}
<p class=muted>Steps and times in the fit and plots below are each run's own: step = version × inner steps + step
in the round, time from the run's first metric.</p>
{_fit_section(data["fits"])}
{_table("rounds (open, then newest closed; 20 at most)", ("run", "version", "state", "reports", "tokens",
                                                          "duration (s)", "close reason", "update norm"),
        rounds, "no rounds")}"""
    first = quote(data["runs"][0]["run_id"], safe="") if data["runs"] else ""
    return _document(f"rcswarm sweep {data['run_id']}", refresh_s, body, f"/api/metrics?run={first}&since=0")




def _int_param(params: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = params.get(name)
    if not values:
        return default
    if len(values) > 1:
        raise BadRequest(f"{name}: given {len(values)} times, expected once")
    text = values[0].strip()
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}={values[0]!r}: expected an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"{name}={value}: expected {low}..{high}")
    return value


def _str_param(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name}: given {len(values)} times, expected once")
    return values[0]


def _only(params: dict[str, list[str]], allowed: Sequence[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        expected = ", ".join(allowed) if allowed else "none"
        raise BadRequest(f"unknown query parameter(s) {', '.join(unknown)}: expected {expected}")


class _Handler(BaseHTTPRequestHandler):
    server_version = "rcswarm-dashboard"
    timeout = REQUEST_TIMEOUT_S  # socket timeout for every connection (slow clients are dropped)
    dashboard: Dashboard

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, (json.dumps({"error": message, "status": int(status)}) + "\n").encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            parts = urlsplit(self.path)
            try:
                params = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query), max_num_fields=20)
            except ValueError as error:
                raise BadRequest(f"malformed query string: {error}") from None
            status, body, content_type = self.dashboard.handle(parts.path, params)
            self._send(status, body, content_type)
        except BadRequest as error:
            self._error(HTTPStatus.BAD_REQUEST, str(error))
        except NotFound as error:
            self._error(HTTPStatus.NOT_FOUND, str(error))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        except Exception:
            log.exception("dashboard request %s failed", self.path)
            try:
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error; see the coordinator's log")
            except OSError:
                pass

    def _not_allowed(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


class _Server6(_Server):
    address_family = socket.AF_INET6


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Dashboard:
    """The HTTP dashboard of a live `SwarmCoordinator` or `SweepCoordinator`, served from a background thread.

    A sweep (anything with `runs`, each a SwarmCoordinator with its own store) gets one page over all its
    runs; its fit and plots use each run's own steps and clock (`run_step_means`).
    """

    def __init__(
        self, coordinator: Any, host: str = "127.0.0.1", port: int = 0, refresh_s: int = 10,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.coordinator = coordinator
        self.is_sweep = hasattr(coordinator, "runs")
        self.refresh_s = refresh_s
        self._cache_lock = threading.Lock()
        self._cache: dict[str, tuple[Any, Any]] = {}
        self._build_locks: dict[str, threading.Lock] = {}
        handler = type("DashboardHandler", (_Handler,), {"dashboard": self, "timeout": request_timeout_s})
        server_cls = _Server6 if ":" in host else _Server
        self.server = server_cls((host, port), handler)
        self.host = host
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dashboard", daemon=True)
        self._registry: Any = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> Dashboard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5.0)

    # -- data

    @property
    def runs(self) -> list[Any]:
        """The SwarmCoordinators shown: a sweep's runs in order, or the single run."""
        return list(self.coordinator.runs) if self.is_sweep else [self.coordinator]

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A query on the single run's store (a sweep's runs each have their own: `run.store.query`)."""
        if self.is_sweep:
            raise TypeError("a sweep has one store per run: query run.store for each of Dashboard.runs")
        return self.coordinator.store.query(sql, params)

    def _newest_rowids(self) -> tuple[int, ...]:
        stamps = []
        for run in self.runs:
            row = run.store.query("SELECT MAX(rowid) FROM metrics", ())
            stamps.append(int(row[0][0] or 0) if row else 0)
        return tuple(stamps)

    def _cached(self, key: str, build: Callable[[], Any]) -> Any:
        """Recompute `key` only when new metric rows arrived; concurrent requests share one build."""
        with self._cache_lock:
            key_lock = self._build_locks.setdefault(key, threading.Lock())
        with key_lock:
            stamp = self._newest_rowids()
            with self._cache_lock:
                hit = self._cache.get(key)
                if hit is not None and hit[0] == stamp:
                    return hit[1]
            value = build()
            with self._cache_lock:
                self._cache[key] = (stamp, value)
            return value

    def views(self) -> list[RunView]:
        return [read_run(index, run) for index, run in enumerate(self.runs)]

    def run_means(self) -> list[list[tuple[float, float, float, float]]]:
        """Per run of a sweep: mean loss and time per (seq_len, run step)."""
        return self._cached("run_means", lambda: [
            run_step_means(run.store.query, run.spec.inner.steps) for run in self.runs])

    def fits(self) -> FitReport:
        if self.is_sweep:
            return self._cached("fits", lambda: fit_step_means(itertools.chain.from_iterable(self.run_means())))
        return self._cached("fits", lambda: fit_report(self.query, self.coordinator.run_id))

    def plot(self, name: str) -> bytes:
        return self._cached(f"plot:{name}", lambda: render_plot(name, self.fits()))

    def status_data(self) -> dict[str, Any]:
        if self.is_sweep:
            return sweep_status_dict(self.coordinator.status(), self.views(), self.run_means(), self.fits())
        status = self.coordinator.status()
        return status_dict(status, worker_totals(self.query, status.run_id), self.fits())

    def _run_named(self, run_id: str) -> Any:
        for run in self.runs:
            if run.run_id == run_id:
                return run
        known = ", ".join(run.run_id for run in self.runs)
        raise BadRequest(f"run={run_id!r}: no such run; expected one of {known}")

    def metrics_page(self, since: int, limit: int, run_id: str | None = None) -> dict[str, Any]:
        """Metric rows with rowid > since; a sweep's rowids count per run, so it needs `run_id`."""
        if run_id is None:
            if self.is_sweep:
                raise BadRequest("a sweep keeps metrics per run: add run=RUN_ID (see runs in /api/status)")
            query = self.query
        else:
            query = self._run_named(run_id).store.query
        columns = ("rowid", "run_id", "worker_id", "version", "step", "seq_len", "batch", "loss", "tokens", "wall_time",
                   "compute_seconds", "sync_seconds", "bytes_sent", "bytes_received", "param_sha256", "received_at")
        rows = query(f"SELECT {', '.join(columns)} FROM metrics WHERE rowid > ? ORDER BY rowid LIMIT ?", (since, limit))
        records = [dict(zip(columns, row)) for row in rows]
        return _finite({
            "since": since, "count": len(records), "next_since": records[-1]["rowid"] if records else since,
            "more": len(records) == limit, "rows": records,
        })

    def prometheus(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(CoordinatorCollector(self))
            self._registry = registry
        return generate_latest(self._registry)

    # -- routing

    def handle(self, path: str, params: dict[str, list[str]]) -> tuple[int, bytes, str]:
        if path in ("/", "/index.html"):
            _only(params, ())
            render = render_sweep_page if self.is_sweep else render_page
            page = render(self.status_data(), self.refresh_s)
            return 200, page.encode(), "text/html; charset=utf-8"
        if path == "/api/status":
            _only(params, ())
            body = json.dumps(self.status_data(), allow_nan=False, indent=1)
            return 200, body.encode(), "application/json"
        if path == "/api/metrics":
            _only(params, ("run", "since", "limit") if self.is_sweep else ("since", "limit"))
            since = _int_param(params, "since", 0, 0, 2**62)
            limit = _int_param(params, "limit", METRICS_PAGE_DEFAULT, 1, METRICS_PAGE_MAX)
            run_id = _str_param(params, "run")
            body = json.dumps(self.metrics_page(since, limit, run_id), allow_nan=False)
            return 200, body.encode(), "application/json"
        if path.startswith("/plot/") and path.endswith(".png"):
            name = path[len("/plot/"):-len(".png")]
            if name not in PLOTS:
                raise NotFound(f"no plot {name!r}: expected one of {', '.join(PLOTS)}")
            _only(params, ("v",))
            _int_param(params, "v", 0, 0, 2**62)  # cache buster, ignored
            return 200, self.plot(name), "image/png"
        if path == "/metrics":
            _only(params, ())
            from prometheus_client import CONTENT_TYPE_LATEST

            return 200, self.prometheus(), CONTENT_TYPE_LATEST
        if path == "/healthz":
            return 200, b"ok\n", "text/plain; charset=utf-8"
        metrics = "/api/metrics?run=RUN_ID&since=0" if self.is_sweep else "/api/metrics?since=0"
        raise NotFound(f"no such path {path!r}: try /, /api/status, {metrics}, /metrics")
