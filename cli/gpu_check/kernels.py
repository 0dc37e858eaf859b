"""Parts (a) and (b) of the GPU check: the Triton kernels against their references, then their speed.

(a) `check_kernels`: `rwkv_product_triton` against `rwkv_product_naive` and `sgsa_triton` against `sgsa_naive`,
outputs and the gradient of every input (the initial state included) for a random cotangent, in float32 and in
bfloat16. The references run in float64 on the same device from the same (for bf16: bf16-rounded) inputs; the
error is `kernels.checks.relative_error` (max |Δ| over max |reference|) and must stay within `TOLERANCES`:
float32 1e-4 (RWKV: fp32 accumulation over T steps; the interpreter tests' bound) and 1e-5 (SGSA: IEEE fp32
dots); bfloat16 2e-2 (inputs, stored outputs and the p·v operands rounded to 8 bits of mantissa).

(b) `time_kernels`: forward and forward + backward in bfloat16 timed with `triton.testing.do_bench` (median
milliseconds of repeated runs after warm-up, gradients reset between runs), as tokens/s and fractions of the
card's peak (`report`): rwkv_product's Triton kernels and flash-linear-attention's `chunk_rwkv7` (only when the
`fla` package is installed: `pip install -e ".[gpu]"`) at T = 4K and 32K; SGSA's Triton kernels and dense causal
`F.scaled_dot_product_attention` (FlashAttention backend where PyTorch has it) at T = 4K and 16K.

On the CPU (tests) the kernels run under TRITON_INTERPRET=1 and the timer is a wall clock.
"""

from __future__ import annotations

import importlib.util
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rcswarm.cli.gpu_check.report import (
    ERROR,
    FAIL,
    INFO,
    PASS,
    SKIPPED,
    CardPeak,
    Row,
    attention_flops,
    causal_pairs,
    fraction,
    rwkv_bytes,
    rwkv_flops,
    sgsa_pairs,
)
from rcswarm.kernels.checks import relative_error

TOLERANCES = {("rwkv", torch.float32): 1e-4, ("rwkv", torch.bfloat16): 2e-2,
              ("sgsa", torch.float32): 1e-5, ("sgsa", torch.bfloat16): 2e-2}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class RwkvCase:
    """B, T, H, d_k, d_v, the Triton checkpoint interval, whether an initial state is given, the w_raw shift."""

    batch: int
    length: int
    heads: int
    d_k: int
    d_v: int
    chunk: int = 32
    with_state: bool = True
    w_shift: float = 0.0

    def label(self) -> str:
        return f"B={self.batch} T={self.length} H={self.heads} d_k={self.d_k} d_v={self.d_v} chunk={self.chunk}"


@dataclass(frozen=True)
class SgsaCase:
    """B, H_q, H_kv, T, D, D_v, window W, anchor stride G."""

    batch: int
    q_heads: int
    kv_heads: int
    length: int
    d: int
    d_v: int
    window: int
    anchor_stride: int

    def label(self) -> str:
        return (f"B={self.batch} H={self.q_heads}/{self.kv_heads} T={self.length} D={self.d}/{self.d_v} "
                f"W={self.window} G={self.anchor_stride}")


# Off the chunk grid with several heads and an initial state; d not a power of two; strong decay.
RWKV_CASES = (RwkvCase(2, 300, 4, 64, 64), RwkvCase(1, 257, 2, 40, 48, chunk=16, with_state=False),
              RwkvCase(1, 96, 2, 32, 32, w_shift=3.0))
# GQA with the window and anchors both in play; T off the block grid; D not a power of two.
SGSA_CASES = (SgsaCase(2, 8, 2, 1000, 64, 64, 128, 32), SgsaCase(1, 4, 4, 777, 48, 40, 100, 16))
# The same shapes of problem, small enough for Triton's interpreter on the CPU (`--device cpu`).
INTERPRETER_RWKV_CASES = (RwkvCase(1, 11, 2, 8, 8, chunk=4), RwkvCase(1, 7, 1, 6, 10, chunk=3, with_state=False))
INTERPRETER_SGSA_CASES = (SgsaCase(1, 4, 2, 40, 16, 16, 8, 4),)


