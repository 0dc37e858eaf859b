"""Traffic where people read it (issue #28): bytes up and down per worker per round and their ratio to fp32 in
`rcswarm status`, the dashboard page, /api/status, /metrics and the run summary (summary.json), over a real round of
the sparse codec on an in-process coordinator (real gRPC on loopback, real SQLite).

The downlink's figure is the steady state, the pulls of the round's step; the full pulls of θ (each worker's first,
float32 whatever the codec) are counted apart (observe/traffic.py).
"""

from __future__ import annotations

import html
import json
from typing import Any

import pytest

from rcswarm.observe import traffic
from rcswarm.observe.report import summarize
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import get
from tests.helpers.sparse import FORMAT, SPARSE, honest_deltas, joined, sparse_push
from tests.helpers.specs import tiny_spec


@pytest.fixture
def sparse_round(start_coordinator) -> dict[str, Any]:
    """One closed round of two workers, each: a full pull of θ_0, a sparse push, a pull of the sparse step, and a
    metric row with its byte counters; what each moved as the client counted it."""
    local = start_coordinator(tiny_spec(sync=SPARSE), http_port=0)
    client, members, theta0 = joined(local, ["a", "b"])
    full_pulls = client.bytes_received
    pushed, stepped = {}, {}
    for index, member in enumerate(members):
        before = client.bytes_sent
        sparse_push(client, member, honest_deltas(local.service.shapes, index))
        pushed[member.worker_id] = client.bytes_sent - before
    for member in members:
        before = client.bytes_received
        version, _ = client.pull(member, member.run_id, have=(0, theta0), wire_format=FORMAT)
        assert version == 1
        stepped[member.worker_id] = client.bytes_received - before
    for member in members:
        # Each worker's cumulative counters, as its metric rows carry them: its full pull, its push, its step pull.
        sent, received = pushed[member.worker_id], full_pulls // 2 + stepped[member.worker_id]
        client.report_metrics(member, [pb.Metric(version=1, step=1, seq_len=32, batch=2, loss=3.0, tokens=16,
                                                 wall_time=1.0, bytes_sent=sent, bytes_received=received)],
                              member.run_id)
    status = client.status()
    client.close()
    return {"local": local, "status": status, "pushed": pushed, "stepped": stepped, "full_pulls": full_pulls}


def test_status_reports_the_steady_state_traffic_and_its_ratio(sparse_round) -> None:
    status, pushed, stepped = sparse_round["status"], sparse_round["pushed"], sparse_round["stepped"]
    parameters = sum(t.numel() for t in sparse_round["local"].service.params.values())
    assert status.fp32_bytes == 4 * parameters
    assert status.bytes_up_per_round == pytest.approx(sum(pushed.values()) / 2)
    # The full pulls (θ in float32, more than fp32_bytes each) are not in the downlink's mean: the steps alone are.
    assert sparse_round["full_pulls"] > 2 * status.fp32_bytes
    assert status.bytes_down_per_round == pytest.approx(sum(stepped.values()) / 2)
    assert status.fp32_bytes / status.bytes_down_per_round > 10 and status.fp32_bytes / status.bytes_up_per_round > 10
    for w in status.workers:
        assert (w.round_bytes_up, w.round_bytes_down) == (pushed[w.worker_id], stepped[w.worker_id])


def test_rcswarm_status_prints_traffic_per_worker_per_round_and_the_ratio(sparse_round) -> None:
    from rich.console import Console

    from rcswarm.cli import status as status_cli

    status = sparse_round["status"]
    console = Console(width=200, record=True)
    status_cli.report(status, console)
    shown = console.export_text()
    line = traffic.describe(status.fp32_bytes, status.bytes_up_per_round, status.bytes_down_per_round)
    ratio_up = status.fp32_bytes / status.bytes_up_per_round
    assert f"({ratio_up:.3g}× below fp32)" in line and line in shown
    for w in status.workers:
        assert f"{traffic.size(w.round_bytes_up)} / {traffic.size(w.round_bytes_down)}" in shown


def test_the_dashboard_page_and_api_show_the_traffic(sparse_round) -> None:
    status, base = sparse_round["status"], sparse_round["local"].running.dashboard.url
    line = traffic.describe(status.fp32_bytes, status.bytes_up_per_round, status.bytes_down_per_round)
    page = get(base)[2].decode()
    assert "traffic per worker per round" in page and html.escape(line) in page
    data = json.loads(get(base + "api/status")[2])
    (run,) = data["runs"]
    assert run["traffic"]["ratio_up"] == pytest.approx(status.fp32_bytes / status.bytes_up_per_round)
    assert run["traffic"]["ratio_down"] == pytest.approx(status.fp32_bytes / status.bytes_down_per_round)
    by_id = {w["worker_id"]: w for w in data["workers"]}
    for w in status.workers:
        assert (by_id[w.worker_id]["round_bytes_up"], by_id[w.worker_id]["round_bytes_down"]) == (
            w.round_bytes_up, w.round_bytes_down)


def test_metrics_export_the_traffic_and_the_ratios(sparse_round) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    status, base = sparse_round["status"], sparse_round["local"].running.dashboard.url
    families = {f.name: f for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
    ratios = {s.labels["direction"]: s.value for s in families["rcswarm_traffic_ratio_to_fp32"].samples}
    assert ratios == pytest.approx({"up": status.fp32_bytes / status.bytes_up_per_round,
                                    "down": status.fp32_bytes / status.bytes_down_per_round})
    (up,) = families["rcswarm_bytes_up_per_worker_round"].samples
    (down,) = families["rcswarm_bytes_down_per_worker_round"].samples
    assert (up.value, down.value) == pytest.approx((status.bytes_up_per_round, status.bytes_down_per_round))
    for name, field in (("rcswarm_worker_round_bytes_up", "round_bytes_up"),
                        ("rcswarm_worker_round_bytes_down", "round_bytes_down")):
        shown = {s.labels["worker_id"]: s.value for s in families[name].samples}
        assert shown == {w.worker_id: float(getattr(w, field)) for w in status.workers}


def test_the_run_summary_takes_the_full_pulls_out_of_the_downlink_ratio(sparse_round) -> None:
    """summary.json's ratio_down is the steady state; the full pulls are reported apart (full_pull_bytes)."""
    store = StateStore.open_read_only(sparse_round["local"].state_dir)
    try:
        summary = summarize(store)
    finally:
        store.close()
    stepped, pushed = sparse_round["stepped"], sparse_round["pushed"]
    assert (summary.full_pulls, summary.full_pull_bytes) == (2, sparse_round["full_pulls"])
    assert summary.bytes_down_per_worker_round == pytest.approx(sum(stepped.values()) / 2)
    assert summary.bytes_up_per_worker_round == pytest.approx(sum(pushed.values()) / 2)
    fp32 = sparse_round["status"].fp32_bytes
    assert traffic.ratio(fp32, summary.bytes_down_per_worker_round) > 10
