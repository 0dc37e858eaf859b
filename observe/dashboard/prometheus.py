"""The dashboard's Prometheus `/metrics`: a prometheus_client custom collector over a data source.

The source (`CollectorSource`) gives, at every scrape, each run's view (GetStatus, summary,
per-worker totals), a run's closed-round durations as a histogram (`RoundHistogram`: aggregates its store
reads in SQL, never one row per round), and the fit over all runs with the name that labels it; the
collector knows nothing of HTTP or of the dashboard.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rcswarm.observe.analysis import FitReport
from rcswarm.observe.dashboard.views import STATE_NAMES, RunView
from rcswarm.observe.forecast import was_pruned
from rcswarm.protos.v1 import coordinator_pb2 as pb

ROUND_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class RoundHistogram:
    """A run's closed rounds up to version `through` as /metrics exports them: how many have a finite duration
    (seconds from opening to close), the durations' sum, how many are <= each of ROUND_BUCKETS, and the newest
    round's duration (None without any)."""

    through: int
    count: int
    total: float
    below: tuple[int, ...]
    last: float | None

    def __post_init__(self) -> None:
        if len(self.below) != len(ROUND_BUCKETS):
            raise ValueError(f"round histogram: {len(self.below)} bucket counts, expected one per ROUND_BUCKETS "
                             f"edge ({len(ROUND_BUCKETS)})")

    def then(self, newer: RoundHistogram) -> RoundHistogram:
        """This histogram followed by `newer`, that of the rounds after `self.through`."""
        return RoundHistogram(newer.through, self.count + newer.count, self.total + newer.total,
                              tuple(a + b for a, b in zip(self.below, newer.below)),
                              self.last if newer.last is None else newer.last)


@dataclass(frozen=True)
class CollectorSource:
    """What a scrape reads: the runs' views, a run's round-duration histogram, the fit and its label."""

    views: Callable[[], Sequence[RunView]]
    round_histogram: Callable[[RunView], RoundHistogram]
    fits: Callable[[], FitReport]
    fit_label: str  # the run_id the fit is labelled with: the run's, or the sweep's name
    # Workers waiting for a place (GetStatusResponse.waiting_for_place), labelled with fit_label.
    waiting: Callable[[], int] = lambda: 0


