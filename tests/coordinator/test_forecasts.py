"""Forecasts per run and the sweep's pruning (coordinator/forecasts.py, RunGroup): the pure decision with a fake
clock, the forecast record, and a real in-process sweep whose losing length is pruned at a fraction of the
budget, its worker moved, with its rounds and metric rows kept and its forecasts surviving a restart."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.forecasts import (
    PruneOptions,
    RunView,
    budget_round,
    decide_budget_end,
    decide_prune,
    forecast_record,
)
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.sweep import SweepCoordinator, open_group
from rcswarm.observe.forecast import BUDGET_ENDED, describe
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import ForecastRecord
from rcswarm.sync import tensor_stream
from tests.helpers.coordinator import creds, deltas_of, previous
from tests.helpers.dashboard import Clock
from tests.helpers.forecasts import ROUNDS, good_loss, pruned_sweep, pruning_spec, train_round
from tests.helpers.specs import tiny_spec

OPTIONS = PruneOptions(True, (0.25, 0.5), 40)


def record(loss: float, low: float, high: float, note: str = "") -> ForecastRecord:
    return ForecastRecord(10, 0.0, 1.0, 40, loss, low, high, math.nan, math.nan, math.nan, math.nan, note)


def views(*forecasts: ForecastRecord | None, version: int = 10, stopped: tuple[int, ...] = ()) -> list[RunView]:
    return [RunView(i, f"L={8 << i}", version, i in stopped, f) for i, f in enumerate(forecasts)]


def test_prune_waits_for_every_run_to_reach_the_fraction():
    runs = views(record(1.0, 0.9, 1.1), record(2.0, 1.9, 2.1))
    assert decide_prune(0.0, runs[:1] + [RunView(1, "L=16", 9, False, runs[1].forecast)], OPTIONS, 0) is None
    assert decide_prune(0.0, runs, PruneOptions(False, (0.25,), 40), 0) is None
    assert decide_prune(0.0, runs, OPTIONS, 2) is None  # every fraction decided


def test_prune_stops_a_confidently_worse_run_and_says_why_for_every_run():
    decision = decide_prune(5.0, views(record(1.0, 0.9, 1.1), record(2.0, 1.9, 2.1)), OPTIONS, 0)
    assert decision is not None and decision.stop == (1,) and decision.now == 5.0 and decision.checkpoint == 0
    reasons = dict(decision.reasons)
    assert "best forecast" in reasons[0] and "pruned" in reasons[1] and "at 25% of the budget (round 10)" in reasons[1]


def test_overlapping_intervals_and_runs_without_forecasts_are_kept():
    overlap = decide_prune(0.0, views(record(1.0, 0.9, 1.1), record(1.08, 0.98, 1.2)), OPTIONS, 0)
    assert overlap.stop == () and "is not above" in dict(overlap.reasons)[1]
    # Intervals that overlap but whose difference is positive at 90 % (0.15 apart, each σ ≈ 0.061): pruned.
    apart = decide_prune(0.0, views(record(1.0, 0.9, 1.1), record(1.15, 1.05, 1.3)), OPTIONS, 0)
    assert apart.stop == (1,) and "at 90% confidence" in dict(apart.reasons)[1]
    short = record(math.nan, math.nan, math.nan, "not enough data: 3 usable rounds")
    missing = decide_prune(0.0, views(record(1.0, 0.9, 1.1), None, short), OPTIONS, 0)
    assert missing.stop == ()
    assert "no forecast yet" in dict(missing.reasons)[1] and "not enough data" in dict(missing.reasons)[2]
    none = decide_prune(0.0, views(None, None), OPTIONS, 0)
    assert none.stop == () and all("all kept" in reason for _, reason in none.reasons)


def test_only_forecasts_of_one_basis_are_compared():
    """A run whose forecast turned held-out (a round ahead) was pruned against one still forecasting its training
    loss, for a gap that is the generalization gap, not a worse length."""
    held_out = dataclasses.replace(record(2.54, 2.52, 2.56), basis="held-out")
    mixed = decide_prune(0.0, views(held_out, record(2.45, 2.43, 2.48)), OPTIONS, 0)
    assert mixed.stop == ()
    assert dict(mixed.reasons)[0].endswith("has the best held-out forecast 2.5400 [2.5200, 2.5600]; kept")
    assert "has the best training forecast" in dict(mixed.reasons)[1]
    # Within one basis a confidently worse run is still pruned, whatever the other basis holds.
    three = decide_prune(0.0, views(held_out, record(2.45, 2.43, 2.48), record(2.9, 2.85, 2.95)), OPTIONS, 0)
    assert three.stop == (2,) and "its training forecast 2.9000" in dict(three.reasons)[2]


def test_a_run_that_completed_its_rounds_is_not_pruned():
    done = [RunView(0, "L=8", 20, False, record(1.0, 0.9, 1.1)), RunView(1, "L=16", 40, False, record(2.0, 1.9, 2.1))]
    decision = decide_prune(0.0, done, OPTIONS, 0)
    assert decision.stop == () and "completed its 40 rounds" in dict(decision.reasons)[1]


def test_at_most_half_of_the_runs_still_in_are_pruned_at_once_and_stopped_runs_do_not_count():
    four = views(record(1.0, 0.95, 1.05), record(2.0, 1.9, 2.1), record(3.0, 2.9, 3.1), record(4.0, 3.9, 4.1))
    decision = decide_prune(0.0, four, OPTIONS, 0)
    assert decision.stop == (3, 2)  # the worst first
    assert "at most half" in dict(decision.reasons)[1]
    later = decide_prune(0.0, views(*(run.forecast for run in four), version=20, stopped=(2, 3)), OPTIONS, 1)
    assert later.stop == (1,) and {index for index, _ in later.reasons} == {0, 1}


def test_forecast_record_fits_complete_rounds_and_turns_rounds_into_seconds():
    losses = [(v, 1.0 + 2.0 * (v + 1) ** -0.5) for v in range(20)]
    made = forecast_record(20, now=1200.0, started_at=1000.0, rounds=40, round_losses=losses, target_loss=1.3)
    assert made.note == "" and made.low <= made.loss <= made.high
    assert made.loss == pytest.approx(1.0 + 2.0 * 40 ** -0.5, abs=0.01)
    # 10 s per round; the law reaches 1.3 at x = (2 / 0.3)^2 ≈ 44.4 rounds.
    assert made.target_seconds == pytest.approx(444, rel=0.1)
    early = forecast_record(5, now=1050.0, started_at=1000.0, rounds=40, round_losses=losses)
    assert "not enough data" in early.note and math.isnan(early.loss)  # versions 0..3 only: 4 rounds


def diverging_and_healthy(rise: float = 1.0, floor: float = 1.30) -> list[RunView]:
    """At round 32 of 64: a run whose loss rises 0.5 → 0.5 + `rise` and one falling to about `floor` + 0.05."""
    rng = np.random.default_rng(1)
    x = np.arange(1, 33, dtype=float)  # versions 0..31, x = v + 1
    diverging = 0.5 + rise * (x - 1) / 31 + rng.normal(0.0, 0.01, 32)
    healthy = floor + 1.5 * x ** -0.8 + rng.normal(0.0, 0.01, 32)
    runs = []
    for index, (name, losses) in enumerate((("L=64", diverging), ("L=128", healthy))):
        made = forecast_record(32, now=1000.0, started_at=0.0, rounds=64,
                               round_losses=list(enumerate(losses.tolist())))
        runs.append(RunView(index, name, 32, False, made))
    return runs


def test_a_diverging_run_gets_no_forecast_and_is_pruned_when_its_level_is_above_the_best():
    """A run whose loss rises 0.5 → 1.49 was forecast 1.229 [0.589, 1.260], below its last 4 losses, and as the
    best run it had the healthy one (2.8 → 1.38, falling) pruned; then, with no forecast, it was never pruned at all.
    Now it has no forecast but its newest level (about 1.47, the low end above the healthy run's 1.35 forecast's
    upper end) prunes it."""
    runs = diverging_and_healthy()
    assert "the loss is not falling" in runs[0].forecast.note and math.isnan(runs[0].forecast.loss)
    assert runs[0].forecast.level == pytest.approx(1.47, abs=0.02)  # the newest round fitted: x = 31
    assert runs[0].forecast.level_low < runs[0].forecast.level
    assert runs[1].forecast.note == "" and runs[1].forecast.loss == pytest.approx(1.35, abs=0.01)
    assert math.isnan(runs[1].forecast.level)
    decision = decide_prune(1000.0, runs, PruneOptions(True, (0.5,), 64), 0)
    assert decision.stop == (0,)
    reasons = dict(decision.reasons)
    assert "L=64 pruned: its loss is not falling and its newest level 1.4" in reasons[0]
    assert "L=128 has the best forecast" in reasons[1]


def test_a_diverging_run_still_below_the_best_forecast_is_kept():
    """The same rise from 0.5 to about 0.8: still below the healthy run's forecast of about 1.35, kept."""
    runs = diverging_and_healthy(rise=0.3)
    assert "the loss is not falling" in runs[0].forecast.note and runs[0].forecast.level < 1.0
    decision = decide_prune(1000.0, runs, PruneOptions(True, (0.5,), 64), 0)
    assert decision.stop == () and "L=64 kept: the loss is not falling" in dict(decision.reasons)[0]


