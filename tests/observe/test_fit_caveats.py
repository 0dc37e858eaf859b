"""The analysis says when its data do not identify a fit, counts crossovers only under its rule, and fits the law
across lengths (held-out losses from summary.json, or the training losses at the last matched step)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rcswarm.observe.analysis import (
    MIN_STEPS_PER_LENGTH,
    LengthCurve,
    analyse,
    crossover_rows,
    fit_rows,
    fit_step_means,
    fit_summary,
    held_out_law,
    law_at_last_step,
    pair_crossover,
)


def curve(length: float, steps: np.ndarray, losses: np.ndarray, seconds_per_step: float) -> LengthCurve:
    return LengthCurve(length, (), steps, losses, steps * seconds_per_step, seconds_per_step)


def paper_curves(last_step: int, noise: float = 0.01, seed: int = 0) -> list[LengthCurve]:
    """loss(L | s) = A(s)·L^(−α(s)), α∞ = 0.3, τ = 100 steps, 0.05·L seconds per step, multiplicative noise."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, last_step + 1, dtype=float)  # [n]
    alpha = 0.3 * (1 - np.exp(-steps / 100.0))
    out = []
    for length in (2.0, 4.0, 8.0, 16.0):
        losses = (4.0 + 2.0 * np.exp(-steps / 50.0)) * length ** -alpha * np.exp(rng.normal(0, noise, steps.shape))
        out.append(curve(length, steps, losses, 0.05 * length))
    return out


def test_enough_steps_identify_the_fit_and_its_rows_show_the_numbers():
    analysis = analyse(paper_curves(1000))
    assert analysis.valid and analysis.caveats == ()
    fit = fit_summary(analysis)
    assert fit["valid"] and fit["alpha_inf_low"] <= 0.3 <= fit["alpha_inf_high"]
    assert fit["tau_low"] <= 100 <= fit["tau_high"]
    rows = dict(fit_rows(fit))
    assert rows["α∞ [90% interval]"].startswith(f"{fit['alpha_inf']:.4f} [")
    assert rows["τ (steps) [90% interval]"].startswith(f"{fit['tau']:.4g} [")
    assert rows["steps fitted"] == f"{fit['first_step']:.4g} to 1000"
    assert all("not enough data" not in text for text in rows.values())


def test_a_handful_of_steps_is_not_enough_data():
    """The issue's dashboard: a fit from tens of steps gave α∞ = 9.93; the same law cut short says so."""
    analysis = analyse(paper_curves(MIN_STEPS_PER_LENGTH - 20))
    assert not analysis.valid and not analysis.identified("alpha_inf") and not analysis.identified("tau")
    assert str(analysis.caveats[0]).startswith("too few recorded steps in the steps all lengths share [1, 80] "
                                               f"(L=2: 80, L=4: 80, L=8: 80, L=16: 80; {MIN_STEPS_PER_LENGTH} needed)")
    fit = fit_summary(analysis)
    rows = dict(fit_rows(fit))
    assert rows["α∞ [90% interval]"].startswith("not enough data (fitted ")
    assert rows["τ (steps) [90% interval]"].startswith("not enough data (fitted ")
    assert rows["per doubling at α∞"] == "not enough data"
    assert all(predicted == "not enough data (the fit has caveats)" for _, _, predicted in crossover_rows(fit))


