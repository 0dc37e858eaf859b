"""Peak memory and seconds per step of streaming BPTT (paged and checkpointed) against plain autograd.

    python benchmarks/streaming_bptt_bench.py                      # tiny + small, L 16/64/256/1024, batch 1, k 8
    python benchmarks/streaming_bptt_bench.py --threads 1          # the same on a busy machine
    python benchmarks/streaming_bptt_bench.py --presets tiny --lengths 16 64 --repeats 2   # smoke run
    python benchmarks/streaming_bptt_bench.py --presets tiny --lengths 1024 8192 32768 --batch-sizes 1 8 \\
        --methods plain paged all uniform binomial --threads 1 --json tiny.json
    python benchmarks/streaming_bptt_bench.py --presets tiny --lengths 1024 100000 --methods binomial \\
        --combined --warmup-length 1024 --mmap-threshold 4096 --threads 1   # one long step measured once

For each frame-model preset (``build_model("frame", preset, seed=0)``), batch size B, window
length L and method, one step is ``model.zero_grad()`` then one of (forward and backward, no
optimizer):

* ``plain``: ``plain_backward(model, batch)``, one autograd graph over the window;
* ``paged``: ``streaming_backward(model, window, k)``, streaming BPTT as before issue #19: k
  frame heads recomputed at a time, the LSTM core's saved tensors (O(L)) paged to host memory;
* ``all``, ``uniform``, ``binomial``, ``binomial-log``: ``streaming_backward(model, window, k,
  checkpoints=CheckpointPlan(...))``, core checkpointing (``rcswarm.train.bptt.checkpointed``)
  with the schedule of that name: every segment boundary's core state kept; checkpoints every
  round(√n) boundaries; the binomial (revolve) schedule with ``--slots`` stored states; the
  binomial schedule with ceil(log2 n) stored states; n = ceil(L / S) segments of S = 8 k
  steps. Their frame embeddings go where ``--embeddings`` says (default: a temporary file,
  read back with pread).

Batches come from ``TypingFrameSource`` (``rcswarm.data.frames``) with the preset's rows, cols
and char_vocab and a charset that fits its action vocabulary (``TypingConfig.fitting``); the
document pool grows with L (at least ``--documents``, more until the stream is longer than L).
``plain`` trains on the materialized batch (``next_batch()``, rendered before the step); the
streaming methods on the lazy window (``next_window()``), whose chunks they render during the
step, twice each: the data side never holds the window.

Every configuration runs in fresh subprocesses, so peaks never mix: each builds the model,
draws one batch and runs ``--warmup`` steps. The first then measures memory over one more
step: the peak resident set size during the step minus the resident set size at its start.
Before the step the kernel's high-water mark (VmHWM) is reset by writing 5 to
/proc/self/clear_refs, and it is read back from /proc/self/status after it; where
clear_refs cannot be written, a thread samples VmRSS every 0.5 ms instead (the output says
which). torch's CPU tensors live in malloc'd memory that tracemalloc does not see, hence RSS.
That child runs with glibc's mmap and trim thresholds fixed (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``; ``--mmap-threshold``, default 128 KiB), so memory freed by the
warm-up goes back to the kernel and cannot be reused unseen: the RSS at the step's start holds
the parameters, gradients, batch and runtime. Allocations below the threshold come from the
heap, where memory freed before the step can be reused without showing; with 4 KiB
(``--mmap-threshold 4096``) nearly every tensor is its own mapping, which costs time (about
1.5x on a tiny-preset step) and rounds each to whole pages, but reads the peak of what is
alive to within a few percent from run to run where 128 KiB varied by 20% at the tiny
preset's 2 MiB peaks. The second child times ``--repeats`` steps with
glibc's default malloc (fresh mmaps cost page faults, about 15% on plain autograd) and
reports their median wall clock (``--threads`` intra-op threads) and median CPU time of the
process (``time.process_time()``: user + system, all threads), the steadier figure when other
jobs share the cores.

``--warmup-length N`` runs the warm-up steps on the first min(L, N) steps of the window.
``--combined`` (for steps of minutes): one child per configuration, with the memory child's
malloc settings, warms up with one step, then measures one step of the whole window for both
peak and time (so its time carries the memory child's malloc settings).

The page cache that holds a spilled embedding file is the kernel's, not the process's: it is
not in the RSS, and the kernel evicts it under memory pressure (the file is then read from
disk). "emb MiB" in the table is that file's size (or the embeddings kept in memory).

Use ``--threads 1`` when other processes keep the cores busy: with more intra-op threads than
free cores, OpenMP's barriers made a tiny-preset step take 3.4 s instead of 10 ms.

Before a configuration runs, its peak is extrapolated linearly in L from the longest length
already measured for the same preset, batch and method; if that plus that child's RSS before
its first step (model and batch built) exceeds ``--memory-fraction`` of MemAvailable, the
configuration is skipped and the output says so. A child that runs past ``--timeout``
seconds is killed with its process group.

Columns: "core MiB" is what a method keeps for the core's backward pass (paged: the saved
tensors its pager counts, views of one tensor each time; checkpointed: the most stored core
states at once, with their count in "states"); "fwd/seg" the core forward passes per segment
(checkpointed: core advances plus n backward turns, over n).

Goals read out below the table (issue #19): the binomial schedule's peak at the longest L
at most 1.2x its peak at L = 1024 (or the shortest L) for every batch size; seconds per step
at most 2x plain's (binomial) and 1.5x (uniform, and paged as before) wherever plain fits.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

METHODS = ("plain", "paged", "all", "uniform", "binomial", "binomial-log")
DEFAULT_METHODS = ("plain", "paged", "all", "uniform", "binomial")
TIME_GOALS = {"binomial": 2.0, "binomial-log": 2.0, "uniform": 1.5, "paged": 1.5}
CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
STATM = Path("/proc/self/statm")
MEMINFO = Path("/proc/meminfo")
MIB = 1024 * 1024


def status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM) in KiB."""
    match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field} field")
    return int(match.group(1))


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo in bytes."""
    match = re.search(r"^MemAvailable:\s+(\d+) kB", MEMINFO.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError("/proc/meminfo has no MemAvailable field")
    return int(match.group(1)) * 1024


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS; False where /proc/self/clear_refs cannot be written."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PeakTracker:
    """Peak RSS increase over one region: VmHWM after a clear_refs reset, else a sampling thread."""

    def __init__(self) -> None:
        self._use_hwm = reset_hwm()
        self.method = "VmHWM reset via clear_refs" if self._use_hwm else "VmRSS sampled every 0.5 ms"
        self._page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_kib = 0
        self._start_kib = 0

    def _rss_kib(self) -> int:
        return int(STATM.read_text().split()[1]) * self._page_kib

    def _sample(self) -> None:
        while not self._stop.wait(0.0005):
            self._peak_kib = max(self._peak_kib, self._rss_kib())

    def start(self) -> None:
        if self._use_hwm:
            reset_hwm()
            self._start_kib = status_kib("VmRSS")
            return
        self._start_kib = self._peak_kib = self._rss_kib()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Bytes by which the RSS peaked above its value at `start()`."""
        if self._use_hwm:
            return (status_kib("VmHWM") - self._start_kib) * 1024
        assert self._thread is not None
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._peak_kib = max(self._peak_kib, self._rss_kib())
        return (self._peak_kib - self._start_kib) * 1024