def test_diverging_runs_are_pruned_first_at_most_half_and_never_alone():
    """Level low ends above the best's upper end are pruned before confidently worse forecasts; half at most; a
    sweep where no run has a forecast keeps every run."""
    rising = "the loss is not falling over rounds 16..32: it rises"

    def diverging(level: float) -> ForecastRecord:
        return dataclasses.replace(record(math.nan, math.nan, math.nan, rising), level=level, level_low=level - 0.1)
    runs = views(record(1.0, 0.9, 1.1), record(2.0, 1.9, 2.1), diverging(3.0), diverging(1.15))
    decision = decide_prune(0.0, runs, OPTIONS, 0)
    assert decision.stop == (2, 1)  # 3.0 diverging first; 1.15 − 0.1 is not above 1.1: kept
    reasons = dict(decision.reasons)
    assert "L=32 pruned: its loss is not falling" in reasons[2] and "L=64 kept: the loss is not falling" in reasons[3]
    crowded = decide_prune(0.0, views(record(1.0, 0.9, 1.1), diverging(3.0), diverging(4.0)), OPTIONS, 0)
    assert crowded.stop == (2,) and "at most half of the 3 runs" in dict(crowded.reasons)[1]
    alone = decide_prune(0.0, views(diverging(3.0), diverging(4.0)), OPTIONS, 0)
    assert alone.stop == () and "no run has a forecast yet" in dict(alone.reasons)[0]


