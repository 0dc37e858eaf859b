"""Part (c) of the GPU check: streaming BPTT of the frame model on the device, peak memory and frames/s.

For each frame preset, window length L and method, a child process (`python -m rcswarm.cli.gpu_check.bptt
CONFIG-JSON`, killed after `timeout` seconds) builds the model on the device, warms up with one step on the
first min(L, 1024) frames, resets the device's peak-memory counter and times one step of forward and backward
over the whole window (no optimizer) on batch 1:

* `plain`: one autograd graph over the window (`plain_backward`), at lengths up to `plain_max` only;
* `paged`: streaming BPTT with the CUDA pager (`streaming_backward(model, window, k)`: the core's saved
  tensors copied to pinned host memory on a side stream and prefetched back);
* `binomial`: core checkpointing (`CheckpointPlan("binomial")`, ⌈log2 n⌉ stored core states, embeddings
  within `budget_mib` in memory, the rest in a temporary file).

The window is `SyntheticWindow`: frames and actions computed from their positions (deterministic, any
length, no rendering), so 10^6 frames cost no data-side time or memory. Peak memory is
`torch.cuda.max_memory_allocated()` during the step (parameters and gradients included); on the CPU the
child reports the process's peak resident set size instead (not comparable; tests of the plumbing only).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from rcswarm.cli.gpu_check.report import (
    BUDGET_SPENT,
    ERROR,
    FAIL,
    INFO,
    PASS,
    SKIPPED,
    CardPeak,
    Row,
    fraction,
    seconds_left,
)
from rcswarm.data.frames.window import check_chunk

METHODS = ("plain", "paged", "binomial")
WARMUP_FRAMES = 1024
# A configuration is started only with at least this many seconds of the check's budget left.
MIN_CONFIG_S = 20.0
# The gradient check of (c): frames per window (off the chunk grid) and the float64 tolerance.
GRAD_CHECK_FRAMES = 331
GRAD_TOLERANCE = 1e-9


@dataclass(frozen=True)
class SyntheticWindow:
    """A `FrameWindow` of B windows of `length` frames computed from positions: chunk(a, b) equals the same
    steps of any other chunking (cell (b, t, r, c) and action (b, t) are fixed integer mixes of their indices)."""

    batch_size: int
    length: int
    rows: int
    cols: int
    char_vocab: int
    n_styles: int
    action_vocab: int
    seed: int = 0

    def chunk(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """(frames [B, n, rows, cols, 2], actions [B, n]), int64, n = stop - start."""
        check_chunk(self, start, stop)
        t = torch.arange(start, stop, dtype=torch.int64)[None, :, None, None]  # [1, n, 1, 1]
        b = torch.arange(self.batch_size, dtype=torch.int64)[:, None, None, None]  # [B, 1, 1, 1]
        r = torch.arange(self.rows, dtype=torch.int64)[None, None, :, None]  # [1, 1, R, 1]
        c = torch.arange(self.cols, dtype=torch.int64)[None, None, None, :]  # [1, 1, 1, C]
        mix = (t * 1_000_003 + b * 7_919 + r * 131 + c * 31 + self.seed * 104_729) % 2_147_483_647  # [B, n, R, C]
        frames = torch.stack(((mix * 48_271) % self.char_vocab, (mix // 7) % self.n_styles), dim=-1)
        actions = ((t[..., 0, 0] * 40_503 + b[..., 0, 0] * 97 + self.seed) % 2_147_483_647) % self.action_vocab
        return frames, actions  # [B, n, R, C, 2], [B, n]


@dataclass(frozen=True)
class BpttConfig:
    """One child's configuration."""

    preset: str
    method: str
    length: int
    device: str
    k: int = 128
    budget_mib: float = 64.0
    batch: int = 1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}: expected one of {METHODS}")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_child(config: BpttConfig) -> dict:
    """Build, warm up, measure one step; the measurement as a dict (what the parent reads from stdout)."""
    from rcswarm.models import registry
    from rcswarm.models.frame.flops import training_step_flops
    from rcswarm.train.bptt.checkpointed import CheckpointPlan
    from rcswarm.train.bptt.streaming import plain_backward, streaming_backward

    device = torch.device(config.device)
    torch.manual_seed(0)
    model = registry.build_model("frame", config.preset, seed=0).to(device)
    c = model.config
    window = SyntheticWindow(config.batch, config.length, c.rows, c.cols, c.char_vocab, c.n_styles, c.action_vocab)
    plan = (CheckpointPlan("binomial", budget_bytes=int(config.budget_mib * 2**20))
            if config.method == "binomial" else None)

    def step(frames: int) -> tuple[float, str]:
        model.zero_grad(set_to_none=True)
        part = window if frames == window.length else SyntheticWindow(**{**asdict(window), "length": frames})
        if config.method == "plain":
            return plain_backward(model, part.chunk(0, frames), config.k), "plain"
        loss, stats = streaming_backward(model, part, config.k, checkpoints=plan)
        return loss, stats.schedule

    step(min(config.length, WARMUP_FRAMES))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    loss, schedule = step(config.length)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    frames = config.batch * config.length
    return {**asdict(config), "seconds": seconds, "frames_per_second": frames / seconds, "loss": loss,
            "schedule": schedule, "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
            "flops": training_step_flops(c, config.batch, config.length, streaming=config.method != "plain",
                                         core_recompute=config.method == "binomial"),
            "allocated_before_bytes": before if cuda else None,
            "reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
            "peak_rss_bytes": None if cuda else _peak_rss_bytes()}


