"""What robustness costs: each aggregator's and the direction check's time and memory, the loss of an honest
run under each with the check on and off, and the direction scores of honest and flipped updates.

    python benchmarks/aggregation_bench.py                              # 10 M and 100 M, 4 and 16 updates
    python benchmarks/aggregation_bench.py --sizes 10m --updates 4 16   # the cheap rows only
    python benchmarks/aggregation_bench.py --skip-time --rounds 30      # only the honest runs
    python benchmarks/aggregation_bench.py --skip-time --rounds 10 --workers 16 --methods clipped_mean
    python benchmarks/aggregation_bench.py --quick                      # smoke run: 1 M parameters, 8 rounds

Time: `aggregation.aggregate` (the coordinator's call at a round close) on N float32 updates of
P parameters (random, split into tensors shaped like the residual LSTM's: a few large matrices
and small vectors), median of `--repeats` calls after one warm-up (the rows of one size take turns,
so that load from other processes falls on all of them alike), one torch thread; freed heap
memory is handed back to the OS before each call (`malloc_trim`), so each call pays for the pages
of its result. The four aggregators run with the direction check off; "direction check" is
`aggregation.direction_check` alone and "check + clipped_mean" the default's whole call. Extra RSS
is the peak resident memory above the RSS at the call's start (sampled every 2 ms from
/proc/self/statm), i.e. what the call allocates: the float32 result and its float64 slice buffers
(centered_clip's centre is its result).

Loss: a real coordinator (in-process, gRPC on 127.0.0.1) and `--workers` real workers (threads of
this process, `worker.Worker`) train a model (`--model`, `--preset`; lstm_lm tiny, 5 AdamW steps of
4 × 32 bytes unless told) for `--rounds` rounds under each aggregation with the direction check off
and on (`--checks`), same seeds and data (every round waits for all, so each run
sees the same updates until the aggregations differ); the table gives the held-out loss (4 fixed
validation batches) of the last version and the mean over the last 5, against `mean`'s without the
check, the updates flagged (clipped or trimmed) and those the check dropped.

Scores: the updates of the run with the check on under clipped_mean (else under the first of
`--methods`) are kept, and after the run every
round's updates are scored: the direction score s_i the check uses (the cosine shared with at least
half of the other updates), the score −Δ_i would have got in Δ_i's place (a sign flip), and for
comparison the cosine of Δ_i, and of −Δ_i in its place, with the round's coordinate-wise median (the
centre the check does not use). The table gives their distribution over all updates of all rounds.
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator, aggregation
from rcswarm.models import registry
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from rcswarm.train.inner import make_sampler, masked_cross_entropy
from rcswarm.worker import Worker, WorkerOptions

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


def make_updates(parameters: int, n: int, seed: int = 0, zeros: float = 0.0,
                 equal_tokens: bool = False) -> list[aggregation.Update]:
    """`n` updates of random normal values × 1e-3 over `parameters` parameters, each entry an exact zero with
    probability `zeros` (a sparse or 2-bit update's many ties: `--zeros`); tokens 1000 + i, or 1000 each with
    `equal_tokens` (workers of one configuration: `--equal-tokens`)."""
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for i in range(n):
        deltas = {name: torch.randn(shape, generator=generator).mul_(1e-3) for name, shape in shapes_for(parameters).items()}
        if zeros > 0:
            for delta in deltas.values():
                delta[torch.rand(delta.shape, generator=generator) < zeros] = 0.0
        tokens = 1000 if equal_tokens else 1000 + i
        updates.append(aggregation.Update(f"w{i:02d}", tokens, tensor_stream.global_norm(deltas), deltas))
    return updates


def time_rows(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Per label: median seconds of its call over `repeats` calls (after a warm-up) and the largest extra RSS in MiB.
    The calls take turns (one of each per repeat), so that load from other processes falls on every row alike."""
    for call in calls.values():
        call()
    seconds: dict[str, list[float]] = {label: [] for label in calls}
    extra = dict.fromkeys(calls, 0)
    for _ in range(repeats):
        for label, call in calls.items():
            release_freed_memory()
            with PeakRss() as peak:
                started = time.perf_counter()
                call()
                seconds[label].append(time.perf_counter() - started)
            extra[label] = max(extra[label], peak.extra)
    return {label: (statistics.median(seconds[label]), extra[label] / 2**20) for label in calls}


def timed_calls(updates: list[aggregation.Update]) -> dict[str, Callable[[], object]]:
    """The calls the time table compares, by row label: each aggregator without the check, the check, the default."""
    history = [u.norm for u in updates]
    previous = {name: t.clone() for name, t in updates[0].deltas.items()}

    def without_check(method: str) -> Callable[[], object]:
        options = aggregation.AggregationOptions(method, min_cosine=aggregation.DIRECTION_OFF)
        start = previous if method == "centered_clip" else None
        return lambda: aggregation.aggregate(updates, options, history, start)

    calls = {method: without_check(method) for method in METHODS}
    calls["direction check"] = lambda: aggregation.direction_check(updates, 0.0)
    calls["check + clipped_mean (default)"] = lambda: aggregation.aggregate(updates, aggregation.AggregationOptions(), history)
    return calls


def time_table(sizes: list[str], counts: list[int], repeats: int, zeros: float = 0.0,
               equal_tokens: bool = False) -> None:
    if zeros > 0:
        print(f"each update's entries exact zeros with probability {zeros:g}")
    print(f"tokens: {'1000 each' if equal_tokens else '1000 + i for update i'}")
    print("| parameters | updates | aggregation | median s | × mean | extra RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        for n in counts:
            started = time.perf_counter()
            updates = make_updates(SIZES[size], n, zeros=zeros, equal_tokens=equal_tokens)
            made = time.perf_counter() - started
            base = None
            for label, (seconds, extra) in time_rows(timed_calls(updates), repeats).items():
                base = base or seconds
                print(f"| {size} | {n} | {label} | {seconds:.3f} | {seconds / base:.2f} | {extra:.0f} |", flush=True)
            print(f"<!-- {size} × {n}: inputs made in {made:.1f} s, {n * SIZES[size] * 4 / 2**30:.2f} GiB -->", flush=True)
            del updates


@dataclass(frozen=True)
class HonestConfig:
    """The honest runs' swarm: model, rounds, workers, codec, and each worker's inner loop."""

    preset: str
    rounds: int
    workers: int
    codec: str
    model: str = "lstm_lm"
    optimizer: str = "adamw"
    lr: float = 1e-2
    steps: int = 5
    batch: int = 4
    seq_len: int = 32

    def describe(self) -> str:
        return (f"{self.model} {self.preset}, {self.workers} workers, {self.rounds} rounds of {self.steps} inner "
                f"{self.optimizer} steps (lr {self.lr:g}) of {self.batch} × {self.seq_len} bytes, {self.codec}")


def flat64(update: aggregation.Update) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(torch.float64) for t in update.deltas.values()])  # [P]


