"""A resumed run's time axis counts only the time the run was served (`analysis.served_clock`).

A run launched again on its state dir (`rcswarm run --run-dir` twice) was served in one period per launch; the
end-of-run summary leaves the time between launches out of its wall time (observe/report.py `served_periods`).
The run clock of the training rows (the dashboard's `run_step_means`, `rcswarm fit RUN_DIR`'s `read_state_dirs`)
counted it: a one-hour stop after 20 of 40 rounds put steps 200 and 201 an hour apart, raised every length's
seconds per step from L/1000 to ~13.5 s and moved each predicted crossover to 0 s, with the fit still valid. Real
SQLite state dirs, written as a coordinator's closes write them.
"""

from __future__ import annotations

import math
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import torch

from rcswarm.cli.fit import main as fit_main
from rcswarm.config.runspec import RunSpec
from rcswarm.observe.analysis import (
    ServedClock,
    _rounds_outside,
    analyse,
    fit_step_means,
    length_curves,
    read_state_dirs,
    run_step_means,
    served_clock,
)
from rcswarm.observe.report import served_periods, summarize
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore

INNER = 10  # steps a round trains
ROUNDS = 40  # 20 per launch
STOP_S = 3_600.0  # the time between the two launches
LENGTHS = (32, 64, 128, 256)
T0 = 1_000.0


def true_loss(step: int, length: int) -> float:
    """α(s) = 0.3·(1 − e^(−s/40)), times a slow decay in s."""
    return 3.0 * step ** -0.2 * length ** -(0.3 * (1 - math.exp(-step / 40)))


