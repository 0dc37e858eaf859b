"""The dashboard's log axes: readable tick labels (plain numbers that never overlap) over any range."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rcswarm.observe.analysis import FitReport, LengthCurve
from rcswarm.observe.dashboard.render import plot_figure
from rcswarm.observe.plots import MAX_TICK_LABELS, log_ticks

# Wall-time spans a run's curves can cover: seconds of a short run, minutes, a narrow late window, hours.
SPANS = [(0.5, 3.0), (20.0, 200.0), (100.0, 130.0), (1.0, 1e4), (0.01, 5000.0), (2.31, 2.35)]


def _report(first: float, last: float) -> FitReport:
    """Three lengths' curves whose wall times run from `first` to `last` seconds (no fit: the plots only)."""
    steps = np.arange(1, 200, dtype=float)  # [199]
    curves = [LengthCurve(length, (), steps, 3.0 * steps ** -0.1 * length ** -0.1, np.geomspace(first, last, len(steps)), 0.1)
              for length in (2.0, 4.0, 8.0)]
    return FitReport(curves, None, "not enough lengths for a fit")


def _labels(axis) -> list:
    return [label for label in axis.get_ticklabels(which="both") if label.get_visible() and label.get_text()]


@pytest.mark.parametrize("span", SPANS)
def test_wall_time_and_loss_labels_are_plain_numbers_that_do_not_overlap(span):
    figure = plot_figure("loss_time", _report(*span))
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    (axes,) = figure.axes
    for axis in (axes.xaxis, axes.yaxis):
        labels = _labels(axis)
        assert len(labels) >= 2, [label.get_text() for label in labels]
        assert all("10^" not in label.get_text() and "\\times" not in label.get_text() for label in labels)
        boxes = [label.get_window_extent(renderer) for label in labels]
        overlapping = [(labels[i].get_text(), labels[j].get_text())
                       for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]
        assert not overlapping, overlapping


def test_log_ticks_prefer_round_numbers_and_stay_apart():
    assert log_ticks(20.0, 200.0) == [20.0, 50.0, 100.0, 200.0]
    assert log_ticks(1.0, 1e4) == [1.0, 10.0, 100.0, 1000.0, 1e4]
    assert log_ticks(100.0, 130.0) == [100.0, 110.0, 120.0, 130.0]
    for low, high in [*SPANS, (1e-3, 1e6), (1763900000.0, 1763900200.0)]:
        ticks = log_ticks(low, high)
        assert 2 <= len(ticks) <= MAX_TICK_LABELS + 1 and all(low <= t <= high for t in ticks), (low, high, ticks)
        if len(ticks) > 3:
            gaps = np.diff(np.log10(ticks))
            assert gaps.min() >= math.log10(high / low) / MAX_TICK_LABELS - 1e-12, (low, high, ticks)
