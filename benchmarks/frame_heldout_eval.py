"""Held-out loss of a frame-model sweep's final parameters, on equal numbers of held-out frames, by position.

    python benchmarks/frame_heldout_eval.py runs/frame-git-sweep-<time> [--frames 16384] [--plot out.png]

`rcswarm run` evaluates each length on 8 batches of its own windows (batch x L x 8 frames: few windows at
the longest L). This evaluates every run's final parameters (final-L<L>.safetensors) on the same number of
held-out frames at every L (`--frames`, as windows of the run's own length L from the held-out split, the
held-out history of a multi-repository dataset), and also by position in the window (the loss at steps
[2^j, 2^(j+1)) of the window), which says whether a longer L helps early positions as much as late ones
(the paper's "uniform improvement"). It fits loss(L) ≈ A L^(-α) on the per-L means (observe/fits.py) and
writes results.json (and a plot with `--plot`) into the run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.observe.fits import fit_power_law
from rcswarm.train.inner import make_sampler

SEED = 777


def position_buckets(length: int) -> list[tuple[int, int]]:
    """[0, 1), [1, 2), [2, 4), [4, 8), ... up to `length`."""
    edges = [0, 1] + [2**j for j in range(1, max(1, math.ceil(math.log2(length))) + 1)]
    edges = sorted({min(e, length) for e in edges})
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


@torch.no_grad()
def evaluate(run: RunSpec, params: dict[str, torch.Tensor], frames: int, batch: int) -> dict:
    """Mean held-out loss over `frames` frames in windows of the run's L, and the loss per position bucket."""
    length = run.data.seq_len
    windows = max(1, frames // length)
    data = dataclasses.replace(run.data, batch_size=min(batch, windows))
    model = registry.build_model(run.model.name, run.model.preset, run.model.overrides, seed=0)
    model.load_state_dict(params, strict=False)
    model.eval()
    sampler = make_sampler(data, seed=SEED, split="val", model_config=model.config)
    per_position = torch.zeros(length, dtype=torch.float64)
    seen = 0
    while seen < windows:
        inputs, targets = sampler.next_batch()  # [B, L, rows, cols, 2], [B, L]
        logits = model(inputs)  # [B, L, V]
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, L]
        take = min(nll.shape[0], windows - seen)
        per_position += nll[:take].double().sum(0)
        seen += take
    per_position /= seen
    buckets = {f"{a}-{b - 1}": float(per_position[a:b].mean()) for a, b in position_buckets(length)}
    return {"L": length, "windows": seen, "frames": seen * length, "loss": float(per_position.mean()),
            "by_position": buckets}


def plot(results: list[dict], fit, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    lengths = [r["L"] for r in results]
    left.plot(lengths, [r["loss"] for r in results], "o", label="held-out loss")
    if fit is not None:
        grid = [lengths[0] * (lengths[-1] / lengths[0]) ** (i / 50) for i in range(51)]
        left.plot(grid, [fit.predict(x) for x in grid], "-",
                  label=f"{fit.amplitude:.3f}·L^(−α), α {fit.alpha:.3f}, R² {fit.r_squared:.2f}")
    left.set_xscale("log", base=2)
    left.set_xlabel("trained length L (frames)")
    left.set_ylabel("held-out loss (nats/action)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    for r in results:
        starts = [int(key.split("-")[0]) + 1 for key in r["by_position"]]
        right.plot(starts, list(r["by_position"].values()), marker=".", label=f"L={r['L']}")
    right.set_xscale("log", base=2)
    right.set_xlabel("position in the window (bucket start + 1)")
    right.set_ylabel("held-out loss")
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a sweep's run directory (run.toml, final-L<L>.safetensors)")
    p.add_argument("--frames", type=int, default=16384, help="held-out frames per length (default 16384)")
    p.add_argument("--batch", type=int, default=16, help="windows per forward pass (at most)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--plot", type=Path, default=None, help="write the plot here too")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        spec = RunSpec.from_toml(args.run_dir / "run.toml")
    except ValueError as exc:  # a missing or invalid run.toml: one line, not a traceback
        print(f"frame_heldout_eval: {args.run_dir}: {exc}", file=sys.stderr)
        return 2
    results = []
    for run in spec.sweep_runs():
        path = args.run_dir / f"final-L{run.data.seq_len}.safetensors"
        if not path.exists():
            print(f"{path}: missing (the run never closed a round?)", file=sys.stderr)
            return 2
        started = time.perf_counter()
        results.append(evaluate(run, load_file(str(path)), args.frames, args.batch))
        r = results[-1]
        print(f"L={r['L']:>5}: held-out loss {r['loss']:.4f} over {r['frames']:,} frames ({r['windows']} windows); "
              f"first position {next(iter(r['by_position'].values())):.3f}, last bucket "
              f"{list(r['by_position'].values())[-1]:.3f}  [{time.perf_counter() - started:.0f} s]", flush=True)
    fit = None
    if len(results) >= 3:
        fit = fit_power_law([r["L"] for r in results], [r["loss"] for r in results])
        print(f"held-out loss ≈ {fit.amplitude:.4f} · L^(−α), α = {fit.alpha:.4f}, R² {fit.r_squared:.3f}, "
              f"α 90% interval [{fit.alpha_low:.4f}, {fit.alpha_high:.4f}], ×{fit.per_doubling:.4f} per doubling")
    ordered = all(b["loss"] < a["loss"] for a, b in itertools.pairwise(results))
    print(f"each longer length below its shorter neighbour: {ordered}")
    document = {"frames_per_length": args.frames, "results": results, "ordered": ordered,
                "fit": None if fit is None else {**dataclasses.asdict(fit), "per_doubling": fit.per_doubling}}
    (args.run_dir / "heldout_eval.json").write_text(json.dumps(document, indent=2))
    if args.plot is not None:
        plot(results, fit, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