def test_a_slowly_falling_run_whose_newest_rounds_drift_up_is_not_pruned_as_diverging():
    """A run falling as 2 + 0.3·x^−0.3 (2.061 at round 200) beside a flat 2.09, both with correlated noise (AR(1),
    ρ 0.7, σ 0.02), at round 100 of 200: its newest rounds sometimes drift up enough to be "not falling"; its level's
    low end must not then rank it above the flat run it ends below (once the scatter as the margin: 1 of these 100)."""
    rng = np.random.default_rng(0)
    x = np.arange(1, 100, dtype=float)
    for seed in range(100):
        runs = []
        for index, law in enumerate((2 + 0.3 * x ** -0.3, np.full_like(x, 2.09))):
            noise = np.zeros_like(x)
            shocks = rng.normal(0.0, 0.02 * math.sqrt(1 - 0.7**2), len(x))
            for k in range(len(x)):
                noise[k] = 0.7 * (noise[k - 1] if k else 0.0) + shocks[k]
            made = forecast_record(100, 1000.0, 0.0, 200, list(enumerate((law + noise).tolist())), seed=seed)
            runs.append(RunView(index, f"L={16 << index}", 100, False, made))
        assert 0 not in decide_prune(0.0, runs, PruneOptions(True, (0.5,), 200), 0).stop, seed


def test_a_diverging_run_is_compared_only_with_forecasts_of_its_basis():
    rising = dataclasses.replace(record(math.nan, math.nan, math.nan, "the loss is not falling"), basis="held-out",
                                 level=5.0, level_low=4.9)
    decision = decide_prune(0.0, views(record(1.0, 0.9, 1.1), rising), OPTIONS, 0)
    assert decision.stop == ()


