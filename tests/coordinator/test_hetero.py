"""Heterogeneous swarms (issue #15) on the wire and in the decisions; the fast and the slow real worker
processes over 10 rounds are tests/swarm/test_hetero.py.

* on the wire: a stale-by-one update is merged with its weight (1 + 1)^-0.5 into the next outer step,
  a stale-by-two one is refused with FAILED_PRECONDITION naming both versions; a merged late update is
  clipped like any other; a push that meets its round's close waits and is merged late;
* the pacing, staleness and close decisions (pure functions) and the [sync] keys' validation.
"""
from __future__ import annotations

import math

import grpc
import pytest
import torch
from rich.console import Console

from rcswarm.cli.status import report
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator, decisions
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import tensor_stream
from tests.helpers.close import SlowCommitStore
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for
from tests.helpers.wire import Wire, push, small_deltas

pytestmark = pytest.mark.slow



def test_a_stale_by_one_update_is_merged_with_its_weight_and_an_older_one_refused(start_coordinator):
    spec = tiny_spec(
        run={"rounds": 6},
        sync={"codec": "fp32", "aggregation": "mean", "min_cosine": -1.0, "max_update_norm": 100.0,
              "round_deadline_s": 0.5},
        outer={"lr": 0.7, "momentum": 0.9, "nesterov": True},  # the momentum carries round 0 into round 1
    )
    local = start_coordinator(spec)
    client = local.client()
    a, c = client.join("a", "cpu", 1), client.join("c", "cpu", 1)
    client.pull(a, a.run_id)
    client.pull(c, c.run_id)
    theta0 = {k: v.clone() for k, v in local.service.params.items()}
    push(client, a, small_deltas(local, 1e-3), tokens=100)
    # c still trains from version 0: the round closes at its deadline without it.
    wait_for(lambda: client.status().version == 1, 10, "round 0 to close at its deadline")
    late = push(client, c, small_deltas(local, 5e-3), version=0, tokens=100)
    assert late.accepted and late.round_version == 1 and late.staleness == 1
    assert late.staleness_weight == pytest.approx(2 ** -0.5)
    client.pull(a, a.run_id)
    push(client, a, small_deltas(local, 1e-3), version=1, tokens=100)
    assert client.status().version == 2
    # Round 1: Δ̄ = (100·1e-3 + 71·5e-3) / 171 (c's 100 tokens × 2^-0.5, rounded); Nesterov η = 0.7, μ = 0.9.
    mean1 = (100 * 1e-3 + round(100 * 2 ** -0.5) * 5e-3) / (100 + round(100 * 2 ** -0.5))
    b1 = 1e-3
    b2 = 0.9 * b1 + mean1
    shift = 0.7 * (1e-3 + 0.9 * b1) + 0.7 * (mean1 + 0.9 * b2)
    for name, theta in local.service.params.items():
        torch.testing.assert_close(theta, theta0[name] - shift, rtol=0, atol=1e-6)
    status = client.status()
    workers = {w.worker_id: w for w in status.workers}
    assert workers[c.worker_id].late_updates == 1 and workers[c.worker_id].applied_tokens == 100
    assert status.applied_tokens == 300
    closed = [r for r in status.rounds if r.version == 1 and r.closed_at]
    assert "merged 1 late update" in closed[0].close_reason and "stale by 1" in closed[0].close_reason
    assert [e.worker_id for e in read_state(local.state_dir, lambda store: store.events("late"))] == [c.worker_id]
    # `rcswarm status` shows tokens trained against applied and each worker's late / stale / clipped / dropped.
    console = Console(record=True, width=400)
    report(status, console)
    text = console.export_text()
    assert "tokens applied" in text and "300" in text and "1 / 0 / 0 / 0" in text, text

    # d pulls version 2 and falls two versions behind: its update is refused, naming both versions.
    d = client.join("d", "cpu", 1)
    version, _ = client.pull(d, d.run_id)
    assert version == 2
    for base in (2, 3):
        client.pull(a, a.run_id)
        push(client, a, small_deltas(local, 1e-3), version=base, tokens=100)
        wait_for(lambda: client.status().version == base + 1, 10, f"round {base} to close")
    with pytest.raises(grpc.RpcError) as refused:
        push(client, d, small_deltas(local, 1e-3), version=2, tokens=100)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details()
    assert "trained from version 2" in details and "global version is 4" in details and "sync.max_staleness = 1" in details
    assert {w.worker_id: w.stale_updates for w in client.status().workers}[d.worker_id] == 1
    assert math.isfinite(tensor_stream.global_norm(local.service.params))
    client.close()


def test_a_late_update_goes_through_the_robust_aggregation(start_coordinator):
    """clipped_mean (the default) clips a merged late update of 10× the honest norm like any other update."""
    spec = tiny_spec(run={"rounds": 4}, sync={"codec": "fp32", "max_update_norm": 100.0, "round_deadline_s": 0.5})
    local = start_coordinator(spec)
    client = local.client()
    a, c = client.join("a", "cpu", 1), client.join("c", "cpu", 1)
    client.pull(a, a.run_id)
    client.pull(c, c.run_id)
    push(client, a, small_deltas(local, 1e-3), tokens=100)
    wait_for(lambda: client.status().version == 1, 10, "round 0 to close at its deadline")
    assert push(client, c, small_deltas(local, 1e-2), version=0, tokens=100).staleness == 1
    client.pull(a, a.run_id)
    push(client, a, small_deltas(local, 1e-3), version=1, tokens=100)
    status = client.status()
    closed = [r for r in status.rounds if r.version == 1 and r.closed_at]
    assert closed[0].clipped == 1 and "merged 1 late update" in closed[0].close_reason
    assert {w.worker_id: w.clipped_updates for w in status.workers} == {a.worker_id: 0, c.worker_id: 1}
    assert [e.worker_id for e in read_state(local.state_dir, lambda store: store.events("clipped"))] == [c.worker_id]
    client.close()


