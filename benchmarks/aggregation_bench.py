"""What robustness costs: each aggregator's time and memory, and the loss of an honest run under each.

    python benchmarks/aggregation_bench.py                              # 10 M and 100 M, 4 and 16 updates
    python benchmarks/aggregation_bench.py --sizes 10m --updates 4 16   # the cheap rows only
    python benchmarks/aggregation_bench.py --skip-time --rounds 30      # only the honest runs
    python benchmarks/aggregation_bench.py --quick                      # smoke run: 1 M parameters, 8 rounds

Time: `aggregation.aggregate` (the coordinator's call at a round close) on N float32 updates of
P parameters (random, split into tensors shaped like the residual LSTM's: a few large matrices
and small vectors), median of `--repeats` calls after one warm-up, one torch thread; freed heap
memory is handed back to the OS before each call (`malloc_trim`), so each call pays for the pages
of its result. Extra RSS is the peak resident memory above the RSS at the call's start (sampled
every 2 ms from /proc/self/statm), i.e. what the aggregator allocates: the float32 result and its
float64 slice buffers (centered_clip's centre is its result).

Loss: a real coordinator (in-process, gRPC on 127.0.0.1) and 4 real workers (threads of this
process, `worker.Worker`) train the tiny LSTM for `--rounds` rounds under each aggregation, same
seeds and data (every round waits for all 4, so each run sees the same updates until the
aggregators differ); the table gives the held-out loss (4 fixed validation batches) of the last
version and the mean over the last 5, against `mean`'s, and how many updates were flagged.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import aggregation
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.store import StateStore
from rcswarm.models import registry
from rcswarm.protos import tensor_stream
from rcswarm.worker.inner import make_sampler, masked_cross_entropy
from rcswarm.worker.worker import Worker, WorkerOptions

TOKEN = "aggregation-bench-token"
METHODS = ("mean", "clipped_mean", "trimmed_mean", "centered_clip")
SIZES = {"1m": 1_000_000, "10m": 10_000_000, "100m": 100_000_000}
PAGE = os.sysconf("SC_PAGE_SIZE")
LIBC = ctypes.CDLL("libc.so.6")


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc `malloc_trim`), so that every timed call starts
    from the same RSS and pays for the pages it touches, whichever aggregator ran before."""
    LIBC.malloc_trim(0)


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


class PeakRss:
    """The highest RSS seen by a sampling thread while the `with` body runs, above the RSS at its start."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s, self.extra, self._stop = interval_s, 0, threading.Event()

    def __enter__(self) -> PeakRss:
        self.base = rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.extra = max(self.extra, rss_bytes() - self.base)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.extra = max(self.extra, rss_bytes() - self.base)


def shapes_for(parameters: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes summing to `parameters`: four square-ish matrices and a few vectors, like an LSTM's."""
    side = int((parameters * 0.24) ** 0.5)
    shapes = {f"layer{i}.weight": (side, side) for i in range(4)}
    used = 4 * side * side
    shapes.update({"embed.bias": (1031,), "norm.weight": (7,)})
    shapes["head.weight"] = (parameters - used - 1038,)
    return shapes


def make_updates(parameters: int, n: int, seed: int = 0) -> list[aggregation.Update]:
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for i in range(n):
        deltas = {name: torch.randn(shape, generator=generator).mul_(1e-3) for name, shape in shapes_for(parameters).items()}
        updates.append(aggregation.Update(f"w{i:02d}", 1000 + i, tensor_stream.global_norm(deltas), deltas))
    return updates


def time_row(updates: list[aggregation.Update], method: str, repeats: int) -> tuple[float, float]:
    """Median seconds of `aggregate` over `repeats` calls (after a warm-up) and the largest extra RSS in MiB."""
    options = aggregation.AggregationOptions(method)
    history = [u.norm for u in updates]
    previous = {name: t.clone() for name, t in updates[0].deltas.items()} if method == "centered_clip" else None
    aggregation.aggregate(updates, options, history, previous)
    seconds, extra = [], 0
    for _ in range(repeats):
        release_freed_memory()
        with PeakRss() as peak:
            started = time.perf_counter()
            aggregation.aggregate(updates, options, history, previous)
            seconds.append(time.perf_counter() - started)
        extra = max(extra, peak.extra)
    return statistics.median(seconds), extra / 2**20


