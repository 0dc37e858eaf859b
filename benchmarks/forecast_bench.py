"""Forecast error, interval coverage and pruning, replayed on recorded sweeps (issue #30).

    python benchmarks/forecast_bench.py RUN_DIR [RUN_DIR ...] [--fraction 0.3] [--final-batches N] [--json out.json]
                                        [--plot out.png]
    python benchmarks/forecast_bench.py --synthetic

For each run of each RUN_DIR (what `rcswarm run` made: summary.json and state/run<i>-L<L>/state.sqlite, read
only) the forecast is made the way the coordinator makes it (`coordinator.forecasts.forecast_record`) from the
rounds closed by `--fraction` of the run's wall time, for its last round R, and compared with

* the final training loss: the mean training loss of its last 3 rounds (the sweeps recorded so far predate the
  held-out loss along the way, `[run] eval_every`, so the replay forecasts the training loss);
* the held-out loss of its final parameters (summary.json's val_loss_final), which the training-loss forecast
  does not claim to predict: the gap between the two is in the table. Where the run measured its held-out loss
  along the way, the held-out forecast (the coordinator's, made from the losses measured by the fraction) is
  compared with it in a table of its own.

`--final-batches N` also measures each run's final parameters (final[-L<L>].safetensors) on N batches of a stream of
the held-out split that nothing along the way reads (FINAL_SEED): a reference far larger than the launcher's 8
batches, against which the held-out forecast of a fixed or a rotating set (`[run] eval_set`) is compared.

The horizon is the run's real last round (as with a `[run] rounds` budget, which the coordinator forecasts
for); "pace" also shows the forecast for the round the run's pace at the fraction extrapolates to (what a
wall-time budget would have to use).

Pruning is replayed with the coordinator's rule (`decide_prune`) at 25 % and 50 % of the wall time, each length
having had an equal share of it (as `rcswarm run --minutes` gives): the winner named is the kept length with the
lowest held-out loss, the worker-seconds those of the kept lengths plus the pruned ones' share up to their stop.

`--synthetic`: the law E + A·x^(−β) with Gaussian noise per round, 3 seeds per setting, forecast at 30 % of 100
rounds: the method's own calibration, without the misfit of a real curve.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from rcswarm.cli.run import local_runs
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.forecasts import PruneOptions, RunView, decide_prune, forecast_record
from rcswarm.observe.forecast import forecast_at, forecast_curve
from rcswarm.state.store import StateStore
from rcswarm.train.round import HELD_OUT_SEED, RoundTrainer

TAIL_ROUNDS = 3
PRUNE_AT = (0.25, 0.5)
# The stream of the large final reference: neither the fixed set's (HELD_OUT_SEED) nor a rotating one's (above it).
FINAL_SEED = HELD_OUT_SEED - 1


def large_finals(run_dir: Path, batches: int) -> dict[int, tuple[float, float]]:
    """By sequence length, each run's final parameters' loss on `batches` batches of FINAL_SEED's held-out stream,
    and on the fixed set along the way (`[run] eval_batches` of HELD_OUT_SEED's; what a perfect forecast of that
    set would predict, whatever the run measured)."""
    spec = RunSpec.from_toml(run_dir / "run.toml")
    finals = {}
    for local in local_runs(run_dir, spec):
        trainer = RoundTrainer(torch.device("cpu"))
        trainer.build(local.spec, model_seed=local.spec.run.seed)
        trainer.load(load_file(str(local.final)))
        finals[local.spec.data.seq_len] = (trainer.held_out_loss(batches, seed=FINAL_SEED),
                                           trainer.held_out_loss(local.spec.run.eval_batches))
    return finals


def read_run(state_dir: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float, float]]]:
    """(version, mean training loss) of every version, and (version, opened_at, closed_at) of every closed round."""
    store = StateStore.open_read_only(state_dir)
    try:
        return store.round_losses(), [(r.version, r.opened_at, r.closed_at) for r in store.rounds()]
    finally:
        store.close()


def state_dir_of(run_dir: Path, summary: dict, index: int) -> Path:
    """The state dir of run `index` of what `rcswarm run` recorded in `run_dir`: state/ for a single run,
    state/run<i>-L<L> for a sweep's."""
    if "runs" not in summary:
        return run_dir / "state"
    return run_dir / "state" / f"run{index}-L{summary['runs'][index]['seq_len']}"


