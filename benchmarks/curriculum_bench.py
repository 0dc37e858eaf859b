"""The adaptive curriculum against fixed lengths (issue #30): wall time to the best fixed length's final held-out loss.

    nice -n 19 python benchmarks/curriculum_bench.py [--config examples/adaptive_curriculum.toml] [--minutes 3]
        [--seeds 0] [--eval-every 4] [--eval-batches 4] [--gains 0,0.05] [--law-from RUNS_DIR]
        [--configured-law-gains 0] [--out DIR] [--json R.json] [--plot P.png]
    python benchmarks/curriculum_bench.py --replay RUN_DIR [RUN_DIR ...] [--json R.json] [--plot P.png]

From one config with an adaptive `[curriculum]` (its `seq_lens` the ladder), per seed: one run at each fixed length
L of the ladder (`policy = "fixed"`, `[data] seq_len = L`) and one adaptive run per `--gains` value
(`curriculum.forecast_gain`; 0 = the Eq. 11 rule alone; with `--law-from` the law is fitted to that directory's run
dirs, e.g. another seed's fixed-length runs, instead of the config's, and `--configured-law-gains` adds curricula with
the config's own law beside them), each started with `rcswarm run CONFIG --minutes M --run-dir
DIR` (a real coordinator and worker processes, one run after the other) with the same model, batch, workers, seed
and budget (`curriculum.budget_seconds` = the budget; `run.rounds` = 100,000, so the budget ends every run). Every run
measures the held-out loss along the way (`[run] eval_every`, `eval_batches`) on windows of the longest rung
(`[run] eval_seq_len`), so all curves are on the same held-out set.

Each run's curve is read from its state dir: (wall time at which θ_v was made — the close of round v − 1, from the
first round's opening —, held-out loss of θ_v), smoothed by a trailing mean of `SMOOTH` measurements (one
measurement moves by a few hundredths of a nat from version to version). A run's final held-out loss is the
smoothed curve's last point, and its wall time that point's time. The best fixed length is the fixed run with the
lowest final loss; for every run the table gives the wall time at which its smoothed curve first reaches that loss
(linear between two measurements; "not reached" otherwise) and the ratio to the best fixed run's wall time (the
issue's goal: ≤ 0.7 for the curriculum). Beside it, each run's rounds, inner steps per worker, the workers' compute
seconds (summed), the seconds the held-out measurements took (per worker: every worker measures each θ_v it pulls,
and the time axis includes them) and the launcher's evaluation of the final θ (8 batches of the same windows): on a
shared machine every run shares the load, so these tell load from method. `--replay` recomputes the table from
recorded run dirs (`bench.json` in each names its role; else the run's spec). Not
part of the test suite.

A second table reads the goal at its own time, GOAL × the best fixed run's wall time T: each fixed length's curve
falls to its end, so at GOAL × T every one of them is still above the target (the best fixed run's final loss). The
lowest of them there (the envelope: the best any one length has reached by that time) says how far below every fixed
length a curriculum must be at that time to meet the goal, a gain that can come only from changing the length during
training; beside it, each curriculum's own loss there.

On a shared machine the load moves between runs run one after the other (issue #30's second round: 202 rounds of
fixed L = 32 at load 2–3, 41–71 rounds of a curriculum at load 7–8 in the same 180 s), so wall time also compares
loads. With `--step-costs` (written by `--calibrate STEPS`: CPU seconds per step at each rung, one thread, this
process) every curve is also put on the step clock: θ_v at Σ over the rounds before v of the steps they trained ×
the cost per step of their length, the compute a worker spent on an otherwise idle core (rounds' sync and the
held-out measurements left out). Beside the wall-time columns the table then gives the step clock of each run's end,
the step-clock time to the best fixed length's final loss with its ratio, and, for each curriculum, the load-free
comparison at its own final loss: the fixed length that reaches that loss first on the step clock, and the
curriculum's step clock over that one's (the issue's ratio, taken at the loss the curriculum reached: ≤ 0.7 meets
the goal's speed-up).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overlap_bench import time_to  # benchmarks/ is no package: the crossing rule is its sibling's

from rcswarm.config.runspec import RunSpec
from rcswarm.state.store import StateStore

ROOT = Path(__file__).resolve().parents[1]
SMOOTH = 3  # measurements in the trailing mean of the held-out curve
GOAL = 0.7  # the issue's: wall time to the best fixed length's final loss, over that length's wall time
ROUNDS = 100_000  # more than any run reaches: the budget (`--minutes`) ends every run


@dataclass
class RunCurve:
    """One run's held-out curve and what it cost."""

    label: str
    seed: int
    fixed: int  # the fixed length, 0 for the curriculum
    curve: list[tuple[float, float]]  # (seconds from the first round's opening, held-out loss of θ_v), smoothed
    raw: list[tuple[float, int, float]]  # (seconds, version, held-out loss) as measured
    rounds: int
    steps: int
    compute_s: float
    eval_s: float
    wall_s: float  # the first round's opening to the last round's close
    rungs: list[tuple[int, float]] = field(default_factory=list)  # (L, seconds it started), the curriculum's
    launcher_final: float = float("nan")  # the launcher's evaluation of the final θ (summary.json, 8 batches)
    # (step-clock seconds, held-out loss of θ_v), smoothed: the curve on `step_clock`'s axis (empty without costs).
    step_curve: list[tuple[float, float]] = field(default_factory=list)

    @property
    def final(self) -> tuple[float, float]:
        return self.curve[-1] if self.curve else (float("nan"), float("nan"))