def time_table(sizes: list[str], counts: list[int], repeats: int) -> None:
    print("| parameters | updates | aggregation | median s | × mean | extra RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        for n in counts:
            started = time.perf_counter()
            updates = make_updates(SIZES[size], n)
            made = time.perf_counter() - started
            base = None
            for method in METHODS:
                seconds, extra = time_row(updates, method, repeats)
                base = base or seconds
                print(f"| {size} | {n} | {method} | {seconds:.3f} | {seconds / base:.2f} | {extra:.0f} |", flush=True)
            print(f"<!-- {size} × {n}: inputs made in {made:.1f} s, {n * SIZES[size] * 4 / 2**30:.2f} GiB -->", flush=True)
            del updates


def honest_spec(method: str, rounds: int, preset: str) -> RunSpec:
    return RunSpec.from_dict({
        "run": {"name": "aggbench", "rounds": rounds, "workers": 4},
        "model": {"name": "lstm_lm", "preset": preset},
        "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 300_000},
        "inner": {"steps": 5, "lr": 1e-2},
        "sync": {"aggregation": method, "min_reports": 4, "round_deadline_s": 60.0},
        "coordinator": {"lease_s": 15.0, "max_wait_s": 2.0, "keep_checkpoints": 6, "durable": False},
    })


def honest_run(method: str, rounds: int, preset: str, state_dir: Path) -> tuple[list[float], int, float]:
    """Held-out losses of the last 5 versions, updates flagged, and mean seconds of the close's aggregation."""
    spec = honest_spec(method, rounds, preset)
    store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    coordinator = SwarmCoordinator(spec, store)
    running = RunningCoordinator(coordinator, TOKEN).start()
    averages: list[float] = []
    watching = threading.Event()

    def watch() -> None:
        seen = None
        while not watching.wait(0.05):
            seconds = coordinator.last_close_seconds
            if seconds is not seen and seconds:
                averages.append(seconds["average"])
                seen = seconds

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    workers = [Worker(WorkerOptions(f"127.0.0.1:{running.port}", TOKEN, device="cpu", name=f"w{i}")) for i in range(4)]
    codes: dict[str, int] = {}
    threads = [threading.Thread(target=lambda w=w: codes.__setitem__(w.name, w.run())) for w in workers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=1800)
    finally:
        for w in workers:
            w.stop.set()
        watching.set()
        watcher.join()
        running.stop(grace=0.5)
    if codes != {f"w{i}": 0 for i in range(4)}:
        raise RuntimeError(f"a worker failed: {codes}")
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides)
    val = make_sampler(spec.data, seed=12345, split="val")
    batches = [val.next_batch() for _ in range(4)]
    losses = []
    for version in range(rounds - 4, rounds + 1):
        tensors = load_params(state_dir / "checkpoints" / f"v{version:08d}.safetensors")
        model.load_state_dict(tensors, strict=True)
        with torch.no_grad():
            losses.append(sum(float(masked_cross_entropy(model(x), y)) for x, y in batches) / len(batches))
    return losses, flagged_updates(state_dir), statistics.mean(averages) if averages else float("nan")


def load_params(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: t for name, t in load_file(str(path)).items() if "/" not in name}


def flagged_updates(state_dir: Path) -> int:
    """Updates the rounds record as flagged or dropped, read through a read-only store."""
    store = StateStore.open_read_only(state_dir)
    try:
        return sum(r.clipped + r.dropped for r in store.recent_rounds(10**6))
    finally:
        store.close()


def loss_table(rounds: int, preset: str) -> None:
    print(f"lstm_lm {preset}, 4 workers, {rounds} rounds of 5 inner steps of 4 × 32 bytes, int8, same seeds")
    print(f"| aggregation | held-out loss, version {rounds} | mean of last 5 | vs mean (last 5) | flagged updates | "
          "aggregate s / round |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = None
    for method in METHODS:
        with tempfile.TemporaryDirectory() as tmp:
            losses, flagged, seconds = honest_run(method, rounds, preset, Path(tmp))
        late = statistics.mean(losses)
        base = base or late
        print(f"| {method} | {losses[-1]:.5f} | {late:.5f} | {late / base - 1:+.3%} | {flagged} | {seconds:.4f} |",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "100m"], choices=sorted(SIZES))
    parser.add_argument("--updates", nargs="+", type=int, default=[4, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--preset", default="tiny", help="lstm_lm preset of the honest runs (tiny, small)")
    parser.add_argument("--skip-time", action="store_true", help="only the honest runs")
    parser.add_argument("--skip-loss", action="store_true", help="only the timings")
    parser.add_argument("--quick", action="store_true", help="1 M parameters, 4 updates, 8 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.updates, args.repeats, args.rounds = ["1m"], [4], 1, 8
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, 1 torch thread")
    if not args.skip_time:
        time_table(args.sizes, args.updates, args.repeats)
    if not args.skip_loss:
        print()
        loss_table(args.rounds, args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
