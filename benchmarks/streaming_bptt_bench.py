"""Peak memory and seconds per step of streaming BPTT against plain autograd, on typing frames.

    python benchmarks/streaming_bptt_bench.py                      # tiny + small, L 16/64/256/1024, k 8
    python benchmarks/streaming_bptt_bench.py --threads 1          # the same on a busy machine (~7 min, 2 cores)
    python benchmarks/streaming_bptt_bench.py --presets tiny --lengths 16 64 --repeats 2   # smoke run
    python benchmarks/streaming_bptt_bench.py --k 16 --threads 2 --json results.json

For each frame-model preset (``build_model("frame", preset, seed=0)``), window length L and
method, one step is ``model.zero_grad()`` then either ``plain_backward(model, batch)`` (one
autograd graph over the window) or ``streaming_backward(model, batch, k)``
(``rcswarm.worker.streaming_bptt``): forward and backward, no optimizer. Batches come from
``TypingFrameSource`` (``rcswarm.data.frames``) with the preset's rows, cols and char_vocab and
a charset that fits its action vocabulary (``TypingConfig.fitting``), ``--batch-size`` windows
of L frames.

Every configuration runs in fresh subprocesses, so peaks never mix: each builds the model,
draws one batch and runs ``--warmup`` steps. The first then measures memory over one more
step: the peak resident set size during the step minus the resident set size at its start.
Before the step the kernel's high-water mark (VmHWM) is reset by writing 5 to
/proc/self/clear_refs, and it is read back from /proc/self/status after it; where
clear_refs cannot be written, a thread samples VmRSS every 0.5 ms instead (the output says
which). torch's CPU tensors live in malloc'd memory that tracemalloc does not see, hence RSS.
That child runs with glibc's mmap and trim thresholds fixed at 128 KiB
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), so memory freed by the warm-up goes
back to the kernel and cannot be reused unseen: the RSS at the step's start holds the
parameters, gradients, batch and runtime. The second child times ``--repeats`` steps with
glibc's default malloc (fresh mmaps cost page faults, about 15% on plain autograd) and
reports their median (wall clock, ``--threads`` intra-op threads).

Use ``--threads 1`` when other processes keep the cores busy: with more intra-op threads than
free cores, OpenMP's barriers made a tiny-preset step take 3.4 s instead of 10 ms.

Before a configuration runs, its peak is extrapolated linearly in L from the longest length
already measured for the same preset and method; if that plus that child's RSS before its
first step (model and batch built) exceeds ``--memory-fraction`` of MemAvailable, the
configuration is skipped and the output says so. A child that runs past ``--timeout``
seconds is killed with its process group.

"core saved MiB" is what streaming keeps for the core's backward pass (the saved tensors its
pager counts, ``StreamingStats.paged_bytes``; views of one tensor count each time). It grows
with L, and it is freed before the k frame heads are recomputed, so streaming's peak is about
the larger of the two phases plus the [B, L, D] embeddings and their gradient: flat in L while
a chunk of frame heads outweighs the core's saved tensors.

The goals read out below the table: streaming's peak at L = 1024 at most 1.2x its peak at
L = 64 (plain autograd grows linearly), and streaming at most 1.5x plain's seconds per step
wherever plain fits.
"""

from __future__ import annotations

import argparse
import gc
import json
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

METHODS = ("plain", "streaming")
CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
STATM = Path("/proc/self/statm")
MEMINFO = Path("/proc/meminfo")
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
MODES = ("memory", "time")
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


def run_child(params: dict[str, Any]) -> dict[str, Any]:
    """Build one configuration in this (fresh) process, warm up, then time it or measure its peak."""
    import torch

    from rcswarm.data.frames import FrameWindowSpec, TypingConfig, TypingFrameSource
    from rcswarm.models import registry
    from rcswarm.worker.streaming_bptt import plain_backward, streaming_backward

    torch.set_num_threads(params["threads"])
    model = registry.build_model("frame", params["preset"], seed=0)
    config = model.config
    typing_config = TypingConfig.fitting(
        config.rows, config.cols, config.char_vocab, config.action_vocab, n_documents=params["documents"]
    )
    spec = FrameWindowSpec(batch_size=params["batch_size"], window=params["length"], seed=0)
    batch = TypingFrameSource(typing_config, spec).next_batch()
    gc.collect()
    result: dict[str, Any] = {"base_rss_bytes": status_kib("VmRSS") * 1024, "core_saved_bytes": None}

    def step() -> float:
        model.zero_grad(set_to_none=False)
        if params["method"] == "plain":
            return plain_backward(model, batch)
        loss, stats = streaming_backward(model, batch, params["k"])
        result["core_saved_bytes"] = stats.paged_bytes
        return loss

    for _ in range(params["warmup"]):
        step()
    if params["mode"] == "memory":
        tracker = PeakTracker()
        gc.collect()
        tracker.start()
        result["loss"] = step()
        return {**result, "peak_bytes": tracker.stop(), "peak_source": tracker.method}
    seconds = []
    for _ in range(params["repeats"]):
        start = time.perf_counter()
        result["loss"] = step()
        seconds.append(time.perf_counter() - start)
    return {**result, "seconds": statistics.median(seconds), "step_seconds": seconds, "torch": torch.__version__}


