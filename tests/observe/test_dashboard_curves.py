"""/api/status's cost does not grow with the run's steps (issue 13): once the step means and fits are
large, requests get the previous curves and a background thread rebuilds them at most once per
refresh interval, while small curves stay exact per request. A real coordinator, store and dashboard
on 127.0.0.1."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcswarm.coordinator import SwarmCoordinator
from rcswarm.observe.dashboard import Dashboard
from rcswarm.observe.dashboard import server as dashboard_server
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import metric_rows
from tests.helpers.specs import tiny_spec
from tests.helpers.waiting import wait_for


def status(dashboard: Dashboard) -> dict[str, Any]:
    with urllib.request.urlopen(dashboard.url + "api/status", timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SwarmCoordinator, Dashboard, list[int]]]:
    """A coordinator with 2,000 metric rows, its dashboard, and the number of step-means builds so far."""
    coordinator = SwarmCoordinator(tiny_spec(run={"rounds": 0}), StateStore(tmp_path, durable=False))
    coordinator.store.add_metrics(metric_rows(coordinator.run_id, 0, 2_000, 1000.0))
    builds: list[int] = []
    real = dashboard_server.step_means

    def counting(*args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dashboard_server, "step_means", counting)
    dashboard = Dashboard(coordinator).start()
    try:
        yield coordinator, dashboard, builds
    finally:
        dashboard.stop()
        coordinator.close()


def last_step(data: dict[str, Any]) -> int:
    """The newest worker step of `metric_rows` the curves hold: the curves count the run step (`views.presentation`),
    and a row of worker step s ≥ 5 is trained from version s // 5 at step s − 5·(s // 5) of its round, run step
    s + 1 (inner.steps = 5; version 0 starts at worker step 1)."""
    return data["runs"][0]["metrics"]["last_step"] - 1


def test_small_curves_are_rebuilt_for_every_request_after_new_rows(counted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, dashboard, builds = counted
    assert last_step(status(dashboard)) == 500 and len(builds) == 1
    status(dashboard)
    assert len(builds) == 1, "rebuilt without new rows"
    coordinator.store.add_metrics(metric_rows(coordinator.run_id, 2_000, 8, 1000.0))
    assert last_step(status(dashboard)) == 502 and len(builds) == 2


def test_large_curves_are_served_as_they_are_and_rebuilt_in_the_background(counted: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, dashboard, builds = counted
    monkeypatch.setattr(dashboard_server, "LARGE_CURVES", 100)  # the 500 steps' curves count as large
    monkeypatch.setattr(dashboard_server, "CURVES_REFRESH_S", 3600.0)
    assert last_step(status(dashboard)) == 500 and len(builds) == 1
    for first in range(2_000, 2_400, 8):  # rows keep arriving, as in a live run
        coordinator.store.add_metrics(metric_rows(coordinator.run_id, first, 8, 1000.0))
        assert last_step(status(dashboard)) == 500
    assert len(builds) == 1, "a request rebuilt the curves although a rebuild is not due"
    monkeypatch.setattr(dashboard_server, "CURVES_REFRESH_S", 0.0)
    monkeypatch.setattr(dashboard_server, "CURVES_REFRESH_FACTOR", 0.0)
    started = time.monotonic()
    assert last_step(status(dashboard)) == 500  # this request starts the rebuild and does not wait for it
    wait_for(lambda: last_step(status(dashboard)) == 600, 30.0, "the rebuilt curves")
    assert len(builds) >= 2 and time.monotonic() - started < 30.0
    assert not dashboard._refreshing
