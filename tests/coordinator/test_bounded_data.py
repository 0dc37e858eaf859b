"""Bounded data in the coordinator (issue 13, finding 6), on a real coordinator over loopback.

Metrics from unknown, left or evicted workers are refused; out-of-range metric values are refused
with INVALID_ARGUMENT naming the field, and GetStatus keeps answering; a worker's metric rows per
round are capped; ended memberships leave memory after `coordinator.forget_after_s`, so join/leave
churn stays fast and GetStatus stays small; the live tokens/s counts from the first pull.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator, decisions
from rcswarm.coordinator.records import STATUS_ENDED_WORKERS, Refusal
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds, deltas_of, push
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for
from tests.helpers.wire import Wire


@pytest.fixture
def wire_to(start_coordinator: Any) -> Iterator[Any]:
    """Start a coordinator for a spec and return (local, Wire); the channels close at teardown."""
    wires: list[Wire] = []

    def start(spec: RunSpec, **kwargs: Any) -> tuple[Any, Wire]:
        local = start_coordinator(spec, **kwargs)
        wires.append(Wire(local.target))
        return local, wires[-1]

    yield start
    for wire in wires:
        wire.close()


def step_metric(step: int, tokens: int = 128, **fields: Any) -> pb.Metric:
    """One ordinary training step's metric row."""
    return pb.Metric(**{"version": 0, "step": step, "seq_len": 32, "batch": 4, "loss": 3.0, "tokens": tokens,
                        "wall_time": 0.1 * step, "compute_seconds": 0.1 * step, **fields})


def test_metrics_from_unknown_left_or_evicted_workers_are_refused(wire_to: Any) -> None:
    local, wire = wire_to(tiny_spec(coordinator={"lease_s": 1.5}))
    nobody = pb.ReportMetricsRequest(worker_id="w999-nobody", worker_secret=bytes(32), metrics=[step_metric(1)])
    unknown = wire.refusal("ReportMetrics", nobody)
    assert unknown.code() == grpc.StatusCode.NOT_FOUND and "unknown" in unknown.details()

    left = wire.join("leaver")
    assert wire.report(left, [step_metric(1)]).stored == 1
    wire.call("Leave", pb.LeaveRequest(**wire.creds(left), reason="done"))
    refused = wire.refusal("ReportMetrics", pb.ReportMetricsRequest(**wire.creds(left), metrics=[step_metric(2)]))
    assert refused.code() == grpc.StatusCode.NOT_FOUND and "left: done" in refused.details()

    silent = wire.join("silent")
    wait_for(lambda: any(w.worker_id == silent and w.state == pb.WORKER_STATE_EVICTED
                         for w in wire.call("GetStatus", pb.GetStatusRequest()).workers), 10, "the eviction")
    evicted = wire.refusal("ReportMetrics", pb.ReportMetricsRequest(**wire.creds(silent), metrics=[step_metric(1)]))
    assert evicted.code() == grpc.StatusCode.NOT_FOUND and "evicted" in evicted.details()
    assert [(r.worker_id, r.step) for r in read_state(local.state_dir, lambda store: store.metric_rows())] == [(left, 1)]


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("tokens", 2**63 - 1, "metrics[1].tokens = 9223372036854775807 is out of range: expected 0..1000000000"),
    ("tokens", -5, "metrics[1].tokens = -5"),
    ("bytes_sent", -1, "metrics[1].bytes_sent = -1"),
    ("version", 2**62, f"metrics[1].version = {2**62}"),
    ("wall_time", math.inf, "metrics[1].wall_time = inf"),
    ("compute_seconds", math.nan, "metrics[1].compute_seconds = nan"),
    ("loss", -math.inf, "metrics[1].loss = -inf"),
    # Stored, a loss <= 0 made every fit of the state dir refuse it whole (rcswarm fit, curriculum.law_from).
    ("loss", -0.5, "metrics[1].loss = -0.5 is out of range: expected a number > 0, or NaN for none"),
    ("loss", 0.0, "metrics[1].loss = 0.0"),
    ("param_sha256", "ab" * 100, "metrics[1].param_sha256 has 200 characters"),
    # tiny_spec: batch 4 × seq_len 32 = 128 tokens a step.
    ("tokens", 129, "metrics[1].tokens = 129 is out of range: one step trains at most 128 (batch 4 × seq_len 32 of "
                    "the assignment at version 0)"),
])
def test_an_out_of_range_metric_is_refused_whole_and_status_still_answers(
    wire_to: Any, field: str, value: Any, shown: str
) -> None:
    local, wire = wire_to(tiny_spec(), http_port=0)
    worker = wire.join("overflow")
    refused = wire.refusal("ReportMetrics", pb.ReportMetricsRequest(
        **wire.creds(worker), metrics=[step_metric(1), step_metric(2, **{field: value})]))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and shown in refused.details(), refused.details()
    assert read_state(local.state_dir, lambda store: store.metric_rows()) == []
    assert wire.report(worker, [step_metric(1, tokens=128), step_metric(2, loss=math.nan, tokens=0)]).stored == 2
    status = wire.call("GetStatus", pb.GetStatusRequest())
    assert status.total_tokens == 128
    with urllib.request.urlopen(local.running.dashboard.url + "api/status", timeout=20) as response:
        assert response.status == 200 and json.loads(response.read())["total_tokens"] == 128