def write_run(state_dir: Path, length: int, stop_s: float) -> None:
    """One run at `length`, L/1000 s a step: launch 1 (worker w0, joined at T0) closes rounds 0-19; `stop_s` later
    launch 2 (worker w1 joins) closes rounds 20-39. Each round opens when the previous one closes (or its launch's
    join), its rows arrive one step apart, the round closes at its last row."""
    store = StateStore(state_dir, durable=False)
    try:
        spec = RunSpec.from_dict({"inner": {"steps": INNER}, "data": {"seq_len": length}})
        store.set_many({"spec_json": spec.to_json(), "run_id": f"r{length}"})
        pace, t = length / 1000.0, T0
        for version in range(ROUNDS):
            worker = "w0" if version < ROUNDS // 2 else "w1"
            if version == ROUNDS // 2:
                t += stop_s
            if version in (0, ROUNDS // 2):
                store.add_event(worker, "join", f"{worker}: ok", t)
            rows = [(f"r{length}", worker, version, version * INNER + k + 1, length, 4,
                     true_loss(version * INNER + k + 1, length), 4 * length, 0.0, 0.0, 0.0, 0, 0, "",
                     t + (k + 1) * pace) for k in range(INNER)]
            store.add_metrics(rows)
            store.commit_version(f"r{length}", version + 1, {"w": torch.zeros(2)}, {},
                                 RoundRecord(version, t, t + INNER * pace, 1, 4 * length * INNER, "all", 0.1, "",
                                             steps=INNER))
            t += INNER * pace
    finally:
        store.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[float, Path]:
    """A sweep's run directory for each stop: 0 (served in one period) and STOP_S (resumed)."""
    made = {}
    for stop_s in (0.0, STOP_S):
        run_dir = tmp_path_factory.mktemp(f"stop-{int(stop_s)}")
        for length in LENGTHS:
            write_run(run_dir / f"run-L{length}", length, stop_s)
        made[stop_s] = run_dir
    return made


def means_of(run_dir: Path, length: int) -> list[tuple[float, float, float, float]]:
    """`run_step_means` of the run at `length` below `run_dir`, as the dashboard reads it."""
    store = StateStore.open_read_only(run_dir / f"run-L{length}")
    try:
        return run_step_means(store, INNER)
    finally:
        store.close()


def test_the_dashboards_run_clock_leaves_the_time_between_launches_out(runs: dict[float, Path]) -> None:
    resumed = means_of(runs[STOP_S], 32)
    steps = {step: seconds for _, step, _, seconds in resumed}
    # Step 201 is the second launch's first: one step (0.032 s) after step 200, not an hour.
    assert steps[201] - steps[200] == pytest.approx(0.032, abs=1e-6)
    # The whole axis is the run served without the stop's.
    assert [seconds for *_, seconds in resumed] == pytest.approx([s for *_, s in means_of(runs[0.0], 32)], abs=1e-6)
    store = StateStore.open_read_only(runs[STOP_S] / "run-L32")
    try:
        summary = summarize(store)
    finally:
        store.close()
    # The same notion of served time as the summary's: its wall time runs from the first round's opening, one step
    # before the first training row, to the last row.
    assert (summary.served_periods, summary.resumed) == (2, True)
    assert steps[ROUNDS * INNER] == pytest.approx(summary.wall_seconds - 0.032, abs=1e-6)


def test_the_fit_of_a_resumed_sweep_keeps_its_pace_and_crossovers(runs: dict[float, Path]) -> None:
    fits = {stop_s: fit_step_means([row for length in LENGTHS for row in means_of(run_dir, length)])
            for stop_s, run_dir in runs.items()}
    resumed, served_once = fits[STOP_S], fits[0.0]
    assert resumed.analysis is not None and served_once.analysis is not None
    # Before: {32: 13.53, 64: 13.56, 128: 13.63, 256: 13.76} s a step, and every predicted crossover at 0.0 s.
    assert {c.length: c.seconds_per_step for c in resumed.curves} == pytest.approx(
        {float(length): length / 1000.0 for length in LENGTHS}, rel=1e-6)
    predicted = [c.predicted.time for c in resumed.analysis.crossovers if c.predicted is not None]
    assert len(predicted) == len(LENGTHS) - 1 and min(predicted) > 1.0
    assert predicted == pytest.approx([c.predicted.time for c in served_once.analysis.crossovers
                                       if c.predicted is not None], rel=1e-6)


def test_rcswarm_fit_of_a_resumed_run_directory_counts_the_time_served(
    runs: dict[float, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rows = read_state_dirs(runs[STOP_S])
    assert rows.time == pytest.approx(read_state_dirs(runs[0.0]).time, abs=1e-6)
    assert {c.length: c.seconds_per_step for c in length_curves(runs[STOP_S], rows)} == pytest.approx(
        {float(length): length / 1000.0 for length in LENGTHS}, rel=1e-6)
    assert analyse(length_curves(runs[STOP_S], rows)).valid
    assert fit_main([str(runs[STOP_S]), "--out", str(tmp_path / "fit.png")]) == 0
    printed = capsys.readouterr().out
    # The table of lengths: "│  32 │  r32 │ 400 │ 0.3200 │ 0.032 │" (its last column seconds per step).
    paces = {int(length): float(pace) for length, pace in
             re.findall(r"│\s*(\d+) │\s*r\d+ │\s*\d+ │\s*[0-9.]+ │\s*([0-9.]+) │", printed)}
    assert paces == {length: pytest.approx(length / 1000.0, rel=1e-3) for length in LENGTHS}, printed


def test_the_served_clock_lays_the_periods_end_to_end() -> None:
    clock = ServedClock.of([(10.0, 20.0), (50.0, 60.0), (100.0, 110.0)])
    times = np.array([5.0, 10.0, 15.0, 20.0, 35.0, 50.0, 55.0, 60.0, 80.0, 100.0, 130.0])
    # Before the first period it counts back; inside a gap it stays at the end of the period before it; after the
    # newest period's end (rows read after it) it keeps counting.
    assert clock.served(times).tolist() == [-5.0, 0.0, 5.0, 10.0, 10.0, 10.0, 15.0, 20.0, 20.0, 20.0, 50.0]
    assert clock.seconds_since(15.0, np.array([15.0, 55.0])).tolist() == [0.0, 10.0]
    # Without periods every second counts.
    assert ServedClock.of([]).seconds_since(3.0, np.array([3.0, 10.0])).tolist() == [0.0, 7.0]
    with pytest.raises(ValueError, match=r"served periods \[\(50.0, 60.0\), \(10.0, 20.0\)\]: expected disjoint"):
        ServedClock.of([(50.0, 60.0), (10.0, 20.0)])


def test_a_state_dir_from_before_the_aggregates_reads_on_every_second(runs: dict[float, Path], tmp_path: Path) -> None:
    """A state dir written by a coordinator older than the aggregate tables has no per-worker usage to find served
    periods in: its rows keep the clock they always had (every second since the first row), and still read."""
    state_dir = tmp_path / "old" / "run-L32"
    write_run(state_dir, 32, STOP_S)
    with closing(sqlite3.connect(state_dir / "state.sqlite", isolation_level=None)) as connection:
        connection.execute("PRAGMA user_version = 0")
    store = StateStore.open_read_only(state_dir)
    try:
        assert served_clock(store).served(np.array([7.0])).tolist() == [7.0]
    finally:
        store.close()
    times = read_state_dirs(tmp_path / "old").time
    assert times[ROUNDS * INNER // 2] - times[ROUNDS * INNER // 2 - 1] == pytest.approx(STOP_S + 0.032)


def clock_of_every_round(store: StateStore) -> ServedClock:
    """The clock of the periods `served_periods` finds with every round, as the summary passes them."""
    joined: dict[str, float] = {}
    for event in store.events("join"):
        joined.setdefault(event.worker_id, event.time)
    return ServedClock.of(served_periods(store.worker_usage(), joined, store.rounds()))


def assert_same_clock(first: ServedClock, second: ServedClock) -> None:
    for name in ("starts", "ends", "served_before"):
        assert getattr(first, name).tolist() == getattr(second, name).tolist(), name


def test_the_clock_reads_the_periods_the_summary_finds_with_every_round(runs: dict[float, Path], tmp_path: Path) -> None:
    """`served_clock` hands `served_periods` only the rounds that can change a period (`_rounds_outside`): the
    periods are those of every round. w1 (joined at 4) reports from 10 to 20, w2 joins at 25 and reports from 27
    to 40; round 0 opens at 5, before any row; round 3 (18 → 27) bridges the two memberships; rounds 1, 2 and 4
    lie inside a membership."""
    for stop_s in (0.0, STOP_S):
        store = StateStore.open_read_only(runs[stop_s] / "run-L64")
        try:
            assert_same_clock(served_clock(store), clock_of_every_round(store))
        finally:
            store.close()
    spans = [(5.0, 10.0), (11.0, 15.0), (15.0, 19.0), (18.0, 27.0), (28.0, 35.0)]
    for bridged in (True, False):
        store = StateStore(tmp_path / f"bridged-{bridged}", durable=False)
        try:
            store.add_event("w1", "join", "w1: ok", 4.0)
            store.add_event("w2", "join", "w2: ok", 25.0)
            store.add_metrics([("r", worker, 0, step, 16, 4, 3.0, 64, 0.0, 0.0, 0.0, 0, 0, "", float(at))
                               for worker, times in (("w1", range(10, 21)), ("w2", range(27, 41)))
                               for step, at in enumerate(times, start=1)])
            for version, (opened, closed) in enumerate(spans):
                if bridged or version != 3:
                    store.commit_version("r", version + 1, {"w": torch.zeros(2)}, {},
                                         RoundRecord(version, opened, closed, 1, 64, "all", 0.1, ""))
            expected = [(5.0, 40.0)] if bridged else [(5.0, 20.0), (27.0, 40.0)]
            assert_same_clock(served_clock(store), ServedClock.of(expected))
            assert_same_clock(served_clock(store), clock_of_every_round(store))
        finally:
            store.close()
    # A round without a close reaches its opening; one without an opening is no span (`served_periods`): both kept.
    assert _rounds_outside([(12.0, None), (None, None), (9.0, None)], [(10.0, 20.0)]) == [(None, None), (9.0, None)]
