"""Expected time per step and per round of a frame-model run on GPUs, from the FLOP model (Appendix J).

    python benchmarks/frame_gpu_plan.py examples/frame_git_gpu.toml                 # H100, 40% utilization
    python benchmarks/frame_gpu_plan.py examples/frame_git_gpu.toml --utilization 0.25 --peak 989e12
    python benchmarks/frame_gpu_plan.py examples/frame_git_gpu.toml --utilization-from runs/gpu-check.json

For every run of the config (each length of a sweep), one step of B windows of L frames costs
`models.frame.flops.training_step_flops` (streaming BPTT: the frame head 4x its forward, the main model 3x, 4x
with core checkpointing), which takes flops / (peak x utilization) seconds; a round is `inner.steps` of them
(the sync is added from the bytes a worker moves: Δ and θ's step in the run's codec, at `--link-gbps`).
Utilization is an assumption (the dense bf16 blocks of the frame head at T = 7,680 and D = 768 are large
matmuls and FlashAttention; the main LSTM is sequential and not counted in it) until the GPU check has
measured it: `--utilization-from` takes the median measured utilization of the check's bptt rows of the
same preset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.models.frame.flops import step_seconds, training_step_flops
from rcswarm.models.frame.presets import count_parameters

H100_BF16 = 989e12


def codec_bytes(parameters: int, codec: str, block_size: int) -> int:
    """Bytes of one encoded tensor set: int8 (1 byte + a float32 scale per block), bf16 (2) or fp32 (4)."""
    if codec == "int8":
        return parameters + 4 * -(-parameters // block_size)
    return parameters * {"bf16": 2, "fp32": 4}[codec]


def measured_utilization(path: Path, preset: str) -> float | None:
    """The median `utilization` of the GPU check's bptt rows of `preset` (None if it has none)."""
    rows = json.loads(path.read_text())["rows"]
    found = [r["data"]["utilization"] for r in rows if r["part"] == "bptt" and r["data"].get("preset") == preset
             and r["data"].get("utilization")]
    return statistics.median(found) if found else None


def plan_rows(spec: RunSpec, peak: float, utilization: float, link_gbps: float) -> list[dict]:
    """One dict per run of `spec`: L, B, FLOPs and seconds per step and per round, sync bytes per round."""
    rows = []
    for run in spec.sweep_runs():
        entry = registry.get(run.model.name)
        config = entry.config_cls(**{**entry.presets[run.model.preset], **run.model.overrides})
        length, batch = run.data.seq_len, run.data.batch_size
        checkpointed = run.inner.memory_budget_mb > 0
        flops = training_step_flops(config, batch, length, streaming=run.inner.bptt_chunk > 0,
                                    core_recompute=checkpointed)
        seconds = step_seconds(flops, peak, utilization)
        moved = 2 * codec_bytes(count_parameters(config), run.sync.codec, run.sync.block_size)
        sync = moved * 8 / (link_gbps * 1e9)
        rows.append({"run": run.run.name, "L": length, "B": batch, "frames_per_step": length * batch,
                     "pflop_per_step": flops / 1e15, "seconds_per_step": seconds, "inner_steps": run.inner.steps,
                     "sync_mb_per_round": moved / 1e6, "seconds_per_round": run.inner.steps * seconds + sync,
                     "workers": run.run.workers})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path, help="a RUN.toml of the frame model")
    p.add_argument("--peak", type=float, default=H100_BF16, help="dense bf16 FLOP/s of one GPU (H100 SXM: 989e12)")
    p.add_argument("--utilization", type=float, default=0.4, help="assumed model FLOPs utilization (default 0.4)")
    p.add_argument("--utilization-from", type=Path, default=None, help="a `rcswarm bench gpu` JSON to read it from")
    p.add_argument("--link-gbps", type=float, default=10.0, help="a worker's link to the coordinator (Gbit/s)")
    args = p.parse_args(argv)
    spec = RunSpec.from_toml(args.config)
    utilization = args.utilization
    if args.utilization_from is not None:
        measured = measured_utilization(args.utilization_from, spec.model.preset)
        if measured is None:
            print(f"{args.utilization_from}: no measured utilization of preset {spec.model.preset!r}", file=sys.stderr)
            return 2
        utilization = measured
    rows = plan_rows(spec, args.peak, utilization, args.link_gbps)
    print(f"{args.config}: preset {spec.model.preset}, {args.peak / 1e12:g} TFLOP/s x {utilization:.0%}, "
          f"link {args.link_gbps:g} Gbit/s")
    print(f"{'L':>9} {'B':>5} {'frames/step':>12} {'FLOP/step':>10} {'s/step':>9} {'H':>3} {'MB sync':>8} "
          f"{'min/round':>10}")
    for r in rows:
        print(f"{r['L']:>9,} {r['B']:>5} {r['frames_per_step']:>12,} {r['pflop_per_step'] * 1e15:>10.3g} "
              f"{r['seconds_per_step']:>9.3g} {r['inner_steps']:>3} {r['sync_mb_per_round']:>8.3g} "
              f"{r['seconds_per_round'] / 60:>10.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
