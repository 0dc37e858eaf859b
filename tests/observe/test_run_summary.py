"""The run summary (`observe/report.summarize`) on state dirs written as a sweep and a resume write them.

Bytes: each membership's rows carry what it moved in the run, cumulative (worker/worker.py `RunCounters`), a
worker the sweep moved in included, so the sum of the memberships' maxima is the run's traffic. Wall time: a run
launched again on its state dir (`rcswarm run --run-dir` twice) was served in two periods; the time between the
launches is not wall time (before, a resumed run's 66.7 s wall time held 44 s between launches: 3,071 tok/s against ~9,300).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rcswarm.observe import traffic
from rcswarm.observe.report import served_note, served_periods, summarize
from rcswarm.state.records import RoundRecord, WorkerUsage
from rcswarm.state.store import StateStore

RUN = "sweep-L16"
PARAMS = {"w": torch.zeros(4)}


def close_round(store: StateStore, version: int, opened: float, closed: float, reports: int) -> None:
    """Round `version` → version + 1, as the coordinator's close records it."""
    store.commit_version(RUN, version + 1, PARAMS, {}, RoundRecord(version, opened, closed, reports, 0, "all", 0.1, ""))


def metric(worker_id: str, version: int, step: int, at: float, sent: int, received: int, tokens: int = 64) -> tuple:
    """One row (METRIC_COLUMNS) stored at `at` with the membership's byte counters `sent` and `received`."""
    return (RUN, worker_id, version, step, 16, 4, 3.0, tokens, float(step), 0.1 * step, 0.01 * step, sent, received,
            "", at)


def test_a_moved_workers_rows_count_once_in_the_run_it_moved_to(tmp_path: Path) -> None:
    """L=16 with its own worker w1 and w2, which the sweep moved in from L=4 before round 1: each pulls θ in full at
    its first pull (1,000 bytes), then a step of 100 bytes and pushes 50 bytes a round; w2's counters start at its
    join into this run."""
    store = StateStore(tmp_path / "state")
    try:
        store.add_event("w1", "join", "gpu-0: ok", 100.0)
        store.add_event("w2", "join", "gpu-1: moved from sweep-L4", 109.0)
        store.set_many({traffic.FULL_PULLS_KEY: traffic.full_pulls_value(2_000, 2)})
        rows = []
        # w1: rounds 0, 1, 2; w2: rounds 1, 2. A round's rows: its pull row, then a training row after its push.
        for version, (opened, closed) in enumerate([(101.0, 110.0), (110.0, 120.0), (120.0, 130.0)]):
            for worker_id, first in (("w1", 0), ("w2", 1)):
                if version < first:
                    continue
                rounds_in = version - first
                received = 1_000 + 100 * rounds_in
                rows.append(metric(worker_id, version, 2 * version, opened + 1, 50 * rounds_in, received, tokens=0))
                rows.append(metric(worker_id, version, 2 * version + 1, closed, 50 * (rounds_in + 1), received))
            close_round(store, version, opened, closed, reports=1 if version == 0 else 2)
        store.add_metrics(rows)
        summary = summarize(store)
    finally:
        store.close()
    # Sent: w1 3 pushes, w2 2 (150 + 100); received: two full pulls and 3 steps (1,000 + 200 + 1,000 + 100).
    assert (summary.rounds, summary.workers) == (3, 2)
    assert summary.bytes_sent_per_round == pytest.approx(250 / 3)
    assert summary.bytes_received_per_round == pytest.approx(2_300 / 3)
    assert summary.bytes_up_per_worker_round == pytest.approx(50)  # 5 updates applied
    assert summary.bytes_down_per_worker_round == pytest.approx(300 / 5)  # the steps, the full pulls apart
    assert (summary.full_pull_bytes, summary.full_pulls) == (2_000, 2)
    # One launch: the wall time as before, from the first round's opening to the last metric row.
    assert summary.wall_seconds == pytest.approx(130.0 - 101.0)
    assert (summary.served_periods, summary.resumed, summary.idle_seconds) == (1, False, 0.0)


