"""/api/status and GetStatus on a large metrics table, while metric rows keep arriving.

    python benchmarks/dashboard_load_bench.py                          # 10 M rows, 64 workers
    python benchmarks/dashboard_load_bench.py --rows 1m --workers 4    # fewer rows, more steps per worker
    python benchmarks/dashboard_load_bench.py --state-dir /tmp/big     # keep the filled state dir for the next run

A real coordinator (`SwarmCoordinator`, tiny LSTM preset, its own state dir) gets `--rows` training
metric rows from `--workers` workers through `StateStore.add_metrics` in batches, as ReportMetrics
stores them (each batch folds into the aggregate tables in its transaction), so each worker reaches
rows / workers steps. Then the coordinator's dashboard serves on 127.0.0.1 while a writer thread adds
10 rows every 50 ms (a live run), and the benchmark times, one after another: `--requests` GETs of
/api/status (the first one cold: nothing cached), and as many calls of `SwarmCoordinator.status`
(what GetStatus answers). It prints each one's median, p90 and max, and the time the step-means-and-fits
build took (it runs in a background thread once it is slow; requests meanwhile get the previous one).
With `--state-dir` an existing state dir that already holds the rows is reused without filling.
Every wait has a timeout; the benchmark is not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import SwarmCoordinator
from rcswarm.observe.dashboard import Dashboard
from rcswarm.state.store import StateStore

BATCH = 100_000


def count(text: str) -> int:
    """'10m' -> 10_000_000, '500k' -> 500_000, '1234' -> 1234."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a count such as 10m, 500k or 1234") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive count")
    return value


def spec() -> RunSpec:
    return RunSpec.from_dict({
        "run": {"name": "dashboard-load", "rounds": 0, "workers": 2},
        "model": {"name": "lstm_lm", "preset": "tiny"},
        "coordinator": {"durable": False},
    })


def rows(run_id: str, first: int, n: int, workers: int, now: float) -> list[tuple]:
    """`n` training rows from `workers` workers, steps counting on from row `first` (METRIC_COLUMNS each)."""
    out = []
    for index in range(first, first + n):
        worker, step = index % workers, index // workers + 1
        out.append((run_id, f"w{worker}", step // 20, step, 64, 8, 3.0 / (1 + step) ** 0.1, 512, 0.01 * step,
                    0.01, 0.001, 1000 * step, 2000 * step, "", now + 0.001 * index))
    return out


def fill(coordinator: SwarmCoordinator, total: int, workers: int) -> float:
    """Add `total` rows in batches; seconds it took (0 when the store already holds them)."""
    store, now = coordinator.store, time.time()
    have = store.newest_metric_rowid()
    if have >= total:
        return 0.0
    started = time.perf_counter()
    for first in range(have, total, BATCH):
        store.add_metrics(rows(coordinator.run_id, first, min(BATCH, total - first), workers, now))
        if (first // BATCH) % 10 == 9:
            print(f"  {first + BATCH:,} rows, {time.perf_counter() - started:.0f}s", flush=True)
    return time.perf_counter() - started


def timed_get(url: str, timeout: float) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}")
    return time.perf_counter() - started


def summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"{name:>22} {len(seconds):>5} {1000 * statistics.median(seconds):>10.1f} {1000 * p90:>10.1f} "
            f"{1000 * max(seconds):>10.1f}")


def measure(args: argparse.Namespace, state_dir: Path) -> None:
    coordinator = SwarmCoordinator(spec(), StateStore(state_dir, durable=False))
    print(f"filling {args.rows:,} rows from {args.workers} workers ...", flush=True)
    filled = fill(coordinator, args.rows, args.workers)
    dashboard = Dashboard(coordinator).start()
    stop = threading.Event()
    first = coordinator.store.newest_metric_rowid()

    def live() -> None:
        index, now = first, time.time()
        while not stop.wait(0.05):
            coordinator.store.add_metrics(rows(coordinator.run_id, index, 10, args.workers, now))
            index += 10

    writer = threading.Thread(target=live, name="live-writer", daemon=True)
    writer.start()
    url = dashboard.url + "api/status"
    try:
        cold = timed_get(url, args.timeout)
        warm = [timed_get(url, args.timeout) for _ in range(args.requests)]
        statuses = []
        for _ in range(args.requests):
            started = time.perf_counter()
            coordinator.status()
            statuses.append(time.perf_counter() - started)
        time.sleep(0.1)
        curves = dashboard._cache.get("curves")
        build = curves.took if curves is not None else float("nan")
    finally:
        stop.set()
        writer.join(timeout=10.0)
        dashboard.stop()
        coordinator.close()
    print(f"\n{args.rows:,} metric rows, {args.workers} workers ({args.rows // args.workers:,} steps each), "
          f"filled in {filled:.0f}s; rows arriving every 50 ms")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'call':>22} {'n':>5} {'median ms':>10} {'p90 ms':>10} {'max ms':>10}")
    print(f"{'/api/status, cold':>22} {1:>5} {1000 * cold:>10.1f} {1000 * cold:>10.1f} {1000 * cold:>10.1f}")
    print(summary("/api/status", warm))
    print(summary("GetStatus (status())", statuses))
    print(f"{'curves build (bg)':>22} {1:>5} {1000 * build:>10.1f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=count, default=10_000_000, help="metric rows (default 10m)")
    parser.add_argument("--workers", type=int, default=64, help="workers the rows come from (default 64)")
    parser.add_argument("--requests", type=int, default=30, help="timed requests of each kind (default 30)")
    parser.add_argument("--state-dir", type=Path, default=None, help="fill (or reuse) this state dir")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds any one request may take (default 120)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.requests < 1 or args.timeout <= 0:
        parser.error("--workers and --requests need >= 1, --timeout > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.state_dir is not None:
        measure(args, args.state_dir)
        return 0
    with tempfile.TemporaryDirectory(prefix="dashboard-load-bench-") as work:
        measure(args, Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