def typing_source(config: Any, params: dict[str, Any]) -> Any:
    """A typing source of B windows of L frames whose document pool is longer than L."""
    from rcswarm.data.frames import FrameWindowSpec, TypingConfig, TypingFrameSource

    spec = FrameWindowSpec(batch_size=params["batch_size"], window=params["length"], seed=0)
    documents = params["documents"]
    while True:
        typing = TypingConfig.fitting(
            config.rows, config.cols, config.char_vocab, config.action_vocab, n_documents=documents
        )
        probe = TypingFrameSource(typing, FrameWindowSpec(batch_size=1, window=1, seed=0))
        if probe.n_steps >= params["length"]:
            return TypingFrameSource(typing, spec)
        documents = math.ceil(documents * params["length"] / probe.n_steps * 1.05) + 1


def checkpoint_plan(params: dict[str, Any]) -> Any:
    """The CheckpointPlan of a checkpointed method, or None for plain and paged."""
    from rcswarm.train.bptt.checkpointed import CheckpointPlan

    method, place = params["method"], params["embeddings"]
    if method in ("plain", "paged"):
        return None
    if method == "binomial":
        return CheckpointPlan("binomial", slots=params["slots"], embeddings=place)
    return CheckpointPlan("binomial" if method == "binomial-log" else method, embeddings=place)