def launch(store: StateStore, first_version: int, t0: float, workers: tuple[str, ...]) -> None:
    """One launch on the state dir from `t0`: `workers` join at t0, each round opens at its first pull (1 s after
    the last close or the joins), its rows arrive when it closes, 5 s later; two rounds."""
    for worker_id in workers:
        store.add_event(worker_id, "join", f"{worker_id}: ok", t0)
    opened = t0 + 1.0
    for version in (first_version, first_version + 1):
        closed = opened + 5.0
        store.add_metrics([metric(w, version, version, closed, 10 * version, 20 * version, tokens=1_000)
                           for w in workers])
        close_round(store, version, opened, closed, reports=len(workers))
        opened = closed


def test_a_resumed_run_counts_the_time_it_was_served_and_says_it_was_resumed(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    try:
        launch(store, 0, 1_000.0, ("w1", "w2"))  # served 1,001 → 1,011
        launch(store, 2, 1_100.0, ("w3", "w4"))  # launched again 89 s after the last row: served 1,101 → 1,111
        summary = summarize(store)
    finally:
        store.close()
    assert summary.tokens == 8_000
    assert summary.wall_seconds == pytest.approx(20.0)  # before: 110 s, 1,111 − 1,001
    assert summary.tokens_per_second == pytest.approx(400.0)
    assert (summary.served_periods, summary.resumed) == (2, True)
    assert summary.idle_seconds == pytest.approx(90.0)
    assert served_note(summary.served_periods, summary.idle_seconds) == (
        "resumed: served in 2 periods (one per launch, or a time without workers); the 90 s between them are left "
        "out of its wall time and tokens/s")
    assert served_note(1, 0.0) == ""


def usage(worker_id: str, first: float, last: float) -> WorkerUsage:
    return WorkerUsage(worker_id, 0, 0, 0.0, 0.0, 0, first, last)


def test_served_periods_join_what_overlaps_and_measure_from_the_first_opening_to_the_last_row() -> None:
    # w1's membership ends (its last row at 20) and w2 joins at 25, while round 3 is open (18 → 27): one period.
    rounds = [RoundRecord(v, o, c, 1, 0, "all", 0.0, "") for v, o, c in [(0, 5.0, 10.0), (3, 18.0, 27.0)]]
    joined = {"w1": 4.0, "w2": 25.0}
    assert served_periods([usage("w1", 10.0, 20.0), usage("w2", 27.0, 40.0)], joined, rounds) == [(5.0, 40.0)]
    # Without the round nothing is served from 20 to 25: two periods, the second from w2's first row (no opening).
    assert served_periods([usage("w1", 10.0, 20.0), usage("w2", 27.0, 40.0)], joined, rounds[:1]) == [
        (5.0, 20.0), (27.0, 40.0)]
    # Without join events a membership reaches back to its first row; rounds alone are no period.
    assert served_periods([usage("w1", 10.0, 20.0)], {}, rounds) == [(5.0, 20.0)]
    assert served_periods([], {}, rounds) == []


def test_the_first_and_last_round_losses_survive_the_metric_rows_cap(tmp_path: Path) -> None:
    """`coordinator.max_metric_rows` deletes the oldest raw rows (the default 4,000,000 fill in about 3 h with 8
    workers); the summary's first-round loss read them and came out NaN ("— → 1.400"), or a biased mean of a round
    half deleted. It reads the aggregates, which keep every round's sums."""
    store = StateStore(tmp_path)
    try:
        at = 1000.0
        for version in range(10):
            loss = 5.0 - 0.4 * version
            rows = [(RUN, worker, version, 5 * version + k + 1, 32, 4, loss, 128, at + k, 0.1, 0.01, 10, 10, "",
                     at + k + 1) for worker in ("w0", "w1") for k in range(5)]
            store.add_metrics(rows, keep_rows=30)  # the cap, scaled down: the first rounds' rows are deleted
            close_round(store, version, at, at + 6, 2)
            at += 7
        assert store.mean_training_loss(0) is None  # the raw rows are gone
        summary = summarize(store)
    finally:
        store.close()
    assert summary.first_round_loss == pytest.approx(5.0) and summary.last_round_loss == pytest.approx(1.4)