def test_a_metrics_flood_is_capped_per_worker_and_round(wire_to: Any) -> None:
    local, wire = wire_to(tiny_spec(sync={"codec": "fp32"},
                                    coordinator={"max_metrics_per_round": 50, "metric_rows_per_s": 0}))
    worker = wire.join("flooder")
    header = wire.pull(worker)
    assert wire.report(worker, [step_metric(k) for k in range(30)]).stored == 30
    refused = wire.refusal("ReportMetrics", pb.ReportMetricsRequest(**wire.creds(worker), metrics=[step_metric(k) for k in range(21)]))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "reported 30 metric rows at version 0; 21 more exceed coordinator.max_metrics_per_round = 50" in refused.details()
    for _ in range(20):
        wire.refusal("ReportMetrics", pb.ReportMetricsRequest(**wire.creds(worker), metrics=[step_metric(k) for k in range(1000)]))
    assert wire.report(worker, [step_metric(k) for k in range(30, 50)]).stored == 20
    assert len(read_state(local.state_dir, lambda store: store.metric_rows())) == 50
    # The next round counts afresh.
    assert wire.push_zero(worker, header).accepted
    wire.call("AwaitVersion", pb.AwaitVersionRequest(**wire.creds(worker), min_version=1, wait_ms=5000))
    assert wire.report(worker, [step_metric(k, version=1) for k in range(50)]).stored == 50
    versions = [r.version for r in read_state(local.state_dir, lambda store: store.metric_rows())]
    assert (versions.count(0), versions.count(1), len(versions)) == (50, 50, 100)


def test_the_metric_cap_defaults_to_four_rounds_of_steps_and_keys_are_checked() -> None:
    # An honest worker writes inner.steps + 1 rows a version (one a step, one a pull).
    assert RunSpec().metric_rows_per_round() == 4 * (25 + 2)
    assert RunSpec.from_dict({"inner": {"steps": 5}}).metric_rows_per_round() == 64
    assert RunSpec.from_dict({"inner": {"steps": 500}}).metric_rows_per_round() == 2008
    assert (RunSpec().coordinator.metric_rows_per_s, RunSpec().coordinator.max_metric_rows) == (1024.0, 4_000_000)
    with pytest.raises(ValueError, match=r"coordinator.metric_rows_per_s = -1"):
        RunSpec.from_dict({"coordinator": {"metric_rows_per_s": -1}})
    with pytest.raises(ValueError, match=r"coordinator.max_metric_rows = -3"):
        RunSpec.from_dict({"coordinator": {"max_metric_rows": -3}})
    assert RunSpec.from_dict({"coordinator": {"max_metrics_per_round": 7}}).metric_rows_per_round() == 7
    with pytest.raises(ValueError, match=r"coordinator.max_metrics_per_round = -1"):
        RunSpec.from_dict({"coordinator": {"max_metrics_per_round": -1}})
    with pytest.raises(ValueError, match=r"coordinator.forget_after_s = 0"):
        RunSpec.from_dict({"coordinator": {"forget_after_s": 0}})