def median_cosines(x: torch.Tensor) -> list[float]:
    """cos(x_i, the coordinate-wise median of the rows of x) for every row i of x [n, P]."""
    ordered = torch.sort(x, dim=0).values  # [n, P]
    n = x.shape[0]
    centre = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2  # [P]
    return [float(x[i] @ centre / (x[i].norm() * centre.norm())) for i in range(n)]


@dataclass
class ScoreLog:
    """The updates of every round of a run (kept while `watching`), scored after the run."""

    rounds: list[list[aggregation.Update]] = field(default_factory=list)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Keep each round's updates as the coordinator aggregates them (references only: nothing is computed)."""
        real = aggregation.aggregate

        def keep(updates: Sequence[aggregation.Update], *args: object, **kwargs: object) -> aggregation.Aggregate:
            self.rounds.append(list(updates))
            return real(updates, *args, **kwargs)

        aggregation.aggregate = keep
        try:
            yield
        finally:
            aggregation.aggregate = real

    def statistics(self) -> dict[str, list[float]]:
        """Every update's score, its flip's score, and both cosines with the coordinate-wise median."""
        rows: dict[str, list[float]] = {"score s_i": [], "score of −Δ_i in its place": [],
                                        "cos with the median (not used)": [], "cos of −Δ_i with the median (not used)": []}
        for updates in self.rounds:
            n = len(updates)
            if n < aggregation.DIRECTION_MIN_UPDATES:
                continue
            cosines = aggregation.cosine_matrix(updates)  # [n, n]
            k = n // 2
            x = torch.stack([flat64(u) for u in updates])  # [n, P]
            rows["cos with the median (not used)"] += median_cosines(x)
            for i in range(n):
                others = sorted(float(c) for j, c in enumerate(cosines[i].tolist()) if j != i)
                rows["score s_i"].append(others[-k])
                rows["score of −Δ_i in its place"].append(-others[k - 1])
                flipped = x.clone()
                flipped[i].neg_()
                rows["cos of −Δ_i with the median (not used)"].append(median_cosines(flipped)[i])
        return rows


