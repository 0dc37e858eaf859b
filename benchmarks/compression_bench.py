"""What the codecs cost and what they keep (issue #28): payload bytes and codec time per model, and the loss of
training at equal tokens under each codec and outer step.

    python benchmarks/compression_bench.py payload                        # Table 1: bytes and seconds per codec
    python benchmarks/compression_bench.py ratios                         # sparse settings' ratios, offsets coded
    python benchmarks/compression_bench.py quality --grid outer --out R.jsonl [--shard 0/2]   # the outer-step grid
    python benchmarks/compression_bench.py quality --grid table2 --out R.jsonl                # Table 2
    python benchmarks/compression_bench.py quality --grid sparse --out R.jsonl [--sparse-h 50]   # density, bits, decay
    python benchmarks/compression_bench.py quality --grid onset --out R.jsonl              # H = 20 and 30
    python benchmarks/compression_bench.py quality --grid followup --sparse-h 20 --out R.jsonl   # variants, seed 1,
                                                                                 # 4 workers, frame model
    python benchmarks/compression_bench.py quality --grid downlink --out R.jsonl     # 4 workers, denser downlinks
    python benchmarks/compression_bench.py quality --grid downlink-key --out R.jsonl  # sync.downlink_density, 4 workers
    python benchmarks/compression_bench.py quality --grid at-100x --out R.jsonl       # the densest ≥ 100x settings
    python benchmarks/compression_bench.py quality --grid one-bit --out R.jsonl       # 1-bit values, 2 workers
    python benchmarks/compression_bench.py quality --grid rounds --out R.jsonl        # the frame model and H = 50,
                                                                                 # 3-8x the rounds
    python benchmarks/compression_bench.py report R.jsonl [--plot P.png [--every-seed]] [--outer sgd-1.0] [--plot-h P.png]

Table 1 (`payload`): for each model preset, the bytes one worker pushes (its update in the run's codec) and pulls
(the compressed step) per round, their ratio to fp32, and the seconds to encode and to decode, scaled to 100 M
parameters, for int8 and the sparse codec side by side in one process. The tensors have the model's shapes (built
on the meta device: nothing is trained) and random normal values; payload sizes depend on the shapes alone. Times
are CPU seconds of this process (`time.process_time`, one torch thread: what the codec costs, not what other
processes on a shared machine take from it), medians of `--repeats` turns that alternate the codecs.

Table 2 and the grids (`quality`): a one-process simulation of a coordinator run with the project's real parts:
`RoundTrainer` (the worker's inner steps, model, data and AdamW), `codec.ErrorFeedback` with the run's
`WireFormat` on every worker, `aggregation.aggregate` (clipped_mean and the direction check, the defaults),
`outer.outer_step` and `outer.compressed_step` with the coordinator's error feedback on the step it broadcasts.
What it leaves out is the wire (gRPC, the payload framing) and time: the workers of one round run one after
another, every round waits for all of them (as `min_reports = workers` would), and no update is late. The model is
the LM sweep's (lstm_lm small, stdlib bytes, L = 16, batch 16, AdamW lr 0.003); every configuration trains the same
number of inner steps per worker (`--steps`), so equal tokens; the same seed gives every configuration the same
θ_0 and data. The held-out loss is the launcher's (cli/run.py `evaluate`'s split and seed) on `--eval-batches`
batches at the end and on EVAL_BATCHES along the way. Simulated time at 100 Mbit/s: per round, H inner steps at
the nominal step time (`--step-s`, measured: the median of the runs) plus every worker's push and pull through
the coordinator's 100 Mbit/s link, one after another (the coordinator's link carries N of each).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rcswarm.cli.run import EVAL_BATCHES, EVAL_SEED
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import aggregation
from rcswarm.models import registry
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec as codecs
from rcswarm.sync import norm_bound, outer, tensor_stream
from rcswarm.train.inner import worker_data_seed
from rcswarm.train.round import RoundTrainer

LINK_BYTES_PER_S = 100e6 / 8
# Outer steps of the grid: name -> [outer] table.
OUTER_STEPS: dict[str, dict[str, Any]] = {
    "nesterov-0.7": {"lr": 0.7, "momentum": 0.9, "nesterov": True},
    "nesterov-0.3": {"lr": 0.3, "momentum": 0.9, "nesterov": True},
    "sgd-1.0": {"lr": 1.0, "momentum": 0.0, "nesterov": False},
    "sgd-0.7": {"lr": 0.7, "momentum": 0.0, "nesterov": False},
    "sgd-1.3": {"lr": 1.3, "momentum": 0.0, "nesterov": False},
}


@dataclass(frozen=True)
class SimConfig:
    """One simulated run: the codec and its keys, the outer step, H, workers, seed and inner steps per worker."""

    codec: str
    outer: str
    inner_steps: int
    workers: int = 2
    seed: int = 0
    steps: int = 1500
    density: float = 0.02
    value_bits: int = 2
    decay: float = 1.0
    # The coordinator's error feedback decay on the broadcast step (None: the same as the workers').
    coord_decay: float | None = None
    # The step's codec: "same" (the run's, as the coordinator sends it), or "fp32" (a dense downlink, for reference).
    down: str = "same"
    # sync.downlink_density when it differs from the uplink's (None: the same; only with down = "same").
    down_density: float | None = None
    seq_len: int = 16
    batch: int = 16
    aggregation: str = "clipped_mean"
    # "lm": the LM sweep's model (lstm_lm small on stdlib bytes); "frame": the frame sweep's (frame tiny, typing).
    model: str = "lm"

    @property
    def key(self) -> str:
        sparse = f" d{self.density:g} b{self.value_bits}" if self.codec == "sparse" else ""
        sparse += f" dd{self.down_density:g}" if self.down_density is not None else ""
        lowbit = f" b{self.value_bits}" if self.codec == "lowbit" else ""
        decay = f" ef{self.decay:g}" + (f"/{self.coord_decay:g}" if self.coord_decay is not None else "")
        method = "" if self.aggregation == "clipped_mean" else f" {self.aggregation}"
        model = "" if self.model == "lm" else f" {self.model}"
        return (f"{self.codec}{sparse}{lowbit}{decay} down={self.down} {self.outer}{method}{model} H{self.inner_steps} "
                f"W{self.workers} s{self.seed} n{self.steps}")

    def spec(self) -> RunSpec:
        sync: dict[str, Any] = {"codec": self.codec, "error_decay": self.decay, "min_reports": self.workers,
                                "aggregation": self.aggregation}
        if self.codec in ("sparse", "lowbit"):
            sync["value_bits"] = self.value_bits
        if self.codec == "sparse":
            sync["density"] = self.density
            sync["downlink_density"] = self.down_density or 0.0
        if self.model == "frame":  # examples/frame_sweep.toml's model, task and inner step
            model = {"name": "frame", "preset": "tiny"}
            data = {"source": "typing", "seq_len": self.seq_len, "batch_size": self.batch,
                    "task_config": {"n_documents": 16}}
            inner = {"lr": 0.003, "steps": self.inner_steps, "weight_decay": 0.0, "bptt_chunk": 4}
        else:  # examples/lm_sweep.toml's
            model = {"name": "lstm_lm", "preset": "small"}
            data = {"source": "stdlib", "seq_len": self.seq_len, "batch_size": self.batch}
            inner = {"lr": 0.003, "steps": self.inner_steps}
        return RunSpec.from_dict({
            "run": {"name": "compression-bench", "seed": self.seed, "workers": self.workers},
            "model": model, "data": data, "inner": inner, "outer": OUTER_STEPS[self.outer], "sync": sync,
        })


def held_out(evaluator: RoundTrainer, theta: dict[str, torch.Tensor], batches: int) -> float:
    """The launcher's held-out loss of θ (its split and seed) on `batches` batches."""
    evaluator.load(theta)
    return evaluator.held_out_loss(batches, seed=EVAL_SEED)