@dataclass
class Measurement:
    """One (preset, L, method) configuration: its result or why it has none."""

    preset: str
    length: int
    method: str
    status: str
    reason: str = ""
    seconds: float | None = None
    peak_bytes: int | None = None
    base_rss_bytes: int | None = None
    detail: dict[str, Any] | None = None


def child_params(args: argparse.Namespace, preset: str, length: int, method: str, mode: str) -> dict[str, Any]:
    return {
        "preset": preset,
        "length": length,
        "method": method,
        "mode": mode,
        "k": args.k,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "documents": args.documents,
    }


def spawn_child(params: dict[str, Any], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run one child in a fresh interpreter: (its result, "") or (None, why not).

    The child runs in its own session; its process group is killed on timeout or interruption.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(params["threads"])}
    if params["mode"] == "memory":
        env.update(MEMORY_ENV)
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


def run_configuration(args: argparse.Namespace, preset: str, length: int, method: str) -> Measurement:
    """The memory child, then (if it succeeded) the timing child of one configuration."""
    measurement = Measurement(preset, length, method, status="failed")
    memory, reason = spawn_child(child_params(args, preset, length, method, "memory"), args.timeout)
    if memory is None:
        measurement.reason = reason
        return measurement
    timing, reason = spawn_child(child_params(args, preset, length, method, "time"), args.timeout)
    if timing is None:
        measurement.reason = reason
        return measurement
    measurement.status = "ok"
    measurement.seconds = timing["seconds"]
    measurement.peak_bytes = memory["peak_bytes"]
    measurement.base_rss_bytes = memory["base_rss_bytes"]
    measurement.detail = {"memory": memory, "time": timing}
    return measurement


def estimated_bytes(done: list[Measurement], preset: str, method: str, length: int) -> int | None:
    """Base RSS plus the peak extrapolated linearly from the longest measured length, if any."""
    measured = [m for m in done if m.preset == preset and m.method == method and m.status == "ok"]
    if not measured:
        return None
    ref = max(measured, key=lambda m: m.length)
    assert ref.peak_bytes is not None and ref.base_rss_bytes is not None
    return ref.base_rss_bytes + int(ref.peak_bytes * length / ref.length)


def measure(args: argparse.Namespace, done: list[Measurement], preset: str, length: int, method: str) -> Measurement:
    estimate = estimated_bytes(done, preset, method, length)
    budget = int(available_bytes() * args.memory_fraction)
    if estimate is not None and estimate > budget:
        return Measurement(
            preset, length, method, status="skipped",
            reason=f"needs ~{estimate / MIB:,.0f} MiB, {budget / MIB:,.0f} MiB allowed "
            f"({args.memory_fraction:.0%} of MemAvailable)",
        )
    return run_configuration(args, preset, length, method)


def find(done: list[Measurement], preset: str, length: int, method: str) -> Measurement | None:
    for m in done:
        if (m.preset, m.length, m.method) == (preset, length, method):
            return m
    return None


def fmt_mib(m: Measurement | None) -> str:
    if m is None or m.status != "ok" or m.peak_bytes is None:
        return "-" if m is None else m.status
    return f"{m.peak_bytes / MIB:,.1f}"


def fmt_core(m: Measurement | None) -> str:
    saved = m.detail["memory"]["core_saved_bytes"] if m is not None and m.detail else None
    return "-" if saved is None else f"{saved / MIB:,.1f}"


def fmt_seconds(m: Measurement | None) -> str:
    if m is None or m.status != "ok" or m.seconds is None:
        return "-" if m is None else m.status
    return f"{m.seconds:.3f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def build_table(args: argparse.Namespace, done: list[Measurement]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"streaming BPTT (k={args.k}) vs plain autograd, frame model, batch {args.batch_size}, "
        f"{args.threads} thread(s)",
        box=box.SIMPLE_HEAVY,
    )
    for name in (
        "preset", "L", "plain peak MiB", "plain s/step", "streaming peak MiB", "core saved MiB",
        "streaming s/step", "time stream/plain", "peak plain/stream",
    ):
        table.add_column(name, justify="left" if name == "preset" else "right")
    for preset in args.presets:
        for length in args.lengths:
            plain = find(done, preset, length, "plain")
            stream = find(done, preset, length, "streaming")
            time_ratio = ratio(stream and stream.seconds, plain and plain.seconds)
            peak_ratio = ratio(plain and plain.peak_bytes, stream and stream.peak_bytes)
            table.add_row(
                preset, str(length), fmt_mib(plain), fmt_seconds(plain), fmt_mib(stream), fmt_core(stream),
                fmt_seconds(stream), fmt_ratio(time_ratio), fmt_ratio(peak_ratio),
            )
    return table


