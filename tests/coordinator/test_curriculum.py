"""The curriculum: the coordinator assigns each worker's (seq_len, batch); adaptive lengthening by the fitted law."""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import threading

import numpy as np
import pytest
import torch
from rich.console import Console

from rcswarm.cli.status import report as status_report
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import SwarmCoordinator
from rcswarm.coordinator import curriculum as curricula
from rcswarm.observe.fits import AlphaScheduleFit
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from tests.helpers.coordinator import creds, previous
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state


def law(alpha_inf: float, tau: float) -> curricula.Law:
    return curricula.Law(AlphaScheduleFit(alpha_inf, tau, math.nan), lambda step: 0.0, "test law")


def options(alpha_inf: float = 2.0, tau: float = 1.0, budget: float = 100.0, lengths=(4, 8, 16)) -> curricula.AdaptiveOptions:
    return curricula.AdaptiveOptions(tuple(lengths), budget, law(alpha_inf, tau))


def measured_state(rung: int = 0, started_at: float | None = 0.0, **costs: tuple[float, int]) -> curricula.CurriculumState:
    return curricula.CurriculumState(
        rung=rung, started_at=started_at, costs={int(k.removeprefix("L")): v for k, v in costs.items()}
    )


def test_a_big_alpha_lengthens_once_measured_with_the_longer_cost_extrapolated():
    decision = curricula.decide_lengthening(10.0, measured_state(L4=(0.1, 10)), options())
    assert decision.ok, decision.reason
    assert "lengthens L = 4 -> 8" in decision.reason and "extrapolated linearly in tokens per step" in decision.reason
    assert "c(8) = 0.02" in decision.reason


def test_stays_without_measurements_before_the_start_and_on_the_last_rung():
    no_costs = curricula.decide_lengthening(10.0, measured_state(), options())
    assert not no_costs.ok and "no seconds per step measured at L = 4" in no_costs.reason
    not_started = curricula.decide_lengthening(10.0, measured_state(started_at=None, L4=(0.1, 10)), options())
    assert not not_started.ok and "not started" in not_started.reason
    last = curricula.decide_lengthening(10.0, measured_state(rung=2, L16=(0.4, 10)), options())
    assert not last.ok and "last rung" in last.reason


def test_a_tiny_budget_or_a_spent_one_stays():
    tiny = curricula.decide_lengthening(1e-4, measured_state(L4=(0.1, 10)), options(budget=1e-3))
    assert not tiny.ok and "no crossover" in tiny.reason and "budget of 0.001 s" in tiny.reason
    spent = curricula.decide_lengthening(200.0, measured_state(L4=(0.1, 10)), options(budget=100.0))
    assert not spent.ok and "spent" in spent.reason


def test_a_crossover_not_reached_yet_waits_then_lengthens():
    # A slow law (tau = 1000 steps at 0.01 s/step): the longer length pulls ahead only later.
    slow = options(alpha_inf=0.3, tau=1000.0, budget=1e6)
    early = curricula.decide_lengthening(1.0, measured_state(L4=(0.1, 10)), slow)
    assert not early.ok and "not reached" in early.reason
    crossing = float(early.reason.split(" from ")[1].split(" s on")[0])
    assert 1.0 < crossing < 1e6
    assert curricula.decide_lengthening(crossing * 1.01, measured_state(L4=(0.1, 10)), slow).ok


def test_costs_are_measured_or_extrapolated_linearly():
    assert curricula.estimate_seconds_per_step({}, 8) is None
    assert curricula.estimate_seconds_per_step({4: 0.5}, 4) == (0.5, "c(4) = 0.5 s/step measured")
    proportional, note = curricula.estimate_seconds_per_step({4: 0.5}, 16)
    assert proportional == pytest.approx(2.0) and "extrapolated" in note
    line, _ = curricula.estimate_seconds_per_step({4: 1.0, 8: 1.5}, 16)
    assert line == pytest.approx(2.5)