def simulate(config: SimConfig, eval_batches: int, points: int = 10) -> dict[str, Any]:
    """Train `config` in one process (module docstring); its record: curve, final loss, bytes, flags, norms."""
    spec = config.spec()
    fmt = codecs.WireFormat.from_sync(spec.sync)
    down = codecs.WireFormat.from_sync(spec.sync, downlink=True) if config.down == "same" else codecs.WireFormat.of(
        codecs.codec_from_name(config.down))
    rounds = config.steps // config.inner_steps
    trainers = []
    for index in range(config.workers):
        trainer = RoundTrainer(torch.device("cpu"))
        trainer.build(spec, model_seed=spec.run.seed)
        trainer.follow(config.seq_len, config.batch, worker_data_seed(spec.run.seed, index + 1))
        trainers.append(trainer)
    evaluator = RoundTrainer(torch.device("cpu"))
    evaluator.build(spec, model_seed=spec.run.seed)
    theta = {name: p.detach().clone() for name, p in trainers[0].model.named_parameters()}
    momentum = {name: torch.zeros_like(t) for name, t in theta.items()}
    parameters = sum(t.numel() for t in theta.values())
    feedback = [codecs.ErrorFeedback(config.decay) for _ in trainers]
    broadcast = codecs.ErrorFeedback(config.decay if config.coord_decay is None else config.coord_decay)
    options = aggregation.AggregationOptions.from_sync(spec.sync)
    history: tuple[tuple[float, ...], ...] = ()
    previous = None
    curve = [(0, 0, held_out(evaluator, theta, EVAL_BATCHES), 0, 0)]
    up = down_bytes = tokens = clipped = dropped = 0
    worst_norm_ratio, step_seconds, scores = 0.0, [], []
    every = max(1, rounds // points)
    for version in range(rounds):
        updates = []
        for index, trainer in enumerate(trainers):
            trainer.load(theta)
            started = time.perf_counter()
            result = trainer.train(version, config.inner_steps)
            step_seconds.append((time.perf_counter() - started) / max(result.steps, 1))
            delta = trainer.delta(theta)
            payloads, received = feedback[index].compress_decoded(delta, fmt, consume=True)
            up += sum(len(p) for p in payloads.values())
            tokens += result.tokens
            norm = tensor_stream.global_norm(received)
            bound, _ = norm_bound.automatic_norm_bound(spec.inner, parameters, math.sqrt(sum(
                float(torch.linalg.vector_norm(t)) ** 2 for t in theta.values())))
            worst_norm_ratio = max(worst_norm_ratio, norm / bound)
            updates.append(aggregation.Update(f"w{index}", result.tokens, norm, received))
        combined = aggregation.aggregate(updates, options, [n for norms in history for n in norms], previous)
        clipped, dropped = clipped + combined.clipped, dropped + combined.dropped
        scores += [s for s in combined.scores if s is not None]
        keep = spec.sync.reference_rounds
        history = (*history, combined.accepted_norms)[-keep:] if keep else ()
        previous = combined.average if options.method == "centered_clip" else None
        target, momentum = outer.outer_step(theta, momentum, combined.average, spec.outer)
        theta, step = outer.compressed_step(theta, target, down, 0, broadcast)
        down_bytes += config.workers * sum(len(p) for p in step.values())
        if (version + 1) % every == 0 or version + 1 == rounds:
            loss = held_out(evaluator, theta, EVAL_BATCHES)
            curve.append((version + 1, tokens, loss, up // config.workers, down_bytes // config.workers))
            if not math.isfinite(loss):
                break
    final = held_out(evaluator, theta, eval_batches)
    fp32 = 4 * parameters
    return {
        "key": config.key, "config": asdict(config), "parameters": parameters, "rounds": rounds,
        "final_loss": final, "curve": curve, "tokens": tokens,
        "up_per_round": up / config.workers / rounds, "down_per_round": down_bytes / config.workers / rounds,
        "ratio_up": fp32 * rounds * config.workers / max(up, 1), "ratio_down": fp32 * rounds * config.workers / max(down_bytes, 1),
        "clipped": clipped, "dropped": dropped, "worst_norm_over_bound": worst_norm_ratio,
        "step_s": statistics.median(step_seconds), "residual_norm": broadcast.residual_norm(),
        "scores": [min(scores), statistics.median(scores)] if scores else None,
    }


SPARSE_DEFAULTS = {"density": 0.02, "value_bits": 2, "decay": 0.95}
GRIDS = ("outer", "sparse", "onset", "followup", "downlink", "downlink-key", "at-100x", "one-bit", "rounds", "table2",
         "all")


def _codecs(codecs_: tuple[str, ...], outer_step: str, h: int, steps: int, workers: int = 2) -> list[SimConfig]:
    return [SimConfig(codec, outer_step, h, workers, steps=steps, **(SPARSE_DEFAULTS if codec == "sparse" else {}))
            for codec in codecs_]


def grid(name: str, steps: int, seeds: list[int], sparse_h: int = 10) -> list[SimConfig]:
    """The configurations of one grid (`--grid`), most telling first; the sparse grid's knobs at H = `sparse_h`."""
    every = ("fp32", "int8", "sparse")
    if name == "outer":
        # Today's default and plain averaging for every codec at H = 10 and 50; other learning rates against int8;
        # H = 200 (at least 10 rounds).
        configs = [c for h in (10, 50) for o in ("nesterov-0.7", "sgd-1.0") for c in _codecs(every, o, h, steps)]
        configs += [c for h in (10, 50) for o in ("nesterov-0.3", "sgd-0.7") for c in _codecs(("int8", "sparse"), o, h, steps)]
        configs += [c for o in ("nesterov-0.7", "sgd-1.0") for c in _codecs(("int8", "sparse"), o, 200, max(steps, 2000))]
    elif name == "sparse":
        base = SimConfig("sparse", "sgd-1.0", sparse_h, steps=steps, **SPARSE_DEFAULTS)
        configs = [base] + [dataclasses_replace(base, **change) for change in (
            {"decay": 1.0}, {"density": 0.03}, {"down": "fp32"}, {"value_bits": 4}, {"coord_decay": 1.0},
            {"density": 0.01}, {"decay": 0.9}, {"value_bits": 1})]
    elif name == "onset":
        # Where the sparse penalty starts: every codec at H = 20 and 30, sparse and fp32 first.
        configs = [c for h in (20, 30) for c in _codecs(("sparse", "fp32", "int8"), "sgd-1.0", h, steps)]
        configs = sorted(configs, key=lambda c: (c.codec == "int8", c.inner_steps))
    elif name == "followup":
        # At H = `sparse_h`: a density growing with H (the bytes per inner step of H = 10's d 0.02) and a downlink
        # twice as dense as the uplink; then seed 1, 4 workers and the frame model at H = 10.
        base = SimConfig("sparse", "sgd-1.0", sparse_h, steps=steps, **SPARSE_DEFAULTS)
        configs = [dataclasses_replace(base, **change) for change in (
            {"density": 0.02 * sparse_h / 10}, {"down_density": 0.04})]
        configs += [dataclasses_replace(c, seed=1) for c in _codecs(("sparse", "fp32", "int8"), "sgd-1.0", 10, steps)]
        configs += _codecs(every, "sgd-1.0", 10, steps, 4)
        configs += [dataclasses_replace(c, model="frame", seq_len=8, batch=8)
                    for c in _codecs(every, "sgd-1.0", 10, 1000)]
        configs += [dataclasses_replace(base, density=0.02 * math.sqrt(sparse_h / 10)),
                    dataclasses_replace(base, density=0.02 * sparse_h / 10, down_density=0.02),
                    SimConfig("sparse", "sgd-1.0", 10, steps=steps, **{**SPARSE_DEFAULTS, "decay": 1.0})]
        return configs
    elif name == "downlink":
        # With N workers the round's step holds up to N × density of each chunk: sparse at H = 10 and 4 workers with
        # the downlink at 2× and 4× the uplink's density.
        base = SimConfig("sparse", "sgd-1.0", 10, 4, steps=steps, **SPARSE_DEFAULTS)
        configs = [dataclasses_replace(base, down_density=d) for d in (0.08, 0.04)]
    elif name == "downlink-key":
        # sync.downlink_density with 4 workers: a lower uplink density under a downlink of 0.02 (≥ 100× both ways),
        # then the downlink at 1×, 2× and 4× the uplink's density against int8 on seed 1 at H = 10 and at H = 50.
        base = SimConfig("sparse", "sgd-1.0", 10, 4, steps=steps, **SPARSE_DEFAULTS)
        configs = [dataclasses_replace(base, density=d, down_density=0.02) for d in (0.01, 0.005)]
        for h, seed in ((10, 1), (50, 0), (50, 1)):
            configs += [c for c in _codecs(("int8",), "sgd-1.0", h, steps, 4)] + [
                dataclasses_replace(base, inner_steps=h, down_density=d) for d in (None, 0.08, 0.04)]
            configs[-4:] = [dataclasses_replace(c, seed=seed) for c in configs[-4:]]
        return configs
    elif name == "at-100x":
        # With the Elias–Fano offsets the densest settings ≥ 100× below fp32 (`ratios`) are d 0.04 at 1-bit values
        # and d 0.034 at 2 bits: the 4-worker downlink at each (1-bit values both ways for the first: 170× up),
        # seeds 0 and 1; then 2 workers at H = 20 with d 0.034 both ways.
        base = SimConfig("sparse", "sgd-1.0", 10, 4, steps=steps, **SPARSE_DEFAULTS)
        configs = [dataclasses_replace(base, **change, seed=seed) for seed in (0, 1) for change in (
            {"value_bits": 1, "down_density": 0.04}, {"down_density": 0.034})]
        configs += [SimConfig("sparse", "sgd-1.0", 20, steps=steps, **{**SPARSE_DEFAULTS, "density": 0.034})]
        # A third seed of the 1-bit setting, beside int8's.
        return configs + [dataclasses_replace(c, seed=2) for c in (
            configs[0], *_codecs(("int8",), "sgd-1.0", 10, steps, 4))]
    elif name == "one-bit":
        # 1-bit values (a sign; the chunk's mid magnitude) against the 2-bit rows at H = 10 with 2 workers.
        configs = [SimConfig("sparse", "sgd-1.0", 10, steps=steps, **{**SPARSE_DEFAULTS, "value_bits": 1}, seed=seed)
                   for seed in (0, 1)]
        return configs
    elif name == "rounds":
        # Is the penalty a matter of rounds? Int8 beside the sparse default, in the order run: the frame model at
        # H = 10 over 3,000 inner steps (300 rounds; its followup rows had 100) and the LM at H = 50 over 6,000 (120
        # rounds; 30 before), seeds 0 and 1; 4 workers at H = 50 over 6,000 with the 4-worker setting ≥ 100× both ways
        # (1-bit values, the step at d 0.04); the frame model over 8,000 (its curves at 3,000 still fell 0.2-0.3 a
        # tenth and the seeds disagreed in sign); seed 1 of the 4 workers; the 4 workers over 12,000 (240 rounds: at
        # 120 the gap was still closing).
        frame = [dataclasses_replace(c, model="frame", seq_len=8, batch=8, seed=seed) for seed in (0, 1)
                 for c in _codecs(("int8", "sparse"), "sgd-1.0", 10, 3000)]
        h50 = [dataclasses_replace(c, seed=seed) for seed in (0, 1) for c in _codecs(("int8", "sparse"), "sgd-1.0", 50, 6000)]
        four = _codecs(("int8", "sparse"), "sgd-1.0", 50, 6000, 4)
        four[1] = dataclasses_replace(four[1], value_bits=1, down_density=0.04)
        return (frame[:2] + h50[:2] + frame[2:] + h50[2:] + four
                + [dataclasses_replace(c, steps=8000) for c in frame[:2]]
                + [dataclasses_replace(c, seed=1) for c in four] + [dataclasses_replace(c, steps=12000) for c in four])
    elif name == "table2":
        configs = [c for workers in (2, 4) for h in (10, 50) for c in _codecs(every, "sgd-1.0", h, steps, workers)]
    elif name == "all":
        # The order the bench ran them in, most needed first (a shared machine decides how far it gets).
        first = [c for h in (10, 50) for o in ("sgd-1.0", "nesterov-0.7") for c in _codecs(every, o, h, steps)]
        four = [c for h in (10, 50) for c in _codecs(("int8", "sparse", "fp32"), "sgd-1.0", h, steps, 4)]
        h200 = [c for o in ("sgd-1.0", "nesterov-0.7") for c in _codecs(("int8", "sparse"), o, 200, max(steps, 2000))]
        base = SimConfig("sparse", "sgd-1.0", 10, steps=steps, **SPARSE_DEFAULTS)
        knobs = [dataclasses_replace(base, **change) for change in (
            {"decay": 1.0}, {"coord_decay": 1.0}, {"down": "fp32"}, {"density": 0.01}, {"value_bits": 4},
            {"density": 0.03}, {"decay": 0.9}, {"value_bits": 1})]
        rates = [c for o in ("sgd-0.7", "nesterov-0.3") for c in _codecs(("int8", "sparse"), o, 10, steps)]
        seeded = [dataclasses_replace(c, seed=1) for h in (10, 50) for c in _codecs(("int8", "sparse"), "sgd-1.0", h, steps)]
        frame = [dataclasses_replace(c, model="frame", seq_len=8, batch=8) for o in ("sgd-1.0", "nesterov-0.7")
                 for c in _codecs(("int8", "sparse"), o, 10, 1000)]
        robust = [dataclasses_replace(c, aggregation=method) for method in ("trimmed_mean", "centered_clip")
                  for c in _codecs(("int8", "sparse"), "sgd-1.0", 10, steps, 4)]
        ordered = first + four + h200 + knobs + rates + seeded + frame + robust
        return ordered + [c for c in grid("outer", steps, [0]) if c not in ordered]
    else:
        raise ValueError(f"--grid {name!r}: expected one of {', '.join(GRIDS)}")
    return [dataclasses_replace(c, seed=s) for c in configs for s in seeds]


def dataclasses_replace(config: SimConfig, **changes: Any) -> SimConfig:
    values = asdict(config)
    values.update(changes)
    return SimConfig(**values)


def done_keys(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def claim(directory: Path | None, key: str) -> bool:
    """Whether this process may run `key`: it creates the claim file (O_EXCL), or no claims are kept."""
    if directory is None:
        return True
    directory.mkdir(parents=True, exist_ok=True)
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)
    try:
        os.close(os.open(directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def run_quality(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    configs = grid(args.grid, args.steps, args.seeds, args.sparse_h)
    index, count = (int(x) for x in args.shard.split("/"))
    configs = configs[index::count]
    out = Path(args.out)
    claims = Path(args.claims) if args.claims else None
    for config in configs:
        if config.key in done_keys(out) or not claim(claims, config.key):
            continue
        started = time.perf_counter()
        record = simulate(config, args.eval_batches)
        record["seconds"] = time.perf_counter() - started
        record["load"] = os.getloadavg()[0]
        with out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(f"{config.key}: held-out {record['final_loss']:.4f}, up {record['ratio_up']:.1f}x, down "
              f"{record['ratio_down']:.1f}x below fp32, {record['seconds']:.0f}s", flush=True)
    return 0


def read_records(paths: list[str]) -> list[dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["key"]] = record
    return list(records.values())


# ---- Table 1: payload bytes and codec seconds ---------------------------------------------------------------

PAYLOAD_MODELS = (("lstm_lm", "small"), ("lstm_lm", "base10m"), ("lstm_lm", "base50m"), ("frame", "small"),
                  ("frame", "82m"), ("frame", "103m"), ("chaingpt", "small"))


def model_shapes(name: str, preset: str) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a preset, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = registry.build_model(name, preset, {}, seed=None)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def payload_rows(formats: dict[str, codecs.WireFormat], repeats: int) -> Iterator[dict[str, Any]]:
    """Per model preset and codec: payload bytes, and CPU seconds (`time.process_time`, one thread) to encode and to
    decode every tensor, medians of `repeats` turns that alternate the codecs."""
    for name, preset in PAYLOAD_MODELS:
        shapes = model_shapes(name, preset)
        parameters = sum(math.prod(s) for s in shapes.values())
        generator = torch.Generator().manual_seed(0)
        tensors = {n: torch.randn(s, generator=generator) * 1e-3 for n, s in shapes.items()}
        fp32 = 4 * parameters
        encode_s: dict[str, list[float]] = {label: [] for label in formats}
        decode_s: dict[str, list[float]] = {label: [] for label in formats}
        sizes = {}
        for _ in range(repeats):
            for label, fmt in formats.items():
                started = time.process_time()
                encoded = {n: codecs.encode(t, fmt) for n, t in tensors.items()}
                middle = time.process_time()
                for n, data in encoded.items():
                    codecs.decode(data, fmt, shapes[n])
                encode_s[label].append(middle - started)
                decode_s[label].append(time.process_time() - middle)
                sizes[label] = sum(len(d) for d in encoded.values())
        scale = 1e8 / parameters
        for label in formats:
            yield {"model": f"{name} {preset}", "parameters": parameters, "codec": label, "bytes": sizes[label],
                   "ratio": fp32 / sizes[label], "encode_s": statistics.median(encode_s[label]) * scale,
                   "decode_s": statistics.median(decode_s[label]) * scale}


def run_payload(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    sparse = RunSpec.from_dict({"sync": {"codec": "sparse", "density": args.density, "value_bits": args.value_bits}})
    formats = {"int8": codecs.WireFormat(pb.CODEC_INT8_BLOCK, 256),
               f"sparse {args.density:g}/{args.value_bits}b": codecs.WireFormat.from_sync(sparse.sync),
               "lowbit 2b": codecs.WireFormat(pb.CODEC_LOWBIT_BLOCK, 256, 0, 2)}
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, 1 torch thread, "
          f"load {os.getloadavg()[0]:.1f}; bytes per worker per round, up = down (the step is sent in the same codec)")
    print("| model | parameters | codec | bytes up = down | × below fp32 | encode s / 100 M | decode s / 100 M "
          "| encode + decode ÷ int8's |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    int8_s: dict[str, float] = {}  # per model: int8's encode + decode (its rows come first), the ratio's reference
    for row in payload_rows(formats, args.repeats):
        both = row["encode_s"] + row["decode_s"]
        reference = int8_s.setdefault(row["model"], both) if row["codec"] == "int8" else int8_s.get(row["model"])
        versus = f"{both / reference:.2f}" if reference else "–"
        print(f"| {row['model']} | {row['parameters'] / 1e6:.1f} M | {row['codec']} | {row['bytes']:,} | "
              f"{row['ratio']:.1f} | {row['encode_s']:.2f} | {row['decode_s']:.2f} | {versus} |", flush=True)
    return 0


def offsets_in_full_size(numel: int, fmt: codecs.WireFormat) -> int:
    """Bytes of a sparse tensor with its offsets written in full (`offset_bits`, the layout before the Elias–Fano
    code): for the ratios of the measurements made with it."""
    full, rest = divmod(numel, fmt.block_size)
    kept = full * fmt.keep + -(-fmt.keep * rest // fmt.block_size)
    chunks = full + (1 if rest else 0)
    return 8 * chunks + -(-kept * codecs.offset_bits(fmt.block_size) // 8) + -(-kept * fmt.value_bits // 8)


def run_ratios(args: argparse.Namespace) -> int:
    """Per sparse setting: × below fp32 of one model's update, offsets Elias–Fano coded and written in full."""
    name, preset = args.model.split(":")
    shapes = [math.prod(s) for s in model_shapes(name, preset).values()]
    print(f"# {name} {preset}: {sum(shapes):,} parameters in {len(shapes)} tensors; chunks of {args.chunk}")
    print("| density | value bits | kept per chunk | × below fp32 | offsets in full (before) | bytes, coded / in full |")
    print("|---:|---:|---:|---:|---:|---:|")
    for density in args.densities:
        for bits in args.value_bits:
            fmt = codecs.WireFormat(pb.CODEC_SPARSE, args.chunk, codecs.sparse_keep(density, args.chunk), bits)
            coded = sum(codecs.encoded_size(n, fmt) for n in shapes)
            in_full = sum(offsets_in_full_size(n, fmt) for n in shapes)
            print(f"| {density:g} | {bits} | {fmt.keep} | {4 * sum(shapes) / coded:.1f} | {4 * sum(shapes) / in_full:.1f} "
                  f"| {coded / in_full:.3f} |")
    return 0


# ---- report ------------------------------------------------------------------------------------------------

def run_report(args: argparse.Namespace) -> int:
    records = read_records(args.records)
    step_s = args.step_s or statistics.median(r["step_s"] for r in records)
    print(f"nominal step time {step_s:.3f} s (median of the runs); link {LINK_BYTES_PER_S * 8 / 1e6:.0f} Mbit/s")
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        c = r["config"]
        groups.setdefault(tuple((k, v) for k, v in c.items() if k != "seed"), []).append(r)
    print("| codec | outer | H | workers | seeds | held-out (mean ± range) | × below fp32 up / down | clipped, dropped | max ‖Δ‖/bound |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, rs in sorted(groups.items(), key=lambda kv: (dict(kv[0])["inner_steps"], dict(kv[0])["workers"],
                                                           dict(kv[0])["outer"], dict(kv[0])["codec"])):
        c = dict(key)
        losses = [r["final_loss"] for r in rs]
        label = SimConfig(**{**c, "seed": 0}).key.rsplit(" s0 ", 1)[0]
        spread = f" ± {(max(losses) - min(losses)) / 2:.4f}" if len(losses) > 1 else ""
        print(f"| {label} | {c['outer']} | {c['inner_steps']} | {c['workers']} | {len(rs)} | "
              f"{statistics.mean(losses):.4f}{spread} | {rs[0]['ratio_up']:.1f} / {rs[0]['ratio_down']:.1f} | "
              f"{sum(r['clipped'] for r in rs)}, {sum(r['dropped'] for r in rs)} | "
              f"{max(r['worst_norm_over_bound'] for r in rs):.3f} |")
    if args.plot:
        shown = [r for r in records if not args.outer or r["config"]["outer"] == args.outer]
        plot(shown, Path(args.plot), step_s, args.every_seed)
    if args.plot_h:
        plot_by_h(records, Path(args.plot_h))
    return 0


def plot(records: list[dict[str, Any]], path: Path, step_s: float, every_seed: bool = False) -> None:
    """Loss vs tokens and vs simulated time at 100 Mbit/s, one panel pair per (model, H, workers), seed 0 (with
    `every_seed`, one per (model, H, workers, seed))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def cell_of(c: dict[str, Any]) -> tuple[str, int, int, int]:
        return c.get("model", "lm"), c["inner_steps"], c["workers"], c["seed"] if every_seed else 0

    cells = sorted({cell_of(r["config"]) for r in records}, key=lambda cell: (cell[0] != "lm", cell[2], cell[1], cell[3]))
    fig, axes = plt.subplots(2, len(cells), figsize=(4.2 * len(cells), 7), squeeze=False)
    for column, (model, h, workers, seed) in enumerate(cells):
        for r in records:
            c = r["config"]
            if (*cell_of(c)[:3], c["seed"]) != (model, h, workers, seed):
                continue
            curve = r["curve"]
            tokens = [p[1] for p in curve]
            loss = [p[2] for p in curve]
            seconds = [p[0] * h * step_s + workers * (p[3] + p[4]) / LINK_BYTES_PER_S for p in curve]
            name = SimConfig(**c).key.split(" ef")[0] + (f", {c['steps']} steps" if every_seed else "")
            label = f"{name} {c['outer']} ({r['ratio_up']:.0f}× / {r['ratio_down']:.0f}×)"
            axes[0][column].plot(tokens, loss, label=label)
            axes[1][column].plot(seconds, loss, label=label)
        seeded = f", seed {seed}" if every_seed else ""
        axes[0][column].set_title(f"{'lstm_lm small' if model == 'lm' else 'frame tiny'}, H = {h}, {workers} workers{seeded}")
        axes[0][column].set_xlabel("tokens (all workers)")
        axes[1][column].set_xlabel("simulated seconds at 100 Mbit/s")
        for row in (0, 1):
            axes[row][column].set_ylabel("held-out loss")
            axes[row][column].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def plot_by_h(records: list[dict[str, Any]], path: Path) -> None:
    """Final held-out loss against H per codec (lstm_lm, plain averaging, 2 workers, seed 0; sparse at its defaults),
    and the sparse variants' loss against their traffic ratio (the mean of up and down) beside fp32 at their H."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [r for r in records if r["config"]["outer"] == "sgd-1.0" and r["config"]["workers"] == 2
            and r["config"]["seed"] == 0 and r["config"].get("model", "lm") == "lm"
            and r["config"].get("aggregation", "clipped_mean") == "clipped_mean"]
    defaults = {**SPARSE_DEFAULTS, "down": "same", "down_density": None, "coord_decay": None}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for codec in ("fp32", "int8", "sparse"):
        points = sorted((r["config"]["inner_steps"], r["final_loss"]) for r in base if r["config"]["codec"] == codec
                        and (codec != "sparse" or all(r["config"].get(k) == v for k, v in defaults.items())))
        if points:
            left.plot([h for h, _ in points], [loss for _, loss in points], marker="o", label=codec)
    left.set_xscale("log")
    left.set_xlabel("H (inner steps per round; equal tokens)")
    left.set_ylabel("final held-out loss")
    left.set_title("the sparse penalty by H (sparse: d 0.02, 2 bits, EF 0.95)")
    left.legend()
    for h in sorted({r["config"]["inner_steps"] for r in base if r["config"]["codec"] == "sparse"}):
        variants = [r for r in base if r["config"]["codec"] == "sparse" and r["config"]["inner_steps"] == h]
        if len(variants) < 2:
            continue
        ratios = [2 / (1 / r["ratio_up"] + 1 / r["ratio_down"]) for r in variants]
        dots = right.scatter(ratios, [r["final_loss"] for r in variants], label=f"sparse variants, H = {h}")
        for r, ratio in zip(variants, ratios):
            label = SimConfig(**r["config"]).key.split(" sgd-1.0")[0].replace(" down=same", "").removeprefix("sparse ")
            right.annotate(label, (ratio, r["final_loss"]), fontsize=6)
        dense = [r["final_loss"] for r in base if r["config"]["codec"] == "fp32" and r["config"]["inner_steps"] == h]
        if dense:
            right.axhline(dense[0], linestyle=":", linewidth=1, color=dots.get_facecolor()[0], label=f"fp32, H = {h}")
    right.axvline(100, color="grey", linewidth=0.8)
    right.set_xscale("log")
    right.set_xlabel("× below fp32, up and down together")
    right.set_ylabel("final held-out loss")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    payload = commands.add_parser("payload", help="Table 1: bytes and codec seconds per model preset")
    payload.add_argument("--repeats", type=int, default=3)
    payload.add_argument("--density", type=float, default=0.02)
    payload.add_argument("--value-bits", type=int, default=2)
    ratios = commands.add_parser("ratios", help="sparse settings' ratios to fp32, offsets coded and in full")
    ratios.add_argument("--model", default="lstm_lm:small", help="NAME:PRESET")
    ratios.add_argument("--chunk", type=int, default=codecs.DEFAULT_SPARSE_CHUNK)
    ratios.add_argument("--densities", type=float, nargs="+",
                        default=[0.005, 0.01, 0.02, 0.03, 0.034, 0.04, 0.05, 0.08])
    ratios.add_argument("--value-bits", type=int, nargs="+", default=[1, 2, 4])
    quality = commands.add_parser("quality", help="Table 2 and the grids: simulated training at equal tokens")
    quality.add_argument("--grid", required=True, choices=GRIDS)
    quality.add_argument("--claims", default="", help="a directory of claim files: processes sharing it split the grid")
    quality.add_argument("--out", required=True)
    quality.add_argument("--steps", type=int, default=1500, help="inner steps per worker (equal tokens)")
    quality.add_argument("--seeds", type=int, nargs="+", default=[0])
    quality.add_argument("--shard", default="0/1", help="I/N: run every N-th configuration from the I-th")
    quality.add_argument("--eval-batches", type=int, default=64)
    quality.add_argument("--sparse-h", type=int, default=10, help="H of the sparse grid's configurations")
    report = commands.add_parser("report", help="the tables (markdown) and the plot of quality records")
    report.add_argument("records", nargs="+")
    report.add_argument("--plot", default="")
    report.add_argument("--every-seed", action="store_true", help="--plot: a panel pair per seed (and steps in the labels)")
    report.add_argument("--outer", default="", help="plot only this outer step's records (e.g. sgd-1.0)")
    report.add_argument("--plot-h", default="", help="a plot of the final loss against H and of the sparse variants")
    report.add_argument("--step-s", type=float, default=0.0, help="nominal seconds per inner step (0: median)")
    args = parser.parse_args(argv)
    return {"payload": run_payload, "ratios": run_ratios, "quality": run_quality,
            "report": run_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
