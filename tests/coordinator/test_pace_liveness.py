"""Pacing that cannot stop a run (a review's reproductions, against a real loopback coordinator):

* a step of no time (two metric rows with the same compute_seconds) is no measurement: under sync.adaptive_steps it
  once made `decide_pace` divide 0/0, failed the metric report, then raised inside the next close's publication,
  after the version was served and before the next round opened: every later push was refused for good;
* whatever fails after a close's version is served (the pace decision, an eviction whose events row the store
  refuses) is logged and the next round is open;
* a member that never reports a step holds an adaptive round one more deadline at most;
* one member claiming 1e9 s a step stretched a time-boxed round without limit: a claimed step is at most the time the
  coordinator's own clock saw pass since the worker's previous report, and the budget grows beyond
  sync.round_seconds by at most sync.round_deadline_s;
* time-boxed rounds train up to sync.step_cap = 10 × inner.steps steps, and the automatic norm bound now counts them:
  a real worker's honest update was refused on its first push.
"""

from __future__ import annotations

import logging
import math
import threading

import pytest

from rcswarm.coordinator import SwarmCoordinator, decisions
from rcswarm.coordinator.records import WorkerRecord
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from rcswarm.worker import Worker, WorkerOptions
from tests.helpers.coordinator import deltas_of, push
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for
from tests.helpers.wire import Wire

PACE = {"inner_steps": 8, "step_cap": 80, "round_seconds": 1.0, "min_steps": 2, "adaptive_steps": False}


def _record(joined_at: float = 0.0) -> WorkerRecord:
    return WorkerRecord(worker_id="w", name="w", device="cpu", joined_at=joined_at, last_seen=joined_at, base_version=0)


def _row(compute_seconds: float, step: int = 0, tokens: int = 128) -> pb.Metric:
    return pb.Metric(version=0, step=step, seq_len=32, batch=4, loss=5.0, tokens=tokens, wall_time=float(step),
                     compute_seconds=compute_seconds)


def test_a_step_of_no_time_or_no_number_is_no_measurement():
    record = _record()
    for compute in (1.0, 1.0, 0.5, math.inf, 2.0):
        record.measure(_row(compute))
    record.check_steps(10.0)
    # 1.0 → 1.0 is a step of no time, 1.0 → 0.5 went backwards, inf is not kept as the last compute: 0.5 → 2.0.
    assert list(record.step_samples) == [1.5] and record.step_seconds() == 1.5

    adaptive = decisions.PaceOptions("steps", **{**PACE, "adaptive_steps": True})
    # Before: round(0 / 0) raised ZeroDivisionError.
    pace = decisions.decide_pace({"zero": 0.0, "fast": 0.05, "slow": 0.1, "nan": math.nan}, adaptive)
    assert (pace.steps_for("zero"), pace.steps_for("nan"), pace.steps_for("fast"), pace.steps_for("slow")) == (8, 8, 8, 4)
    assert "zero" not in pace.reason and "nan" not in pace.reason
    assert "no step measured yet" in decisions.decide_pace({"zero": 0.0, "neg": -1.0}, adaptive).reason
    timed = decisions.decide_pace({"zero": 0.0, "inf": math.inf}, decisions.PaceOptions("time", **PACE))
    assert timed.round_seconds == 1.0 and "sync.round_seconds = 1" in timed.reason


def test_a_claimed_step_is_at_most_the_time_the_coordinators_clock_saw_pass():
    record = _record(joined_at=100.0)
    record.measure(_row(0.0, tokens=0))
    record.measure(_row(1e9, step=1))
    assert record.step_seconds() is None, "a claim counts once the coordinator checked it"
    record.check_steps(105.0)
    assert list(record.step_samples) == [5.0], "5 s passed since the join"
    # Honest steps within the time since the previous report stay whole.
    record.measure(_row(1e9 + 0.5, step=2))
    record.measure(_row(1e9 + 1.0, step=3))
    record.check_steps(106.0)
    assert list(record.step_samples) == [5.0, 0.5, 0.5]
    record.measure(_row(1e9 + 31.0, step=4))
    record.check_steps(108.0)
    assert list(record.step_samples)[-1] == 2.0
    record.check_steps(200.0)
    assert len(record.step_samples) == 4, "nothing new claimed, nothing new taken"
    # A clock that did not move takes no claim.
    same = _record(joined_at=5.0)
    same.measure(_row(1.0, tokens=0))
    same.measure(_row(2.0, step=1))
    same.check_steps(5.0)
    assert same.step_seconds() is None and not same.view().measured


def test_a_time_boxed_budget_grows_by_at_most_the_round_deadline():
    options = decisions.PaceOptions("time", **PACE, round_deadline_s=2.0)
    grown = decisions.decide_pace({"fast": 0.05, "slow": 0.8}, options)
    assert grown.round_seconds == pytest.approx(1.6) and "capped" not in grown.reason
    capped = decisions.decide_pace({"fast": 0.05, "liar": 1e9}, options)
    assert capped.round_seconds == 3.0
    assert "slowest worker liar" in capped.reason
    assert "capped at sync.round_seconds + sync.round_deadline_s = 1 + 2" in capped.reason
    # Options made without a deadline (a caller of the pure function) do not cap.
    assert decisions.decide_pace({"liar": 1e9}, decisions.PaceOptions("time", **PACE)).round_seconds == 2e9


