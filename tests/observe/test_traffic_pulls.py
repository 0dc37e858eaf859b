"""summary.json's downlink per worker per round is one pull of a round's step (issue #28), as `rcswarm status` shows
it: the step pulls' bytes over their count as the coordinator stored them (observe/traffic.py `STEP_PULLS_KEY`),
not over the updates applied, of which each membership's last has no step pull after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rcswarm.observe import traffic
from rcswarm.observe.report import summarize
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore

RUN = "rsweep-L2"
PARAMS = {"w": torch.zeros(4)}
# The review's runA at L = 2 (int8 both ways): θ's float32 bytes, a full pull, a step pull and an update.
FP32, FULL, STEP, UPDATE = 4_942_848, 4_943_973, 1_256_114, 1_256_180


def _round(store: StateStore, version: int, reports: int) -> None:
    """Round `version` → version + 1 closed with `reports` updates applied."""
    opened = 100.0 + 10 * version
    store.commit_version(RUN, version + 1, PARAMS, {},
                         RoundRecord(version, opened, opened + 9.0, reports, 0, "all", 0.1, ""))


def _row(worker_id: str, version: int, step: int, sent: int, received: int, tokens: int) -> tuple:
    """One metric row (METRIC_COLUMNS) with the membership's cumulative byte counters."""
    return (RUN, worker_id, version, step, 2, 8, 3.0, tokens, float(step), 0.1, 0.01, sent, received, "",
            101.0 + 10 * version + step)


def _short_run(store: StateStore) -> None:
    """w1 reports in rounds 0–4, w2 (joined at round 1) in rounds 1–4: 9 updates applied, 2 full pulls (the joins)
    and 7 step pulls (none after either membership's last update), as the coordinator counted them."""
    rows = []
    for version in range(5):
        for worker_id, first in (("w1", 0), ("w2", 1)):
            if version < first:
                continue
            done = version - first  # rounds this membership finished before this one
            received = FULL + STEP * done
            rows.append(_row(worker_id, version, 0, UPDATE * done, received, tokens=0))  # its pull row
            rows.append(_row(worker_id, version, 1, UPDATE * (done + 1), received, tokens=64))  # after its push
        _round(store, version, reports=1 if version == 0 else 2)
    store.add_metrics(rows)
    store.set_many({traffic.FULL_PULLS_KEY: traffic.full_pulls_value(2 * FULL, 2)})


def test_the_summary_divides_the_step_pulls_bytes_by_their_count(tmp_path: Path) -> None:
    """The review's L = 2: ratio_down read 5.06 (the 7 step pulls' bytes over 9 updates) where every pull was 3.94×
    below fp32, the figure `rcswarm status` showed."""
    store = StateStore(tmp_path / "state")
    try:
        _short_run(store)
        store.set_many({traffic.STEP_PULLS_KEY: traffic.step_pulls_value(7 * STEP, 7)})
        summary = summarize(store)
    finally:
        store.close()
    assert summary.bytes_down_per_worker_round == pytest.approx(STEP)
    assert traffic.ratio(FP32, summary.bytes_down_per_worker_round) == pytest.approx(3.935, abs=1e-3)
    assert summary.bytes_up_per_worker_round == pytest.approx(UPDATE)  # 9 updates, 9 applied
    assert (summary.full_pull_bytes, summary.full_pulls) == (2 * FULL, 2)


def test_a_store_without_the_step_pulls_count_keeps_the_updates_applied(tmp_path: Path) -> None:
    """A state dir written before the count was kept: the workers' bytes less the full pulls over the updates
    applied, as before (its ratio reads high by up to one pull per membership)."""
    store = StateStore(tmp_path / "state")
    try:
        _short_run(store)
        summary = summarize(store)
    finally:
        store.close()
    assert summary.bytes_down_per_worker_round == pytest.approx(7 * STEP / 9)


def test_the_step_pulls_value_reads_back_and_an_unset_one_is_none() -> None:
    assert traffic.step_pulls(traffic.step_pulls_value(7 * STEP, 7)) == (7 * STEP, 7)
    assert traffic.step_pulls(None) == (0, 0)
    assert traffic.STEP_PULLS_KEY != traffic.FULL_PULLS_KEY
    assert traffic.downlink_per_pull(7 * STEP, 7, received=0, full_bytes=0, reports=9) == STEP
    assert traffic.downlink_per_pull(0, 0, received=2 * FULL + 7 * STEP, full_bytes=2 * FULL, reports=9) == (
        pytest.approx(7 * STEP / 9))