def test_a_rising_held_out_loss_is_no_forecast_rather_than_the_training_loss_one():
    """A run that overfits (held-out loss rising 2.0 → 2.6 while its training loss falls) keeps the held-out basis
    with a note: falling back to its training forecast would compare it against runs on the training basis."""
    training = [(v, 1.0 + 2.0 * (v + 1) ** -0.5) for v in range(30)]
    held_out = [(v, 2.0 + 0.02 * v) for v in range(0, 31, 2)]
    made = forecast_record(30, now=1300.0, started_at=1000.0, rounds=60, round_losses=training, held_out=held_out)
    assert made.basis == "held-out" and "the loss is not falling" in made.note and math.isnan(made.loss)
    falling = [(v, 2.0 + 2.0 * (v + 1) ** -0.5) for v in range(0, 31, 2)]
    assert forecast_record(30, 1300.0, 1000.0, 60, training, held_out=falling).basis == "held-out"


def test_a_sweep_prunes_its_losing_length_moves_its_worker_and_keeps_its_rounds_and_forecasts(tmp_path):
    clock = Clock(1000.0)
    sweep, good, bad = pruned_sweep(tmp_path, clock)
    assert sweep.runs[1].stopped and "pruned" in sweep.runs[1].stopped and sweep.runs[1].finished
    assert not sweep.runs[0].finished and sweep.prune_done == 1
    status = sweep.status()
    assert status.runs[1].forecast.stopped == sweep.runs[1].stopped
    assert status.runs[0].forecast.loss == pytest.approx(good_loss(ROUNDS), abs=0.02)
    # The pruned run's worker is told to join again, and lands on the run still going.
    with pytest.raises(Refusal, match="its run was stopped"):
        sweep.heartbeat(pb.HeartbeatRequest(**creds(bad)))
    moved = sweep.join(pb.JoinRequest(worker_name="b", run_id=bad.run_id, **previous(bad)))
    assert moved.run_id == good.run_id
    # Nothing of the pruned run was lost: its 8 rounds, its 24 metric rows, and every run's reason.
    pruned_store = sweep.runs[1].store
    assert len(pruned_store.rounds()) == 8 and len(pruned_store.metric_rows()) == 24
    assert [e.reason for e in pruned_store.events("prune")] == [sweep.runs[1].stopped]
    assert "best forecast" in sweep.runs[0].store.events("prune")[0].reason
    forecasts = [run.store.forecasts() for run in sweep.runs]
    sweep.close()
    # A restarted coordinator has the forecasts, the stop and the decisions made.
    restarted = SweepCoordinator(pruning_spec(prune=True, prune_at=[0.5]), tmp_path, clock)
    assert repr([run.store.forecasts() for run in restarted.runs]) == repr(forecasts)  # NaN where not enough data
    assert restarted.runs[1].finished and restarted.prune_done == 1
    assert repr(restarted.latest[0]) == repr(forecasts[0][-1]) and forecasts[0][-1].note == ""
    restarted.close()


def test_a_sweep_prunes_a_diverging_length_and_its_level_survives_a_restart(tmp_path):
    """L = 16's loss rises from 1.6 to 3.0 over its 8 rounds while L = 8's falls to about 1.5: at half of the budget
    the rising run has no forecast, and is pruned on its newest level, stored with its forecast."""
    clock = Clock(1000.0)
    sweep, _, _ = pruned_sweep(tmp_path, clock, losing=lambda x: 1.4 + 0.2 * x)
    assert sweep.runs[1].stopped and "pruned: its loss is not falling and its newest level" in sweep.runs[1].stopped
    newest = sweep.runs[1].store.forecasts(newest_only=True)[0]
    assert newest.note.startswith("the loss is not falling") and newest.level == pytest.approx(1.4 + 0.2 * 7)
    assert newest.level_low > sweep.latest[0].high
    sweep.close()
    restarted = SweepCoordinator(pruning_spec(prune=True, prune_at=[0.5]), tmp_path, clock)
    assert repr(restarted.latest[1]) == repr(newest) and restarted.runs[1].finished
    restarted.close()