def test_ended_memberships_are_forgotten_oldest_first_after_the_grace_period() -> None:
    options = decisions.MembershipOptions(lease_s=10.0, max_workers=4, forget_after_s=60.0)
    ended = [decisions.WorkerView(f"w{i}", 0.0, 0, False, ended_at=t) for i, t in enumerate((100.0, 130.0, 170.0))]
    assert decisions.decide_forgetting(150.0, ended, options) == []
    forgotten = decisions.decide_forgetting(200.0, ended, options)
    assert [worker_id for worker_id, _ in forgotten] == ["w0", "w1"]
    assert forgotten[0][1] == "ended 100.0s ago > forget_after_s 60.0s"


def test_ended_memberships_beyond_sixteen_a_place_are_forgotten_at_once() -> None:
    """A join token's holder joining and leaving in a loop (~800 a second) kept each membership forget_after_s: 0.5 GB
    of them at 300 s (review of the twentieth session). The newest 16 × max_workers stay; the oldest go at once."""
    options = decisions.MembershipOptions(lease_s=10.0, max_workers=2, forget_after_s=60.0)
    ended = [decisions.WorkerView(f"w{i}", 0.0, 0, False, ended_at=100.0 + i) for i in range(40)]
    forgotten = decisions.decide_forgetting(101.0, iter(ended), options, len(ended))
    assert [worker_id for worker_id, _ in forgotten] == [f"w{i}" for i in range(8)]
    assert forgotten[0][1] == "more than 32 ended memberships kept (16 × max_workers 2)"
    assert decisions.decide_forgetting(101.0, ended, options) == forgotten  # counted when not given
    aged = decisions.decide_forgetting(165.0, ended, options)  # w0 .. w4 are also past the grace period
    assert [worker_id for worker_id, _ in aged] == [f"w{i}" for i in range(8)]