def memory_goal(args: argparse.Namespace, done: list[Measurement], preset: str) -> str | None:
    """Streaming's peak growth from L = 64 (or the shortest L) to the longest L, against plain's."""
    longest, reference = max(args.lengths), 64 if 64 in args.lengths else min(args.lengths)
    if longest == reference:
        return None
    growth = {}
    for method in METHODS:
        hi, lo = find(done, preset, longest, method), find(done, preset, reference, method)
        growth[method] = ratio(hi and hi.peak_bytes, lo and lo.peak_bytes)
    stream = growth["streaming"]
    verdict = "n/a" if stream is None else ("met" if stream <= 1.2 else "NOT met")
    return (
        f"{preset}: streaming peak L={longest} / L={reference} = {fmt_ratio(stream)} "
        f"(goal <= 1.20x: {verdict}); plain = {fmt_ratio(growth['plain'])} "
        f"(linear would be {longest / reference:.0f}x)"
    )


def time_goal(args: argparse.Namespace, done: list[Measurement], preset: str) -> str | None:
    """The largest streaming / plain seconds-per-step ratio over the lengths where both ran."""
    ratios = []
    for length in args.lengths:
        plain, stream = find(done, preset, length, "plain"), find(done, preset, length, "streaming")
        value = ratio(stream and stream.seconds, plain and plain.seconds)
        if value is not None:
            ratios.append((value, length))
    if not ratios:
        return None
    worst, at = max(ratios)
    verdict = "met" if worst <= 1.5 else "NOT met"
    return (
        f"{preset}: streaming / plain seconds per step at most {worst:.2f}x (at L={at}) "
        f"where plain fits (goal <= 1.50x: {verdict})"
    )


def goal_lines(args: argparse.Namespace, done: list[Measurement]) -> list[str]:
    """The goals read against the measurements, one line per preset and goal."""
    lines = [memory_goal(args, done, preset) for preset in args.presets]
    lines += [time_goal(args, done, preset) for preset in args.presets]
    return [line for line in lines if line is not None]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Streaming BPTT vs plain autograd: peak memory and time per step.")
    p.add_argument("--presets", nargs="+", default=["tiny", "small"], help="frame model presets")
    p.add_argument("--lengths", nargs="+", type=int, default=[16, 64, 256, 1024], help="window lengths L")
    p.add_argument("--k", type=int, default=8, help="streaming chunk: frame heads alive at once")
    p.add_argument("--batch-size", type=int, default=1, help="windows per batch")
    p.add_argument("--repeats", type=int, default=3, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--documents", type=int, default=64, help="typing documents in the dataset")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write all results here")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument(
        "--memory-fraction", type=float, default=0.8,
        help="skip a configuration whose estimated RSS exceeds this fraction of MemAvailable",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("k", "batch_size", "repeats", "threads", "documents"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive int")
    if args.warmup < 0 or args.timeout <= 0 or min(args.lengths) < 1:
        p.error("--warmup must be >= 0, --timeout > 0 and every --lengths value >= 1")
    if not 0.0 < args.memory_fraction <= 1.0:
        p.error(f"--memory-fraction={args.memory_fraction}: expected a number in (0, 1]")
    args.lengths = sorted(set(args.lengths))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(width=None if sys.stdout.isatty() else 160)
    plan = [(p, n, m) for p in args.presets for n in args.lengths for m in METHODS]
    done: list[Measurement] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("configurations", total=len(plan))
        for preset, length, method in plan:
            progress.update(task, description=f"{preset} L={length} {method}")
            result = measure(args, done, preset, length, method)
            done.append(result)
            if result.status != "ok":
                progress.console.print(f"{preset} L={length} {method}: {result.status} ({result.reason})")
            progress.advance(task)
    console.print(build_table(args, done))
    sources = {m.detail["memory"]["peak_source"] for m in done if m.detail}
    console.print(
        f"peak = peak RSS during one step - RSS at its start ({', '.join(sorted(sources)) or 'no measurement'}); "
        f"s/step = median of {args.repeats} steps after {args.warmup} warm-up; each in fresh "
        f"processes; total {time.perf_counter() - started:.0f} s"
    )
    load_after = os.getloadavg()
    console.print(
        f"{os.cpu_count()} CPUs; 1-minute load average {load_before[0]:.2f} at the start, "
        f"{load_after[0]:.2f} at the end (above --threads means other processes shared the cores)"
    )
    for line in goal_lines(args, done):
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