class CoordinatorCollector:
    """Reads its source at every scrape (prometheus_client custom collector).

    Every sample carries the run_id of its run; a sweep's runs each give their own samples, the
    fit (over all of a sweep's runs) carries the sweep's name.
    """

    def __init__(self, source: CollectorSource) -> None:
        self.source = source

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        source = self.source
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
            "fp32": ("rcswarm_fp32_bytes", "Bytes of the parameters in float32: one uncompressed update or pull"),
            "bytes_up": ("rcswarm_bytes_up_per_worker_round", "Mean bytes of one worker's update (messages received)"),
            "bytes_down": ("rcswarm_bytes_down_per_worker_round", "Mean bytes of one worker's pull (messages served)"),
            "utilization": ("rcswarm_utilization", "Mean share of the workers' wall time spent in inner steps"),
            # Issue #30: the newest forecast of the run's final loss (absent while there is none): of the held-out
            # loss once the losses measured along the way support one ([run] eval_every), else of the training loss.
            "forecast": ("rcswarm_forecast_loss", "Forecast of the loss at the end of the rounds budget (held-out "
                                                  "where measured along the way, else training)"),
            "val_loss": ("rcswarm_val_loss", "Newest held-out loss measured along the way ([run] eval_every)"),
            "val_version": ("rcswarm_val_loss_version", "The version whose θ the newest held-out loss measured"),
            "forecast_low": ("rcswarm_forecast_loss_low", "Low end of the forecast's 90% bootstrap interval"),
            "forecast_high": ("rcswarm_forecast_loss_high", "High end of the forecast's 90% bootstrap interval"),
            "target_s": ("rcswarm_forecast_target_seconds",
                         "Forecast seconds from the run's first round to [run] target_loss (absent: none or never)"),
            "pruned": ("rcswarm_run_pruned", "1 when the sweep stopped this run before its budget ([sweep] prune)"),
        }
        runs = {key: GaugeMetricFamily(name, doc, labels=["run_id"]) for key, (name, doc) in run_gauges.items()}
        workers_by_state = GaugeMetricFamily("rcswarm_workers", "Workers known to the coordinator by state",
                                             labels=["run_id", "state"])
        tokens = CounterMetricFamily("rcswarm_tokens", "Tokens reported by all workers", labels=["run_id"])
        applied = CounterMetricFamily("rcswarm_tokens_applied", "Tokens of the updates the outer steps applied",
                                      labels=["run_id"])
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
            "applied": CounterMetricFamily("rcswarm_worker_tokens_applied", "Tokens of the worker's updates the outer steps applied", labels=labels),
            "late": CounterMetricFamily("rcswarm_worker_updates_late", "The worker's late updates merged with a staleness weight", labels=labels),
            "stale": CounterMetricFamily("rcswarm_worker_updates_stale", "The worker's updates refused as stale (work lost)", labels=labels),
            "round_up": GaugeMetricFamily("rcswarm_worker_round_bytes_up", "Bytes of the worker's last update", labels=labels),
            "round_down": GaugeMetricFamily("rcswarm_worker_round_bytes_down", "Bytes of the worker's last pull", labels=labels),
            "utilization": GaugeMetricFamily("rcswarm_worker_utilization",
                                             "Share of the worker's wall time spent in inner steps", labels=labels),
        }
        ratios = GaugeMetricFamily("rcswarm_traffic_ratio_to_fp32",
                                   "fp32 bytes over the mean bytes per worker per round (100 = 100x less traffic)",
                                   labels=["run_id", "direction"])
        for view in source.views():
            status, run = view.status, view.status.run_id
            by_state = {name: 0 for name in ("active", "left", "evicted")}
            for w in status.workers:
                name = STATE_NAMES.get(w.state, "unknown")
                by_state[name] = by_state.get(name, 0) + 1
            values = {
                "version": status.version, "target": status.target_rounds,
                "finished": 1.0 if status.run_state == pb.RUN_STATE_FINISHED else 0.0,
                "seq_len": view.summary.seq_len, "batch": view.summary.batch_size, "active": by_state["active"],
                "loss": status.latest_loss, "tps": status.tokens_per_second, "fp32": status.fp32_bytes,
                "bytes_up": status.bytes_up_per_round, "bytes_down": status.bytes_down_per_round,
                "utilization": status.utilization,
            }
            newest = view.coordinator.store.forecasts(newest_only=True)
            held_out = view.coordinator.store.held_out_losses(newest_only=True)
            if held_out:
                values |= {"val_loss": held_out[0].loss, "val_version": held_out[0].version}
            values["pruned"] = 1.0 if was_pruned(getattr(view.coordinator, "stopped", None)) else 0.0
            if newest and not newest[0].note:
                values |= {"forecast": newest[0].loss, "forecast_low": newest[0].low, "forecast_high": newest[0].high}
                if math.isfinite(newest[0].target_seconds):
                    values["target_s"] = newest[0].target_seconds
            for key, value in values.items():
                runs[key].add_metric([run], value)
            for name, count in sorted(by_state.items()):
                workers_by_state.add_metric([run, name], count)
            tokens.add_metric([run], status.total_tokens)
            for direction, moved in (("up", status.bytes_up_per_round), ("down", status.bytes_down_per_round)):
                if moved > 0 and status.fp32_bytes > 0:
                    ratios.add_metric([run, direction], status.fp32_bytes / moved)
            applied.add_metric([run], status.applied_tokens)
            for w in status.workers:
                key = [run, w.worker_id, w.name]
                t = view.totals.get(w.worker_id)
                worker_families["heartbeat"].add_metric(key, w.seconds_since_heartbeat)
                worker_families["base"].add_metric(key, w.base_version)
                worker_families["up"].add_metric(key, 1.0 if w.state == pb.WORKER_STATE_ACTIVE else 0.0)
                worker_families["applied"].add_metric(key, w.applied_tokens)
                worker_families["late"].add_metric(key, w.late_updates)
                worker_families["stale"].add_metric(key, w.stale_updates)
                worker_families["round_up"].add_metric(key, w.round_bytes_up)
                worker_families["round_down"].add_metric(key, w.round_bytes_down)
                worker_families["utilization"].add_metric(key, w.utilization)
                if t is not None:
                    worker_families["loss"].add_metric(key, t.last_loss)
                    worker_families["tps"].add_metric(key, t.tokens_per_second)
                    worker_families["seq"].add_metric(key, t.last_seq_len)
                    worker_families["tokens"].add_metric(key, t.tokens)
                    worker_families["sent"].add_metric(key, t.bytes_sent)
                    worker_families["received"].add_metric(key, t.bytes_received)
            durations = source.round_histogram(view)
            closed.add_metric([run], durations.count)
            buckets = [(f"{edge:g}", float(below)) for edge, below in zip(ROUND_BUCKETS, durations.below)]
            buckets.append(("+Inf", float(durations.count)))
            histogram.add_metric([run], buckets, sum_value=float(durations.total))
            if durations.last is not None:
                runs["last_round"].add_metric([run], durations.last)
        yield from (runs[key] for key in run_gauges if key != "last_round")
        yield workers_by_state
        yield ratios
        yield tokens
        yield applied
        yield from worker_families.values()
        yield closed
        yield histogram
        yield runs["last_round"]
        waiting = GaugeMetricFamily("rcswarm_workers_waiting_for_place",
                                    "Workers refused a place lately (every place taken) that still ask for one",
                                    labels=["run_id"])
        waiting.add_metric([source.fit_label], source.waiting())
        yield waiting
        fits = source.fits()
        g = GaugeMetricFamily("rcswarm_fit_alpha_inf", "Fitted α∞ of α(s) = α∞(1 − e^(−s/τ)) (absent without a fit)", labels=["run_id"])
        valid = GaugeMetricFamily("rcswarm_fit_valid", "1 when the data identify the fit (no caveats), 0 when they do "
                                  "not: read α∞ only where this is 1 (absent without a fit)", labels=["run_id"])
        if fits.analysis is not None:
            g.add_metric([source.fit_label], fits.analysis.schedule.alpha_inf)
            valid.add_metric([source.fit_label], float(fits.analysis.valid))
        yield g
        yield valid