def test_event_rows_beyond_the_bound_are_deleted_oldest_first(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events table was never pruned: join and leave churn grew it without bound (7,208 rows in 10 s)."""
    from rcswarm.state import store as store_module

    monkeypatch.setattr(store_module, "MAX_EVENT_ROWS", 100)
    monkeypatch.setattr(store_module, "EVENT_PRUNE_EVERY", 10)
    store = StateStore(tmp_path, durable=False)
    try:
        for i in range(1000):
            store.add_event(f"w{i}", "join", "churn", float(i))
        kept = store.events()
        assert 100 <= len(kept) < 110 and kept[-1].worker_id == "w999"
        assert [int(e.worker_id[1:]) for e in kept] == list(range(1000 - len(kept), 1000))
    finally:
        store.close()


def test_callers_strings_stay_one_log_line_and_long_ids_are_cut_in_refusals(wire_to: Any,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A worker name with a newline forged a second log line (and a device's escape sequence reached the terminal),
    and a refusal echoing a 3 MiB worker id came back RESOURCE_EXHAUSTED from gRPC's metadata limit instead of
    NOT_FOUND (review of the twentieth session)."""
    local, wire = wire_to(tiny_spec())
    name, device = "x\n2026-01-01 00:00:00,000 WARNING rcswarm.coordinator forged line", "cpu\x1b[31m"
    with caplog.at_level(logging.INFO, logger="rcswarm"):
        worker = wire.call("Join", pb.JoinRequest(worker_name=name, device=device, pid=1)).worker_id
    joined = [r.getMessage() for r in caplog.records if worker in r.getMessage()]
    assert joined and all("\n" not in line and "\x1b" not in line for line in joined), joined
    assert any(r"x\n2026-01-01" in line and r"cpu\x1b[31m" in line for line in joined), joined
    status = {w.worker_id: w for w in wire.call("GetStatus", pb.GetStatusRequest()).workers}
    assert (status[worker].name, status[worker].device) == (name.replace("\n", r"\n"), r"cpu\x1b[31m")
    long_id = "w" * (3 << 20)
    for method, request in (("Heartbeat", pb.HeartbeatRequest(worker_id=long_id, worker_secret=b"s")),
                            ("ReportMetrics", pb.ReportMetricsRequest(worker_id=long_id, worker_secret=b"s"))):
        refused = wire.refusal(method, request)
        assert refused.code() == grpc.StatusCode.NOT_FOUND, (method, refused.code(), refused.details()[:200])
        assert refused.details().endswith("more characters)") and len(refused.details()) < 1100, refused.details()[-80:]
    # Four-byte characters percent-encode to 12 bytes each: 1,000 of them (the cut by characters of before) passed
    # gRPC's 8 KiB soft metadata limit, and about half the calls ended RESOURCE_EXHAUSTED instead of the refusal.
    emoji_id = "\U0001f600" * 5000
    for _ in range(10):
        refused = wire.refusal("Heartbeat", pb.HeartbeatRequest(worker_id=emoji_id, worker_secret=b"s"))
        assert refused.code() == grpc.StatusCode.NOT_FOUND, (refused.code(), refused.details()[:200])
        assert len(refused.details().encode()) < 1100, len(refused.details().encode())


def test_join_leave_churn_stays_fast_status_small_and_history_kept(wire_to: Any) -> None:
    pairs, grace = 3000, 1.0
    local, wire = wire_to(tiny_spec(coordinator={"forget_after_s": grace, "durable": False, "lease_s": 120.0}))
    keeper = wire.join("keeper")
    seconds_per_500 = []
    started = time.monotonic()
    for block in range(pairs // 500):
        block_started = time.monotonic()
        for i in range(500):
            worker = wire.join(f"churn-{block}-{i}")
            wire.call("Leave", pb.LeaveRequest(**wire.creds(worker), reason="churn"))
        seconds_per_500.append(time.monotonic() - block_started)
    elapsed = time.monotonic() - started
    status = wire.call("GetStatus", pb.GetStatusRequest())
    # The growth decides (a history that slowed each join would show in the last block); the total is a hang guard
    # only: 3,000 pairs took 12-26 s on 2 cores as their load varied.
    assert elapsed < 90.0 and seconds_per_500[-1] < 3 * seconds_per_500[0] + 1.0, seconds_per_500
    assert len(status.workers) <= 1 + STATUS_ENDED_WORKERS and status.ByteSize() < 32 * 1024, status.ByteSize()
    assert status.workers[0].worker_id == keeper and status.workers[0].state == pb.WORKER_STATE_ACTIVE
    assert all(w.state == pb.WORKER_STATE_LEFT for w in status.workers[1:])
    wait_for(lambda: len(local.service.workers) == 1, 10 * grace + 5, "the ended memberships to be forgotten")
    forgotten = wire.refusal("Heartbeat", pb.HeartbeatRequest(**wire.creds(worker)))
    assert forgotten.code() == grpc.StatusCode.NOT_FOUND
    kinds = [e.kind for e in read_state(local.state_dir, lambda store: store.events())]
    assert sorted((kind, kinds.count(kind)) for kind in set(kinds)) == [("join", pairs + 1), ("leave", pairs)]


def test_live_tokens_per_second_counts_from_the_first_pull(tmp_path: Any) -> None:
    now = [1000.0]
    coordinator = SwarmCoordinator(tiny_spec(), StateStore(tmp_path, durable=False), clock=lambda: now[0])
    try:
        worker = creds(coordinator.join(pb.JoinRequest(worker_name="a")))
        list(coordinator.pull(pb.PullParametersRequest(**worker)))
        now[0] = 1010.0
        coordinator.report_metrics(pb.ReportMetricsRequest(**worker, metrics=[step_metric(k, tokens=100) for k in range(10)]))
        now[0] = 1011.0
        status = coordinator.status()
        assert status.total_tokens == 1000 and status.tokens_per_second == pytest.approx(1000 / 11)
    finally:
        coordinator.close()


def test_training_rows_past_a_finite_runs_last_round_are_not_kept(tmp_path) -> None:
    """A worker that pulled the final version before it heard the run finished trains a round no round can
    take: its training rows (version >= run.rounds) are not stored; a pull's digest row (no tokens) is."""
    coordinator = SwarmCoordinator(tiny_spec(run={"rounds": 1}), StateStore(tmp_path))
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        push(coordinator, member, deltas_of(coordinator, 1e-3), 8)
        assert coordinator.version == 1
        length = coordinator.spec.data.seq_len
        rows = [pb.Metric(version=0, step=1, seq_len=length, loss=3.0, tokens=8),
                pb.Metric(version=1, step=6, seq_len=length, loss=2.5, tokens=8),
                pb.Metric(version=1, step=5, seq_len=length, loss=math.nan, tokens=0, param_sha256="ab")]
        assert coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=rows)).stored == 2
        stored = sorted(read_state(tmp_path, lambda store: store.metric_rows()), key=lambda row: row.step)
        assert [(r.version, r.tokens) for r in stored] == [(0, 8), (1, 0)]
        assert coordinator.total_tokens == 8
    finally:
        coordinator.close()


