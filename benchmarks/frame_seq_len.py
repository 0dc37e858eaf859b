"""Loss against trained sequence length on the fully observable typing task, with the fitted power law.

The experiment of Appendix G of "Recurrence-Complete Frame-based Action Models", scaled to a
CPU: the frame model trains for the same number of steps at each window length L (batch
fixed, so longer windows see more actions per step), on a small set of typed documents it
is meant to overfit, through the worker's own inner step (streaming BPTT, k frames at a
time). The loss at the matched step is the mean training loss over the last 10% of steps;
loss(L) ≈ A · L^(−α) is fitted in log–log space (rcswarm.observe.fits).

    python benchmarks/frame_seq_len.py [--preset tiny] [--lengths 2 4 8 16] [--steps 300] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.observe.fits import fit_power_law
from rcswarm.train.inner import inner_step, make_inner_optimizer, make_sampler


def train_at(length: int, args: argparse.Namespace, progress: Progress) -> dict[str, float]:
    spec = RunSpec.from_dict({
        "model": {"name": "frame", "preset": args.preset},
        "data": {"source": "typing", "seq_len": length, "batch_size": args.batch_size,
                 "task_config": {"n_documents": args.documents}},
        "inner": {"lr": args.lr, "bptt_chunk": args.k, "weight_decay": 0.0},
    })
    model = registry.build_model("frame", args.preset, seed=args.seed)
    sampler = make_sampler(spec.data, args.seed, model_config=model.config)
    optimizer = make_inner_optimizer(model, spec.inner)
    job = progress.add_task(f"L = {length}", total=args.steps)
    losses, started = [], time.perf_counter()
    for _ in range(args.steps):
        result = inner_step(model, optimizer, sampler, spec.inner.grad_clip, torch.device("cpu"), args.k)
        losses.append(result.loss)
        progress.advance(job)
    tail = losses[-max(1, args.steps // 10):]
    return {"length": length, "loss": sum(tail) / len(tail), "first_loss": losses[0],
            "seconds_per_step": (time.perf_counter() - started) / args.steps}


def write_plot(rows: list[dict[str, float]], fit, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["length"] for r in rows]
    figure, axis = plt.subplots(figsize=(5.5, 4))
    axis.loglog(lengths, [r["loss"] for r in rows], "o", label="loss at the matched step")
    axis.loglog(lengths, [fit.predict(x) for x in lengths], "-",
                label=f"{fit.formula()} (R² {fit.r_squared:.3f})")
    axis.set(xlabel="trained sequence length L (frames)", ylabel="cross-entropy", title="typing frames: loss vs L")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--documents", type=int, default=16, help="typed documents in the (overfitted) dataset")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--k", type=int, default=4, help="frame heads recomputed at a time (streaming BPTT)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (default: none; it once "
                        "went to ./frame_seq_len.png, into the checkout)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    # The power law is fitted to the losses at the end (observe.fits needs 3 distinct lengths): a bad --lengths
    # once failed with a traceback after every length had trained.
    if len(set(args.lengths)) < 3 or min(args.lengths) < 1:
        parser.error(f"--lengths {' '.join(map(str, args.lengths))}: expected at least 3 distinct lengths >= 1 "
                     "(the power law is fitted to them)")
    if min(args.steps, args.batch_size, args.documents, args.k, args.threads) < 1:
        parser.error("--steps, --batch-size, --documents, --k and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    console = Console()
    with Progress(console=console) as progress:
        rows = [train_at(length, args, progress) for length in args.lengths]
    fit = fit_power_law([r["length"] for r in rows], [r["loss"] for r in rows])
    table = Table(title=f"frame/{args.preset}, {args.steps} steps, batch {args.batch_size}, lr {args.lr}, k {args.k}")
    for column in ("L", "first loss", "loss at step", "fit", "s/step"):
        table.add_column(column)
    for r in rows:
        table.add_row(str(r["length"]), f"{r['first_loss']:.3f}", f"{r['loss']:.3f}", f"{fit.predict(r['length']):.3f}",
                      f"{r['seconds_per_step']:.3f}")
    console.print(table)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
                  f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
                  f"torch {torch.__version__}, {args.threads} thread(s)")
    console.print(f"loss ≈ {fit.formula(4)}; R² = {fit.r_squared:.4f}; "
                  f"α 90% bootstrap interval [{fit.alpha_low:.4f}, {fit.alpha_high:.4f}]; per doubling ×{fit.per_doubling:.4f}")
    if args.plot is not None:
        write_plot(rows, fit, args.plot)
        console.print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "alpha": fit.alpha, "amplitude": fit.amplitude,
                                         "r_squared": fit.r_squared}, indent=2))


if __name__ == "__main__":
    main()