def run_configs(base: dict, minutes: float, seed: int, eval_every: int, eval_batches: int,
                gains: list[float], law_from: str = "",
                configured_gains: list[float] | None = None) -> list[tuple[str, int, dict]]:
    """(label, fixed length or 0, the config as a dict) of every run of one seed: each rung fixed, then the
    curriculum per forecast gain of `gains` (with `law_from`: the law fitted there instead of the config's), then
    per gain of `configured_gains` one with the config's own law."""
    ladder = list(base["curriculum"]["seq_lens"])
    run = {**base.get("run", {}), "seed": seed, "rounds": ROUNDS, "eval_every": eval_every,
           "eval_batches": eval_batches, "eval_seq_len": max(ladder)}
    configs = []
    for length in ladder:
        fixed = {**base, "run": {**run, "name": f"fixed{length}"}, "data": {**base.get("data", {}), "seq_len": length}}
        fixed.pop("curriculum")
        configs.append((f"fixed L = {length}", length, fixed))
    fitted = {"law_from": str(Path(law_from).resolve()), "alpha_inf": 0.0, "tau": 0.0} if law_from else {}
    variants = [(gain, fitted) for gain in gains] + [(gain, {}) for gain in (configured_gains or []) if fitted]
    for gain, law in variants:
        curriculum = {**base["curriculum"], "budget_seconds": minutes * 60.0, "forecast_gain": gain, **law}
        name = "adaptive" + ("-fit" if law else "") + (f"-g{gain:g}" if gain else "")
        label = "curriculum" + (" (fitted law)" if law else "") + ", Eq. 11" + (f" + forecast_gain {gain:g}" if gain else "")
        configs.append((label, 0, {**base, "run": {**run, "name": name}, "curriculum": curriculum}))
    return configs


def launch(label: str, fixed: int, config: dict, minutes: float, run_dir: Path) -> None:
    """One `rcswarm run` of `config` for `minutes` into `run_dir` (its role in bench.json beside it)."""
    run_dir.mkdir(parents=True, exist_ok=False)
    path = run_dir.with_suffix(".toml")
    path.write_text(RunSpec.from_dict(config).to_toml())
    (run_dir / "bench.json").write_text(json.dumps({"label": label, "fixed": fixed}))
    started = time.monotonic()
    with open(run_dir.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rcswarm.cli", "run", str(path), "--minutes", f"{minutes:g}",
                                 "--run-dir", str(run_dir)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=minutes * 60.0 + 600.0)
        except BaseException:  # the timeout, Ctrl-C, or SIGTERM (main makes it SystemExit): stop the run, then raise
            stop_run(proc)
            raise
    print(f"  {label}: {time.monotonic() - started:.0f} s ({run_dir})", flush=True)