def test_a_training_row_at_a_length_the_run_never_assigns_refuses_the_batch_and_stores_nothing(tmp_path) -> None:
    """A training row (tokens > 0) at a length the run never assigns (`analysis.run_lengths`: data.seq_len and the
    curriculum's) was trained for no assignment of this run, and every fit would take it as a length of its own: the
    whole batch is refused (INVALID_ARGUMENT naming the row and the lengths the run assigns) and nothing of it
    stored; rows at each length the run does assign are taken. A diagnostic task sets its own lengths: any is taken."""
    spec = tiny_spec(curriculum={"worker_seq_lens": [8, 16]})  # lengths 8 and 16 (and data.seq_len, 32)
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path / "lengths", durable=False))
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        report = creds(member)
        assigned = [pb.Metric(version=0, step=step, seq_len=length, batch=4, loss=3.0, tokens=4 * length)
                    for step, length in enumerate((8, 16), start=1)]
        assert coordinator.report_metrics(pb.ReportMetricsRequest(**report, metrics=assigned)).stored == 2
        stray = [pb.Metric(version=0, step=3, seq_len=8, batch=4, loss=3.0, tokens=32),
                 pb.Metric(version=0, step=4, seq_len=24, batch=2, loss=3.0, tokens=48)]
        with pytest.raises(Refusal) as refused:
            coordinator.report_metrics(pb.ReportMetricsRequest(**report, metrics=stray))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "metrics[1].seq_len = 24: not a length this run assigns (expected one of [8, 16, 32])" in str(refused.value)
        assert sorted(row.step for row in coordinator.store.metric_rows()) == [1, 2]
        assert coordinator.total_tokens == 4 * (8 + 16)
    finally:
        coordinator.close()
    diag = tiny_spec(data={"source": "diag", "task": "s5", "task_config": {"max_length": 8}})
    coordinator = SwarmCoordinator(diag, StateStore(tmp_path / "diag", durable=False))
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        rows = [pb.Metric(version=0, step=step, seq_len=length, batch=4, loss=3.0, tokens=4 * length)
                for step, length in enumerate((5, 7, 24), start=1)]
        assert coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=rows)).stored == 3
    finally:
        coordinator.close()


