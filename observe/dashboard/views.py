"""The dicts the dashboard's JSON API and page show, computed over a list of runs.

A single run is a list of one; a sweep is a list of its runs. Every worker and round names
its run (`run_id`, `run_index`, `run_seq_len`); `runs` has one entry per run. The status
dict keeps GetStatus's fields (numbers as numbers) and adds `kind` ("run" or "sweep"), the
`clock` its steps and times are counted on, `runs`, and `fits` (see `analysis.FitReport`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from rcswarm.observe import traffic
from rcswarm.observe.analysis import Clock, FitReport, StepMean, WorkerTotals
from rcswarm.observe.report import loss_kind
from rcswarm.protos.v1 import coordinator_pb2 as pb


def _enum_names(enum: Any, prefix: str) -> dict[int, str]:
    """{value: "active"} for WORKER_STATE_ACTIVE etc.; follows the proto as states are added."""
    names = {number: name.removeprefix(prefix).lower() for name, number in enum.items()}
    names[0] = "unknown"
    return names


STATE_NAMES = _enum_names(pb.WorkerState, "WORKER_STATE_")
RUN_STATE_NAMES = _enum_names(pb.RunState, "RUN_STATE_")


def presentation(is_sweep: bool, mirrored: bool = False) -> tuple[str, Clock]:
    """The kind shown and the clock of the curves: each run's own (`Clock.RUN`), a single run's too; a hivemind swarm
    that `rcswarm dht` mirrors (`mirrored`) on its peers' own (`Clock.WORKER`): it has no coordinator rounds to count
    a run step from, and its peers' versions advance peer to peer.

    A sweep's because a worker that moves between its runs keeps its counters. A single run was once
    shown on its workers' clocks (`Clock.WORKER`: each worker's step and wall time, per step, since
    its workers never move), but a worker that restarts or joins late counts from step 1 and second 0
    again, so its rows fell among the run's first steps and bent the fit. The run step keeps what the
    workers' steps gave, one point per step trained, for late and restarted workers too, and is what
    `rcswarm fit` counts for the same state dir; times are when the rows arrived (a round's rows
    arrive together), as for a sweep."""
    return ("sweep" if is_sweep else "run"), Clock.WORKER if mirrored and not is_sweep else Clock.RUN


@dataclass(frozen=True)
class RunView:
    """One run as read for one request: its coordinator, GetStatus, one-line summary and per-worker totals."""

    index: int
    coordinator: Any
    status: pb.GetStatusResponse
    summary: pb.RunSummary
    totals: dict[str, WorkerTotals]


def read_run(index: int, coordinator: Any, totals: dict[str, WorkerTotals]) -> RunView:
    status = coordinator.status()
    return RunView(index, coordinator, status, coordinator.summary(status), totals)


# MessageToDict writes these as strings (JSON numbers lose 64-bit precision in JavaScript; ours stay far below 2^53).
_INT64_TYPES = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


def message_data(message: Message) -> dict[str, Any]:
    """`message` as JSON-ready data, every field present (MessageToDict's, with its field names and enum names), but
    numbers as numbers: 64-bit integers as ints rather than strings, and NaN or infinity as null rather than
    "NaN"/"Infinity", so that a field's type never depends on its value."""
    data = json_format.MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _numbers(message.DESCRIPTOR, data)


def _numbers(descriptor: Descriptor, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (MessageToDict's of a `descriptor` message) with its numbers as numbers, recursively."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        field = descriptor.fields_by_name[name]
        convert = _converter(field)
        out[name] = [convert(v) for v in value] if isinstance(value, list) else convert(value)
    return out


def _converter(field: FieldDescriptor) -> Any:
    """How one value of `field` (as MessageToDict wrote it) becomes a plain number, or stays as it is."""
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        entry = _converter(field.message_type.fields_by_name["value"])  # keys stay strings, as JSON's must
        return lambda value: {key: entry(item) for key, item in value.items()}
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return lambda value: _numbers(field.message_type, value)
    if field.type in _INT64_TYPES:
        return int
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return lambda value: None if isinstance(value, str) else finite(float(value))
    return lambda value: value


def finite(value: Any) -> Any:
    """JSON cannot carry NaN or infinity: those become null, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def worker_dict(w: pb.WorkerStatus, totals: dict[str, WorkerTotals]) -> dict[str, Any]:
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
        "clipped_updates": w.clipped_updates, "dropped_updates": w.dropped_updates, "stale_updates": w.stale_updates,
        "outlier_rounds": w.outlier_rounds, "outlier": w.outlier,
        # Issue #15: late updates merged, tokens trained and applied, seconds per step and the round's pace.
        "late_updates": w.late_updates, "trained_tokens": w.trained_tokens, "applied_tokens": w.applied_tokens,
        "step_seconds": w.step_seconds or None,
        "inner_steps": w.assignment.inner_steps if w.HasField("assignment") else None,
        "round_seconds": w.assignment.round_seconds if w.HasField("assignment") else None,
        # Issue #28: the bytes of its last update and of its last pull.
        "round_bytes_up": w.round_bytes_up, "round_bytes_down": w.round_bytes_down,
        # Issue #29: the share of its wall time in inner steps.
        "utilization": w.utilization or None,
    }


def traffic_dict(status: pb.GetStatusResponse) -> dict[str, Any]:
    """A run's mean bytes per worker per round, up and down, with their ratios to fp32 (issue #28)."""
    return {"fp32_bytes": status.fp32_bytes, "bytes_up_per_round": status.bytes_up_per_round,
            "bytes_down_per_round": status.bytes_down_per_round,
            "ratio_up": traffic.ratio(status.fp32_bytes, status.bytes_up_per_round),
            "ratio_down": traffic.ratio(status.fp32_bytes, status.bytes_down_per_round)}


def round_dict(r: pb.RoundStatus) -> dict[str, Any]:
    return {"version": r.version, "reports": r.reports, "tokens": r.tokens, "opened_at": r.opened_at,
            "closed_at": r.closed_at or None, "close_reason": r.close_reason, "update_norm": r.update_norm,
            "duration_s": (r.closed_at - r.opened_at) if r.closed_at else None, "open": not r.closed_at,
            "clipped": r.clipped, "dropped": r.dropped, "aggregation": r.aggregation}


def forecast_dict(view: RunView) -> dict[str, Any] | None:
    """The run's newest forecast of its final loss (issue #30; held-out or training, `loss_kind`) from its store, and
    why a sweep stopped it; None before its first."""
    newest = view.coordinator.store.forecasts(newest_only=True)
    if not newest:
        return None
    r = newest[0]
    return {"made_at_version": r.version, "at_seconds": r.at_seconds, "at_round": r.at_round, "loss": r.loss,
            "low": r.low, "high": r.high, "loss_kind": loss_kind(r), "note": r.note, "target_loss": r.target_loss,
            "target_seconds": r.target_seconds, "target_low_s": r.target_low_s, "target_high_s": r.target_high_s,
            "stopped": getattr(view.coordinator, "stopped", None)}


def run_dict(view: RunView, means: Sequence[StepMean]) -> dict[str, Any]:
    """One run: its summary, the workers assigned to it, its metrics on the shown clock's steps, its forecast."""
    s = view.summary
    assigned = [w for w in view.status.workers if w.state == pb.WORKER_STATE_ACTIVE]
    last = max(means, key=lambda row: row[1]) if means else None
    return {
        "index": view.index, "run_id": s.run_id, "seq_len": s.seq_len, "batch_size": s.batch_size,
        "run_state": RUN_STATE_NAMES.get(s.run_state, "unknown"), "version": s.version,
        "target_rounds": s.target_rounds, "active_workers": s.active_workers, "refused_by": s.refused_by,
        "last_refusal": s.last_refusal,
        "workers": [{"worker_id": w.worker_id, "name": w.name} for w in assigned],
        "tokens_per_second": s.tokens_per_second, "latest_loss": s.latest_loss, "total_tokens": s.total_tokens,
        "param_sha256": view.status.param_sha256, "state_dir": str(view.coordinator.store.state_dir),
        "traffic": traffic_dict(view.status), "utilization": view.status.utilization or None,
        "forecast": forecast_dict(view),
        "metrics": {
            "steps": len(means), "last_step": last[1] if last else None, "last_loss": last[2] if last else None,
            "seconds": last[3] if last else None,
            "seq_lens": sorted({row[0] for row in means}),
        },
    }


def _run_labels(view: RunView) -> dict[str, Any]:
    return {"run_id": view.summary.run_id, "run_index": view.index, "run_seq_len": view.summary.seq_len}


def status_dict(kind: str, clock: Clock, status: pb.GetStatusResponse, views: Sequence[RunView],
                means: Sequence[Sequence[StepMean]], fits: FitReport) -> dict[str, Any]:
    """GetStatus of the run or sweep with every run's data; each worker and round names its run."""
    out = message_data(status)
    out["run_state"] = RUN_STATE_NAMES.get(status.run_state, "unknown")
    out["kind"] = kind
    out["clock"] = clock.value
    out["runs"] = [run_dict(view, rows) for view, rows in zip(views, means, strict=True)]
    out["workers"] = [{**worker_dict(w, view.totals), **_run_labels(view)} for view in views for w in view.status.workers]
    out["rounds"] = [{**round_dict(r), **_run_labels(view)} for view in views for r in view.status.rounds]
    out["fits"] = fits.summary()
    return finite(out)


def metrics_page(rows: list[dict[str, Any]], since: int, limit: int) -> dict[str, Any]:
    """A page of metric rows (the store's `metrics_since`) and where the next page starts."""
    return finite({
        "since": since, "count": len(rows), "next_since": rows[-1]["rowid"] if rows else since,
        "more": len(rows) == limit, "rows": rows,
    })
