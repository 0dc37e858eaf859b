"""The held-out loss measured along the way (`[run] eval_every`, issue #30): pull rows carrying it are recorded (a
version's loss is the median of its workers' first reports, so one lying worker among three does not set it),
refused out of range with nothing stored, shown in the status, fitted by the forecasts once they support a fit, and
kept across a coordinator restart (whose eval_seq_len may not change); bad config keys are refused with a message."""

from __future__ import annotations

import math

import pytest

from rcswarm.coordinator.forecasts import forecast_record
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.sweep import open_group
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import creds, deltas_of, push
from tests.helpers.dashboard import Clock
from tests.helpers.specs import tiny_spec

ROUNDS = 16
EVERY = 2
LENGTH = 32  # tiny_spec's data.seq_len: the one length these runs assign


def val_loss(v: float) -> float:
    return 1.5 + 2.0 * v ** -0.5 if v > 0 else 5.5


def train_loss(x: float) -> float:
    return 1.0 + 2.0 * x ** -0.5


def run_rounds(group, member: pb.JoinResponse, clock: Clock, rounds: int) -> None:
    """`rounds` real rounds: the pull row of θ_v (its held-out loss where v is a multiple of EVERY), training rows,
    the update; the group ticked after each."""
    run = group.runs[0]
    for _ in range(rounds):
        v = run.version
        pull = pb.Metric(version=v, step=v * 5, seq_len=LENGTH, batch=4, loss=math.nan, tokens=0, param_sha256="ab",
                         **({"val_loss": val_loss(v), "val_seconds": 0.25} if v % EVERY == 0 else {}))
        rows = [pb.Metric(version=v, step=v * 5 + k, seq_len=LENGTH, batch=4, loss=train_loss(v + 1), tokens=4 * LENGTH,
                          wall_time=float(v), compute_seconds=float(v)) for k in range(1, 4)]
        group.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[pull, *rows], run_id=member.run_id))
        push(run, member, deltas_of(run, 0.0), tokens=128)
        clock.now += 1.0
        run.tick()
        group.tick()


def spec(**run: object):
    return tiny_spec(run={"rounds": ROUNDS, "eval_every": EVERY, **run}, sync={"min_reports": 1})


def test_held_out_losses_are_recorded_shown_forecast_and_survive_a_restart(tmp_path):
    clock = Clock(1000.0)
    group = open_group(spec(), tmp_path, clock)
    member = group.join(pb.JoinRequest(worker_name="a"))
    run_rounds(group, member, clock, 14)
    # The same worker's second measurement of a version it measured is not kept (its first is).
    late = pb.Metric(version=4, step=999, seq_len=LENGTH, batch=4, loss=math.nan, val_loss=9.0, val_seconds=0.1)
    group.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[late], run_id=member.run_id))
    held = group.runs[0].store.held_out_losses()
    assert [r.version for r in held] == list(range(0, 14, EVERY))
    assert [r.loss for r in held] == pytest.approx([val_loss(r.version) for r in held])
    assert all(r.seconds == 0.25 and r.worker_id == member.worker_id and r.reports == 1 for r in held)
    status = group.status()
    assert status.val_version == 12 and status.val_loss == pytest.approx(val_loss(12))
    # v = 2..12 are 6 usable points: the forecast is of the held-out loss, near the law at the budget.
    assert status.forecast.basis == "held-out" and status.forecast.note == ""
    assert status.forecast.loss == pytest.approx(val_loss(ROUNDS), abs=0.02)
    assert status.forecast.low <= status.forecast.loss <= status.forecast.high
    forecasts = group.runs[0].store.forecasts()
    assert forecasts[0].basis == "training" and forecasts[-1].basis == "held-out"
    group.close()
    with pytest.raises(ValueError, match=r"run\.eval_seq_len"):  # its windows may not: the curve would mix two sets
        open_group(spec(eval_seq_len=64), tmp_path, clock)
    with pytest.raises(ValueError, match=r"run\.eval_set"):  # nor its batches
        open_group(spec(eval_set="rotating"), tmp_path, clock)
    restarted = open_group(spec(eval_every=4), tmp_path, clock)  # eval_every may change on a restart
    assert restarted.runs[0].store.held_out_losses() == held
    again = restarted.status()
    assert (again.val_version, again.val_loss, again.forecast.basis) == (12, status.val_loss, "held-out")
    assert repr(restarted.runs[0].store.forecasts()) == repr(forecasts)
    restarted.close()


def test_the_held_out_loss_of_a_version_is_the_median_of_its_workers_reports(tmp_path):
    """Every worker measures the same θ_v on the same held-out batches, so honest reports agree (to the last digits
    their devices round differently); a lying or broken worker that reports first no longer sets the loss the
    status, the forecasts and the pruning read: the median of the first MAX_HELD_OUT_REPORTS workers' first reports
    does, kept across a restart."""
    group = open_group(spec(), tmp_path, Clock(1000.0))

    def report(name: str, loss: float) -> str:
        member = group.join(pb.JoinRequest(worker_name=name)) if name not in members else members[name]
        members[name] = member
        pull = pb.Metric(version=0, step=0, seq_len=LENGTH, batch=4, loss=math.nan, tokens=0, val_loss=loss,
                         val_seconds=0.25)
        group.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[pull], run_id=member.run_id))
        return member.worker_id

    def held():
        return [(r.version, r.loss, r.reports, r.worker_id) for r in group.runs[0].store.held_out_losses()]

    members: dict[str, pb.JoinResponse] = {}
    honest = val_loss(0)
    report("liar", 0.01)
    assert group.status().val_loss == 0.01  # one report is all there is
    report("a", honest)
    assert group.status().val_loss == pytest.approx((0.01 + honest) / 2)  # two: their mean
    b = report("b", honest + 1e-6)
    assert group.status().val_loss == honest  # the liar among three is outvoted (it was the first report's, 0.01)
    assert held() == [(0, honest, 3, members["a"].worker_id)]
    report("a", 9.0)  # a worker's second report of a version is not kept
    assert held() == [(0, honest, 3, members["a"].worker_id)]
    group.close()
    group = open_group(spec(), tmp_path, Clock(1000.0))
    assert held() == [(0, honest, 3, members["a"].worker_id)]
    members.clear()
    report("c", honest + 2e-6)
    report("d", 50.0)  # a second liar among five is outvoted too
    assert held() == [(0, honest + 1e-6, 5, b)]
    report("e", 0.02)  # a version keeps its first 5 reports
    assert held() == [(0, honest + 1e-6, 5, b)] and group.status().val_loss == honest + 1e-6
    group.close()