def read_held_out(state_dir: Path) -> list[tuple[int, float]]:
    """(version, held-out loss of θ_v) measured along the way (`[run] eval_every`; none in older state dirs)."""
    store = StateStore.open_read_only(state_dir)
    try:
        return [(r.version, r.loss) for r in store.held_out_losses()]
    finally:
        store.close()


def forecast_by(losses: list[tuple[int, float]], rounds: list[tuple[int, float, float]], fraction: float,
                horizon: float | None = None, held_out: list[tuple[int, float]] = ()):
    """The coordinator's forecast from the rounds closed (and the held-out losses measured) by `fraction` of the
    run's wall time."""
    start, end = rounds[0][1], rounds[-1][2]
    cut = start + fraction * (end - start)
    version = sum(1 for _, _, closed in rounds if closed <= cut)
    last = len(rounds) if horizon is None else horizon
    return forecast_record(version, cut, start, round(last), losses, held_out=held_out), version


def replay(run_dir: Path, fraction: float, final_batches: int = 0) -> list[dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    large = large_finals(run_dir, final_batches) if final_batches else {}
    rows = []
    for index, run in enumerate(summary.get("runs", [summary])):
        state_dir = state_dir_of(run_dir, summary, index)
        losses, rounds = read_run(state_dir)
        if len(rounds) < 10:
            continue
        final_round = len(rounds)
        by_version = dict(losses)
        tail = [by_version[v] for v in range(final_round - TAIL_ROUNDS, final_round) if v in by_version]
        truth = float(np.mean(tail))
        made, version = forecast_by(losses, rounds, fraction, horizon=final_round - (TAIL_ROUNDS - 1) / 2)
        paced, _ = forecast_by(losses, rounds, fraction, horizon=max(1.0, version / fraction))
        # With held-out losses measured along the way: the coordinator's held-out forecast for the final θ
        # (version = the last round), against the launcher's held-out loss of it.
        measured = read_held_out(state_dir)
        held, _ = forecast_by(losses, rounds, fraction, horizon=final_round, held_out=measured)
        # The last measurement along the way when it is of the final θ or the one before: with a fixed set the same
        # batches as the forecast's points (the launcher's final evaluation uses 8 batches, of which that set is the
        # first few); with a rotating one a single draw of its own.
        last_measured = measured[-1][1] if measured and measured[-1][0] >= final_round - 1 else None
        rows.append({
            "run_dir": run_dir.name, "seq_len": run["seq_len"], "rounds": final_round, "at_round": version,
            "forecast": made.loss, "low": made.low, "high": made.high, "note": made.note, "train_final": truth,
            "val_final": run.get("val_loss_final"), "pace_forecast": paced.loss,
            "held_out_forecast": held.loss if held.basis == "held-out" else None, "held_out_low": held.low,
            "held_out_high": held.high, "held_out_last_measured": last_measured,
            "val_large_final": large[run["seq_len"]][0] if large else None,
            "fixed_set_final": large[run["seq_len"]][1] if large else None,
        })
    return rows


def prune_replay(run_dir: Path) -> dict:
    """decide_prune at PRUNE_AT of the wall time; the winner kept and the worker-seconds spent."""
    summary = json.loads((run_dir / "summary.json").read_text())
    runs = summary.get("runs", [summary])
    data = [read_run(state_dir_of(run_dir, summary, i)) for i in range(len(runs))]
    stopped_at: dict[int, float] = {}
    reasons = []
    for done, fraction in enumerate(PRUNE_AT):
        views = []
        for index, (losses, rounds) in enumerate(data):
            made, _ = forecast_by(losses, rounds, fraction, horizon=len(rounds))
            views.append(RunView(index, f"L={runs[index]['seq_len']}", 1, index in stopped_at, made))
        decision = decide_prune(0.0, views, PruneOptions(True, PRUNE_AT, 2), done)
        if decision is None:
            continue
        for index in decision.stop:
            stopped_at[index] = fraction
        reasons += [reason for index, reason in decision.reasons if index in decision.stop]
    val = {i: r["val_loss_final"] for i, r in enumerate(runs)}
    best = min(val, key=val.get)
    kept = [i for i in val if i not in stopped_at]
    named = min(kept, key=val.get)
    cost = (len(kept) + sum(stopped_at.values())) / len(runs)
    return {"run_dir": run_dir.name, "winner": runs[best]["seq_len"], "named": runs[named]["seq_len"],
            "pruned": {runs[i]["seq_len"]: f for i, f in stopped_at.items()}, "worker_seconds_ratio": cost,
            "reasons": reasons}


def plot(run_dir: Path, fraction: float, out: Path) -> None:
    """The forecast panel of the dashboard for `run_dir`'s lengths as made at `fraction` of the wall time, with the
    rounds that came after it (grey): what the forecast had to predict."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rcswarm.observe.plots import draw_forecast

    summary = json.loads((run_dir / "summary.json").read_text())
    curves, later = [], []
    for index, run in enumerate(summary.get("runs", [summary])):
        losses, rounds = read_run(state_dir_of(run_dir, summary, index))
        start, end = rounds[0][1], rounds[-1][2]
        version = sum(1 for _, _, closed in rounds if closed <= start + fraction * (end - start))
        curves.append(forecast_curve(f"L={run['seq_len']}", [(v, y) for v, y in losses if v <= version - 2],
                                     float(len(rounds))))
        later += [(v + 1, y) for v, y in losses if v > version - 2]
    figure = Figure(figsize=(6.4, 4.4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    axes.plot([x for x, _ in later], [y for _, y in later], ".", ms=2, color="0.7", label="rounds after the forecast")
    draw_forecast(axes, curves)
    axes.set_title(f"{run_dir.name}: forecasts made at {fraction:.0%} of the wall time", fontsize=10)
    figure.tight_layout()
    figure.savefig(out)


def synthetic() -> list[dict]:
    rows = []
    for e, a, beta, noise in ((1.2, 2.5, 0.6, 0.02), (1.8, 1.0, 0.3, 0.02), (1.0, 3.0, 1.0, 0.05),
                              (2.0, 1.5, 0.5, 0.01)):
        for seed in range(3):
            x = np.arange(1, 101, dtype=float)
            y = e + a * x ** -beta + np.random.default_rng(seed).normal(0.0, noise, len(x))
            made = forecast_at(x[:30], y[:30], 100.0, seed=seed)
            truth = e + a * 100 ** -beta
            rows.append({"law": f"E={e} A={a} β={beta} σ={noise}", "seed": seed, "forecast": made.loss,
                         "low": made.low, "high": made.high, "truth": truth})
    return rows


# The held-out forecast's references, (column, row key): the launcher's final evaluation, the large one of
# --final-batches, the last measurement along the way.
def _held_out_references(final_batches: int) -> list[tuple[str, str]]:
    references = [("launcher's final (8 batches)", "val_final")]
    if final_batches:
        references.append((f"large final ({final_batches} batches)", "val_large_final"))
    return references + [("last along the way", "held_out_last_measured")]


def print_held_out(held: list[dict], final_batches: int) -> None:
    """The held-out forecasts against each reference: a row per run, then the median error and the coverage."""
    references = _held_out_references(final_batches)
    print("\n| run | L | held-out forecast [90%] | " + " | ".join(f"{name} | \\|error\\| | covered"
                                                            for name, _ in references) + " |")
    print("| --- " * (3 + 3 * len(references)) + "|")
    for r in held:
        cells = []
        for _, key in references:
            truth = r[key]
            cells += (["–"] * 3 if truth is None else
                      [f"{truth:.3f}", f"{abs(r['held_out_forecast'] - truth):.3f}",
                       "yes" if r["held_out_low"] <= truth <= r["held_out_high"] else "no"])
        print(f"| {r['run_dir']} | {r['seq_len']} | {r['held_out_forecast']:.3f} [{r['held_out_low']:.3f}, "
              f"{r['held_out_high']:.3f}] | " + " | ".join(cells) + " |")
    for name, key in references:
        known = [r for r in held if r[key] is not None]
        if known:
            errors = [abs(r["held_out_forecast"] - r[key]) for r in known]
            inside = sum(r["held_out_low"] <= r[key] <= r["held_out_high"] for r in known)
            print(f"held-out forecast against {name}: median |error| {np.median(errors):.4f}, "
                  f"coverage {inside}/{len(known)}")
    offsets = [abs(r["fixed_set_final"] - r["val_large_final"]) for r in held if r["fixed_set_final"] is not None]
    if offsets:
        print(f"the fixed set's reading of the final θ against the large final: median |offset| "
              f"{np.median(offsets):.4f} (max {max(offsets):.4f}), the error of a perfect forecast of the fixed set")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="*", type=Path)
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path, help="the forecast panel of the first RUN_DIR, with what came after")
    parser.add_argument("--final-batches", type=int, default=0,
                        help="also measure each run's final parameters on this many held-out batches (FINAL_SEED)")
    args = parser.parse_args(argv)
    out: dict = {}
    if args.synthetic:
        rows = synthetic()
        errors = [abs(r["forecast"] - r["truth"]) for r in rows]
        covered = [r["low"] <= r["truth"] <= r["high"] for r in rows]
        print("| law | median abs error | covered |\n| --- | --- | --- |")
        for law in dict.fromkeys(r["law"] for r in rows):
            mine = [r for r in rows if r["law"] == law]
            print(f"| {law} | {np.median([abs(r['forecast'] - r['truth']) for r in mine]):.4f} | "
                  f"{sum(r['low'] <= r['truth'] <= r['high'] for r in mine)}/{len(mine)} |")
        print(f"all: median error {np.median(errors):.4f}, coverage {sum(covered)}/{len(covered)}")
        out["synthetic"] = rows
    if args.run_dirs:
        rows = [row for run_dir in args.run_dirs for row in replay(run_dir, args.fraction, args.final_batches)]
        print(f"\n| run | L | rounds | forecast at round | forecast [90%] | final train (last {TAIL_ROUNDS}) | "
              "|error| | covered | held-out final | pace forecast |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            if r["note"]:
                print(f"| {r['run_dir']} | {r['seq_len']} | {r['rounds']} | {r['at_round']} | {r['note']} | | | | | |")
                continue
            print(f"| {r['run_dir']} | {r['seq_len']} | {r['rounds']} | {r['at_round']} | {r['forecast']:.3f} "
                  f"[{r['low']:.3f}, {r['high']:.3f}] | {r['train_final']:.3f} | "
                  f"{abs(r['forecast'] - r['train_final']):.3f} | {'yes' if r['low'] <= r['train_final'] <= r['high'] else 'no'} | "
                  f"{r['val_final']:.3f} | {r['pace_forecast']:.3f} |")
        made = [r for r in rows if not r["note"]]
        if made:
            train = [abs(r["forecast"] - r["train_final"]) for r in made]
            val = [abs(r["forecast"] - r["val_final"]) for r in made if r["val_final"] is not None]
            pace = [abs(r["pace_forecast"] - r["train_final"]) for r in made if math.isfinite(r["pace_forecast"])]
            cover = sum(r["low"] <= r["train_final"] <= r["high"] for r in made)
            held = [r for r in made if r["held_out_forecast"] is not None and r["val_final"] is not None]
            if held:
                print_held_out(held, args.final_batches)
            print(f"\nforecasts made: {len(made)} of {len(rows)}; median |forecast − final train| {np.median(train):.4f}; "
                  f"coverage {cover}/{len(made)} ({cover / len(made):.0%}); median |forecast − held-out final| "
                  f"{np.median(val):.4f}; with the pace's horizon: median error {np.median(pace):.4f}")
        prunes = [prune_replay(run_dir) for run_dir in args.run_dirs]
        print("\n| run | winner (held-out) | named after pruning | pruned L: at fraction | worker-seconds vs full |")
        print("| --- | --- | --- | --- | --- |")
        for p in prunes:
            pruned = ", ".join(f"{k}: {v:.0%}" for k, v in p["pruned"].items()) or "none"
            print(f"| {p['run_dir']} | L={p['winner']} | L={p['named']} | {pruned} | {p['worker_seconds_ratio']:.2f} |")
        out["runs"], out["pruning"] = rows, prunes
    if args.plot and args.run_dirs:
        plot(args.run_dirs[0], args.fraction, args.plot)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=lambda v: None))
    if not (args.synthetic or args.run_dirs):
        parser.error("give RUN_DIRs or --synthetic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
