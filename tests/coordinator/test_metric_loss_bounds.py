"""What one member's metric rows weigh in the run's curves, over the real wire (an in-process coordinator on
127.0.0.1, real SQLite).

A loss above MAX_LOSS (the bound the forecasts leave garbage out by, observe/forecast.py): the intake refused only
non-finite losses and those <= 0, so a row with loss 1.7e308 was stored, and every later fit of the state dir
(`rcswarm fit`, the sweep dashboard's /api/status and /metrics) failed with OverflowError, across restarts. Now it
is stored as no loss (NaN), its row and tokens kept (a diverged step's: refusing it took the honest rows beside it).

A trained step reported again (a report retried after its answer was lost, or sent again on purpose): every copy
was stored, up to the per-round row cap, so one worker's loss counted that many times in its step's mean and its
tokens as many times in the totals. Now a trained step's row is stored once per (worker, version, step).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rcswarm.observe.forecast import MAX_LOSS
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import MAX_VAL_LOSS
from tests.helpers.coordinator import serving
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state
from tests.helpers.wire import Wire

LENGTH = 32  # tiny_spec's data.seq_len; batch 4: a step trains at most 128 tokens


def step_row(step: int, loss: float = 3.0, version: int = 0, tokens: int = 4 * LENGTH) -> pb.Metric:
    """One training step's row."""
    return pb.Metric(version=version, step=step, seq_len=LENGTH, batch=4, loss=loss, tokens=tokens,
                     wall_time=0.1 * step, compute_seconds=0.1 * step)


def test_the_forecasts_bound_is_the_one_the_wire_bounds_held_out_losses_by() -> None:
    assert MAX_LOSS == MAX_VAL_LOSS == 1e4


@pytest.mark.parametrize("loss", [1e5, 1.7e308, math.inf, MAX_LOSS * (1 + 1e-15)])
def test_a_loss_above_max_loss_is_stored_as_none_with_its_row_and_the_rows_beside_it(tmp_path: Path,
                                                                                     loss: float) -> None:
    """A diverged step's loss (exploded logits give a finite cross-entropy of ~8.6e4) or a garbage one: stored as
    no loss (NaN), its row and tokens kept, the honest rows beside it stored. Refused (the first version of the
    bound), it took the honest rows with it and, before a re-join, ended its worker; stored as sent, one of 1.7e308
    made every later fit of the state dir fail with OverflowError."""
    with serving(tiny_spec(), tmp_path) as (group, target):
        wire = Wire(target)
        try:
            worker = wire.join("diverged")
            assert wire.report(worker, [step_row(1, loss=loss), step_row(2), step_row(3, loss=MAX_LOSS)]).stored == 3
            status = wire.call("GetStatus", pb.GetStatusRequest())
            assert status.total_tokens == 3 * 4 * LENGTH
        finally:
            wire.close()
    rows = read_state(tmp_path, lambda store: store.metric_rows())
    losses = [row.loss for row in rows]
    assert losses == [None, 3.0, MAX_LOSS]  # NaN is stored as NULL


def test_a_trained_step_reported_again_is_stored_and_counted_once(tmp_path: Path) -> None:
    """The same rows sent twice (a retried report), a batch mixing a repeat and a new step, one step twice in one
    batch: each trained step of a worker is stored once, its tokens counted once; another worker's row of the same
    (version, step) is its own, and a pull's row (no tokens) is not a trained step."""
    with serving(tiny_spec(), tmp_path) as (group, target):
        wire = Wire(target)
        try:
            a, b = wire.join("a"), wire.join("b")
            first = [step_row(1, loss=3.0), step_row(2, loss=2.9), step_row(3, loss=2.8)]
            assert wire.report(a, first).stored == 3
            assert wire.report(a, first).stored == 0
            assert wire.report(a, [step_row(3, loss=9000.0), step_row(4, loss=2.7)]).stored == 1
            assert wire.report(a, [step_row(5, loss=2.6), step_row(5, loss=2.6)]).stored == 1
            assert wire.report(b, [step_row(1, loss=5.0)]).stored == 1
            pull = pb.Metric(version=0, step=5, seq_len=LENGTH, batch=4, loss=math.nan, tokens=0)
            assert wire.report(a, [pull]).stored == 1 and wire.report(a, [pull]).stored == 1
            status = wire.call("GetStatus", pb.GetStatusRequest())
            assert status.total_tokens == 6 * 4 * LENGTH
            sums = group.runs[0].store.run_step_sums().rows
        finally:
            wire.close()
    # (seq_len, version, k, loss sum, time sum, n): a's steps 1..5 at k = 0..4, b's step 1 at its own k = 0.
    assert [(row[2], row[3], row[5]) for row in sums] == [(0, 8.0, 2), (1, 2.9, 1), (2, 2.8, 1), (3, 2.7, 1),
                                                          (4, 2.6, 1)]
    rows = read_state(tmp_path, lambda store: store.metric_rows())
    trained = sorted((row.worker_id == a, row.step, row.loss) for row in rows if row.tokens > 0)
    assert trained == [(False, 1, 5.0), (True, 1, 3.0), (True, 2, 2.9), (True, 3, 2.8), (True, 4, 2.7),
                       (True, 5, 2.6)]