def test_costs_extrapolate_in_tokens_per_step_so_constant_tokens_stays_flat():
    constant_tokens = {4: 64, 8: 64, 16: 64}.__getitem__  # batch 16, 8, 4
    flat, note = curricula.estimate_seconds_per_step({4: 0.5}, 16, constant_tokens)
    assert flat == pytest.approx(0.5) and "tokens per step (64 at L = 16)" in note
    flat, _ = curricula.estimate_seconds_per_step({4: 0.5, 8: 0.6}, 16, constant_tokens)
    assert flat == pytest.approx(0.6)  # no line through equal tokens: proportional from the nearest
    half_batch = {4: 64, 8: 64, 16: 128}.__getitem__
    line, _ = curricula.estimate_seconds_per_step({4: 0.5, 16: 0.9}, 8, half_batch)
    assert line == pytest.approx(0.5)
    # With equal cost per step a longer length is ahead from the start under a positive α(s).
    state = measured_state(L4=(0.1, 10))
    opts = dataclasses.replace(options(alpha_inf=0.3, tau=100.0, budget=1000.0), tokens_per_step=(64, 64, 64))
    decision = curricula.decide_lengthening(state.started_at + 1.0, state, opts)
    assert decision.ok and "c(8) = 0.01 s/step extrapolated" in decision.reason, decision.reason
    assert not curricula.decide_lengthening(state.started_at + 1.0, state, options(alpha_inf=0.3, tau=100.0,
                                                                                    budget=1000.0)).ok


def test_a_cost_measured_off_the_ladder_is_ignored():
    state = measured_state(L4=(0.1, 10), L6=(0.5, 10))  # L = 6 is not a rung (an older worker's data.seq_len)
    opts = dataclasses.replace(options(), tokens_per_step=(16, 32, 64))
    decision = curricula.decide_lengthening(10.0, state, opts)
    assert decision.ok and "from L = [4]" in decision.reason, decision.reason


def test_a_first_pull_on_a_full_disk_is_served_and_its_start_saved_by_the_next_save(tmp_path, caplog):
    """The first pull saves the curriculum's start: on a full disk that write raised StoreError and failed the pull."""
    spec = tiny_spec(curriculum={"policy": "adaptive", "seq_lens": [16, 32], "alpha_inf": 0.3, "tau": 50.0,
                                 "budget_seconds": 100.0})
    store = StateStore(tmp_path)
    real = store.set_many

    def full(values):
        raise StoreError(f"{store.db_path}: cannot write it: database or disk is full", full=True)

    try:
        tracker = curricula.CurriculumTracker(spec, store)
        store.set_many = full
        with caplog.at_level(logging.WARNING, logger="rcswarm.coordinator"):
            tracker.start(5.0)  # before: StoreError, out of the pull
        assert tracker.state.started_at == 5.0 and "start was not saved" in caplog.text
        store.set_many = real
        tracker.advance(9.0, 0)  # a round close's decision saves the state, the start in it
        assert curricula.CurriculumTracker(spec, store).state.started_at == 5.0
    finally:
        store.close()


def test_a_step_of_no_compute_time_is_no_measurement_and_a_zero_cost_does_not_raise(tmp_path):
    """A worker whose compute_seconds did not grow costed its length 0 s/step, and the decision divided by it: every
    round close logged a traceback and the run never lengthened."""
    spec = tiny_spec(curriculum={"policy": "adaptive", "seq_lens": [16, 32], "alpha_inf": 0.3, "tau": 50.0,
                                 "budget_seconds": 100.0})
    store = StateStore(tmp_path)
    try:
        tracker = curricula.CurriculumTracker(spec, store)
        for step in range(1, 5):
            tracker.measure("w1", pb.Metric(version=0, step=step, seq_len=16, batch=4, loss=3.0, tokens=64))
        assert tracker.state.seconds_per_step() == {}
    finally:
        store.close()
    decision = curricula.decide_lengthening(10.0, measured_state(L4=(0.0, 10)), options())  # a state saved before
    assert not decision.ok and "no seconds per step measured at L = 4 yet" in decision.reason