def run_child(params: dict[str, Any]) -> dict[str, Any]:
    """Build one configuration in this (fresh) process, warm up, then time it and/or measure its peak."""
    import torch

    from rcswarm.models import registry
    from rcswarm.train.bptt.streaming import plain_backward, streaming_backward

    torch.set_num_threads(params["threads"])
    model = registry.build_model("frame", params["preset"], seed=0)
    source = typing_source(model.config, params)
    window = source.next_window()
    batch = window.chunk(0, window.length) if params["method"] == "plain" else None
    plan = checkpoint_plan(params)
    gc.collect()
    result: dict[str, Any] = {"base_rss_bytes": status_kib("VmRSS") * 1024, "stats": None}

    def step(data: Any) -> float:
        model.zero_grad(set_to_none=False)
        if params["method"] == "plain":
            return plain_backward(model, data)
        loss, stats = streaming_backward(model, data, params["k"], checkpoints=plan)
        result["stats"] = asdict(stats)
        return loss

    data = batch if batch is not None else window
    short = min(params["length"], params["warmup_length"] or params["length"])
    warm = data if short == params["length"] else (window.chunk(0, short) if batch is not None else _prefix(window, short))
    if params["mode"] == "combined":
        step(warm)
        gc.collect()
        tracker = PeakTracker()
        tracker.start()
        start, cpu_start = time.perf_counter(), time.process_time()
        result["loss"] = step(data)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        return {**result, "peak_bytes": tracker.stop(), "peak_source": tracker.method, "seconds": seconds,
                "cpu_seconds": cpu, "step_seconds": [seconds], "torch": torch.__version__}
    for _ in range(params["warmup"]):
        step(warm)
    if params["mode"] == "memory":
        tracker = PeakTracker()
        gc.collect()
        tracker.start()
        result["loss"] = step(data)
        return {**result, "peak_bytes": tracker.stop(), "peak_source": tracker.method}
    seconds, cpu = [], []
    for _ in range(params["repeats"]):
        start, cpu_start = time.perf_counter(), time.process_time()
        result["loss"] = step(data)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return {**result, "seconds": statistics.median(seconds), "cpu_seconds": statistics.median(cpu),
            "step_seconds": seconds, "torch": torch.__version__}


def _prefix(window: Any, length: int) -> Any:
    """The first `length` steps of a lazy window, still lazy."""
    from dataclasses import replace

    return replace(window, length=length)


@dataclass
class Measurement:
    """One (preset, B, L, method) configuration: its result or why it has none."""

    preset: str
    batch_size: int
    length: int
    method: str
    status: str
    reason: str = ""
    seconds: float | None = None
    cpu_seconds: float | None = None
    peak_bytes: int | None = None
    base_rss_bytes: int | None = None
    detail: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, int, int, str]:
        return self.preset, self.batch_size, self.length, self.method

    @property
    def stats(self) -> dict[str, Any] | None:
        return None if self.detail is None else self.detail["memory"].get("stats")


def child_params(
    args: argparse.Namespace, preset: str, batch_size: int, length: int, method: str, mode: str
) -> dict[str, Any]:
    return {
        "preset": preset, "length": length, "method": method, "mode": mode, "k": args.k,
        "batch_size": batch_size, "threads": args.threads, "warmup": args.warmup, "repeats": args.repeats,
        "documents": args.documents, "slots": args.slots, "embeddings": args.embeddings,
        "warmup_length": args.warmup_length, "mmap_threshold": args.mmap_threshold,
    }