def test_a_crossing_inside_the_initial_plateau_is_not_counted():
    """Both curves level at 5.5 for 5 s, the longer one dipping below inside that plateau; then the shorter falls
    faster, 2 + 3.5·e^(−(t−5)/10) against 1.6 + 3.9·e^(−(t−5)/25), and the longer overtakes it for good at
    about 61 s. Only that crossing counts: the rule starts counting after both curves are 10% below their start
    and after the first tenth of the time (10 s)."""
    rng = np.random.default_rng(1)
    steps = np.arange(1, 2001, dtype=float)  # [2000]
    short_t, long_t = steps * 0.05, steps * 0.1  # seconds: the longer run's steps cost twice as much
    short = np.where(short_t < 5, 5.5, 2.0 + 3.5 * np.exp(-(short_t - 5) / 10)) + rng.normal(0, 0.05, 2000)
    long_ = np.where(long_t < 5, 5.5, 1.6 + 3.9 * np.exp(-(long_t - 5) / 25)) + rng.normal(0, 0.05, 2000)
    long_[:30] -= 0.3  # the longer run below inside the plateau (its first 3 s)
    pair = pair_crossover(curve(2, steps, short, 0.05), curve(4, steps, long_, 0.1), 25, None)
    assert 10.0 <= pair.counted_from < 12.0  # the longer curve is 10% below its (dipped) start at about 11 s
    assert pair.observed == pytest.approx(61.0, abs=4.0), pair


def test_a_gap_within_the_noise_is_no_crossover():
    steps = np.arange(1, 1001, dtype=float)
    noise = np.random.default_rng(2).normal(0, 0.2, 1000)  # the same on both: the gap is exactly 0.01
    short = 2.0 + 3.0 / np.sqrt(steps) + noise
    long_ = 1.99 + 3.0 / np.sqrt(steps) + noise  # 0.01 below, far inside 2σ of two 25-step means (0.11)
    pair = pair_crossover(curve(2, steps, short, 0.1), curve(4, steps, long_, 0.1), 25, None)
    assert pair.observed is None and "within the noise" in pair.observed_note


def test_a_curve_still_on_its_plateau_has_no_crossover_yet():
    steps = np.arange(1, 201, dtype=float)
    flat = np.full(200, 5.5)
    falling = 5.5 * np.exp(-steps / 100.0) + 1.0
    pair = pair_crossover(curve(2, steps, falling, 0.1), curve(4, steps, flat, 0.2), 25, None)
    assert pair.observed is None
    assert pair.observed_note == "L=4 has not left its initial plateau (not yet 10% below its start)"


def test_the_law_across_lengths_from_summary_json_or_the_last_matched_step(tmp_path: Path):
    assert held_out_law(tmp_path) is None
    runs = [{"seq_len": length, "rounds": 5, "val_loss_final": 2.6 * length ** -0.12} for length in (2, 4, 8, 16)]
    (tmp_path / "summary.json").write_text(json.dumps({"runs": runs + [{"seq_len": 32, "rounds": 0}]}))
    law = held_out_law(tmp_path)
    assert law is not None and law.lengths == (2.0, 4.0, 8.0, 16.0)
    assert law.what == "held-out loss of the final parameters"
    assert law.fit.alpha == pytest.approx(0.12) and law.fit.caveats() == []
    (tmp_path / "summary.json").write_text(json.dumps({"runs": runs[:2]}))
    assert held_out_law(tmp_path) is None  # two lengths: no law
    (tmp_path / "summary.json").write_text("not json")
    assert held_out_law(tmp_path) is None
    analysis = analyse(paper_curves(1000, noise=0.0))
    last = law_at_last_step(analysis)
    assert last.what.startswith(f"training loss at step {analysis.points[-1].step:.0f} (25-step mean)")
    assert last.fit.alpha == pytest.approx(0.3 * (1 - math.exp(-1000 / 100)), rel=0.02)


def test_a_sweep_of_two_lengths_is_told_it_needs_three():
    rows = [(length, step, 1.0 / step, float(step)) for length in (8, 16) for step in range(1, 10)]
    report = fit_step_means(rows, lengths=[8, 16])
    assert report.analysis is None
    assert report.message == "not enough lengths for a fit: the sweep trains 2 (L = 8, 16), a fit needs at least 3"
    waiting = fit_step_means(rows, lengths=[8, 16, 32, 64])
    assert waiting.message.startswith("not enough data yet: the sweep's L = 32, 64 have fewer than 2 steps")