def test_a_pruning_decision_interrupted_by_a_failed_write_is_finished_not_decided_again(tmp_path):
    """The losers were stopped one by one and `prune_done` written last: a failed write (or a crash) between them
    decided the same fraction again over the runs still in, pruning 3 of 4 runs at the 25% point."""
    clock = Clock(1000.0)
    spec = tiny_spec(sweep={"seq_lens": [4, 8, 16, 32], "prune": True, "prune_at": [0.25, 0.5]}, run={"rounds": 4},
                     sync={"codec": "fp32", "max_update_norm": 100.0}, coordinator={"lease_s": 60.0})
    sweep = SweepCoordinator(spec, tmp_path, clock)
    for name in "abcd":  # one worker a run, one round each: every run at version 1, the 25% point of 4 rounds
        member = sweep.join(pb.JoinRequest(worker_name=name))
        run = next(r for r in sweep.runs if r.knows(member.worker_id))
        for _ in run.pull(pb.PullParametersRequest(**creds(member))):
            pass
        header, chunks = tensor_stream.build_payload(deltas_of(run, 1e-3), codec=run.wire_format, run_id=run.run_id,
                                                     version=0)
        run.push(iter([pb.PushUpdateRequest(meta=pb.UpdateMeta(**creds(member), base_version=0, tokens=40)),
                       pb.PushUpdateRequest(header=header), *(pb.PushUpdateRequest(chunk=c) for c in chunks)]))
    for index, (run, loss) in enumerate(zip(sweep.runs, (2.0, 3.2, 3.1, 3.0))):  # run 0 the best, the others worse
        forecast = ForecastRecord(1, clock(), 10.0, 4, loss, loss - 0.01, loss + 0.01, *[math.nan] * 4, "")
        run.store.add_forecast(forecast)
        sweep.latest[index], sweep._forecast_at[index] = forecast, 1
    add_event = sweep.runs[3].store.add_event

    def disk_full(worker_id, kind, reason, now=None):
        raise OSError(28, "No space left on device")

    sweep.runs[3].store.add_event = disk_full
    with pytest.raises(OSError):
        sweep._prune()
    sweep.runs[3].store.add_event = add_event  # space again: the next tick finishes the decision
    sweep._prune()
    assert [run.stopped is not None for run in sweep.runs] == [False, True, True, False] and sweep.prune_done == 1
    events = [[e.reason for e in run.store.events("prune")] for run in sweep.runs]
    assert [len(reasons) for reasons in events] == [1, 1, 1, 1] and "at most half" in events[3][0]
    sweep.close()
    restarted = SweepCoordinator(spec, tmp_path, clock)
    restarted._prune()
    assert [run.stopped is not None for run in restarted.runs] == [False, True, True, False]
    assert [[e.reason for e in run.store.events("prune")] for run in restarted.runs] == events
    restarted.close()


@pytest.mark.parametrize(("sweep", "match"), [
    ({"prune_at": [0.5, 0.25]}, "sweep.prune_at"), ({"prune_at": [1.0]}, "sweep.prune_at"),
    ({"prune_at": []}, "sweep.prune_at"), ({"prune": True, "seq_lens": [8]}, "sweep.prune"),
])
def test_prune_keys_are_validated(sweep, match):
    with pytest.raises(ValueError, match=match):
        pruning_spec(**sweep)
    with pytest.raises(ValueError, match="run.target_loss"):
        tiny_spec(run={"target_loss": -1.0})
    with pytest.raises(ValueError, match="sweep.prune"):
        RunSpec.from_dict({**tiny_spec(run={"rounds": 0}).to_dict(), "sweep": {"seq_lens": [8, 16], "prune": True}})


def test_the_budget_round_is_the_rounds_or_where_the_pace_reaches_the_minutes():
    assert budget_round(10, 100.0, 40) == 40 and budget_round(10, 100.0, 0) == 0
    # 10 rounds in 100 s: a 600 s budget ends at round 60, unless the rounds end first.
    assert budget_round(10, 100.0, 0, 600.0) == 60 and budget_round(10, 100.0, 40, 600.0) == 40
    assert budget_round(10, 100.0, 80, 605.0) == 60  # the last round completed by then
    assert budget_round(0, 0.0, 40, 600.0) == 0  # no pace before a round closed
    assert budget_round(10, 1e-300, 0, 600.0) == 2**62  # a pace past any run: bounded (it raised OverflowError)


def test_a_forecast_under_a_minutes_budget_is_of_the_round_the_pace_reaches():
    losses = [(v, 1.0 + 2.0 * (v + 1) ** -0.5) for v in range(20)]
    # 20 rounds in 200 s; a 6-minute budget: round 36.
    made = forecast_record(20, now=1200.0, started_at=1000.0, rounds=0, round_losses=losses, budget_s=360.0)
    assert made.at_round == 36 and made.note == ""
    assert made.loss == pytest.approx(1.0 + 2.0 * 36 ** -0.5, abs=0.01)
    unbounded = forecast_record(20, now=1200.0, started_at=1000.0, rounds=0, round_losses=losses)
    assert "no budget to forecast at" in unbounded.note and "[run] rounds or minutes" in unbounded.note