def score_table(config: HonestConfig, log: ScoreLog) -> None:
    print(f"direction scores, {config.describe()} (the honest updates of the run with the check on)")
    print("| statistic | updates | min | 5th percentile | median | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, values in log.statistics().items():
        ordered = sorted(values)
        if not ordered:
            continue
        fifth = ordered[int(0.05 * (len(ordered) - 1))]
        print(f"| {name} | {len(ordered)} | {ordered[0]:+.3f} | {fifth:+.3f} | {statistics.median(ordered):+.3f} | "
              f"{ordered[-1]:+.3f} |", flush=True)


def honest_spec(method: str, min_cosine: float, config: HonestConfig) -> RunSpec:
    return RunSpec.from_dict({
        "run": {"name": "aggbench", "rounds": config.rounds, "workers": config.workers},
        "model": {"name": config.model, "preset": config.preset},
        "data": {"seq_len": config.seq_len, "batch_size": config.batch, "max_bytes": 300_000},
        "inner": {"steps": config.steps, "lr": config.lr, "optimizer": config.optimizer},
        "sync": {"aggregation": method, "min_cosine": min_cosine, "codec": config.codec, "min_reports": config.workers,
                 "round_deadline_s": 60.0},
        "coordinator": {"lease_s": 15.0, "max_wait_s": 2.0, "keep_checkpoints": 6, "durable": False},
    })


def honest_run(spec: RunSpec, state_dir: Path) -> tuple[list[float], tuple[int, int], float]:
    """Held-out losses of the last 5 versions, (updates flagged, updates dropped), and mean seconds of the
    close's aggregation."""
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
    count = spec.run.workers
    workers = [Worker(WorkerOptions(f"127.0.0.1:{running.port}", device="cpu", name=f"w{i}"), TOKEN) for i in range(count)]
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
    if codes != {f"w{i}": 0 for i in range(count)}:
        raise RuntimeError(f"a worker failed: {codes}")
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides)
    val = make_sampler(spec.data, seed=12345, split="val")
    batches = [val.next_batch() for _ in range(4)]
    losses = []
    rounds = spec.run.rounds
    for version in range(rounds - 4, rounds + 1):
        tensors = load_params(state_dir / "checkpoints" / f"v{version:08d}.safetensors")
        model.load_state_dict(tensors, strict=True)
        with torch.no_grad():
            losses.append(sum(float(masked_cross_entropy(model(x), y)) for x, y in batches) / len(batches))
    return losses, flagged_updates(state_dir), statistics.mean(averages) if averages else float("nan")


def load_params(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: t for name, t in load_file(str(path)).items() if "/" not in name}