def test_an_unmeasured_worker_holds_an_adaptive_round_one_more_deadline_only():
    workers = [decisions.WorkerView("a", 0.0, 3, True), decisions.WorkerView("never", 0.0, 3, True, measured=False)]
    round_ = decisions.RoundView(3, 100.0, frozenset({"a"}))
    options = decisions.RoundOptions(5.0, wait_unmeasured=True)
    waiting = decisions.decide_round_close(109.9, round_, workers, options)
    assert not waiting.ok and "not measured yet, until 10.0s" in waiting.reason
    # Before: it waited for as long as the member stayed, whatever the time.
    closed = decisions.decide_round_close(110.0, round_, workers, options)
    assert closed.ok and "deadline 5.0s reached with 1 reports; 1 worker still training" in closed.reason


def _honest_and_liar(start_coordinator, **sync):
    """A run of `sync` settings (round_deadline_s 1 s) with two members, both of which pulled version 0: (the local
    coordinator, its wire, the honest and the lying member, the honest one's pull header)."""
    spec = tiny_spec(run={"rounds": 0}, sync={"round_deadline_s": 1.0, **sync}, coordinator={"durable": False})
    local = start_coordinator(spec)
    wire = Wire(local.target)
    honest, liar = wire.join("honest"), wire.join("liar")
    header = wire.pull(honest)
    wire.pull(liar)
    return local, wire, honest, liar, header


def test_a_step_of_no_time_on_the_wire_neither_fails_the_report_nor_freezes_the_run(start_coordinator):
    local, wire, honest, liar, header = _honest_and_liar(start_coordinator, adaptive_steps=True)
    try:
        # Before: UNKNOWN "float division by zero".
        assert wire.report(liar, [_row(1.0, step=0), _row(1.0, step=1)]).stored == 2
        assert wire.push_zero(honest, header, tokens=100).accepted
        # The liar never pushes and is never measured: round 0 waits for it one more deadline, then closes.
        wait_for(lambda: local.service.version == 1, 15, "round 0 to close")
        service = local.service
        assert service.closer.under_way is None and service.round.version == 1 and not service.round.closing
        header = wire.pull(honest)
        assert header.version == 1 and wire.push_zero(honest, header, tokens=100).accepted
        wait_for(lambda: local.service.version == 2, 15, "round 1 to close")
        status = wire.call("GetStatus", pb.GetStatusRequest())
        assert "adaptive steps" in status.pace
        assert local.running.health_reason == "rounds close"
    finally:
        wire.close()


class FailsAfterServing(SwarmCoordinator):
    """The real coordinator whose pace decision raises (as the 0/0 once did) and whose outlier evictions raise the
    store's error (an events row the store refuses)."""

    def _decide_pace(self) -> None:
        raise ZeroDivisionError("float division by zero")

    def _evict_outliers(self, now: float) -> None:
        raise StoreError("events: database or disk is full", full=True)


def test_a_failure_after_the_version_is_served_leaves_the_next_round_open(tmp_path, caplog):
    coordinator = FailsAfterServing(tiny_spec(run={"rounds": 0}, coordinator={"durable": False}), StateStore(tmp_path))
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        with caplog.at_level(logging.ERROR, logger="rcswarm.coordinator"):
            # Before: the push raised ZeroDivisionError, and round 0 stayed closing with version 1 served.
            assert push(coordinator, member, deltas_of(coordinator, 0.0), 100).accepted
        assert coordinator.version == 1 and coordinator.closer.under_way is None
        assert coordinator.round.version == 1 and not coordinator.round.closing
        logged = caplog.text
        assert "round 0: the pace decision (the pace stays) failed after version 1 was served" in logged
        assert "round 0: evicting outliers failed after version 1 was served" in logged
        assert push(coordinator, member, deltas_of(coordinator, 0.0), 100, version=1).accepted
        assert coordinator.version == 2
    finally:
        coordinator.close()


def test_a_member_claiming_slow_steps_cannot_stretch_a_time_boxed_round(start_coordinator):
    local, wire, honest, liar, header = _honest_and_liar(start_coordinator, round="time", round_seconds=1.0)
    spec = local.service.spec
    try:
        wire.report(liar, [_row(0.0, step=0), _row(1e9, step=1)])
        with local.service._lock:
            budget = local.service.round.budget_s
            reason = local.service.pace.reason
        # Before: budget_s = 1e9, and the round never closed.
        assert budget <= spec.sync.round_seconds + spec.sync.round_deadline_s, reason
        wire.push_zero(honest, header, tokens=100)
        # The liar never pushes: the round closes at its budget plus its deadline.
        wait_for(lambda: local.service.version == 1, 10, "round 0 to close at its deadline")
        status = wire.call("GetStatus", pb.GetStatusRequest())
        liar_status = next(w for w in status.workers if w.name == "liar")
        assert 0 < liar_status.step_seconds < spec.sync.round_seconds + spec.sync.round_deadline_s
        assert "time-boxed" in status.pace
    finally:
        wire.close()


def test_a_real_worker_in_time_boxed_rounds_trains_its_step_cap_and_is_never_refused(start_coordinator):
    # round_seconds is long, so every round trains sync.step_cap = 10 × inner.steps = 50 steps.
    spec = tiny_spec(run={"rounds": 2}, inner={"steps": 5, "lr": 1e-2}, sync={"round": "time", "round_seconds": 60.0},
                     coordinator={"durable": False})
    local = start_coordinator(spec)
    worker = Worker(WorkerOptions(coordinator=local.target, device="cpu", name="honest", threads=1), TOKEN)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    why = local.service.closer.norm_bound[1]
    assert "the most 50 honest inner steps (sync.max_steps of a time-boxed round)" in why
    # Before: the first push was refused (global L2 norm 9.1 > the bound for inner.steps = 5, 5.6) and the worker exited 1.
    assert result == [0] and local.service.version == 2
    assert read_state(local.state_dir, lambda store: store.events("dropped")) == []
    assert [r.steps for r in read_state(local.state_dir, lambda store: store.rounds())] == [50, 50]
