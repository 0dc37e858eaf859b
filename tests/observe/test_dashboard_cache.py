"""What the dashboard caches and reads stays true to the store: a plot drawn from large curves catches up with the
run's last rows (it keeps the stamp of the curves it was drawn from, not of the rows seen when its rebuild started),
and /metrics' round-duration histogram is aggregated in SQL (a scrape reads O(buckets) values, not one row per
round) with the text the per-row computation gave. A real coordinator, SQLite store and dashboard on 127.0.0.1."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from rcswarm.coordinator import SwarmCoordinator
from rcswarm.observe.dashboard import Dashboard
from rcswarm.observe.dashboard import server as dashboard_server
from rcswarm.observe.dashboard.prometheus import ROUND_BUCKETS
from rcswarm.observe.dashboard.render import DEFAULT_SMOOTHING, render_plot
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import metric_rows
from tests.helpers.specs import tiny_spec

HISTOGRAM_METRICS = ("rcswarm_round_duration_seconds", "rcswarm_rounds_closed", "rcswarm_last_round_duration_seconds")


def fetch(dashboard: Dashboard, path: str) -> bytes:
    with urllib.request.urlopen(dashboard.url + path, timeout=30) as response:
        assert response.status == 200
        return response.read()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SwarmCoordinator, Dashboard]]:
    """A coordinator with 2,000 metric rows (500 steps) and its dashboard."""
    coordinator = SwarmCoordinator(tiny_spec(run={"rounds": 0}), StateStore(tmp_path, durable=False))
    coordinator.store.add_metrics(metric_rows(coordinator.run_id, 0, 2_000, 1000.0))
    dashboard = Dashboard(coordinator).start()
    try:
        yield coordinator, dashboard
    finally:
        dashboard.stop()
        coordinator.close()


def add_rounds(store: StateStore, durations: list[tuple[float | None, float | None]], first: int) -> None:
    """Closed rounds of versions first, first + 1, ... with these (opened_at, closed_at)."""
    with store._writer() as db:
        db.execute("BEGIN")
        db.executemany("INSERT INTO rounds (version, opened_at, closed_at, reports, tokens, close_reason, update_norm) "
                       "VALUES (?, ?, ?, 2, 100, 'all', 1.0)",
                       [(first + index, opened, closed) for index, (opened, closed) in enumerate(durations)])
        db.execute("COMMIT")


def exact_durations(count: int, first: int) -> list[tuple[float | None, float | None]]:
    """(opened_at, closed_at) of `count` rounds of versions from `first` lasting powers of two from 1/16 s to 1024 s:
    on edges, between them and past the last, and summed exactly in any order."""
    return [(1000.0 + 4 * index, 1000.0 + 4 * index + 2.0 ** ((first + index) * 7 % 15 - 4)) for index in range(count)]


def per_row_lines(run_id: str, store: StateStore) -> set[str]:
    """The histogram's sample lines as the collector computed them from every round's row before the aggregate
    query: the finite durations in version order, counted per edge and summed in Python."""
    rows = store._read("SELECT closed_at - opened_at FROM rounds WHERE closed_at IS NOT NULL AND opened_at IS NOT NULL "
                       "ORDER BY version")
    durations = [row[0] for row in rows if row[0] is not None and abs(row[0]) < float("inf")]
    closed = CounterMetricFamily("rcswarm_rounds_closed", "closed", labels=["run_id"])
    closed.add_metric([run_id], len(durations))
    histogram = HistogramMetricFamily("rcswarm_round_duration_seconds", "durations", labels=["run_id"])
    buckets = [(f"{edge:g}", float(sum(1 for x in durations if x <= edge))) for edge in ROUND_BUCKETS]
    histogram.add_metric([run_id], [*buckets, ("+Inf", float(len(durations)))], sum_value=float(sum(durations)))
    last = GaugeMetricFamily("rcswarm_last_round_duration_seconds", "last", labels=["run_id"])
    if durations:
        last.add_metric([run_id], durations[-1])

    class Families:
        def collect(self) -> Any:
            yield from (closed, histogram, last)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())  # type: ignore[arg-type]
    return histogram_lines(generate_latest(registry))


def histogram_lines(text: bytes) -> set[str]:
    """The sample lines of the round-duration metrics in a Prometheus exposition."""
    return {line for line in text.decode().splitlines() if line.startswith(HISTOGRAM_METRICS)}


def test_a_plot_of_large_curves_catches_up_with_the_last_rows(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, dashboard = served
    monkeypatch.setattr(dashboard_server, "LARGE_CURVES", 100)  # the 500 steps' curves count as large
    monkeypatch.setattr(dashboard_server, "CURVES_REFRESH_S", 0.2)
    monkeypatch.setattr(dashboard_server, "CURVES_REFRESH_FACTOR", 1.0)
    before = fetch(dashboard, "plot/loss_step.png")
    assert dashboard._cache["curves"].points > 100
    # The run's last rows, at five times the loss: then nothing arrives any more (a finished or paused run).
    rows = [(*row[:6], 5 * row[6], *row[7:]) for row in metric_rows(coordinator.run_id, 2_000, 400, 1000.0)]
    coordinator.store.add_metrics(rows)
    time.sleep(0.3)  # past the refresh interval: the next plot request starts a rebuild
    current = render_plot("loss_step", dashboard._build_curves()[1], DEFAULT_SMOOTHING)
    assert current != before
    deadline, plot = time.monotonic() + 10.0, before
    while plot != current and time.monotonic() < deadline:
        plot = fetch(dashboard, "plot/loss_step.png")  # what a browser's image refresh asks, nothing else
        time.sleep(0.1)
    stamp = dashboard._cache[f"plot:loss_step:{DEFAULT_SMOOTHING:g}"].stamp
    assert plot == current, f"the plot still shows older curves (its stamp {stamp}, rows {dashboard._newest_rowids()})"


def test_the_histogram_text_is_that_of_the_rows(served: Any) -> None:
    coordinator, dashboard = served
    store = coordinator.store
    empty = histogram_lines(fetch(dashboard, "metrics"))
    assert empty == per_row_lines(coordinator.run_id, store) and any("_count" in line for line in empty)
    add_rounds(store, exact_durations(500, 1), 1)
    lines = histogram_lines(fetch(dashboard, "metrics"))
    assert lines == per_row_lines(coordinator.run_id, store)
    assert f'rcswarm_round_duration_seconds_count{{run_id="{coordinator.run_id}"}} 500.0' in lines
    # Rounds closed since the last scrape: read alone and added to the histogram that scrape read.
    add_rounds(store, exact_durations(37, 501), 501)
    assert histogram_lines(fetch(dashboard, "metrics")) == per_row_lines(coordinator.run_id, store)


def test_a_scrape_reads_aggregates_not_a_row_per_round(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, dashboard = served
    store = coordinator.store
    fetch(dashboard, "metrics")  # builds the curves (500 step means), cached while no metric row arrives
    add_rounds(store, exact_durations(3_000, 1), 1)
    fetched: list[tuple[int, str]] = []
    read = store._read

    def counting(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        rows = read(sql, params)
        fetched.append((len(rows), sql))
        return rows

    monkeypatch.setattr(store, "_read", counting)
    lines = histogram_lines(fetch(dashboard, "metrics"))
    assert f'rcswarm_rounds_closed_total{{run_id="{coordinator.run_id}"}} 3000.0' in lines
    most = max(fetched)
    assert most[0] < 300, f"a scrape's read fetched {most[0]} rows (3,000 rounds): {most[1]}"


def test_the_store_aggregates_finite_durations_in_one_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path, durable=False)
    try:
        assert store.round_duration_histogram(ROUND_BUCKETS) == (0, 0, 0.0, (0,) * len(ROUND_BUCKETS), None)
        inf = float("inf")
        # On an edge, between, past the last edge, unknown (NULL), ±inf, then a finite newest round.
        add_rounds(store, [(10.0, 10.5), (10.0, 12.0), (10.0, 710.0), (10.0, None), (None, 3.0), (10.0, inf),
                           (inf, 10.0), (20.0, 20.25), (30.0, inf)], 1)
        reads: list[str] = []
        read = store._read

        def logged(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
            reads.append(sql)
            return read(sql, params)

        monkeypatch.setattr(store, "_read", logged)
        edges = (0.25, 0.5, 1.0, 600.0)
        assert store.round_duration_histogram(edges) == (9, 4, 702.75, (1, 2, 2, 3), 0.25)
        assert len(reads) == 1 and "COUNT(" in reads[0] and "TOTAL(" in reads[0]
        assert store.round_duration_histogram(edges, after=2) == (9, 2, 700.25, (1, 1, 1, 1), 0.25)
        assert store.round_duration_histogram(edges, after=9) == (9, 0, 0.0, (0, 0, 0, 0), None)
        for bad in ((1.0, 1.0), (2.0, 1.0), (1.0, inf), (float("nan"),)):
            with pytest.raises(ValueError, match="expected finite seconds in increasing order"):
                store.round_duration_histogram(bad)
    finally:
        store.close()
