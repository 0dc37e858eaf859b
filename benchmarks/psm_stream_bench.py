"""Per-token time and state memory of streaming inference: Transformer-PSM vs a GPT with a KV cache.

The setting of Figure 6 of "Sequential-Parallel Duality in Prefix-Scannable Models", scaled to
a 2-core CPU: one long stream decoded token by token (batch 1). The GPT's per-token cost and
its KV cache grow with the context; Transformer-PSM keeps at most ⌈log2(r + 1)⌉ chunk states
(r = chunks seen) and runs its inference Transformer over at most 2c positions, so its cost
per token stays flat (plus an aggregation every c tokens).

    python benchmarks/psm_stream_bench.py [--tokens 8192] [--window 512] [--plot out.png]

Prints a table of the median per-token time and the streaming state in each window of tokens,
and writes a plot. State memory is counted exactly from the tensors each model keeps between
tokens (KV cache; PSM roots, their cached folds and the current chunk's tokens).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rcswarm.models import registry


def tensor_bytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def gpt_state_bytes(cache) -> int:
    return tensor_bytes(cache.keys) + tensor_bytes(cache.values)


def psm_state_bytes(stream) -> int:
    return tensor_bytes(stream.scan.stored()) + tensor_bytes(stream.buffer)


def decode(name: str, model, tokens: torch.Tensor, progress: Progress) -> tuple[list[float], list[int]]:
    """Seconds and state bytes after each token of `tokens` [T]."""
    if name == "gpt":
        state = model.init_cache(1)
        step, size = (lambda tok: model.step(tok, state)), (lambda: gpt_state_bytes(state))
    else:
        stream = model.stream(1)
        step, size = stream.step, (lambda: psm_state_bytes(stream))
    seconds, sizes = [], []
    job = progress.add_task(name, total=len(tokens))
    with torch.no_grad():
        for token in tokens:
            started = time.perf_counter()
            step(token.view(1))
            seconds.append(time.perf_counter() - started)
            sizes.append(size())
            progress.advance(job)
    return seconds, sizes


def build_models(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    gpt = registry.build_model(
        "transformer", "small",
        {"vocab_size": 256, "d_model": args.d_model, "n_layers": 4, "n_heads": 4, "positions": "rope",
         "max_len": args.tokens + 1},
        seed=0,
    )
    psm = registry.build_model(
        "psm", "small",
        {"vocab_size": 256, "d_model": args.d_model, "n_heads": 4, "agg_layers": 2, "inf_layers": 2,
         "chunk_size": args.chunk},
        seed=0,
    )
    return {"gpt": gpt.eval(), "psm": psm.eval()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--window", type=int, default=512, help="tokens per row of the table")
    parser.add_argument("--chunk", type=int, default=64, help="Transformer-PSM chunk size c")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=Path("psm_stream.png"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    models = build_models(args)
    tokens = torch.randint(0, 256, (args.tokens,), generator=torch.Generator().manual_seed(0))
    results = {}
    with Progress(console=console) as progress:
        for name, model in models.items():
            results[name] = decode(name, model, tokens, progress)
    params = {name: registry.parameter_count(model) for name, model in models.items()}
    table = Table(title=f"streaming decode, batch 1, {args.threads} thread(s): median ms/token and state KiB per window")
    table.add_column("tokens")
    for name in models:
        table.add_column(f"{name} ms/token")
        table.add_column(f"{name} state KiB")
    table.add_column("gpt / psm time")
    for start in range(0, args.tokens, args.window):
        stop = min(start + args.window, args.tokens)
        cells = [f"{start}–{stop}"]
        medians = {}
        for name in models:
            seconds, sizes = results[name]
            medians[name] = statistics.median(seconds[start:stop])
            cells += [f"{1000 * medians[name]:.2f}", f"{max(sizes[start:stop]) / 1024:,.0f}"]
        cells.append(f"{medians['gpt'] / medians['psm']:.2f}")
        table.add_row(*cells)
    console.print(f"parameters: gpt {params['gpt']:,} (d {args.d_model}, 4 layers, 4 heads, RoPE, KV cache); "
                  f"psm {params['psm']:,} (d {args.d_model}, 4 heads, Agg 2 + Inf 2 layers, c = {args.chunk})")
    console.print(table)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
                  f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
                  f"torch {torch.__version__}")
    write_plot(results, args)
    console.print(f"plot: {args.plot}")


def write_plot(results: dict[str, tuple[list[float], list[int]]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (seconds, sizes) in results.items():
        window = args.window
        xs = list(range(window // 2, len(seconds), window))
        left.plot(xs, [1000 * statistics.median(seconds[max(0, x - window // 2): x + window // 2]) for x in xs],
                  marker="o", label=name)
        right.plot(range(len(sizes)), [s / 1024 for s in sizes], label=name)
    left.set(xlabel="token position", ylabel="ms per token (median per window)", title="per-token time")
    right.set(xlabel="token position", ylabel="KiB", title="streaming state")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(args.plot, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