def test_a_push_for_a_closing_round_waits_for_the_close_and_is_merged_late(tmp_path):
    """With late updates merged, a push that meets its round's close (a store whose commit sleeps) is not
    refused: it waits for the new version and lands in the next round, stale by one."""
    spec = tiny_spec(sync={"round_deadline_s": 1.0}, coordinator={"lease_s": 30.0, "max_wait_s": 10.0, "durable": False})
    store = SlowCommitStore(tmp_path / "state", durable=False)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    wire = Wire(f"127.0.0.1:{running.port}")
    try:
        first, late = wire.join("first"), wire.join("late")
        header = wire.pull(first)
        wire.pull(late)
        wire.push_zero(first, header)
        assert store.committing.wait(timeout=15), "the round did not start closing"
        answer = wire.push_zero(late, header)
        assert answer.accepted and answer.round_version == 1 and answer.staleness == 1
        status = wire.call("GetStatus", pb.GetStatusRequest())
        assert status.version == 1 and {w.name: w.late_updates for w in status.workers} == {"first": 0, "late": 1}
        assert [r.reports for r in status.rounds if r.version == 1] == [1]
    finally:
        wire.close()
        running.stop(grace=0.5)


PACE = dict(inner_steps=8, step_cap=80, round_seconds=1.0, min_steps=2, adaptive_steps=False)


def test_pacing_decisions_are_pure_functions_with_reasons():
    measured = {"fast": 0.05, "slow": 0.15}
    steps = decisions.decide_pace(measured, decisions.PaceOptions("steps", **PACE))
    assert steps.round_seconds == 0 and steps.steps_for("slow") == 8 and "step-boxed" in steps.reason
    adaptive = decisions.decide_pace(measured, decisions.PaceOptions("steps", **{**PACE, "adaptive_steps": True}))
    assert (adaptive.steps_for("fast"), adaptive.steps_for("slow"), adaptive.steps_for("new")) == (8, 3, 8)
    assert "0.050s/step" in adaptive.reason and "slow 3" in adaptive.reason
    # At least min_steps for a very slow worker.
    crawling = decisions.decide_pace({"fast": 0.05, "crawl": 5.0}, decisions.PaceOptions("steps", **{**PACE, "adaptive_steps": True}))
    assert crawling.steps_for("crawl") == 2
    timed = decisions.decide_pace(measured, decisions.PaceOptions("time", **PACE))
    assert timed.round_seconds == 1.0 and timed.steps_for("slow") == 80 and "sync.round_seconds = 1" in timed.reason
    # The budget grows so that the slowest worker completes min_steps.
    grown = decisions.decide_pace({"fast": 0.05, "slow": 0.8}, decisions.PaceOptions("time", **PACE))
    assert grown.round_seconds == pytest.approx(1.6) and "slowest worker slow" in grown.reason


def test_staleness_and_close_decisions_say_what_happened():
    options = decisions.StalenessOptions(max_staleness=1, exponent=0.5)
    assert decisions.decide_staleness(4, 4, 4, options) == decisions.Lateness(True, 0, 1.0, "on time for round 4")
    late = decisions.decide_staleness(3, 4, 3, options)
    assert late.ok and late.staleness == 1 and late.weight == pytest.approx(2 ** -0.5) and "merged into round 4" in late.reason
    too_old = decisions.decide_staleness(2, 4, 2, options)
    assert not too_old.ok and "version 2" in too_old.reason and "global version is 4" in too_old.reason
    not_pulled = decisions.decide_staleness(3, 4, 1, options)
    assert not not_pulled.ok and "did not pull version 3" in not_pulled.reason
    assert decisions.staleness_weight(2, 1.0) == pytest.approx(1 / 3)

    workers = [decisions.WorkerView("a", 0.0, 3, True), decisions.WorkerView("b", 0.0, 3, True, measured=False)]
    round_ = decisions.RoundView(3, 100.0, frozenset({"a"}), budget_s=10.0)
    late_close = decisions.RoundOptions(5.0, max_staleness=1)
    assert not decisions.decide_round_close(114.9, round_, workers, late_close).ok
    closed = decisions.decide_round_close(115.0, round_, workers, late_close)
    assert closed.ok and "budget 10.0s used" in closed.reason and "1 worker still training: merged late" in closed.reason
    # Adaptive steps: the deadline does not leave behind a worker whose speed is not measured yet.
    waiting = decisions.decide_round_close(115.0, round_, workers, decisions.RoundOptions(5.0, wait_unmeasured=True))
    assert not waiting.ok and "not measured yet" in waiting.reason


@pytest.mark.parametrize(("sync", "message"), [
    ({"round": "rounds"}, "sync.round = 'rounds'"),
    ({"round_seconds": 0}, "sync.round_seconds = 0"),
    ({"max_staleness": 17}, "sync.max_staleness = 17"),
    ({"staleness_exponent": -1.0}, "sync.staleness_exponent = -1.0"),
    ({"min_steps": 9}, "sync.min_steps = 9"),
])
def test_sync_pacing_keys_are_validated(sync, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        tiny_spec(inner={"steps": 8}, sync=sync)