class FullDiskStore(StateStore):
    """A real store whose database may not grow once `fill` ran: SQLite's own SQLITE_FULL ("database or disk is
    full", through `PRAGMA max_page_count`), what a full disk gives the coordinator's writes."""

    def fill(self) -> None:
        with self._writer() as db:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {pages}")


def test_metrics_refused_on_a_full_disk_reach_the_worker_as_resource_exhausted_and_log_one_line(
    tmp_path: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    # 3 refusals of 398 rows each: the rows the store refused go back to the budget, or the third would meet the cap.
    spec = tiny_spec(coordinator={"max_metrics_per_round": 1000, "metric_rows_per_s": 0})
    store = FullDiskStore(tmp_path / "state", spec.coordinator.keep_checkpoints, durable=False)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    wire = Wire(f"127.0.0.1:{running.port}")
    try:
        worker = wire.join("w")
        assert wire.report(worker, [step_metric(1)]).stored == 1
        store.fill()
        with caplog.at_level(logging.WARNING):
            refusals = [wire.refusal("ReportMetrics", pb.ReportMetricsRequest(
                **wire.creds(worker), metrics=[step_metric(k) for k in range(2, 400)])) for _ in range(3)]
        for refused in refusals:
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert "disk is full" in refused.details() and "retry later" in refused.details()
        lines = [r for r in caplog.records if "ReportMetrics refused" in r.getMessage()]
        assert len(lines) == 3 and all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
        assert not [r for r in caplog.records if r.exc_info is not None]
        # Nothing was half-stored, and the coordinator answers on.
        assert wire.call("Heartbeat", pb.HeartbeatRequest(**wire.creds(worker))).version == 0
    finally:
        wire.close()
        running.stop(grace=0.5)
    assert len(read_state(tmp_path / "state", lambda s: s.metric_rows())) == 1


def test_decide_metric_rows_caps_a_version_and_budgets_time() -> None:
    options = decisions.MetricOptions(per_round=20, rows_per_s=5.0)
    ok, budget = decisions.decide_metric_rows(100.0, 3, decisions.MetricBudget(), 15, options)
    assert ok.ok and (budget.version, budget.in_round, budget.left, budget.at) == (3, 15, 5.0, 100.0)
    refused, budget = decisions.decide_metric_rows(100.5, 3, budget, 6, options)
    assert not refused.ok and "reported 15 metric rows at version 3; 6 more exceed coordinator.max_metrics_per_round = 20" in refused.reason
    # A new version: the per-version count starts afresh, the time budget does not (7.5 rows after 0.5 s).
    refused, budget = decisions.decide_metric_rows(100.5, 4, budget, 10, options)
    assert not refused.ok and "10 metric rows exceed the 7 its time budget holds now" in refused.reason
    assert "coordinator.metric_rows_per_s = 5" in refused.reason and "retry in 0.5 s" in refused.reason
    ok, budget = decisions.decide_metric_rows(101.0, 4, budget, 10, options)
    assert ok.ok and budget.left == 0.0 and budget.in_round == 10
    # Refilled at most to per_round, however long the worker was silent.
    ok, budget = decisions.decide_metric_rows(10_000.0, 5, budget, 20, options)
    assert ok.ok and budget.left == 0.0
    assert decisions.refund_metric_rows(budget, 5, 20, options) == decisions.MetricBudget(5, 0, 20.0, 10_000.0)
    # Without a time budget only the per-version cap applies.
    plain = decisions.MetricOptions(per_round=20, rows_per_s=0.0)
    for version in range(100):
        ok, _ = decisions.decide_metric_rows(100.0, version, decisions.MetricBudget(), 20, plain)
        assert ok.ok


def test_the_metrics_table_keeps_its_newest_rows_and_the_aggregates_keep_every_row(tmp_path: Any) -> None:
    store = StateStore(tmp_path, durable=False)
    try:
        def row(worker: str, step: int) -> tuple[Any, ...]:
            return ("run", worker, 0, step, 32, 4, 3.0, 128, 0.1 * step, 0.1 * step, 0.0, 0, 0, "", 1000.0 + step)

        for start in range(0, 1000, 100):
            store.add_metrics([row(f"w{k % 3}", start + k) for k in range(100)], keep_rows=250)
        kept = store.metric_rows()
        assert len(kept) == 250 and [r.step for r in kept] == list(range(750, 1000))
        totals = {w.worker_id: (w.tokens, w.rows) for w in store.worker_rows("run")}
        assert sum(tokens for tokens, _ in totals.values()) == 1000 * 128 and sum(n for _, n in totals.values()) == 1000
    finally:
        store.close()


def test_a_metrics_flood_from_many_identities_while_rounds_close_fast_stays_within_the_budgets(wire_to: Any) -> None:
    # The attack: identities of one token report as much as they may and close rounds as fast as they can
    # (each pushes a zero update), so a per-version cap alone would reset every round.
    rate, keep = 50.0, 600
    local, wire = wire_to(tiny_spec(run={"rounds": 0}, sync={"codec": "fp32", "round_deadline_s": 60.0},
                                    coordinator={"lease_s": 30.0, "metric_rows_per_s": rate, "max_metric_rows": keep}))
    names = [wire.join(f"flood{k}") for k in range(8)]
    per_round = local.service.metric_options.per_round
    stored = dict.fromkeys(names, 0)
    started = time.monotonic()
    rounds = 0
    while time.monotonic() - started < 3.0:
        headers = {name: wire.pull(name) for name in names}
        for name in names:
            request = pb.ReportMetricsRequest(**wire.creds(name), metrics=[step_metric(k) for k in range(per_round)])
            try:
                stored[name] += wire.call("ReportMetrics", request).stored
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            wire.push_zero(name, headers[name])
        rounds += 1
    elapsed = time.monotonic() - started
    assert rounds >= 3
    for name in names:
        assert stored[name] <= per_round + rate * elapsed, (stored[name], elapsed)
    rows = read_state(local.state_dir, lambda store: store.metric_rows())
    assert len(rows) <= keep
    # Without the time budget each identity would have stored per_round rows every round.
    assert sum(stored.values()) < 0.5 * 8 * per_round * rounds, (stored, rounds)


def test_the_fit_reads_the_same_steps_and_times_after_the_oldest_rows_are_deleted(tmp_path) -> None:
    """`max_metric_rows` deleted a round's first rows: the fit's reader counted the step within the round and the
    time from the rows that survived (step 5 read as the round's first, at t = 0) while the dashboard's aggregates
    kept the truth."""
    from rcswarm.coordinator.sweep import open_group
    from rcswarm.observe import analysis

    now = [1000.0]
    spec = tiny_spec(run={"rounds": 0}, inner={"steps": 10}, coordinator={"max_metric_rows": 6})
    group = open_group(spec, tmp_path, lambda: now[0])
    member = group.join(pb.JoinRequest(worker_name="a"))
    for _ in group.runs[0].pull(pb.PullParametersRequest(**creds(member))):
        pass
    for step in range(1, 11):  # one round from version 0, one report a step, 1 s apart
        now[0] += 1.0
        group.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[
            pb.Metric(version=0, step=step, seq_len=32, batch=4, loss=3.0 - 0.1 * step, tokens=128,
                      wall_time=float(step), compute_seconds=0.1 * step)]))
    assert [row.step for row in group.runs[0].store.metric_rows()] == [5, 6, 7, 8, 9, 10]
    dashboard = {(step, round(loss, 6), t) for _, step, loss, t in analysis.run_step_means(group.runs[0].store, 10)}
    group.close()
    fit = {(row.step, round(row.loss, 6), row.time) for row in analysis.read_state_dirs(tmp_path)}
    assert fit == {(float(step), round(3.0 - 0.1 * step, 6), step - 1.0) for step in range(5, 11)}
    assert fit <= dashboard