def spawn(config: BpttConfig, timeout: float) -> dict:
    """Run one configuration in a child process; its measurement, or {"error": why} (timeout, crash, OOM)."""
    command = [sys.executable, "-m", "rcswarm.cli.gpu_check.bptt", json.dumps(asdict(config))]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": ("out of memory: " if "out of memory" in proc.stderr.lower() else "") + tail[:300]}
    return json.loads(lines[-1])


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:,.1f} MiB"


def row_of(config: BpttConfig, result: dict, peak: CardPeak | None = None) -> Row:
    """The table row of one configuration's result; with the card's `peak`, the FLOP utilization of the step
    (`models.frame.flops.training_step_flops` over the seconds, over the dense bf16 peak)."""
    name = f"{config.preset} {config.method} L={config.length:,}"
    if "error" in result:
        status = SKIPPED if result["error"].startswith(("timed out", "out of memory")) else ERROR
        return Row("bptt", name, "not measured", result["error"], status, {**asdict(config)})
    peak_bytes = result["peak_bytes"] if result["peak_bytes"] is not None else result["peak_rss_bytes"]
    what = "peak allocated" if result["peak_bytes"] is not None else "peak RSS (CPU)"
    rate = result["flops"] / result["seconds"]
    utilization = fraction(result["flops"], result["seconds"], peak.bf16_flops if peak else None)
    detail = (f"{what} {_mib(peak_bytes)}; {result['seconds']:.1f} s; {rate / 1e12:.2f} TFLOP/s"
              + (f" = {utilization:.1%} of bf16 peak" if utilization is not None else "")
              + f"; loss {result['loss']:.3f}; {result['schedule']}")
    return Row("bptt", name, f"{result['frames_per_second']:,.0f} frames/s", detail, INFO,
               {**result, "utilization": utilization})


def check_gradients(device: str, length: int = GRAD_CHECK_FRAMES, k: int = 32) -> list[Row]:
    """(c)'s correctness rows: every parameter's gradient after streaming BPTT (the pager; binomial checkpointing
    with 2 slots and read-ahead 3, embeddings in memory and on disk: every host copy and prefetch) against plain
    autograd, the tiny preset in float64 on `device`, 2 windows of `length` frames (off the chunk grid); error =
    max |Δ| / max |reference| over all parameters, at most GRAD_TOLERANCE."""
    from rcswarm.kernels.checks import relative_error
    from rcswarm.models import registry
    from rcswarm.train.bptt.checkpointed import CheckpointPlan
    from rcswarm.train.bptt.streaming import plain_backward, streaming_backward

    model = registry.build_model("frame", "tiny", seed=0).double().to(torch.device(device))
    c = model.config
    window = SyntheticWindow(2, length, c.rows, c.cols, c.char_vocab, c.n_styles, c.action_vocab)

    def grads(backward: Callable[[], object]) -> list[Tensor]:
        model.zero_grad(set_to_none=True)
        backward()
        return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]

    want = grads(lambda: plain_backward(model, window.chunk(0, length), k))
    methods = {"paged": None, **{f"binomial, embeddings in {where}": CheckpointPlan(
        "binomial", slots=2, embeddings=where, segment_steps=4 * k) for where in ("memory", "disk")}}
    rows = []
    for name, checkpoints in methods.items():
        got = grads(lambda checkpoints=checkpoints: streaming_backward(model, window, k, prefetch=3,
                                                                        checkpoints=checkpoints))
        error = max(relative_error(g, w) for g, w in zip(got, want, strict=True)) if len(got) == len(want) else math.inf
        rows.append(Row("bptt", f"gradients: {name} vs plain (float64, L={length})", f"{error:.1e}",
                        f"every parameter's gradient; tolerance {GRAD_TOLERANCE:g}",
                        PASS if error <= GRAD_TOLERANCE else FAIL, {"method": name, "error": error, "length": length}))
    return rows


def plan(presets: tuple[str, ...], lengths: tuple[int, ...], device: str, plain_max: int, k: int,
         budget_mib: float) -> list[BpttConfig]:
    """Every configuration to measure: plain up to `plain_max`, paged and binomial at every length."""
    return [BpttConfig(preset, method, length, device, k, budget_mib)
            for preset in presets for length in sorted(lengths) for method in METHODS
            if method != "plain" or length <= plain_max]


def measure_bptt(device: str, presets: tuple[str, ...] = ("tiny", "small"),
                 lengths: tuple[int, ...] = (32768, 100_000, 1_000_000), plain_max: int = 32768, k: int = 128,
                 budget_mib: float = 64.0, timeout: float = 300.0, peak: CardPeak | None = None,
                 on_row=None, deadline: float | None = None) -> list[Row]:
    """Part (c): every configuration of `plan`, each in its own child process for at most `timeout` s and never
    past `deadline` (time.monotonic(); the check's budget): a configuration with under MIN_CONFIG_S left is not
    started (a SKIPPED row says so)."""
    rows = []
    for config in plan(presets, lengths, device, plain_max, k, budget_mib):
        left = seconds_left(deadline)
        if left < MIN_CONFIG_S:
            rows.append(Row("bptt", f"{config.preset} {config.method} L={config.length:,}", "not run",
                            BUDGET_SPENT, SKIPPED, {**asdict(config)}))
        else:
            rows.append(row_of(config, spawn(config, min(timeout, left)), peak))
        if on_row is not None:
            on_row(rows[-1])
    return rows


if __name__ == "__main__":
    print(json.dumps(run_child(BpttConfig(**json.loads(sys.argv[1])))))
