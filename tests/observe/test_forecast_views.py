"""Forecasts where people read them (issue #30): the dashboard's run table, its forecast panel, /api/status and
/metrics, over a real in-process sweep whose losing length was pruned."""

from __future__ import annotations

import json

import pytest

from tests.helpers.dashboard import assert_png_not_blank, get
from tests.helpers.forecasts import ROUNDS, good_loss


def test_the_dashboard_shows_each_runs_forecast_its_band_and_the_pruning(served):
    sweep, base = served
    status = json.loads(get(base + "api/status")[2])
    good, bad = (run["forecast"] for run in status["runs"])
    assert good["loss"] == pytest.approx(good_loss(ROUNDS), abs=0.02) and good["low"] <= good["loss"] <= good["high"]
    assert good["at_round"] == ROUNDS and good["loss_kind"] == "train" and good["stopped"] is None
    assert "pruned" in bad["stopped"]
    page = get(base)[2].decode()
    assert "forecast of the final loss (90%)" in page and "/plot/forecast.png" in page and "pruned: " in page
    code, content_type, png = get(base + "plot/forecast.png")
    assert code == 200 and content_type == "image/png"
    assert_png_not_blank(png)


def test_metrics_export_the_forecast_and_the_pruned_flag(served):
    from prometheus_client.parser import text_string_to_metric_families

    sweep, base = served
    families = {f.name: f for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
    by_run = {name: {s.labels["run_id"]: s.value for s in families[name].samples}
              for name in ("rcswarm_forecast_loss", "rcswarm_forecast_loss_low", "rcswarm_forecast_loss_high",
                           "rcswarm_run_pruned")}
    good, bad = (run.run_id for run in sweep.runs)
    assert by_run["rcswarm_forecast_loss"][good] == pytest.approx(good_loss(ROUNDS), abs=0.02)
    assert by_run["rcswarm_forecast_loss_low"][good] <= by_run["rcswarm_forecast_loss_high"][good]
    assert by_run["rcswarm_run_pruned"] == {good: 0.0, bad: 1.0}


def test_rcswarm_status_and_fit_show_the_forecasts(served, tmp_path, capsys):
    from rich.console import Console

    from rcswarm.cli import fit, status

    sweep, _ = served
    console = Console(width=200, record=True)
    status.report(sweep.status(), console)
    shown = console.export_text()
    assert "forecasts of each run's final loss (90%)" in shown and "pruned: " in shown and f"at round {ROUNDS}" in shown
    fit.forecast_report(tmp_path / "state", console)
    shown = console.export_text()
    assert "run0-L8" in shown and "run1-L16" in shown and "pruned: " in shown