@pytest.mark.parametrize(("fields", "match"), [
    ({"val_loss": math.nan}, "val_loss"), ({"val_loss": -1.0}, "val_loss"), ({"val_loss": 1e5}, "val_loss"),
    ({"val_loss": math.inf}, "val_loss"), ({"val_loss": 2.0, "val_seconds": math.inf}, "val_seconds"),
    ({"val_loss": 2.0, "val_seconds": -1.0}, "val_seconds"),
])
def test_a_held_out_loss_out_of_range_is_refused_and_nothing_is_stored(tmp_path, fields, match):
    group = open_group(spec(), tmp_path, Clock(1000.0))
    member = group.join(pb.JoinRequest(worker_name="a"))
    good = pb.Metric(version=0, step=1, seq_len=LENGTH, batch=4, loss=2.0, tokens=4 * LENGTH)
    bad = pb.Metric(version=0, step=0, seq_len=LENGTH, batch=4, loss=math.nan, **fields)
    with pytest.raises(Refusal, match=f"metrics\\[1\\].{match} = .* is out of range") as refused:
        group.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[good, bad], run_id=member.run_id))
    assert refused.value.code.name == "INVALID_ARGUMENT"
    assert group.runs[0].store.held_out_losses() == [] and group.runs[0].store.metric_rows() == []
    group.close()


def test_a_forecast_falls_back_to_the_training_loss_while_the_held_out_losses_are_too_few():
    losses = [(v, train_loss(v + 1)) for v in range(20)]
    few = [(v, val_loss(v)) for v in (0, 4, 8)]
    made = forecast_record(20, now=1200.0, started_at=1000.0, rounds=40, round_losses=losses, held_out=few)
    assert made.basis == "training" and made.note == ""
    assert made.loss == pytest.approx(train_loss(40), abs=0.01)
    # Measurements of versions the run has not reached are not fitted.
    future = [(v, val_loss(v)) for v in range(2, 40, 2)]
    assert forecast_record(8, 1200.0, 1000.0, 40, losses[:4], held_out=future).note.startswith("not enough data")
    held = forecast_record(20, 1200.0, 1000.0, 40, losses, held_out=future)
    assert held.basis == "held-out" and held.loss == pytest.approx(val_loss(40), abs=0.01)


@pytest.mark.parametrize(("run", "match"), [
    ({"eval_every": -1}, "run.eval_every = -1"), ({"eval_every": True}, "run.eval_every = True"),
    ({"eval_every": 2.5}, "run.eval_every = 2.5"), ({"eval_batches": 0}, "run.eval_batches = 0"),
    ({"eval_batches": 65}, "between 1 and 64"), ({"eval_batches": "4"}, "run.eval_batches = '4'"),
    ({"eval_seq_len": -1}, r"run.eval_seq_len = -1 .*>= 0 \(0 = data.seq_len\)"),
    ({"eval_seq_len": True}, "run.eval_seq_len = True"), ({"eval_seq_len": 64.0}, "run.eval_seq_len = 64.0"),
    ({"eval_set": "random"}, "run.eval_set = 'random'.*'fixed', 'rotating'"),
])
def test_bad_eval_keys_are_refused_with_the_key_and_what_was_expected(run, match):
    with pytest.raises(ValueError, match=match):
        tiny_spec(run=run)


def test_status_and_metrics_show_the_newest_held_out_loss(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    from rich.console import Console

    from rcswarm.cli import status as status_cli
    from rcswarm.coordinator.server import RunningCoordinator
    from tests.helpers.dashboard import get
    from tests.helpers.specs import TOKEN

    clock = Clock(1000.0)
    group = open_group(spec(), tmp_path, clock)
    member = group.join(pb.JoinRequest(worker_name="a"))
    run_rounds(group, member, clock, 14)
    console = Console(width=200, record=True)
    status_cli.report(group.status(), console)
    shown = console.export_text()
    assert "held-out loss (along the way)" in shown and f"{val_loss(12):.4g} (θ_12)" in shown
    assert "forecast of the final held-out loss (90%)" in shown and "held-out: " in shown
    running = RunningCoordinator(group, TOKEN, http_port=0).start()
    try:
        metrics = get(running.dashboard.url + "metrics")[2].decode()
        families = {f.name: f for f in text_string_to_metric_families(metrics)}
        page = get(running.dashboard.url)[2].decode()
    finally:
        running.stop(grace=0.5)
    assert [s.value for s in families["rcswarm_val_loss"].samples] == pytest.approx([val_loss(12)])
    assert [s.value for s in families["rcswarm_val_loss_version"].samples] == [12.0]
    assert "held-out: " in page
