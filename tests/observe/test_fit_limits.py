"""What bounds a fit's work and what wall-time problems leave of it: a worker that reports rows at hundreds of
lengths makes neither the dashboard's nor `rcswarm fit`'s fit slow (the work per length is numpy, and a fit takes at
most MAX_LENGTHS lengths, saying which it left out); times that do not overlap, a constant wall time and a length
without a pace cost a crossover or a length, named, not the α(s) fit, and no error message lists a whole curve."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from rcswarm.observe import fits
from rcswarm.observe.analysis import MAX_LENGTHS, fit_rows, fit_step_means
from tests.helpers.dashboard import ALPHA_INF, LENGTHS, true_loss


def law_rows(lengths: tuple[int, ...] = LENGTHS, steps: range = range(1, 301)) -> list[tuple[float, ...]]:
    """(seq_len, step, loss, seconds) of the known law, L/1000 s per step."""
    return [(length, step, true_loss(step, length), step * length / 1000.0) for length in lengths for step in steps]


def test_a_worker_reporting_hundreds_of_lengths_leaves_a_bounded_fit_of_the_runs_lengths() -> None:
    rogue = [row for i in range(300) for row in ((1000 + i, 1, 3.0, 1.0), (1000 + i, 2, 2.9, 2.0))]
    started = time.perf_counter()
    report = fit_step_means(law_rows() + rogue)
    took = time.perf_counter() - started
    assert report.analysis is not None, report.message
    assert len(report.curves) == MAX_LENGTHS and len(report.analysis.curves) == MAX_LENGTHS
    assert {curve.length for curve in report.curves} >= set(LENGTHS)  # those with the most recorded steps
    (note,) = report.analysis.notes
    assert note.startswith(f"{304 - MAX_LENGTHS} of 304 lengths left out, L = [1028, 1029, 1030, …, 1297, 1298, 1299]")
    assert len(note) < 300 and report.summary()["fit"]["notes"] == [note]
    assert took < 3.0, f"{took:.1f} s (12 s before: 4,000 Python calls of the gap per neighbouring pair)"


def test_a_predicted_crossover_evaluates_the_law_on_arrays() -> None:
    calls: list[int] = []

    def log_amplitude(steps: np.ndarray) -> np.ndarray:
        calls.append(np.size(steps))
        return np.log(2.0 + 3.0 * np.exp(-np.asarray(steps, dtype=float) / 200.0))

    schedule = fits.AlphaScheduleFit(alpha_inf=0.3, tau=100.0, r_squared=1.0)
    cross = fits.predicted_crossover(schedule, 2, 1.0, 4, 2.0, log_amplitude=log_amplitude)
    assert cross is not None and len(calls) <= 2 * (1 + fits.REFINE_ROUNDS), len(calls)  # was 8,200 calls

    def gap(t: float) -> float:
        return float(log_amplitude(np.array(t / 2.0)) - schedule.alpha(t / 2.0) * math.log(4)
                     - log_amplitude(np.array(t)) + schedule.alpha(t) * math.log(2))

    assert gap(cross.time * (1 - 1e-9)) >= 0 > gap(cross.time * (1 + 1e-9))  # the sign change, to a float's precision
    # A function of one float, and a constant (a configured law's A), still serve.
    scalar = fits.predicted_crossover(schedule, 2, 1.0, 4, 2.0,
                                      log_amplitude=lambda s: math.log(2.0 + 3.0 * math.exp(-s / 200.0)))
    assert scalar is not None and scalar.time == pytest.approx(cross.time, rel=1e-9)
    constant = fits.predicted_crossover(schedule, 2, 1.0, 4, 2.0, log_amplitude=lambda s: 0.7)
    assert constant == fits.predicted_crossover(schedule, 2, 1.0, 4, 2.0)


def test_times_that_do_not_overlap_make_a_crossover_unobservable_not_an_error() -> None:
    observed = fits.observed_crossover([0, 10, 20], [3.0, 2.0, 1.8], [30, 40, 50], [2.5, 1.5, 1.2])
    assert observed.time is None and "do not overlap" in observed.note
    # Through the fit: L=64's times start after L=32's end; α(s) does not use time and is kept.
    rows = [(length, step, loss, t + (10_000.0 if length == 64 else 0.0)) for length, step, loss, t in law_rows()]
    report = fit_step_means(rows)
    assert report.analysis is not None, report.message
    assert abs(report.analysis.schedule.alpha_inf - ALPHA_INF) < 0.05
    pairs = {(c.length_short, c.length_long): c for c in report.analysis.crossovers}
    assert "do not overlap" in pairs[32.0, 64.0].observed_note and "do not overlap" in pairs[64.0, 128.0].observed_note


def test_a_constant_wall_time_has_no_pace_and_errors_show_a_few_values() -> None:
    steps, constant = np.arange(1, 1001, dtype=float), np.full(1000, 5.0)
    with pytest.raises(ValueError, match="expected wall time to increase with step") as raised:
        fits.seconds_per_step(steps, constant)  # a least-squares slope of about 1e-18
    assert len(str(raised.value)) < 200 and "(1000 values)" in str(raised.value)
    with pytest.raises(ValueError, match="expected at least 2 distinct values") as raised:
        fits.observed_crossover(constant, np.linspace(3, 2, 1000), steps, np.linspace(3, 1, 1000))
    assert len(str(raised.value)) < 200, len(str(raised.value))  # was every value: 51 KB in /api/status
    assert fits.seconds_per_step([1, 2, 3], [1e9, 1e9 + 1, 1e9 + 2]) == pytest.approx(1.0)  # a pace on a large clock


def test_lengths_without_a_pace_are_named() -> None:
    rows = [(length, step, loss, 0.0 if length == 256 else t) for length, step, loss, t in law_rows()]
    report = fit_step_means(rows)
    assert report.analysis is not None and [c.length for c in report.analysis.curves] == [32, 64, 128]
    assert report.analysis.notes == (("L = [256] left out: wall time does not increase with step, so there are no "
                                      "seconds per step for the crossovers"),)
    assert ("lengths left out", report.analysis.notes[0]) in fit_rows(report.summary()["fit"])
    frozen = [(length, step, loss, 0.0 if length in (128, 256) else t) for length, step, loss, t in law_rows()]
    assert "(L = [128, 256])" in fit_step_means(frozen).message