def stop_run(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM an `rcswarm run` (it stops its workers, then its coordinator: they run in sessions of their own, so
    only it can), SIGKILL it after `grace_s`. subprocess.run's timeout SIGKILLed it at once, and a benchmark ended
    by a signal left it running: either way its coordinator and workers outlived the benchmark."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def calibrate(config: str, steps: int, warmup: int = 3) -> dict[int, float]:
    """CPU seconds per inner step at each rung of `config`'s ladder, measured here in one thread (as each of the
    run's workers trains: `--threads 0` on 2 cores and 2 workers), on the run's model, batch and data: a cost per
    length the machine's other load barely moves (process time, not wall time)."""
    import torch

    from rcswarm.train.inner import worker_data_seed
    from rcswarm.train.round import RoundTrainer

    torch.set_num_threads(1)
    spec = RunSpec.from_toml(config)
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=spec.run.seed)
    costs = {}
    for length in spec.curriculum.seq_lens:
        trainer.follow(length, spec.curriculum.batch_for(length, spec.data.batch_size), worker_data_seed(spec.run.seed, 1))
        trainer.train(0, warmup)
        started = time.process_time()
        trainer.train(0, steps)
        costs[length] = (time.process_time() - started) / steps
    return costs


def step_clock(versions: dict[int, int], steps: dict[int, int], inner_steps: int,
               costs: dict[int, float]) -> dict[int, float]:
    """Version -> seconds on the step clock when θ_v was made: Σ over the rounds before v of the steps it trained
    (`steps`, else `inner_steps`) × the cost per step of its length (`versions`: version -> L it trained at)."""
    clock, total = {0: 0.0}, 0.0
    for version in range(max(versions, default=-1) + 1):
        if version in versions:
            total += steps.get(version, inner_steps) * costs[versions[version]]
        clock[version + 1] = total
    return clock


def smooth(points: list[tuple[float, float]], width: int = SMOOTH) -> list[tuple[float, float]]:
    """The trailing mean of `width` losses at each point's time (from the width-th point on)."""
    return [(points[i][0], sum(loss for _, loss in points[i - width + 1:i + 1]) / width)
            for i in range(width - 1, len(points))]


def read_run(run_dir: Path, costs: dict[int, float] | None = None) -> RunCurve:
    """A recorded run's curve and costs from its state dir; with `costs` (seconds per step by L) its curve on the
    step clock too."""
    spec = RunSpec.from_toml(run_dir / "run.toml") if (run_dir / "run.toml").exists() else None
    role = json.loads((run_dir / "bench.json").read_text()) if (run_dir / "bench.json").exists() else {}
    if spec is None:
        spec = RunSpec.from_toml(run_dir.with_suffix(".toml"))
    adaptive = spec.curriculum.policy == "adaptive"
    fixed = int(role.get("fixed", 0 if adaptive else spec.data.seq_len))
    label = role.get("label", f"fixed L = {fixed}" if fixed else "curriculum")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    store = StateStore.open_read_only(run_dir / "state")
    try:
        rounds = store.rounds()
        made = {r.version + 1: r.closed_at for r in rounds}  # θ_{v+1} is made when round v closes
        start = rounds[0].opened_at if rounds else 0.0
        made[rounds[0].version if rounds else 0] = start
        held = store.held_out_losses()
        raw = [(made[r.version] - start, r.version, r.loss) for r in held if r.version in made]
        usage = store.worker_usage()
        rungs, trained_at = [], {}
        for length in spec.curriculum.seq_lens if adaptive else [spec.data.seq_len]:
            versions = [v for v, _ in store.round_losses(length)]
            trained_at.update(dict.fromkeys(versions, length))
            if versions and adaptive:
                rungs.append((length, made.get(min(versions), start) - start))
        round_steps = store.round_steps()
        steps = sum(round_steps.values())
        step_curve = []
        if costs:
            clock = step_clock(trained_at, round_steps, spec.inner.steps, costs)
            step_curve = smooth([(clock[v], loss) for _, v, loss in raw if v in clock])
        return RunCurve(label, spec.run.seed, fixed, smooth([(t, loss) for t, _, loss in raw]), raw, len(rounds),
                        steps, sum(u.compute_seconds for u in usage), sum(r.seconds for r in held),
                        rounds[-1].closed_at - start if rounds else 0.0, rungs,
                        summary.get("val_loss_final", float("nan")), step_curve)
    finally:
        store.close()


