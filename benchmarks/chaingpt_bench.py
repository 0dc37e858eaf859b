"""ChainGPT kernels and model on CPU: RWKV-Product chunked vs naive, SGSA sparse vs dense, training tokens/s.

    python benchmarks/chaingpt_bench.py              # all three tables (~2 minutes on 2 cores)
    python benchmarks/chaingpt_bench.py --quick      # smoke run: small T, one repeat (< 1 minute)
    python benchmarks/chaingpt_bench.py --threads 2 --repeats 2 --skip-dense-16k
    python benchmarks/chaingpt_bench.py --only sgsa            # one section; repeatable or comma list
    python benchmarks/chaingpt_bench.py --only rwkv --threads 1 --cpu-time   # RWKV by CPU time

(a) RWKV-Product, forward + backward (autograd, a random linear loss of y and the final state),
float32, B = 1, H = 4 heads of size 64 (D = 256), M ∈ {1, 2} substeps (the kernel runs T·M
steps), T ∈ {512, 2048, 8192}, the default chunk (32). `--cpu-time` times this section by
process CPU time instead of wall time (for a machine shared with other jobs; with
`--threads 1` it is the single-core time). The naive per-step loop is timed at T up to
`--naive-max-t` (2048) and extrapolated LINEARLY in T above that (its work per step is constant,
checked by tests/kernels/test_rwkv_product.py::test_forward_backward_work_is_linear_in_length;
the table marks such rows "extrap."). GFLOP/s counts the recurrence's nominal work, not
the chunked algorithm's: forward 9·d_k·d_v FLOPs per step and head (S a, S ⊙ w, (S a) bᵀ,
v kᵀ, S r), backward counted as 2× forward, so 27·B·H·T·M·d_k·d_v per call. The reference is
this machine's measured fp32 torch.matmul rate (4096 × 4096 × 4096, same thread count).

(b) SGSA forward (no_grad), float32, B = 1, H_q = 8, H_kv = 2 (one group config), head dim 64,
W = 512, G = 64, T ∈ {4096, 8192, 16384}: `sgsa_sparse` vs F.scaled_dot_product_attention
with the boolean [T, T] mask (`sgsa_mask`, enable_gqa). Reports time(16K) / time(4K) of the
sparse path and dense / sparse at each T.

(c) ChainGPT training step (forward, backward, AdamW) on random tokens, "small" preset
(D 128, C121, M 2, 4 recurrent iterations with 2 under gradients, W 64, G 16), B × T tokens
per step; tokens/s = B·T / seconds per step.

Times are the median of `--repeats` runs after one warm-up run; in (a), where the naive loop
is measured, it and the chunked path alternate (⌊repeats / 2⌋ rounds of 3 chunked calls and
1 naive call) so that load from other processes affects both sides of the ratio alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from rcswarm.kernels.rwkv_product import rwkv_product_substeps
from rcswarm.kernels.sgsa import sgsa_mask, sgsa_sparse
from rcswarm.models.chaingpt import PRESETS, ChainGPT, ChainGPTConfig


def timed(function: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def cpu_timed(function: Callable[[], object], repeats: int) -> float:
    """Median process CPU seconds (all threads) of `repeats` calls after one warm-up call.

    Robust to other processes competing for the cores (wall time is not); with one thread it
    equals wall time on an idle machine.
    """
    function()
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        function()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def interleaved(
    first: Callable[[], object], second: Callable[[], object], rounds: int, clock: Callable[[], float]
) -> tuple[float, float]:
    """Medians of `first` (3 calls per round) and `second` (1 call per round) over `rounds`
    rounds that alternate between them, after one warm-up call each: a load spike from other
    processes then hits both, so their ratio stays meaningful on a shared machine."""
    first()
    second()
    first_samples, second_samples = [], []
    for _ in range(rounds):
        for _ in range(3):
            start = clock()
            first()
            first_samples.append(clock() - start)
        start = clock()
        second()
        second_samples.append(clock() - start)
    return statistics.median(first_samples), statistics.median(second_samples)


def matmul_gflops(repeats: int, n: int = 4096, timer: Callable[[Callable[[], object], int], float] = timed) -> float:
    x, y = torch.randn(n, n), torch.randn(n, n)
    seconds = timer(lambda: torch.matmul(x, y), repeats)
    return 2 * n**3 / seconds / 1e9


def rwkv_inputs(length: int, substeps: int, heads: int = 4, dim: int = 64, seed: int = 0) -> list[torch.Tensor]:
    """Random RWKV-7-like float32 inputs with a substep axis, all leaves requiring grad."""
    g = torch.Generator().manual_seed(seed)
    kappa = F.normalize(torch.randn(1, length, substeps, heads, dim, generator=g), dim=-1)
    beta = torch.rand(1, length, substeps, heads, dim, generator=g)
    tensors = [
        torch.randn(1, length, heads, dim, generator=g),  # r
        torch.randn(1, length, heads, dim, generator=g) - 0.5,  # w_raw
        torch.randn(1, length, substeps, heads, dim, generator=g) / dim**0.5,  # k
        torch.randn(1, length, substeps, heads, dim, generator=g),  # v
        -kappa,  # a
        kappa * beta,  # b
        torch.zeros(1, heads, dim, dim),  # initial state
    ]
    return [t.requires_grad_(True) for t in tensors]


def rwkv_step(inputs: list[torch.Tensor], naive: bool) -> Callable[[], None]:
    def run() -> None:
        *xs, initial = inputs
        y, state = rwkv_product_substeps(*xs, initial, naive=naive)
        loss = y.sum() + state.sum()
        torch.autograd.grad(loss, inputs)

    return run


def bench_rwkv(
    console: Console, lengths: list[int], naive_max_t: int, repeats: int, peak: float, cpu_time: bool = False
) -> None:
    heads, dim = 4, 64
    timer = cpu_timed if cpu_time else timed
    clock = "CPU s" if cpu_time else "s"
    table = Table(
        title=f"(a) RWKV-Product fwd+bwd, float32, B=1, H={heads}, d={dim}; matmul peak {peak:.1f} GFLOP/s"
        + (" (process CPU time)" if cpu_time else "")
    )
    for column in ("M", "T", f"chunked {clock}", "chunked GFLOP/s", "% of matmul", f"naive {clock}", "naive", "speed-up"):
        table.add_column(column, justify="right")
    for substeps in (1, 2):
        naive_per_token = None
        for length in lengths:
            flops = 27 * heads * length * substeps * dim * dim
            chunked_step = rwkv_step(rwkv_inputs(length, substeps), naive=False)
            if length <= naive_max_t:
                naive_step = rwkv_step(rwkv_inputs(length, substeps), naive=True)
                clock = time.process_time if cpu_time else time.perf_counter
                chunked, naive = interleaved(chunked_step, naive_step, max(1, repeats // 2), clock)
                naive_per_token, how = naive / length, "measured"
            else:
                chunked = timer(chunked_step, repeats)
                if naive_per_token is None:
                    short = naive_max_t
                    naive_per_token = timer(rwkv_step(rwkv_inputs(short, substeps), naive=True), 1) / short
                naive, how = naive_per_token * length, f"extrap. T={naive_max_t}"
            gflops = flops / chunked / 1e9
            table.add_row(
                str(substeps), str(length), f"{chunked:.3f}", f"{gflops:.2f}", f"{100 * gflops / peak:.1f}%",
                f"{naive:.2f}", how, f"{naive / chunked:.1f}x",
            )
    console.print(table)


def dense_sgsa_seconds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, stride: int, repeats: int) -> float:
    """F.scaled_dot_product_attention with the boolean [T, T] SGSA mask (T² bytes)."""
    mask = sgsa_mask(q.shape[2], window, stride)
    return timed(partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True), repeats)


@torch.no_grad()
def bench_sgsa(console: Console, lengths: list[int], repeats: int, skip_dense: int | None) -> None:
    q_heads, kv_heads, dim, window, stride = 8, 2, 64, 512, 64
    table = Table(title=f"(b) SGSA forward, float32, B=1, H_q={q_heads}, H_kv={kv_heads}, d={dim}, W={window}, G={stride}")
    for column in ("T", "sparse s", "dense SDPA+mask s", "dense / sparse"):
        table.add_column(column, justify="right")
    sparse_times = {}
    for length in lengths:
        g = torch.Generator().manual_seed(length)
        q = torch.randn(1, q_heads, length, dim, generator=g)
        k = torch.randn(1, kv_heads, length, dim, generator=g)
        v = torch.randn(1, kv_heads, length, dim, generator=g)
        sparse = timed(partial(sgsa_sparse, q, k, v, window, stride), repeats)
        sparse_times[length] = sparse
        if skip_dense is not None and length >= skip_dense:
            table.add_row(str(length), f"{sparse:.3f}", "skipped", "-")
            continue
        try:
            dense = dense_sgsa_seconds(q, k, v, window, stride, max(1, repeats // 2))
        except RuntimeError as error:  # CPU out of memory
            table.add_row(str(length), f"{sparse:.3f}", f"failed: {str(error)[:40]}", "-")
            continue
        table.add_row(str(length), f"{sparse:.3f}", f"{dense:.3f}", f"{dense / sparse:.1f}x")
    console.print(table)
    first, last = min(sparse_times), max(sparse_times)
    console.print(
        f"sparse time({last}) / time({first}) = {sparse_times[last] / sparse_times[first]:.2f} "
        f"(T ratio {last / first:.0f})"
    )


def bench_training(console: Console, batch: int, length: int, repeats: int) -> None:
    config = ChainGPTConfig(**PRESETS["small"])
    torch.manual_seed(0)
    model = ChainGPT(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, config.vocab_size, (batch, length + 1), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    seconds = timed(step, repeats)
    parameters = sum(p.numel() for p in model.parameters())
    table = Table(title='(c) ChainGPT training step, "small" preset, float32')
    for column in ("params", "B x T", "s / step", "tokens/s"):
        table.add_column(column, justify="right")
    table.add_row(f"{parameters / 1e6:.2f}M", f"{batch} x {length}", f"{seconds:.3f}", f"{batch * length / seconds:.0f}")
    console.print(table)


SECTIONS = ("rwkv", "sgsa", "step")


def parse_sections(values: list[str] | None) -> set[str]:
    """Sections named by `--only` (repeatable, each value a comma list); all of them when absent."""
    if not values:
        return set(SECTIONS)
    chosen = {name.strip() for value in values for name in value.split(",") if name.strip()}
    unknown = sorted(chosen - set(SECTIONS))
    if unknown:
        raise ValueError(f"--only got unknown section(s) {unknown}; expected some of {list(SECTIONS)}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-max-t", type=int, default=2048, help="largest T at which the naive loop is timed")
    parser.add_argument("--skip-dense-16k", action="store_true", help="do not run dense attention at T=16384")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument(
        "--cpu-time", action="store_true",
        help="RWKV section: time by process CPU time (robust on a shared machine; use with --threads 1)",
    )
    parser.add_argument(
        "--only", action="append", default=None, metavar="{rwkv,sgsa,step}",
        help="run only these sections (repeatable or comma list, e.g. --only rwkv,sgsa); default: all",
    )
    args = parser.parse_args()
    sections = parse_sections(args.only)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=200)
    repeats = 1 if args.quick else args.repeats
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; machine: {platform.machine()}, "
                  f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.quick:
        if "rwkv" in sections:
            peak = matmul_gflops(repeats, 1024, cpu_timed if args.cpu_time else timed)
            bench_rwkv(console, [128, 512], 128, repeats, peak, args.cpu_time)
        if "sgsa" in sections:
            bench_sgsa(console, [1024, 2048], repeats, None)
        if "step" in sections:
            bench_training(console, 2, 64, repeats)
        return
    if "rwkv" in sections:
        peak = matmul_gflops(repeats, 4096, cpu_timed if args.cpu_time else timed)
        bench_rwkv(console, [512, 2048, 8192], args.naive_max_t, repeats, peak, args.cpu_time)
    if "sgsa" in sections:
        bench_sgsa(console, [4096, 8192, 16384], repeats, 16384 if args.skip_dense_16k else None)
    if "step" in sections:
        bench_training(console, 8, 256, repeats)


if __name__ == "__main__":
    main()
