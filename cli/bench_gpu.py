"""`rcswarm bench gpu` (`make gpu-check`): the whole GPU check in one command (issue #32, `cli/gpu_check/`).

    rcswarm bench gpu                                  # every part, JSON to runs/gpu-check.json
    rcswarm bench gpu --parts kernels timings          # (a) and (b) only
    rcswarm bench gpu --parts bptt --bptt-presets tiny --bptt-lengths 32768 100000
    rcswarm bench gpu --quick                          # shorter (b) and (c), 2 swarm rounds
    rcswarm bench gpu --quick --budget-minutes 9       # never past 9 minutes: what fits, then the table

Parts: (a) `kernels`, the Triton kernels against their references, forward and every gradient, fp32 and bf16;
(b) `timings`, rwkv_product and SGSA beside flash-linear-attention's chunk_rwkv7 and SDPA; (c) `bptt`,
streaming BPTT's gradients against plain autograd (float64; the pager, checkpointing's host copies and prefetches),
then its peak memory and frames/s at long windows; (d) `swarm`, a 2-worker swarm on the GPU. One table
on screen, the goals of the issue read out under it, and a JSON file with every number. Exit status 1 when a
correctness check fails or a part raises (missed speed goals are reported, not failed), else 0. The JSON is
written after every part and every (c) configuration, so a check cut off by its machine keeps what it measured;
`--budget-minutes` ends it in time by itself (a part not started for it is a SKIPPED row).

Without a CUDA device it prints one line saying so and exits 0. `--device cpu` runs the parts on the CPU
instead (kernels and timings, with tiny shapes, only under TRITON_INTERPRET=1): a test of the plumbing, not a
measurement.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rcswarm.cli.gpu_check.report import (
    BUDGET_SPENT,
    ERROR,
    PARTS,
    SKIPPED,
    Row,
    card_peak,
    document,
    exit_status,
    goals,
    render_table,
    seconds_left,
    write_json,
)
from rcswarm.cli.usage import new_parser, output_file_problem, parse_or_status
from rcswarm.kernels.triton_probe import triton_available

# A part is started only with at least this many seconds of the check's budget left.
MIN_PART_S = 30.0

FULL = {"bptt_lengths": [32768, 100_000, 1_000_000], "bptt_presets": ["tiny", "small"], "swarm_rounds": 3,
        "rwkv_lengths": [4096, 32768], "sgsa_lengths": [4096, 16384]}
QUICK = {"bptt_lengths": [32768, 100_000], "bptt_presets": ["tiny"], "swarm_rounds": 2,
         "rwkv_lengths": [32768], "sgsa_lengths": [16384]}


def parser() -> argparse.ArgumentParser:
    p = new_parser("rcswarm bench gpu", "Check the Triton kernels, streaming BPTT and a swarm on a CUDA device.")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run (default: all)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: CUDA when present, else say so and exit 0; cpu: run on the CPU (tests of the plumbing)")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check.json"), help="the JSON file (default runs/gpu-check.json)")
    p.add_argument("--quick", action="store_true", help="shorter timings (without fla's fp32 agreement row), bptt at "
                   "32K and 10^5 (tiny), 2 swarm rounds")
    p.add_argument("--rwkv-lengths", type=int, nargs="+", default=None, help="T of the RWKV timings (default 4096 32768)")
    p.add_argument("--sgsa-lengths", type=int, nargs="+", default=None, help="T of the SGSA timings (default 4096 16384)")
    p.add_argument("--bptt-presets", nargs="+", default=None, help="frame presets of (c) (default tiny small)")
    p.add_argument("--bptt-lengths", type=int, nargs="+", default=None,
                   help="window lengths of (c) (default 32768 100000 1000000)")
    p.add_argument("--bptt-chunk", type=int, default=128, help="encoder chunk k of streaming BPTT in (c)")
    p.add_argument("--plain-max", type=int, default=32768, help="longest window plain autograd is tried on in (c)")
    p.add_argument("--bptt-timeout", type=float, default=300.0, help="seconds each (c) configuration may take")
    p.add_argument("--swarm-rounds", type=int, default=None, help="rounds of the swarm in (d) (default 3)")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="wall-time budget of the whole check: a part (or a (c) configuration) is not started once "
                        "too little of it is left, and (c) and (d) are cut off at its end; the JSON is written after "
                        "every part either way (default: none)")
    return p


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The lengths, presets and rounds: given flags, else --quick's or the full defaults."""
    base = QUICK if args.quick else FULL
    return {key: getattr(args, key) if getattr(args, key) is not None else value for key, value in base.items()}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What ran the check: the card, its peaks, the software."""
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine()
    peak = card_peak(name) if cuda else None
    return {
        "device": str(device), "device_name": name, "peak": None if peak is None else peak.__dict__,
        "memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": _version("triton"),
        "flash_linear_attention": _version("fla-core") or _version("flash-linear-attention"),
        "python": platform.python_version(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def deadline_of(budget_minutes: float | None, started: float) -> float | None:
    """The check's deadline on time.monotonic() from `--budget-minutes` (None: no budget); ValueError for a
    budget that is not positive."""
    if budget_minutes is None:
        return None
    if not budget_minutes > 0:
        raise ValueError(f"--budget-minutes {budget_minutes}: expected a number of minutes > 0")
    return started + 60.0 * budget_minutes


def run_parts(args: argparse.Namespace, device: torch.device, console: Console,
              save: Callable[[list[Row]], None] = lambda rows: None, deadline: float | None = None,
              part_seconds: dict[str, float] | None = None) -> list[Row]:
    """Every requested part, in the order asked; a part that raises becomes an error row and the others still run.
    `save` gets the rows so far after every part and every (c) configuration; a part with under MIN_PART_S of
    the budget left (`deadline`, time.monotonic()) is not started, and (c) and (d) end by the deadline. Each part's
    wall seconds go to `part_seconds` (before its rows are saved) and on screen."""
    from rcswarm.cli.gpu_check import bptt, kernels, swarm

    cfg = settings(args)
    peak = card_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    interpreter = device.type == "cpu" and triton_available() and os.environ.get("TRITON_INTERPRET") == "1"
    rows: list[Row] = []
    for part in args.parts:
        left = seconds_left(deadline)
        if left < MIN_PART_S:
            rows.append(Row(part, part, "not run", BUDGET_SPENT, SKIPPED))
            save(rows)
            continue
        console.print(f"[bold]{part}[/] ...")
        started = time.monotonic()

        def on_row(row: Row) -> None:
            console.print(f"  {row.name}: {row.value}")
            save(rows + [row])

        try:
            if part == "kernels":
                if device.type == "cuda":
                    rows += kernels.check_kernels(device)
                elif interpreter:  # the interpreter's tl.dot is wrong on bf16 operands: SGSA in fp32 only
                    rows += kernels.check_kernels(device, (torch.float32, torch.bfloat16),
                                                  kernels.INTERPRETER_RWKV_CASES, ())
                    rows += kernels.check_kernels(device, (torch.float32,), (), kernels.INTERPRETER_SGSA_CASES)
                else:
                    rows.append(Row("kernels", "Triton kernels", "not run", "needs CUDA (or TRITON_INTERPRET=1 on the "
                                    "CPU) and triton", SKIPPED))
            elif part == "timings":
                if device.type == "cuda":
                    rows += kernels.time_kernels(device, peak, tuple(cfg["rwkv_lengths"]), tuple(cfg["sgsa_lengths"]),
                                                 agreement=not args.quick)
                elif interpreter:  # tiny shapes and a wall clock: the rows' plumbing, not a measurement
                    rows += kernels.time_rwkv(device, None, (16,), batch=1, heads=1, d=8)
                    rows += kernels.time_sgsa(device, None, (64,), 1, 2, 1, 16, 16, 8)
                else:
                    rows.append(Row("timings", "kernel timings", "not run", "needs CUDA (do_bench)", SKIPPED))
            elif part == "bptt":
                for row in bptt.check_gradients(device.type):
                    on_row(row)
                    rows.append(row)
                rows += bptt.measure_bptt(device.type, tuple(cfg["bptt_presets"]), tuple(cfg["bptt_lengths"]),
                                          args.plain_max, args.bptt_chunk, timeout=args.bptt_timeout, peak=peak,
                                          on_row=on_row, deadline=deadline)
            else:
                rows.append(swarm.run_swarm(device.type, cfg["swarm_rounds"], timeout=min(swarm.TIMEOUT_S, left)))
        except Exception as error:  # noqa: BLE001 - one part's failure is reported, the others still run
            rows.append(Row(part, f"{part} raised", type(error).__name__, str(error)[:500], ERROR))
        elapsed = time.monotonic() - started
        if part_seconds is not None:
            part_seconds[part] = round(elapsed, 1)
        console.print(f"  {part}: {elapsed:.0f} s")
        save(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    if args.device == "auto" and not torch.cuda.is_available():
        print(f"rcswarm bench gpu: no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}): "
              "nothing to check; run it where a GPU is (docs/PERFORMANCE.md, 'The GPU check')")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("rcswarm bench gpu: --device cuda, but CUDA is not available on this machine", file=sys.stderr)
        return 2
    try:
        deadline = deadline_of(args.budget_minutes, time.monotonic())
        problem = output_file_problem("--out", args.out, (".json",))
        if problem is not None:
            raise ValueError(problem)
    except ValueError as error:
        print(f"rcswarm bench gpu: {error}", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.device == "cpu" else "cuda")
    console = Console()
    env = environment(device)
    console.print(f"rcswarm bench gpu on {env['device_name']} ({env['device']}); torch {env['torch']}, "
                  f"triton {env['triton']}, flash-linear-attention {env['flash_linear_attention']}")
    env["part_seconds"] = {}
    rows = run_parts(args, device, console, lambda so_far: write_json(document(so_far, env), args.out), deadline,
                     env["part_seconds"])
    render_table(rows, f"rcswarm bench gpu — {env['device_name']}", console)
    for goal in goals(rows):
        console.print(goal.line())
    write_json(document(rows, env), args.out)
    console.print(f"JSON: {args.out}")
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