def compare(runs: list[RunCurve]) -> list[dict]:
    """Per run: final loss and wall time, and the wall time to the best fixed run's final loss of its seed with the
    ratio to that run's wall time."""
    rows = []
    for seed in sorted({r.seed for r in runs}):
        mine = sorted((r for r in runs if r.seed == seed and r.curve), key=lambda r: (not r.fixed, r.fixed, r.label))
        fixed = [r for r in mine if r.fixed]
        best = min(fixed, key=lambda r: r.final[1]) if fixed else None
        for run in mine:
            reach = time_to(run.curve, best.final[1]) if best else None
            step_reach = time_to(run.step_curve, best.final[1]) if best and best.step_curve else None
            # The load-free comparison at this run's own final loss: the fixed length that reaches it first on the
            # step clock, and this run's step clock over that one's (None where no fixed run reaches it).
            matches = [(t, r.fixed) for r in fixed if run.step_curve and not run.fixed
                       and (t := time_to(r.step_curve, run.step_curve[-1][1])) is not None]
            match = min(matches, default=None)
            rows.append({"seed": seed, "run": run.label, "fixed": run.fixed, "final_loss": run.final[1],
                         "wall_s": run.final[0], "best_fixed": best.fixed if best else None,
                         "target": best.final[1] if best else None, "reach_s": reach,
                         "ratio": reach / best.final[0] if reach is not None and best else None,
                         "rounds": run.rounds, "steps": run.steps, "compute_s": run.compute_s, "eval_s": run.eval_s,
                         "points": len(run.raw), "rungs": run.rungs,
                         "launcher_final": run.launcher_final,
                         "step_clock_s": run.step_curve[-1][0] if run.step_curve else None,
                         "step_reach_s": step_reach,
                         "step_ratio": step_reach / best.step_curve[-1][0] if step_reach is not None else None,
                         "match_fixed": match[1] if match else None, "match_s": match[0] if match else None,
                         "match_ratio": run.step_curve[-1][0] / match[0] if match and match[0] > 0 else None})
    return rows