def test_the_last_compute_of_ended_memberships_is_not_kept_for_ever(tmp_path):
    """Each reporting membership left its last compute seconds behind for the coordinator's life: a join token holder
    joining and leaving in a loop grew it without bound (review of the twentieth session). It keeps the most recent
    reporters, at most max(MAX_REMEMBERED_WORKERS, 2 × max_workers), and a reporting worker's steps still cost."""
    spec = tiny_spec(coordinator={"max_workers": 8})
    store = StateStore(tmp_path)
    try:
        tracker = curricula.CurriculumTracker(spec, store)
        for n in range(3 * curricula.MAX_REMEMBERED_WORKERS):
            tracker.measure(f"w{n}", pb.Metric(version=0, step=1, seq_len=16, batch=4, loss=3.0, tokens=64,
                                               compute_seconds=1.0))
            if n % 7 == 0:  # one long-lived worker reports among them
                tracker.measure("steady", pb.Metric(version=0, step=1, seq_len=16, batch=4, loss=3.0, tokens=64,
                                                    compute_seconds=float(n + 1)))
        assert len(tracker._last_compute) == curricula.MAX_REMEMBERED_WORKERS
        assert "steady" in tracker._last_compute and "w0" not in tracker._last_compute
        assert tracker.state.seconds_per_step()[16] == pytest.approx(7.0)  # each of steady's steps: 7 s more
    finally:
        store.close()


def test_a_late_answer_of_a_previous_membership_does_not_change_the_assignment():
    from rcswarm.worker import Worker

    worker = Worker.__new__(Worker)
    worker._assignment_lock = threading.Lock()
    worker._assignment, worker._assignment_owner = pb.TrainingAssignment(seq_len=8, batch_size=2, version=3), "run-b/w1"
    stale = pb.HeartbeatResponse(assignment=pb.TrainingAssignment(seq_len=16, batch_size=4, version=9))
    worker._note_assignment(stale, "run-a/w0")
    assert (worker._assignment.seq_len, worker._assignment.version) == (8, 3)
    worker._note_assignment(stale, "run-b/w1")
    assert (worker._assignment.seq_len, worker._assignment.version) == (16, 9)


def test_worker_lengths_go_round_robin_and_refill_the_emptiest():
    lengths = [4, 8]
    active: list[int] = []
    for _ in range(4):
        length, reason = curricula.decide_worker_length(active, lengths)
        active.append(length)
    assert active == [4, 8, 4, 8] and "worker_seq_lens" in reason
    assert curricula.decide_worker_length([4, 4, 8], lengths)[0] == 8
    # A length listed twice gets twice the workers.
    picks: list[int] = []
    for _ in range(6):
        picks.append(curricula.decide_worker_length(picks, [8, 8, 16])[0])
    assert sorted(picks) == [8, 8, 8, 8, 16, 16]


def test_curriculum_state_round_trips_through_json():
    state = measured_state(rung=1, started_at=12.5, L4=(0.25, 10), L8=(0.5, 5))
    state = curricula.CurriculumState(**{**state.__dict__, "reason": "why", "decided_version": 3})
    assert curricula.CurriculumState.from_json(state.to_json()) == state
    assert state.seconds_per_step() == {4: 0.025, 8: 0.1}


