"""A single run's fit counts the run's own step (`views.presentation`): a worker that restarts (leaves, and a new
process joins in its place) counts its own steps from 1 again, and must not land among the run's first steps.
A real coordinator, store and dashboard on 127.0.0.1."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from rcswarm.coordinator import SwarmCoordinator
from rcswarm.observe.dashboard import Dashboard
from rcswarm.observe.dashboard.views import presentation
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import ALPHA_INF, LENGTHS, TAU, true_loss
from tests.helpers.specs import tiny_spec

INNER = 5  # tiny_spec's inner.steps: a round trains 5 steps
ROUNDS = 24  # 120 run steps
T0 = 1_000_000.0


def rows_of(run_id: str, worker: str, length: int, versions: range,
            own_first: int) -> list[tuple[Any, ...]]:
    """METRIC_COLUMNS rows of run `run_id`'s `worker` at `length` for the rounds trained from `versions`, its own
    step counter starting at `own_first`, its own clock at 0 when it started; each row arrives at
    T0 + run step · L/1000 s."""
    rows = []
    for version in versions:
        for k in range(INNER):
            run_step = version * INNER + k + 1
            own = own_first + (version - versions[0]) * INNER + k
            rows.append((run_id, worker, version, own, length, 4, true_loss(run_step, length), 4 * length,
                         own * length / 1000.0, own * length / 1200.0, 0.0, 0, 0, "", T0 + run_step * length / 1000.0))
    return rows


def test_a_restarted_worker_counts_on_the_runs_steps_and_keeps_the_fit(tmp_path: Path) -> None:
    coordinator = SwarmCoordinator(tiny_spec(run={"rounds": 0}), StateStore(tmp_path, durable=False))
    run, rows = coordinator.run_id, []
    for length in LENGTHS:
        if length == 64:  # this length's worker left after 12 rounds; the process that replaced it counts from 1
            rows += rows_of(run, "w64", 64, range(12), 1) + rows_of(run, "w64-restarted", 64, range(12, ROUNDS), 1)
        else:
            rows += rows_of(run, f"w{length}", length, range(ROUNDS), 1)
    coordinator.store.add_metrics(sorted(rows, key=lambda row: row[-1]))
    dashboard = Dashboard(coordinator).start()
    try:
        with urllib.request.urlopen(dashboard.url + "api/status", timeout=30) as response:
            data = json.loads(response.read())
    finally:
        dashboard.stop()
        coordinator.close()
    fit = data["fits"]["fit"]
    assert fit is not None, data["fits"]["message"]
    # On the workers' own steps the restarted worker's rows fell on steps 1-60 and the fit read α∞ = 0.444, τ = 0,
    # R² = 0; on the run's steps it is the law's.
    assert abs(fit["alpha_inf"] - ALPHA_INF) < 0.02 and abs(fit["tau"] - TAU) < 4.0 and fit["r_squared"] > 0.99
    assert data["runs"][0]["metrics"]["last_step"] == ROUNDS * INNER
    assert presentation(False) == ("run", presentation(True)[1]) and data["clock"] == "run"