def table(rows: list[dict]) -> str:
    lines = [("| seed | run | final held-out loss | at (s) | time to the best fixed's final | ratio | rounds "
              "| steps per worker | compute s (workers) | held-out s (per worker) | final θ, launcher "
              "| rungs started at (s) | step clock (s) | step clock: time to the best fixed's final | ratio "
              "| step clock: first fixed to this run's final (L: s) | ratio |"),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        best = " (best fixed)" if r["fixed"] and r["fixed"] == r["best_fixed"] else ""
        reach = "not reached" if r["reach_s"] is None else f"{r['reach_s']:.0f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        rungs = ", ".join(f"{length}: {t:.0f}" for length, t in r["rungs"])
        clock = "" if r.get("step_clock_s") is None else f"{r['step_clock_s']:.0f}"
        step_reach = "" if not clock else "not reached" if r["step_reach_s"] is None else f"{r['step_reach_s']:.0f}"
        step_ratio = "" if r.get("step_ratio") is None else f"{r['step_ratio']:.2f}"
        match = "" if r["fixed"] or not clock else ("none reaches it" if r["match_s"] is None
                                                   else f"{r['match_fixed']}: {r['match_s']:.0f}")
        match_ratio = "" if r.get("match_ratio") is None else f"{r['match_ratio']:.2f}"
        lines.append(f"| {r['seed']} | {r['run']}{best} | {r['final_loss']:.3f} | {r['wall_s']:.0f} | {reach} "
                     f"| {ratio} | {r['rounds']} | {r['steps']} | {r['compute_s']:.0f} | {r['eval_s']:.0f} "
                     f"| {r['launcher_final']:.3f} | {rungs} | {clock} | {step_reach} | {step_ratio} | {match} | {match_ratio} |")
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """Per curriculum variant over the seeds: its ratios, their median, and how many met the goal."""
    lines = []
    for label in dict.fromkeys(r["run"] for r in rows if not r["fixed"]):
        for clock, key in (("wall time", "ratio"), ("step clock", "step_ratio")):
            if clock == "step clock" and all(r.get("step_clock_s") is None for r in rows if r["run"] == label):
                continue
            ratios = [r[key] for r in rows if r["run"] == label]
            reached = sorted(x for x in ratios if x is not None)
            median = statistics.median([math.inf if x is None else x for x in ratios]) if ratios else math.nan
            lines.append(f"{label}, {clock}: ratios {', '.join('not reached' if x is None else f'{x:.2f}' for x in ratios)}; "
                         f"median {'not reached' if median == math.inf else f'{median:.2f}'}; ≤ {GOAL} in "
                         f"{sum(x <= GOAL for x in reached)} of {len(ratios)} seeds")
    return lines


def loss_at(curve: list[tuple[float, float]], seconds: float) -> float | None:
    """The curve's last loss at or before `seconds` (None before its first point)."""
    return next((loss for t, loss in reversed(curve) if t <= seconds), None)


def at_goal(runs: list[RunCurve]) -> list[dict]:
    """Per seed, what the goal asks at GOAL × the best fixed run's wall time T: the best fixed run's final loss must
    be reached by then, and every fixed length's curve is still above it there (each falls to its end), so the
    lowest of them (the envelope) says by how much a curriculum has to beat every fixed length at that time; beside
    it each curriculum's own loss there."""
    rows = []
    for seed in sorted({r.seed for r in runs}):
        fixed = [r for r in runs if r.seed == seed and r.fixed and r.curve]
        if not fixed:
            continue
        best = min(fixed, key=lambda r: r.final[1])
        seconds = GOAL * best.final[0]
        by_fixed = {r.fixed: loss_at(r.curve, seconds) for r in fixed}
        envelope, lowest = min(((loss, length) for length, loss in by_fixed.items() if loss is not None),
                               default=(None, None))
        curricula = {r.label: loss_at(r.curve, seconds) for r in runs if r.seed == seed and not r.fixed and r.curve}
        rows.append({"seed": seed, "at_s": seconds, "target": best.final[1], "best_fixed": best.fixed,
                     "fixed": by_fixed, "envelope": envelope, "envelope_fixed": lowest, "curricula": curricula})
    return rows


def at_goal_table(rows: list[dict]) -> str:
    """One line per seed: the fixed lengths' envelope at GOAL × T, the drop it lacks, and each curriculum there."""
    def fmt(loss: float | None) -> str:
        return "—" if loss is None else f"{loss:.3f}"
    lines = [f"| seed | at {GOAL} × T (s) | best fixed's final (target) | lowest fixed length there (envelope) "
             "| envelope − target | curricula there (− target) |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lack = "" if r["envelope"] is None else f"{r['envelope'] - r['target']:+.3f}"
        curricula = "; ".join(f"{label}: {fmt(loss)}" + ("" if loss is None else f" ({loss - r['target']:+.3f})")
                              for label, loss in r["curricula"].items())
        lines.append(f"| {r['seed']} | {r['at_s']:.0f} | {r['target']:.3f} (L = {r['best_fixed']}) "
                     f"| {fmt(r['envelope'])} (L = {r['envelope_fixed']}) | {lack} | {curricula} |")
    return "\n".join(lines)


def plot(runs: list[RunCurve], rows: list[dict], path: Path) -> None:
    """Per seed the held-out curves against wall time and, where the runs have one, against the step clock below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r.seed for r in runs})
    clocks = [("curve", "wall time from the first round (s)")]
    if any(r.step_curve for r in runs):
        clocks.append(("step_curve", "step clock: steps × CPU seconds per step of their L (s)"))
    fig, axes = plt.subplots(len(clocks), len(seeds), figsize=(6.5 * len(seeds), 4.5 * len(clocks)), squeeze=False,
                             sharey=True)
    for row, (attribute, xlabel) in enumerate(clocks):
        for ax, seed in zip(axes[row], seeds):
            for run in sorted((r for r in runs if r.seed == seed), key=lambda r: (not r.fixed, r.fixed, r.label)):
                curve = getattr(run, attribute)
                style = "-" if run.fixed else "--"
                line, = ax.plot([t for t, _ in curve], [loss for _, loss in curve], style, label=run.label)
                if attribute == "curve":
                    ax.plot([t for t, _, _ in run.raw], [loss for _, _, loss in run.raw], ".", color=line.get_color(),
                            alpha=0.25, markersize=3)
            target = next((r["target"] for r in rows if r["seed"] == seed and r["target"] is not None), None)
            if target is not None:
                ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
            ax.set_title(f"seed {seed}")
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel(f"held-out loss (trailing mean of {SMOOTH})" + ("; dots: measured" if row == 0 else ""))
    axes[0][0].legend(fontsize=8)
    lows = [loss for r in runs for _, loss in r.curve]
    if lows:
        axes[0][0].set_ylim(min(lows) - 0.05, min(lows) + 1.0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "adaptive_curriculum.toml"))
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--gains", default="0", help="curriculum.forecast_gain of each adaptive run (0: Eq. 11 only)")
    parser.add_argument("--law-from", default="", help="curriculum.law_from of the --gains curricula: a directory of "
                        "fixed-length run dirs (or a metrics file) to fit the law to; default: the config's law")
    parser.add_argument("--configured-law-gains", default="", help="with --law-from: also one curriculum per gain "
                        "with the config's own law (the control)")
    parser.add_argument("--out", default="curriculum-bench", help="directory of the run dirs")
    parser.add_argument("--replay", nargs="+", metavar="RUN_DIR", help="recompute the table from recorded run dirs")
    parser.add_argument("--step-costs", metavar="COSTS.json", help="seconds per step by L ({\"32\": 0.05, ...}): "
                        "each curve also on the step clock (Σ steps × cost of their L), a time axis the machine's "
                        "load does not move; written by --calibrate")
    parser.add_argument("--calibrate", type=int, default=0, metavar="STEPS", help="first measure the CPU seconds "
                        "per step at each rung of --config over STEPS steps (one thread) into --step-costs")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through launch's cleanup, as Ctrl-C goes
    print(f"{platform.node()}: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.replay:
        dirs = [Path(d) for d in args.replay]
    else:
        with open(args.config, "rb") as handle:
            base = tomllib.load(handle)
        if base.get("curriculum", {}).get("policy") != "adaptive":
            raise SystemExit(f"{args.config}: expected an adaptive [curriculum] whose seq_lens are the ladder")
        out, dirs = Path(args.out), []
        for seed in (int(s) for s in args.seeds.split(",")):
            configs = run_configs(base, args.minutes, seed, args.eval_every, args.eval_batches,
                                  [float(g) for g in args.gains.split(",")], args.law_from,
                                  [float(g) for g in args.configured_law_gains.split(",") if g])
            for label, fixed, config in configs:
                dirs.append(out / f"s{seed}-{config['run']['name']}")
                launch(label, fixed, config, args.minutes, dirs[-1])
                print(f"    load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    costs = None
    if args.calibrate:
        if not args.step_costs:
            raise SystemExit("--calibrate needs --step-costs FILE to write the costs to")
        costs = calibrate(args.config, args.calibrate)
        Path(args.step_costs).write_text(json.dumps({str(length): cost for length, cost in costs.items()}))
        print(f"seconds per step (CPU, one thread): {costs}")
    elif args.step_costs:
        costs = {int(length): float(cost) for length, cost in json.loads(Path(args.step_costs).read_text()).items()}
    runs = [read_run(d, costs) for d in dirs]
    for run, run_dir in zip(runs, dirs, strict=True):
        if not run.curve:  # compare() leaves it out: say so, or a short run's table is silently empty
            print(f"left out: {run_dir} ({run.label}): no held-out loss on its curve ({len(run.raw)} measured in "
                  f"{run.rounds} rounds): run longer (--minutes) or measure more often (--eval-every)", file=sys.stderr)
    rows = compare(runs)
    goal_rows = at_goal(runs)
    print(table(rows))
    print("\n".join(verdicts(rows)))
    print(f"\nAt {GOAL} × the best fixed run's wall time T (trailing means of {SMOOTH}):")
    print(at_goal_table(goal_rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "at_goal": goal_rows, "runs": [asdict(r) for r in runs]},
                                              indent=1))
    if args.plot:
        plot(runs, rows, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