def spawn_child(params: dict[str, Any], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run one child in a fresh interpreter: (its result, "") or (None, why not).

    The child runs in its own session; its process group is killed on timeout or interruption.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(params["threads"])}
    if params["mode"] in ("memory", "combined"):
        threshold = str(params["mmap_threshold"])
        env.update({"MALLOC_MMAP_THRESHOLD_": threshold, "MALLOC_TRIM_THRESHOLD_": threshold})
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(params)]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"timeout: {params['mode']} run killed after {timeout:.0f} s (--timeout)"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or [""]
        return None, f"{params['mode']} run exited with status {proc.returncode}: {tail[0][:200]}"
    return json.loads(stdout.strip().splitlines()[-1]), ""


def run_configuration(args: argparse.Namespace, preset: str, batch_size: int, length: int, method: str) -> Measurement:
    """The memory child, then (if it succeeded) the timing child; or the one combined child."""
    measurement = Measurement(preset, batch_size, length, method, status="failed")
    modes = ("combined",) if args.combined else ("memory", "time")
    results = {}
    for mode in modes:
        result, reason = spawn_child(child_params(args, preset, batch_size, length, method, mode), args.timeout)
        if result is None:
            measurement.reason = reason
            return measurement
        results[mode] = result
    memory, timing = results.get("memory", results.get("combined")), results.get("time", results.get("combined"))
    assert memory is not None and timing is not None
    measurement.status = "ok"
    measurement.seconds = timing["seconds"]
    measurement.cpu_seconds = timing["cpu_seconds"]
    measurement.peak_bytes = memory["peak_bytes"]
    measurement.base_rss_bytes = memory["base_rss_bytes"]
    measurement.detail = {"memory": memory, "time": timing}
    return measurement


def estimated_bytes(done: list[Measurement], key: tuple[str, int, int, str]) -> int | None:
    """Base RSS plus the peak extrapolated linearly from the longest measured length, if any."""
    preset, batch_size, length, method = key
    measured = [
        m for m in done if (m.preset, m.batch_size, m.method) == (preset, batch_size, method) and m.status == "ok"
    ]
    if not measured:
        return None
    ref = max(measured, key=lambda m: m.length)
    assert ref.peak_bytes is not None and ref.base_rss_bytes is not None
    return ref.base_rss_bytes + int(ref.peak_bytes * length / ref.length)


def measure(args: argparse.Namespace, done: list[Measurement], key: tuple[str, int, int, str]) -> Measurement:
    estimate = estimated_bytes(done, key)
    budget = int(available_bytes() * args.memory_fraction)
    if estimate is not None and estimate > budget:
        return Measurement(
            *key, status="skipped",
            reason=f"needs ~{estimate / MIB:,.0f} MiB, {budget / MIB:,.0f} MiB allowed "
            f"({args.memory_fraction:.0%} of MemAvailable)",
        )
    return run_configuration(args, *key)


def find(done: list[Measurement], key: tuple[str, int, int, str]) -> Measurement | None:
    for m in done:
        if m.key == key:
            return m
    return None


def fmt_mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


def fmt_status(m: Measurement | None, value: str) -> str:
    if m is None:
        return "-"
    return value if m.status == "ok" else m.status


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def reference_length(args: argparse.Namespace) -> int:
    return 1024 if 1024 in args.lengths else min(args.lengths)


def core_columns(m: Measurement | None) -> tuple[str, str, str, str]:
    """(core MiB, states, fwd/seg, emb MiB) of a streaming measurement."""
    stats = None if m is None else m.stats
    if stats is None:
        return "-", "-", "-", "-"
    if stats["schedule"] == "paged":
        return fmt_mib(stats["paged_bytes"]), "-", "1.00", "-"
    segments = math.ceil(stats["n_steps"] / stats["segment_steps"])
    per_segment = (stats["core_advances"] + segments) / segments
    place = " (disk)" if stats["embeddings_on_disk"] else ""
    return (
        fmt_mib(stats["stored_state_bytes"]), str(stats["stored_states"]), f"{per_segment:.2f}",
        fmt_mib(stats["embedding_bytes"]) + place,
    )