def test_prune_at_fractions_of_a_minutes_budget():
    timed = PruneOptions(True, (0.25, 0.5), 0, 400.0)
    good, bad = record(1.0, 0.9, 1.1), record(2.0, 1.9, 2.1)
    early = [RunView(0, "L=8", 3, False, good, 120.0), RunView(1, "L=16", 2, False, bad, 99.0)]
    assert decide_prune(0.0, early, timed, 0) is None  # L=16 has not reached 25 % of 400 s
    due = [RunView(0, "L=8", 3, False, good, 120.0), RunView(1, "L=16", 2, False, bad, 100.0)]
    decision = decide_prune(0.0, due, timed, 0)
    assert decision.stop == (1,) and "at 25% of the budget (100 s)" in dict(decision.reasons)[1]
    unknown = [RunView(0, "L=8", 3, False, good, 120.0), RunView(1, "L=16", 0, False, bad)]  # no round closed
    assert decide_prune(0.0, unknown, timed, 0) is None
    # With both budgets, whichever fraction every run reached first.
    both = PruneOptions(True, (0.25,), 40, 4000.0)
    assert decide_prune(0.0, views(good, bad), both, 0).stop == (1,)  # round 10 of 40 reached, 1000 s not


def test_the_budget_end_decision():
    assert decide_budget_end(1000.0, None, 60.0) is None  # no round closed yet
    assert decide_budget_end(1059.0, 1000.0, 60.0) is None and decide_budget_end(1059.0, 1000.0, 0.0) is None
    reason = decide_budget_end(1060.0, 1000.0, 60.0)
    assert reason.startswith(BUDGET_ENDED) and "1 minutes" in reason and "60 s" in reason
    assert describe(math.nan, math.nan, math.nan, 0, stopped=reason) == reason  # not "pruned"


def test_a_run_ends_at_its_minutes_budget_and_stays_ended_after_a_restart(tmp_path):
    clock = Clock(1000.0)
    spec = tiny_spec(run={"rounds": 0, "minutes": 0.1}, sync={"min_reports": 1})  # 6 s; a round takes 1 s here
    group = open_group(spec, tmp_path, clock)
    run = group.runs[0]
    member = group.join(pb.JoinRequest(worker_name="a"))
    for round_ in range(5):
        train_round(run, member, good_loss(round_ + 1.0), clock)
        group.tick()
    assert not run.finished and group.status().run_state == pb.RUN_STATE_RUNNING
    train_round(run, member, good_loss(6.0), clock)
    group.tick()
    assert run.finished and run.stopped.startswith(BUDGET_ENDED) and group.status().run_state == pb.RUN_STATE_FINISHED
    assert [e.reason for e in run.store.events("budget")] == [run.stopped] and not run.store.events("prune")
    # Its forecasts were of the round the pace reached at the budget, and its rounds stay.
    assert {record.at_round for record in run.store.forecasts() if record.version >= 1} <= {6}
    assert len(run.store.rounds()) == 6
    assert group.heartbeat(pb.HeartbeatRequest(**creds(member))).run_state == pb.RUN_STATE_FINISHED
    group.close()
    restarted = open_group(spec, tmp_path, clock)
    assert restarted.runs[0].finished and restarted.runs[0].stopped == run.stopped
    restarted.close()


def test_minutes_is_validated_and_prune_needs_a_budget():
    for bad in (-1.0, math.inf, math.nan, True, 1e300):  # 1e300: accepted, then the horizon overflowed SQLite
        with pytest.raises(ValueError, match="run.minutes"):
            tiny_spec(run={"minutes": bad})
    with pytest.raises(ValueError, match="run.minutes = 0"):
        RunSpec.from_dict({**tiny_spec(run={"rounds": 0}).to_dict(), "sweep": {"seq_lens": [8, 16], "prune": True}})
    timed = RunSpec.from_dict({**tiny_spec(run={"rounds": 0, "minutes": 5.0}).to_dict(),
                               "sweep": {"seq_lens": [8, 16], "prune": True}})
    assert timed.run.minutes == 5.0 and timed.sweep.prune