def flagged_updates(state_dir: Path) -> tuple[int, int]:
    """(updates flagged, updates dropped) as the rounds record them, read through a read-only store."""
    store = StateStore.open_read_only(state_dir)
    try:
        rounds = store.recent_rounds(10**6)
        return sum(r.clipped for r in rounds), sum(r.dropped for r in rounds)
    finally:
        store.close()


def loss_table(config: HonestConfig, methods: Sequence[str], checks: Sequence[float]) -> ScoreLog:
    """The honest runs' table, each method with each of `checks` (sync.min_cosine); returns the updates of the run
    with the check on under clipped_mean (the default; else under the first method), to score."""
    print(f"{config.describe()}, same seeds")
    print(f"| aggregation | direction check | held-out loss, version {config.rounds} | mean of last 5 | vs mean (last 5) | "
          "flagged | dropped by the check | aggregate s / round |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    base = None
    log = ScoreLog()
    scored = "clipped_mean" if "clipped_mean" in methods else methods[0]
    for method in methods:
        for min_cosine in checks:
            spec = honest_spec(method, min_cosine, config)
            keep = method == scored and min_cosine > aggregation.DIRECTION_OFF
            with tempfile.TemporaryDirectory() as tmp, (log.watching() if keep else nullcontext()):
                losses, (flagged, dropped), seconds = honest_run(spec, Path(tmp))
            late = statistics.mean(losses)
            base = base or late
            check = "off" if min_cosine <= aggregation.DIRECTION_OFF else f"on ({min_cosine:g})"
            print(f"| {method} | {check} | {losses[-1]:.5f} | {late:.5f} | {late / base - 1:+.3%} | {flagged} | {dropped} | "
                  f"{seconds:.4f} |", flush=True)
    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "100m"], choices=sorted(SIZES))
    parser.add_argument("--updates", nargs="+", type=int, default=[4, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--zeros", type=float, default=0.0,
                        help="time table: each update entry an exact zero with this probability (sparse or 2-bit "
                             "updates' ties; default 0)")
    parser.add_argument("--equal-tokens", action="store_true",
                        help="time table: every update of 1000 tokens (default: 1000 + i, all different)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--preset", default="tiny", help="lstm_lm preset of the honest runs (tiny, small)")
    parser.add_argument("--workers", type=int, default=4, help="workers of the honest runs")
    parser.add_argument("--codec", default="int8", help="sync.codec of the honest runs (int8 with error feedback, fp32)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="aggregations of the honest runs")
    parser.add_argument("--checks", nargs="+", default=["off", "on"], choices=["off", "on"],
                        help="the honest runs with the direction check off (min_cosine -1), on (the default), or both")
    parser.add_argument("--model", default="lstm_lm", help="model of the honest runs")
    parser.add_argument("--optimizer", default="adamw", help="inner.optimizer of the honest runs")
    parser.add_argument("--lr", type=float, default=1e-2, help="inner.lr of the honest runs")
    parser.add_argument("--steps", type=int, default=5, help="inner.steps of the honest runs")
    parser.add_argument("--batch", type=int, default=4, help="data.batch_size of the honest runs")
    parser.add_argument("--seq-len", type=int, default=32, help="data.seq_len of the honest runs")
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
        if not 0.0 <= args.zeros < 1.0:
            parser.error(f"--zeros {args.zeros}: expected a probability in [0, 1)")
        time_table(args.sizes, args.updates, args.repeats, args.zeros, args.equal_tokens)
    if not args.skip_loss:
        print()
        config = HonestConfig(args.preset, args.rounds, args.workers, args.codec, args.model, args.optimizer, args.lr,
                              args.steps, args.batch, args.seq_len)
        checks = [aggregation.DIRECTION_OFF if c == "off" else aggregation.AggregationOptions().min_cosine for c in args.checks]
        log = loss_table(config, args.methods, checks)
        print()
        score_table(config, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