def build_table(args: argparse.Namespace, done: list[Measurement]) -> Any:
    from rich import box
    from rich.table import Table

    mode = "one combined step" if args.combined else f"median of {args.repeats}"
    table = Table(
        title=f"streaming BPTT (k={args.k}, binomial slots {args.slots}, embeddings {args.embeddings}) vs plain "
        f"autograd, frame model, {args.threads} thread(s), {mode}",
        box=box.SIMPLE_HEAVY,
    )
    for name in (
        "preset", "B", "L", "method", "peak MiB", "s/step", "time / plain", "cpu s/step", "cpu / plain",
        "peak / L_ref", "core MiB", "states", "fwd/seg", "emb MiB",
    ):
        table.add_column(name, justify="left" if name in ("preset", "method") else "right")
    ref = reference_length(args)
    for m in sorted(done, key=lambda m: (args.presets.index(m.preset), m.batch_size, m.length, METHODS.index(m.method))):
        plain = find(done, (m.preset, m.batch_size, m.length, "plain"))
        base = find(done, (m.preset, m.batch_size, ref, m.method))
        table.add_row(
            m.preset, str(m.batch_size), f"{m.length:,}", m.method,
            fmt_status(m, fmt_mib(m.peak_bytes)), fmt_status(m, "-" if m.seconds is None else f"{m.seconds:.3f}"),
            fmt_ratio(ratio(m.seconds, plain and plain.seconds)),
            fmt_status(m, "-" if m.cpu_seconds is None else f"{m.cpu_seconds:.3f}"),
            fmt_ratio(ratio(m.cpu_seconds, plain and plain.cpu_seconds)),
            fmt_ratio(ratio(m.peak_bytes, base and base.peak_bytes)),
            *core_columns(m),
        )
    return table


def memory_goals(args: argparse.Namespace, done: list[Measurement]) -> list[str]:
    """Each streaming method's peak growth from the reference length to the longest, with plain's."""
    longest, ref = max(args.lengths), reference_length(args)
    if longest == ref:
        return []
    lines = []
    for preset in args.presets:
        for batch_size in args.batch_sizes:
            growth = {}
            for method in args.methods:
                hi = find(done, (preset, batch_size, longest, method))
                lo = find(done, (preset, batch_size, ref, method))
                growth[method] = ratio(hi and hi.peak_bytes, lo and lo.peak_bytes)
            parts = [f"{method} {fmt_ratio(value)}" for method, value in growth.items()]
            line = f"{preset} B={batch_size}: peak L={longest:,} / L={ref:,}: {', '.join(parts)}"
            if "binomial" in growth:
                value = growth["binomial"]
                verdict = "n/a" if value is None else ("met" if value <= 1.2 else "NOT met")
                line += f" (binomial goal <= 1.20x: {verdict})"
            lines.append(line)
    return lines