def write_metrics(path, loss, steps=range(1, 400), lengths=(2, 4, 8)):
    """A metrics CSV of one run per length: loss(length, step) at each step, 0.01 s per step per unit of length."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run_id", "step", "seq_len", "loss", "wall_time"])
        for length in lengths:
            for step in steps:
                writer.writerow([f"L{length}", step, length, loss(length, step), step * 0.01 * length])
    return path


def paper_law(alpha_inf: float = 0.3, tau: float = 50.0):
    return lambda length, step: 3.0 * length ** (-alpha_inf * (1 - math.exp(-step / tau)))


def test_the_law_is_fitted_from_a_metrics_file(tmp_path):
    alpha_inf, tau = 0.3, 50.0
    path = write_metrics(tmp_path / "metrics.csv", paper_law(alpha_inf, tau))
    fitted = curricula.law_of(RunSpec.from_dict({"curriculum": {
        "policy": "adaptive", "seq_lens": [2, 4], "law_from": str(path)}}).curriculum)
    assert fitted.schedule.alpha_inf == pytest.approx(alpha_inf, rel=0.05)
    assert fitted.schedule.tau == pytest.approx(tau, rel=0.1)
    assert "fitted to" in fitted.source and "not enough data" not in fitted.source
    with pytest.raises(ValueError, match="curriculum.law_from = .*missing.csv"):
        curricula.fitted_law(tmp_path / "missing.csv")


_NOISE = np.random.default_rng(0)


@pytest.mark.parametrize(("loss", "steps", "lengths", "fragment"), [
    # Every length has the same loss: α∞ ≈ 1e-16 (round-off), so the run would never lengthen.
    (lambda length, step: 2.0, range(1, 400), (2, 4, 8),
     r"α∞ = \S+ is below 0\.001: under this law a longer length never overtakes"),
    # A steady law under which longer lengths are worse: its α∞ < 0 is identified, and it never lengthens either.
    (lambda length, step: 3.0 * length ** (0.3 * (1 - math.exp(-step / 50))), range(1, 400), (2, 4, 8),
     r"α∞ = -0\.3 is below 0\.001"),
    # Noise that does not depend on the length: R² of α(s) ≈ 0.
    (lambda length, step: 2.0 + _NOISE.normal(0, 0.01), range(1, 400), (2, 4, 8), r"R² = \S+ of α\(s\) is below 0\.7"),
    # A clean law, but 57 recorded steps per length: a handful of rounds, not a curve.
    (paper_law(), range(1, 400, 7), (2, 4, 8), r"too few recorded steps .*100 needed"),
    # τ beyond the last recorded step: α(s) has not levelled off, α∞ is an extrapolation.
    (paper_law(tau=2000.0), range(1, 400), (2, 4, 8), r"α∞ is an extrapolation"),
], ids=["all-equal", "longer-is-worse", "no-length-dependence", "too-few-steps", "tau-beyond-the-data"])
def test_a_law_from_fit_that_cannot_decide_is_refused_before_anything_starts(tmp_path, loss, steps, lengths, fragment):
    """A fit `rcswarm fit` marks "not enough data" for α∞, or an α∞ under which a longer length never pays, is
    refused when the coordinator is built (ValueError naming curriculum.law_from, the fitted numbers and what was
    expected; `rcswarm coordinator` turns it into a usage error before it serves), not used to steer a run."""
    path = write_metrics(tmp_path / "metrics.csv", loss, steps, lengths)
    spec = RunSpec.from_dict({**tiny_spec().to_dict(), "curriculum": {
        "policy": "adaptive", "seq_lens": [2, 4], "law_from": str(path)}})
    store = StateStore(tmp_path / "state")
    try:
        with pytest.raises(ValueError, match=fragment) as refused:
            SwarmCoordinator(spec, store)
    finally:
        store.close()
    message = str(refused.value)
    assert message.startswith(f"curriculum.law_from = {str(path)!r}: the fit (α∞ = ")
    assert "τ = " in message and "R² " in message and "expected a fit whose α∞" in message
    assert "curriculum.alpha_inf and curriculum.tau" in message


def test_rcswarm_coordinator_refuses_an_all_equal_law_from_as_a_usage_error_before_it_serves(
    tmp_path, monkeypatch, capsys,
):
    from rcswarm.cli import coordinator as coordinator_cli

    def serve(*args: object, **kwargs: object) -> None:
        raise AssertionError("the coordinator took the law and was about to serve")

    monkeypatch.setattr(coordinator_cli, "RunningCoordinator", serve)
    path = write_metrics(tmp_path / "metrics.csv", lambda length, step: 2.0)
    config = tmp_path / "run.toml"
    config.write_text(RunSpec.from_dict({**tiny_spec().to_dict(), "curriculum": {
        "policy": "adaptive", "seq_lens": [2, 4], "law_from": str(path)}}).to_toml())
    status = coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                   "--token", "t"])
    assert status == 2
    assert f"rcswarm coordinator: curriculum.law_from = {str(path)!r}: the fit (α∞ = " in capsys.readouterr().err


def test_rcswarm_run_refuses_an_all_equal_law_from_before_it_makes_the_run_dir(tmp_path, capsys):
    from rcswarm.cli import run as run_cli

    path = write_metrics(tmp_path / "metrics.csv", lambda length, step: 2.0)
    config = tmp_path / "run.toml"
    config.write_text(RunSpec.from_dict({**tiny_spec().to_dict(), "curriculum": {
        "policy": "adaptive", "seq_lens": [2, 4], "law_from": str(path)}}).to_toml())
    status = run_cli.main([str(config), "--run-dir", str(tmp_path / "run")])
    assert status == 2
    assert f"curriculum.law_from = {str(path)!r}: the fit (α∞ = " in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_law_from_fit_with_fewer_than_3_lengths_is_refused(tmp_path):
    path = write_metrics(tmp_path / "metrics.csv", paper_law(), lengths=(2, 4))
    with pytest.raises(ValueError, match=r"curriculum.law_from = .* is invalid: .*at least 3 distinct lengths"):
        curricula.fitted_law(path)


def test_a_law_from_fit_uncertain_in_tau_alone_is_used_and_says_so(tmp_path, caplog):
    """A noisy law whose τ's interval is wider than τ (docs/RESULTS.md's fitted law had such a caveat) leaves the
    crossovers' timing uncertain but α∞ identified: the law is used, the caveat logged and named in its source
    (GetStatus' curriculum law)."""
    rng = np.random.default_rng(1)
    path = write_metrics(tmp_path / "metrics.csv",
                         lambda length, step: paper_law(tau=150.0)(length, step) * math.exp(rng.normal(0, 0.05)))
    with caplog.at_level("WARNING", logger="rcswarm.coordinator"):
        fitted = curricula.fitted_law(path)
    assert fitted.schedule.alpha_inf == pytest.approx(0.3, rel=0.1)
    assert "not enough data for τ: τ's 90% interval" in fitted.source
    assert "the law is used" in caplog.text


def _write_run_dir(run_dir, spec: RunSpec, rows: list[tuple[int, int, float]]) -> None:
    """A coordinator state dir under `run_dir` holding `spec` and one worker's training rows (version, step, loss)."""
    store = StateStore(run_dir / "state")
    try:
        store.set_many({"run_id": run_dir.name, "spec_json": spec.to_json()})
        length, batch = spec.data.seq_len, spec.data.batch_size
        store.add_metrics([(run_dir.name, "w", version, step, length, batch, loss, length * batch, 0.01 * step,
                            0.01 * step, 0.0, 0, 0, "", 100.0 + 0.01 * step * length) for version, step, loss in rows])
    finally:
        store.close()


def test_the_law_is_fitted_from_a_directory_of_fixed_length_run_dirs(tmp_path):
    """law_from = a directory holding one run dir per fixed length (issue #30's benchmark: one seed's fixed runs) fits
    one law across them; a curriculum's run dir among them (several lengths in one run) is a clear error."""
    alpha_inf, tau, inner = 0.3, 50.0, 5
    for length in (2, 4, 8):
        rows = [((step - 1) // inner, step, 3.0 * length ** (-alpha_inf * (1 - math.exp(-step / tau))))
                for step in range(1, 400)]
        _write_run_dir(tmp_path / "sweep" / f"fixed{length}",
                       tiny_spec(data={"seq_len": length}, inner={"steps": inner}), rows)
    fitted = curricula.fitted_law(tmp_path / "sweep")
    assert fitted.schedule.alpha_inf == pytest.approx(alpha_inf, rel=0.05)
    assert fitted.schedule.tau == pytest.approx(tau, rel=0.1)
    adaptive = RunSpec.from_dict({**tiny_spec(data={"seq_len": 2}, inner={"steps": inner}).to_dict(), "curriculum": {
        "policy": "adaptive", "seq_lens": [2, 4], "alpha_inf": 0.3, "tau": 50.0}})
    _write_run_dir(tmp_path / "sweep" / "adaptive", adaptive, [(0, 1, 2.0), (0, 2, 1.9)])
    store = StateStore(tmp_path / "sweep" / "adaptive" / "state")
    try:
        store.add_metrics([("adaptive", "w", 1, 3, 4, 4, 1.8, 16, 0.03, 0.03, 0.0, 0, 0, "", 200.0)])
    finally:
        store.close()
    with pytest.raises(ValueError, match=r"curriculum.law_from = .*sweep.* run 'adaptive' has length 4, expected 2"):
        curricula.fitted_law(tmp_path / "sweep")


@pytest.mark.parametrize(
    "table, fragment",
    [
        ({"policy": "greedy"}, "curriculum.policy = 'greedy'"),
        ({"policy": "adaptive", "seq_lens": [4, 4, 8], "alpha_inf": 1.0, "tau": 1.0}, "curriculum.seq_lens = [4, 4, 8]"),
        ({"policy": "adaptive", "seq_lens": [8, 4], "alpha_inf": 1.0, "tau": 1.0}, "curriculum.seq_lens = [8, 4]"),
        ({"policy": "adaptive", "seq_lens": [4, 8], "alpha_inf": 1.0, "tau": 1.0, "budget_seconds": 0.0},
         "curriculum.budget_seconds = 0.0"),
        ({"budget_seconds": -5.0}, "curriculum.budget_seconds = -5.0"),
        ({"worker_seq_lens": [8, 0]}, "curriculum.worker_seq_lens = [8, 0]"),
        ({"policy": "adaptive", "seq_lens": [4, 8]}, "curriculum.alpha_inf = 0.0"),
        ({"policy": "adaptive", "seq_lens": [4], "alpha_inf": 1.0, "tau": 1.0}, "curriculum.seq_lens = [4]"),
        ({"seq_lens": [4, 8]}, "curriculum.seq_lens = [4, 8]"),
        ({"policy": "adaptive", "seq_lens": [4, 8], "alpha_inf": 1.0, "tau": 1.0, "worker_seq_lens": [4]},
         "curriculum.worker_seq_lens = [4]"),
        ({"schedule": [[0, 8, 2]], "worker_seq_lens": [4]}, "curriculum.worker_seq_lens = [4]"),
        ({"policy": "adaptive", "seq_lens": [4, 8], "tau": 1.0, "alpha_inf": 1.0, "law_from": "runs/x"},
         "curriculum.law_from = 'runs/x'"),
    ],
)
def test_bad_curricula_name_the_key_and_value(table, fragment):
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_dict({"curriculum": table})
    assert fragment in str(excinfo.value)


def test_a_curriculum_that_varies_lengths_refuses_a_sweep_and_a_diag_task():
    with pytest.raises(ValueError, match=r"sweep.seq_lens = \[2, 4\]"):
        RunSpec.from_dict({"sweep": {"seq_lens": [2, 4]}, "curriculum": {"worker_seq_lens": [4, 8]}})
    with pytest.raises(ValueError, match="curriculum.worker_seq_lens"):
        RunSpec.from_dict({"data": {"source": "diag", "task": "s5"}, "curriculum": {"worker_seq_lens": [4, 8]}})


def test_constant_tokens_scales_the_batch_from_the_first_length():
    section = RunSpec.from_dict({"curriculum": {"worker_seq_lens": [4, 8, 16], "constant_tokens": True}}).curriculum
    assert [section.batch_for(length, 8) for length in (4, 8, 16)] == [8, 4, 2]
    fixed = RunSpec.from_dict({"curriculum": {"worker_seq_lens": [4, 8]}}).curriculum
    assert fixed.batch_for(8, 8) == 8


def _push_zero(coordinator: SwarmCoordinator, member: pb.JoinResponse, version: int, tokens: int) -> pb.PushUpdateResponse:
    deltas = {name: torch.zeros_like(p) for name, p in coordinator.params.items()}
    header, chunks = tensor_stream.build_payload(deltas, codec=pb.CODEC_FP32, run_id=coordinator.run_id, version=version)
    messages = [pb.PushUpdateRequest(meta=pb.UpdateMeta(**creds(member), base_version=version, tokens=tokens)),
                pb.PushUpdateRequest(header=header), *[pb.PushUpdateRequest(chunk=c) for c in chunks]]
    return coordinator.push(iter(messages))


def test_the_coordinator_assigns_a_fixed_schedule_by_version(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32"}, inner={"steps": 5}, curriculum={"schedule": [[0, 16, 4], [5, 32, 2]]})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    try:
        joined = coordinator.join(pb.JoinRequest(worker_name="a"))
        assert (joined.assignment.seq_len, joined.assignment.batch_size, joined.assignment.version) == (16, 4, 0)
        list(coordinator.pull(pb.PullParametersRequest(**creds(joined))))
        _push_zero(coordinator, joined, 0, 64)
        beat = coordinator.heartbeat(pb.HeartbeatRequest(**creds(joined)))
        assert (beat.assignment.seq_len, beat.assignment.batch_size, beat.assignment.version) == (32, 2, 1)
        assert "curriculum.schedule at step 5" in beat.assignment.reason
        assert coordinator.status().curriculum.seq_len == 32
    finally:
        coordinator.close()


def test_an_adaptive_decision_is_persisted_and_survives_a_restart(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32"}, inner={"steps": 5}, data={"batch_size": 4}, curriculum={
        "policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 2.0, "tau": 1.0, "budget_seconds": 100.0,
        "constant_tokens": True})
    now = [1000.0]
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path), clock=lambda: now[0])
    try:
        joined = coordinator.join(pb.JoinRequest(worker_name="a"))
        assert (joined.assignment.seq_len, joined.assignment.batch_size) == (4, 4)
        list(coordinator.pull(pb.PullParametersRequest(**creds(joined))))
        rows = [pb.Metric(version=0, seq_len=4, batch=4, tokens=0, compute_seconds=0.0, loss=math.nan)]
        rows += [pb.Metric(version=0, step=k, seq_len=4, batch=4, tokens=16, compute_seconds=0.01 * k, loss=5.0)
                 for k in range(1, 6)]
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(joined), metrics=rows))
        now[0] = 1005.0
        _push_zero(coordinator, joined, 0, 80)
        beat = coordinator.heartbeat(pb.HeartbeatRequest(**creds(joined)))
        assert (beat.assignment.seq_len, beat.assignment.batch_size, beat.assignment.version) == (8, 2, 1)
        assert "lengthens L = 4 -> 8" in beat.assignment.reason
        status = coordinator.status().curriculum
        assert (status.policy, status.seq_len, status.rung, status.decided_version) == ("adaptive", 8, 1, 0)
        assert status.seconds_per_step[4] == pytest.approx(0.01)
        assert status.elapsed_seconds == pytest.approx(5.0)
        console = Console(record=True, width=200)
        status_report(coordinator.status(), console)
        printed = console.export_text()
        assert "adaptive" in printed and "8 × 2" in printed and "L=4: 0.01" in printed and "lengthens" in printed
    finally:
        coordinator.close()
    # A restart may extend the budget; the rung and the last decision stay.
    longer_budget = dataclasses.replace(spec, curriculum=dataclasses.replace(spec.curriculum, budget_seconds=500.0))
    restarted = SwarmCoordinator(longer_budget, StateStore(tmp_path), clock=lambda: now[0])
    try:
        after = restarted.status().curriculum
        assert (after.seq_len, after.batch_size, after.rung, after.reason) == (8, 2, 1, status.reason)
        assert after.budget_seconds == 500.0
        assert restarted.join(pb.JoinRequest(worker_name="b")).assignment.seq_len == 8
        events = read_state(restarted.store.state_dir, lambda store: store.events("curriculum"))
        assert len(events) == 1 and "lengthens" in events[0].reason
    finally:
        restarted.close()


