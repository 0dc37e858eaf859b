"""The rows a fit reads: a state dir's training rows held column by column (`MetricRows`: no object and no
"where" text per row, built only for an error), and one rule for which rows are training rows, in SQL for state
dirs (state/schema.py TRAINING_FILTER) and in Python for exported metrics tables (`is_training_row`)."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import pytest

from rcswarm.coordinator import SwarmCoordinator
from rcswarm.observe import analysis
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import metric_rows
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state

ROWS = 20_000


def test_a_state_dirs_rows_cost_a_few_numbers_each(tmp_path: Path) -> None:
    coordinator = SwarmCoordinator(tiny_spec(run={"rounds": 0}), StateStore(tmp_path / "run", durable=False))
    coordinator.store.add_metrics(metric_rows(coordinator.run_id, 0, ROWS, 1000.0))
    coordinator.close()
    analysis.read_state_dirs(tmp_path)  # imports and caches outside the measurement
    tracemalloc.start()
    try:
        rows = analysis.read_state_dirs(tmp_path)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == ROWS
    # Before: a Row with a 117-character `where` per row, about 370 bytes held and 530 at the peak per row.
    assert held / ROWS < 150 and peak / ROWS < 450, (held / ROWS, peak / ROWS)
    stored = read_state(tmp_path / "run", lambda store: store.training_rows())
    row = rows[7]
    assert row.where == (f"{tmp_path / 'run' / 'state.sqlite'} table metrics, training row 8 "
                         f"(worker {stored[7][0]}, version {stored[7][1]})")
    assert (row.loss, row.length, row.run) == (pytest.approx(stored[7][4]), 32.0, coordinator.run_id)
    assert [r.step for r in rows][:3] == [1.0, 1.0, 1.0]  # the first round's first step, for 3 of its workers


def test_is_training_row_is_the_state_dirs_training_filter(tmp_path: Path) -> None:
    store = StateStore(tmp_path, durable=False)
    cases = [(tokens, loss) for tokens in (0, 1, 128) for loss in (2.0, 0.5, math.nan)]
    try:
        # One worker per case, so each case is its own round's first step and `training_rows` names it.
        store.add_metrics([("run", f"w{i}", 0, 1, 32, 4, loss, tokens, 1.0, 0.0, 0.0, 0, 0, "", 100.0 + i)
                           for i, (tokens, loss) in enumerate(cases)])
        stored = store.metric_rows()
        training = {worker for worker, *_ in store.training_rows()}
    finally:
        store.close()
    assert {row.worker_id for row in stored if analysis.is_training_row(row.tokens, row.loss)} == training
    assert [analysis.is_training_row(tokens, loss) for tokens, loss in cases] == [
        f"w{i}" in training for i in range(len(cases))]
    assert training == {"w3", "w4", "w6", "w7"}