def rwkv_inputs(case: RwkvCase, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """RWKV-7-like inputs (a = −κ, b = κ ⊙ β, κ unit-norm): r, w_raw, k, a, b [B, T, H, d_k], v [B, T, H, d_v]."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.length, case.heads)

    def randn(*dims: int) -> Tensor:
        return torch.randn(*shape, *dims, generator=g)

    kappa = torch.nn.functional.normalize(randn(case.d_k), dim=-1)
    inputs = {"r": randn(case.d_k), "w_raw": randn(case.d_k) + case.w_shift, "k": randn(case.d_k) / case.d_k**0.5,
              "v": randn(case.d_v), "a": -kappa, "b": kappa * torch.rand(*shape, case.d_k, generator=g)}
    if case.with_state:
        inputs["initial_state"] = torch.randn(case.batch, case.heads, case.d_v, case.d_k, generator=g)
    return {name: x.to(device=device, dtype=dtype) for name, x in inputs.items()}


def sgsa_inputs(case: SgsaCase, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """q [B, H_q, T, D], k [B, H_kv, T, D], v [B, H_kv, T, D_v]."""
    g = torch.Generator().manual_seed(seed)
    tensors = {"q": torch.randn(case.batch, case.q_heads, case.length, case.d, generator=g),
               "k": torch.randn(case.batch, case.kv_heads, case.length, case.d, generator=g),
               "v": torch.randn(case.batch, case.kv_heads, case.length, case.d_v, generator=g)}
    return {name: x.to(device=device, dtype=dtype) for name, x in tensors.items()}


def outputs_and_grads(run: Callable[..., tuple[Tensor, ...]], inputs: dict[str, Tensor], seed: int = 1,
                      rounding: torch.dtype | None = None) -> dict[str, Tensor]:
    """Outputs of `run(**leaves)` and the gradients of Σ cotangent · output w.r.t. every input, by name.

    The cotangents are seeded normals rounded to `rounding` (the kernel's dtype, so that a float64 reference
    sees the very cotangents a bf16 kernel saw), then cast to each output's dtype.
    """
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    outputs = run(**leaves)
    g = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=g).to(rounding or o.dtype).to(device=o.device, dtype=o.dtype)
                  for o in outputs]
    grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outputs, cotangents, strict=True)),
                                list(leaves.values()))
    named = {f"out{i}": o.detach() for i, o in enumerate(outputs)}
    return {**named, **{f"d{name}": grad for name, grad in zip(leaves, grads, strict=True)}}


def _rwkv_runs(chunk: int) -> tuple[Callable, Callable]:
    from rcswarm.kernels.rwkv_product import rwkv_product_naive
    from rcswarm.kernels.rwkv_product.triton_kernel import rwkv_product_triton

    def naive(r, w_raw, k, v, a, b, initial_state=None):
        return rwkv_product_naive(r, w_raw, k, v, a, b, initial_state)

    def triton(r, w_raw, k, v, a, b, initial_state=None):
        return rwkv_product_triton(r, w_raw, k, v, a, b, initial_state, chunk_size=chunk)

    return naive, triton


def _sgsa_runs(case: SgsaCase) -> tuple[Callable, Callable]:
    from rcswarm.kernels.sgsa import sgsa_naive
    from rcswarm.kernels.sgsa.triton_flash import sgsa_triton

    def naive(q, k, v):
        return (sgsa_naive(q, k, v, case.window, case.anchor_stride),)

    def triton(q, k, v):
        return (sgsa_triton(q, k, v, case.window, case.anchor_stride),)

    return naive, triton


def compare(kernel: str, case: RwkvCase | SgsaCase, dtype: torch.dtype, device: torch.device) -> Row:
    """One correctness row: the kernel against its float64 reference on the same inputs, every output and gradient."""
    if kernel == "rwkv":
        inputs = rwkv_inputs(case, dtype, device)
        naive, triton = _rwkv_runs(case.chunk)
    else:
        inputs = sgsa_inputs(case, dtype, device)
        naive, triton = _sgsa_runs(case)
    got = outputs_and_grads(triton, inputs)
    want = outputs_and_grads(naive, {name: x.double() for name, x in inputs.items()}, rounding=dtype)
    errors = {name: relative_error(got[name], want[name]) for name in want}
    finite = all(bool(torch.isfinite(t).all()) for t in got.values())
    tolerance = TOLERANCES[(kernel, dtype)]
    worst = max(errors, key=errors.get)
    ok = finite and errors[worst] <= tolerance
    name = f"{'rwkv_product' if kernel == 'rwkv' else 'sgsa'} triton {DTYPE_NAMES[dtype]} {case.label()}"
    return Row("kernels", name, f"max rel err {errors[worst]:.2e} ({worst})",
               f"tolerance {tolerance:g}; {len(errors)} outputs and gradients" + ("" if finite else "; NOT finite"),
               PASS if ok else FAIL,
               {"kernel": kernel, "dtype": DTYPE_NAMES[dtype], "case": case.label(), "errors": errors,
                "tolerance": tolerance, "finite": finite})


def check_kernels(device: torch.device, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
                  rwkv_cases: tuple[RwkvCase, ...] = RWKV_CASES,
                  sgsa_cases: tuple[SgsaCase, ...] = SGSA_CASES) -> list[Row]:
    """Part (a): every case of both kernels in every dtype."""
    return [compare(kernel, case, dtype, device) for dtype in dtypes
            for kernel, cases in (("rwkv", rwkv_cases), ("sgsa", sgsa_cases)) for case in cases]


def fla_available() -> bool:
    """Whether flash-linear-attention (`fla`) can be imported (checked without importing it)."""
    return importlib.util.find_spec("fla") is not None


def fla_rwkv7() -> Callable[..., tuple[Tensor, Tensor]]:
    """flash-linear-attention's `chunk_rwkv7` adapted to rwkv_product's arguments (r, w_raw, k, v, a, b).

    Releases differ in how the decay is passed: a `log_w` argument (then `w` is raw), or `w` as the log decay.
    Both get log w_t = −exp(w_raw). The state of fla is [B, H, d_k, d_v], the transpose of ours.
    """
    from fla.ops.rwkv7 import chunk_rwkv7

    takes_log_w = "log_w" in inspect.signature(chunk_rwkv7).parameters

    def run(r, w_raw, k, v, a, b):
        decay = {"log_w": -torch.exp(w_raw)} if takes_log_w else {"w": -torch.exp(w_raw)}
        y, state = chunk_rwkv7(r=r, k=k, v=v, a=a, b=b, scale=1.0, initial_state=None, output_final_state=True,
                               **decay)
        return y, state.transpose(-1, -2)

    return run


def fla_agreement(device: torch.device) -> Row:
    """How far fla's chunk_rwkv7 is from rwkv_product_naive on one small float32 case (information: a different
    convention for a or b would show here, and the timings then compare the same work, not the same result)."""
    from rcswarm.kernels.rwkv_product import rwkv_product_naive

    case = RwkvCase(1, 128, 2, 64, 64, with_state=False)
    inputs = rwkv_inputs(case, torch.float32, device)
    inputs.pop("initial_state", None)
    y, state = fla_rwkv7()(**inputs)
    y_ref, state_ref = rwkv_product_naive(*(inputs[n].double() for n in ("r", "w_raw", "k", "v", "a", "b")))
    errors = {"y": relative_error(y, y_ref), "final_state": relative_error(state, state_ref)}
    return Row("timings", "fla chunk_rwkv7 against rwkv_product_naive (fp32, T=128)",
               f"max rel err {max(errors.values()):.2e}", "information: same recurrence when small", INFO,
               {"kernel": "fla agreement", "errors": errors})


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Seconds per call of a function: triton.testing.do_bench's median on CUDA, else the median of 3 wall clocks."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3

    def wall(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(3):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return sorted(times)[1]

    return wall


def _step(run: Callable[..., tuple[Tensor, ...]], leaves: dict[str, Tensor], backward: bool) -> Callable[[], None]:
    """A closure running the kernel (and its backward with unit cotangents), for the timer."""
    cotangents: list[Tensor] = []

    def step() -> None:
        for leaf in leaves.values():
            leaf.grad = None
        outputs = run(**leaves)
        if backward:
            if not cotangents:
                cotangents.extend(torch.ones_like(o) for o in outputs)
            torch.autograd.backward(list(outputs), cotangents)

    return step


def _timing_row(kernel: str, length: int, tokens: int, backward: bool, seconds: float, flops: int,
                bytes_moved: int | None, peak: CardPeak | None, shape: str) -> Row:
    flop_share = fraction(flops, seconds, peak.bf16_flops if peak else None)
    byte_share = fraction(bytes_moved, seconds, peak.bandwidth if peak else None) if bytes_moved else None
    pass_name = "fwd+bwd" if backward else "fwd"
    detail = f"{seconds * 1e3:.3f} ms; {flops / seconds / 1e12:.2f} TFLOP/s"
    if flop_share is not None:
        detail += f" = {flop_share:.1%} of bf16 peak"
    if bytes_moved:
        detail += f"; {bytes_moved / seconds / 1e9:.0f} GB/s"
        if byte_share is not None:
            detail += f" = {byte_share:.1%} of bandwidth"
    return Row("timings", f"{kernel} {pass_name} T={length:,} bf16", f"{tokens / seconds / 1e6:.2f} Mtok/s",
               f"{detail}; {shape}", INFO,
               {"kernel": kernel, "length": length, "backward": backward, "seconds": seconds,
                "tokens_per_second": tokens / seconds, "flops": flops, "flop_fraction": flop_share,
                "bytes": bytes_moved, "bandwidth_fraction": byte_share})


# The Triton kernel's rows per program in its second timing row: the default 32 gives B·H·2 = 128 programs at
# d_v = 64 on the H100's 132 SMs, one each (2026-11-27: 0.17x fla's fwd+bwd); 16 gives 256 (measured next lease).
RWKV_BLOCK_V = 16
# The chunked path's row: bf16 inputs, float32 inside (no byte count: its traffic is not the bf16 one of the others).
CHUNKED_FP32 = "rwkv_product chunked (fp32 inside)"


def time_rwkv(device: torch.device, peak: CardPeak | None, lengths: tuple[int, ...] = (4096, 32768),
              batch: int = 4, heads: int = 16, d: int = 64, agreement: bool = True) -> list[Row]:
    """rwkv_product's Triton kernels (as dispatched, and with RWKV_BLOCK_V rows per program), its chunked path (in
    float32; batched PyTorch products, the chunk-to-chunk scan one Triton launch) and (when installed and
    importable) fla's chunk_rwkv7, forward and forward + backward; with `agreement`, also fla's distance from the
    naive loop (fp32: its own compile and autotune)."""
    from rcswarm.kernels.rwkv_product.chunked import rwkv_product_chunked
    from rcswarm.kernels.rwkv_product.triton_kernel import rwkv_product_triton

    bench = timer(device)
    rows: list[Row] = []
    kernels: dict[str, Callable] = {
        "rwkv_product triton": lambda r, w_raw, k, v, a, b: rwkv_product_triton(r, w_raw, k, v, a, b, None),
        f"rwkv_product triton BLOCK_V={RWKV_BLOCK_V}": lambda r, w_raw, k, v, a, b: rwkv_product_triton(
            r, w_raw, k, v, a, b, None, block_v=RWKV_BLOCK_V),
        # in float32, as the models run it (`in_float32`; its triangular solve has no bf16 kernel), the casts timed too
        CHUNKED_FP32: lambda r, w_raw, k, v, a, b: rwkv_product_chunked(
            *(x.float() for x in (r, w_raw, k, v, a, b))),
    }
    if fla_available():
        try:
            kernels["fla chunk_rwkv7"] = fla_rwkv7()
        except Exception as error:  # noqa: BLE001 - the baseline is missing; rwkv_product and SGSA are still timed
            rows.append(Row("timings", "fla chunk_rwkv7", "not importable",
                            f"{type(error).__name__}: {str(error)[:300]}", SKIPPED, {"kernel": "fla chunk_rwkv7"}))
        if agreement and "fla chunk_rwkv7" in kernels:
            try:
                rows.append(fla_agreement(device))
            except Exception as error:  # noqa: BLE001 - information only; the timings still run
                rows.append(Row("timings", "fla chunk_rwkv7 against rwkv_product_naive", "failed",
                                f"{type(error).__name__}: {str(error)[:300]}", SKIPPED, {"kernel": "fla agreement"}))
    else:
        rows.append(Row("timings", "fla chunk_rwkv7", "not installed", 'pip install -e ".[gpu]"', SKIPPED,
                        {"kernel": "fla chunk_rwkv7"}))
    for length in lengths:
        case = RwkvCase(batch, length, heads, d, d, with_state=False)
        inputs = rwkv_inputs(case, torch.bfloat16, device)
        inputs.pop("initial_state", None)
        shape = f"B={batch} H={heads} d={d}"
        for name, run in kernels.items():
            for backward in (False, True):
                leaves = {n: x.clone().requires_grad_(backward) for n, x in inputs.items()}
                moved = None if name == CHUNKED_FP32 else rwkv_bytes(batch, length, heads, d, d, 2, backward)
                rows.append(_measured(bench, _step(run, leaves, backward), name, length, batch * length, backward,
                                      rwkv_flops(batch, length, heads, d, d, backward), moved, peak, shape))
    return rows


def _measured(bench: Callable, step: Callable[[], None], kernel: str, length: int, tokens: int, backward: bool,
              flops: int, bytes_moved: int | None, peak: CardPeak | None, shape: str) -> Row:
    """The timing row of `step`, or, when it raises (out of memory, a baseline's API), a row saying so: an error
    for our kernels, skipped for a baseline; either way the other timings still run."""
    try:
        seconds = bench(step)
    except Exception as error:  # noqa: BLE001 - reported in the table; the next measurement still runs
        ours = kernel in ("rwkv_product triton", "sgsa triton")  # as dispatched; variants and baselines: skipped
        return Row("timings", f"{kernel} {'fwd+bwd' if backward else 'fwd'} T={length:,} bf16", "failed",
                   f"{type(error).__name__}: {str(error)[:300]}", ERROR if ours else SKIPPED,
                   {"kernel": kernel, "length": length, "backward": backward})
    return _timing_row(kernel, length, tokens, backward, seconds, flops, bytes_moved, peak, shape)


def sdpa_causal() -> tuple[Callable[[Tensor, Tensor, Tensor], Tensor], str]:
    """Dense causal attention, pinned to PyTorch's FlashAttention backend where it has one; (function, backend)."""
    import torch.nn.functional as F

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), "default"

    def run(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run, "flash"


def time_sgsa(device: torch.device, peak: CardPeak | None, lengths: tuple[int, ...] = (4096, 16384), batch: int = 1,
              q_heads: int = 16, kv_heads: int = 4, d: int = 64, window: int = 512, anchor_stride: int = 64) -> list[Row]:
    """SGSA's Triton kernels against dense causal SDPA (key/value heads repeated for it), fwd and fwd + bwd."""
    from rcswarm.kernels.sgsa.triton_flash import sgsa_triton

    bench = timer(device)
    sdpa, backend = sdpa_causal()
    rows: list[Row] = []
    group = q_heads // kv_heads
    for length in lengths:
        case = SgsaCase(batch, q_heads, kv_heads, length, d, d, window, anchor_stride)
        inputs = sgsa_inputs(case, torch.bfloat16, device)
        dense = {"q": inputs["q"], "k": inputs["k"].repeat_interleave(group, 1).contiguous(),
                 "v": inputs["v"].repeat_interleave(group, 1).contiguous()}
        shape = f"B={batch} H={q_heads}/{kv_heads} D={d} W={window} G={anchor_stride}"
        runs = (("sgsa triton", lambda q, k, v: (sgsa_triton(q, k, v, window, anchor_stride),), inputs,
                 sgsa_pairs(length, window, anchor_stride)),
                ("sdpa causal", lambda q, k, v: (sdpa(q, k, v),), dense, causal_pairs(length)))
        for name, run, tensors, pairs in runs:
            detail = shape + (f"; SDPA backend {backend}" if name == "sdpa causal" else "")
            for backward in (False, True):
                leaves = {n: x.clone().requires_grad_(backward) for n, x in tensors.items()}
                rows.append(_measured(bench, _step(run, leaves, backward), name, length, batch * length, backward,
                                      attention_flops(batch, q_heads, d, d, pairs, backward), None, peak, detail))
    return rows


def time_kernels(device: torch.device, peak: CardPeak | None, rwkv_lengths: tuple[int, ...] = (4096, 32768),
                 sgsa_lengths: tuple[int, ...] = (4096, 16384), agreement: bool = True) -> list[Row]:
    """Part (b): both kernels' timings with their baselines (`agreement`: fla's distance from the naive loop too)."""
    return time_rwkv(device, peak, rwkv_lengths, agreement=agreement) + time_sgsa(device, peak, sgsa_lengths)