def test_workers_of_different_paces_train_their_own_rungs_through_a_restart(tmp_path):
    """Issue #30 through the coordinator: a round close decides each worker on its own pace, each heartbeat carries
    the worker's own length, the token bound admits the longer one's update, and a re-join after a restart naming
    its previous membership resumes its rung while a newcomer starts at the run's (the lowest a worker trains)."""
    spec = tiny_spec(sync={"codec": "fp32"}, inner={"steps": 5}, data={"batch_size": 4}, curriculum={
        "policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 0.3, "tau": 100.0, "budget_seconds": 1000.0})
    now = [1000.0]
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path), clock=lambda: now[0])
    try:
        fast, slow = (coordinator.join(pb.JoinRequest(worker_name=name)) for name in ("fast", "slow"))
        for member, pace in ((fast, 0.1), (slow, 0.3)):
            list(coordinator.pull(pb.PullParametersRequest(**creds(member))))
            rows = [pb.Metric(version=0, seq_len=4, batch=4, tokens=0, compute_seconds=0.0, loss=math.nan)]
            rows += [pb.Metric(version=0, step=k, seq_len=4, batch=4, tokens=16, compute_seconds=pace * k, loss=5.0)
                     for k in range(1, 6)]
            coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=rows))
        # 20 s in: past the fast worker's crossover (13.9 s at 0.1 s/step), before the slow one's (41.6 s at 0.3).
        now[0] = 1020.0
        _push_zero(coordinator, fast, 0, 80)
        _push_zero(coordinator, slow, 0, 80)
        lengths = [coordinator.heartbeat(pb.HeartbeatRequest(**creds(m))).assignment.seq_len for m in (fast, slow)]
        assert lengths == [8, 4]
        status = coordinator.status()
        assert (status.curriculum.rung, status.curriculum.seq_len) == (0, 4)
        assert sorted(w.assignment.seq_len for w in status.workers) == [4, 8]
        list(coordinator.pull(pb.PullParametersRequest(**creds(fast))))
        assert _push_zero(coordinator, fast, 1, 8 * 4 * 5).accepted
    finally:
        coordinator.close()
    restarted = SwarmCoordinator(spec, StateStore(tmp_path), clock=lambda: now[0])
    try:
        back = restarted.join(pb.JoinRequest(worker_name="fast", **previous(fast)))
        newcomer = restarted.join(pb.JoinRequest(worker_name="new"))
        assert (back.assignment.seq_len, newcomer.assignment.seq_len) == (8, 4)
    finally:
        restarted.close()


def test_extrapolation_through_three_lengths_is_the_least_squares_line():
    lengths = [2, 4, 8]
    costs = {length: 0.1 + 0.05 * length for length in lengths}
    value, note = curricula.estimate_seconds_per_step(costs, 16)
    assert value == pytest.approx(float(np.polyval([0.05, 0.1], 16))) and "[2, 4, 8]" in note
