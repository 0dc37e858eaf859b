"""The thirty-first session's operator review, fits: a `--smooth` window far wider than the curve, and summary.json
held-out values that are not positive finite numbers (observe/fits.py `smooth_losses`, observe/analysis.py
`held_out_law`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rcswarm.observe.analysis import held_out_law
from rcswarm.observe.fits import smooth_losses

# 8 bytes a step of the window: 8 PB, beyond any address space, where a window that wide was allocated whole.
HUGE_WINDOW = 10**15


@pytest.mark.parametrize("count", [1, 2, 3, 40, 257])
def test_a_window_wider_than_the_curve_averages_as_the_covering_window_does(count: int) -> None:
    """`rcswarm fit --smooth 100000000` took 77 s and 1.8 GB on 40 steps: the window's sums were allocated whole.
    A centred window of 2n + 1 steps already holds every value at each of them; wider ones give the same means,
    bit for bit, at a cost that follows the data."""
    rng = np.random.default_rng(count)
    losses = rng.lognormal(size=count) * 10.0 ** rng.uniform(-5, 5, size=count)  # [count]
    covering = smooth_losses(losses, 2 * count + 1)
    assert np.array_equal(smooth_losses(losses, HUGE_WINDOW), covering)
    for window in (2 * count - 1, 2 * count, 2 * count + 2, 10**9):
        assert np.array_equal(smooth_losses(losses, window), covering)
    np.testing.assert_allclose(covering, np.full(count, math.fsum(losses) / count), rtol=1e-12)
    assert smooth_losses([], HUGE_WINDOW).shape == (0,)


def _write_summary(run_dir: Path, runs: list[dict]) -> None:
    (run_dir / "summary.json").write_text(json.dumps({"runs": runs}))


def test_held_out_values_that_are_not_positive_and_finite_are_left_out_and_named(tmp_path: Path) -> None:
    """`rcswarm fit RUN_DIR` ended in a ValueError traceback when summary.json held a length <= 0 or an infinite
    loss: only losses <= 0 were left out before the power-law fit refused the rest."""
    good = [{"seq_len": length, "rounds": 5, "val_loss_final": 2.6 * length ** -0.12} for length in (2, 4, 8, 16)]
    bad = [{"seq_len": 0, "rounds": 5, "val_loss_final": 3.2}, {"seq_len": -4, "rounds": 5, "val_loss_final": 3.1},
           {"seq_len": 32, "rounds": 5, "val_loss_final": math.inf},
           {"seq_len": 64, "rounds": 5, "val_loss_final": math.nan},
           {"seq_len": 10**400, "rounds": 5, "val_loss_final": 2.0}]
    _write_summary(tmp_path, good + bad)
    skipped: list[str] = []
    law = held_out_law(tmp_path, skipped)
    assert law is not None and law.lengths == (2.0, 4.0, 8.0, 16.0)
    assert law.fit.alpha == pytest.approx(0.12)
    assert law.what == ("held-out loss of the final parameters (5 run(s) left out: length or loss not positive and "
                        "finite)")
    assert len(skipped) == 5
    for line, shown in zip(skipped, ("seq_len 0 ", "seq_len -4 ", "held-out loss inf ", "held-out loss nan ",
                                     f"seq_len {10**400} "), strict=True):
        assert line.startswith(f"{tmp_path / 'summary.json'}: the run at ") and shown in line
        assert "left out of the law across lengths" in line


@pytest.mark.parametrize("edit", [{"seq_len": 0}, {"seq_len": -4}, {"val_loss_final": math.inf}])
def test_a_sweep_of_three_with_one_bad_held_out_value_has_no_law_and_says_why(tmp_path: Path, edit: dict) -> None:
    """The review's runA (L = 2, 4, 8) with one value edited: two lengths are left, no law (the fit falls back to
    the training losses), and the line names the run left out."""
    runs = [{"seq_len": length, "rounds": 8, "val_loss_final": loss} for length, loss in ((2, 3.28), (4, 3.15),
                                                                                          (8, 2.81))]
    runs[0].update(edit)
    _write_summary(tmp_path, runs)
    skipped: list[str] = []
    assert held_out_law(tmp_path, skipped) is None
    (line,) = skipped
    assert f"seq_len {runs[0]['seq_len']!r} with held-out loss {runs[0]['val_loss_final']!r}" in line
    assert held_out_law(tmp_path) is None  # without a list to fill: the same, silently
