"""Dashboard reads never stall the writer (issue 13, finding 4): with a large metrics table, a
browser reloading /api/status while metrics keep arriving must not delay the writes a round
close makes (`commit_version`, `add_event`), and /api/status itself stays fast."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rcswarm.coordinator import SwarmCoordinator
from rcswarm.observe.dashboard import Dashboard
from rcswarm.state.records import MetricRow, RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from tests.helpers.dashboard import metric_rows
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state

ROWS = 500_000
BATCH = 50_000
WRITE_BOUND_S = 0.5
HAMMER_S = 6.0
BROWSERS = 3
MAX_WRITES = 300


def get_status(url: str) -> float:
    """Seconds one GET of /api/status took; raises on anything but 200."""
    started = time.perf_counter()
    with urllib.request.urlopen(url + "api/status", timeout=60) as response:
        response.read()
        assert response.status == 200
    return time.perf_counter() - started


@pytest.mark.slow
def test_status_reads_on_a_large_metrics_table_never_stall_the_writer(tmp_path: Path) -> None:
    spec = tiny_spec(run={"rounds": 0})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path, durable=False))
    store, now = coordinator.store, time.time()
    for first in range(0, ROWS, BATCH):
        store.add_metrics(metric_rows(coordinator.run_id, first, BATCH, now))
    dashboard = Dashboard(coordinator).start()
    latencies: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def hammer() -> None:
        deadline = time.monotonic() + HAMMER_S
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                latencies.append(get_status(dashboard.url))
            except BaseException as error:  # noqa: BLE001 - reported by the test below
                errors.append(error)
                return

    browsers = [threading.Thread(target=hammer, name=f"browser{i}", daemon=True) for i in range(BROWSERS)]
    writes: list[tuple[str, float]] = []
    try:
        for browser in browsers:
            browser.start()
        time.sleep(0.3)  # the first requests are under way
        params, momentum = coordinator.params, {"outer_momentum": coordinator.momentum}
        digest = tensor_stream.params_sha256(params).hex()
        for index in range(MAX_WRITES):
            if not any(browser.is_alive() for browser in browsers):
                break
            # New rows, as a live run sends them, so each request recomputes instead of hitting the cache.
            store.add_metrics(metric_rows(coordinator.run_id, ROWS + 10 * index, 10, now))
            started = time.perf_counter()
            store.commit_version(coordinator.run_id, index + 1, params, momentum,
                                 RoundRecord(index, now, now, 1, 128, "test", 0.1, digest))
            writes.append(("commit_version", time.perf_counter() - started))
            started = time.perf_counter()
            store.add_event("w0", "test", f"write {index}")
            writes.append(("add_event", time.perf_counter() - started))
            time.sleep(0.02)
    finally:
        stop.set()
        for browser in browsers:
            browser.join(timeout=120)
        dashboard.stop()
        coordinator.close()
    assert not errors, errors
    assert len(latencies) >= 2, f"only {len(latencies)} /api/status answers in {HAMMER_S} s"
    slowest = max(writes, key=lambda write: write[1])
    print(f"\n/api/status at {ROWS} metric rows: {len(latencies)} requests, median "
          f"{sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms; "
          f"slowest write {slowest[0]} {slowest[1] * 1000:.1f} ms over {len(writes)} writes")
    assert len(writes) >= 40
    assert slowest[1] < WRITE_BOUND_S, f"{slowest[0]} took {slowest[1]:.2f} s while the dashboard read"


def test_the_aggregates_match_the_metric_rows_they_summarise(tmp_path: Path) -> None:
    store = StateStore(tmp_path, durable=False)
    now = 1000.0
    try:
        for first in range(0, 2_000, 150):  # batches that split rounds and workers
            rows = metric_rows("run", first, 150, now)
            rows[0] = (*rows[0][:6], float("nan"), 0, *rows[0][8:])  # a row without a loss or tokens
            store.add_metrics(rows)
        store.add_metrics([("run", "w9", 1, 1, 32, 4, 2.0, 2**63 - 1, 1.0, 0.0, 0.0, 0, 0, "", now)] * 2)
        totals = {row.worker_id: row for row in store.worker_rows("run")}
        usage = {row.worker_id: row for row in store.worker_usage()}
        means = store.worker_step_means("run")
    finally:
        store.close()
    every = read_state(tmp_path, lambda store: store.metric_rows())
    by_worker: dict[str, list[MetricRow]] = {}
    for r in every:
        by_worker.setdefault(r.worker_id, []).append(r)
    for worker_id, mine in by_worker.items():
        tokens, sent, count, step = (sum(max(r.tokens, 0) for r in mine), max(r.bytes_sent for r in mine), len(mine),
                                     max(r.step for r in mine))
        assert totals[worker_id].tokens == min(int(tokens), 2**63 - 1) and usage[worker_id].tokens == totals[worker_id].tokens
        assert (totals[worker_id].bytes_sent, totals[worker_id].rows, totals[worker_id].last_step) == (sent, count, step)
    chosen: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in every:
        if r.loss is not None and r.loss > 0 and r.seq_len > 0 and r.step > 0 and r.run_id == "run":
            chosen.setdefault((r.seq_len, r.step), []).append((r.loss, r.wall_time))
    expected = [(*key, sum(loss for loss, _ in pairs) / len(pairs), sum(wall for _, wall in pairs) / len(pairs))
                for key, pairs in sorted(chosen.items())]
    assert [row[:2] for row in means] == [row[:2] for row in expected]
    assert [value for row in means for value in row[2:]] == pytest.approx([value for row in expected for value in row[2:]])