def time_goals(args: argparse.Namespace, done: list[Measurement]) -> list[str]:
    """Each streaming method's largest wall and CPU seconds-per-step ratios to plain where plain ran, against its goal."""
    lines = []
    for preset in args.presets:
        for batch_size in args.batch_sizes:
            for method, goal in TIME_GOALS.items():
                if method not in args.methods:
                    continue
                for clock in ("seconds", "cpu_seconds"):
                    ratios = []
                    for length in args.lengths:
                        plain = find(done, (preset, batch_size, length, "plain"))
                        stream = find(done, (preset, batch_size, length, method))
                        value = ratio(stream and getattr(stream, clock), plain and getattr(plain, clock))
                        if value is not None:
                            ratios.append((value, length))
                    if ratios:
                        worst, at = max(ratios)
                        verdict = "met" if worst <= goal else "NOT met"
                        what = "wall" if clock == "seconds" else "CPU"
                        lines.append(
                            f"{preset} B={batch_size}: {method} / plain {what} seconds per step at most {worst:.2f}x "
                            f"(at L={at:,}) where plain ran (goal <= {goal:.2f}x: {verdict})"
                        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Streaming BPTT vs plain autograd: peak memory and time per step.")
    p.add_argument("--presets", nargs="+", default=["tiny", "small"], help="frame model presets")
    p.add_argument("--lengths", nargs="+", type=int, default=[16, 64, 256, 1024], help="window lengths L")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1], help="windows per batch (B)")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=METHODS, help="what to run")
    p.add_argument("--k", type=int, default=8, help="streaming chunk: frame heads alive at once (checkpointed segments are 8 k steps)")
    p.add_argument("--slots", type=int, default=64, help="stored core states of the 'binomial' method")
    p.add_argument("--embeddings", default="disk", choices=("memory", "disk"),
                   help="where the checkpointed methods keep the frame embeddings")
    p.add_argument("--repeats", type=int, default=3, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--combined", action="store_true",
                   help="one child per configuration: a warm-up step, then one step measured for memory and time")
    p.add_argument("--warmup-length", type=int, default=None,
                   help="warm-up steps run on the window's first min(L, this) steps (default: all L)")
    p.add_argument("--mmap-threshold", type=int, default=131072,
                   help="glibc's mmap and trim thresholds (bytes) in the memory-measuring child")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--documents", type=int, default=64, help="typing documents at least (more as L needs)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write all results here")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    p.add_argument(
        "--memory-fraction", type=float, default=0.8,
        help="skip a configuration whose estimated RSS exceeds this fraction of MemAvailable",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("k", "slots", "repeats", "threads", "documents", "mmap_threshold"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive int")
    if args.warmup < 0 or args.timeout <= 0 or min(args.lengths) < 1 or min(args.batch_sizes) < 1:
        p.error("--warmup must be >= 0, --timeout > 0 and every --lengths and --batch-sizes value >= 1")
    if args.warmup_length is not None and args.warmup_length < 1:
        p.error(f"--warmup-length={args.warmup_length}: expected a positive int")
    if not 0.0 < args.memory_fraction <= 1.0:
        p.error(f"--memory-fraction={args.memory_fraction}: expected a number in (0, 1]")
    args.lengths = sorted(set(args.lengths))
    args.batch_sizes = sorted(set(args.batch_sizes))
    args.methods = [m for m in METHODS if m in args.methods]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(width=None if sys.stdout.isatty() else 200)
    plan = [(p, b, n, m) for p in args.presets for b in args.batch_sizes for n in args.lengths for m in args.methods]
    done: list[Measurement] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("configurations", total=len(plan))
        for key in plan:
            progress.update(task, description=f"{key[0]} B={key[1]} L={key[2]} {key[3]}")
            result = measure(args, done, key)
            done.append(result)
            if result.status != "ok":
                progress.console.print(f"{key[0]} B={key[1]} L={key[2]} {key[3]}: {result.status} ({result.reason})")
            progress.advance(task)
    console.print(build_table(args, done))
    sources = {m.detail["memory"]["peak_source"] for m in done if m.detail}
    how = ("one step after a warm-up on a short window, memory and time from the same step" if args.combined
           else f"s/step = median of {args.repeats} steps after {args.warmup} warm-up")
    console.print(
        f"peak = peak RSS during one step - RSS at its start ({', '.join(sorted(sources)) or 'no measurement'}); "
        f"{how}; each in fresh processes; total {time.perf_counter() - started:.0f} s"
    )
    load_after = os.getloadavg()
    console.print(
        f"{os.cpu_count()} CPUs; 1-minute load average {load_before[0]:.2f} at the start, "
        f"{load_after[0]:.2f} at the end (above --threads means other processes shared the cores)"
    )
    for line in memory_goals(args, done) + time_goals(args, done):
        console.print(line)
    if args.json is not None:
        payload = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "cpu_count": os.cpu_count(), "load_average": [load_before, load_after],
                   "results": [asdict(m) for m in done]}
        args.json.write_text(json.dumps(payload, indent=2))
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
