"""Loss against wall time of a 1-fast + 1-slow swarm under four ways of pacing rounds (issue #15).

    python benchmarks/hetero_bench.py                          # 150 s per configuration, the plot in docs/img/
    python benchmarks/hetero_bench.py --seconds 60 --configs b c --plot /tmp/hetero.png

A real coordinator (`SwarmCoordinator` behind `RunningCoordinator`, gRPC on 127.0.0.1, a fresh state
dir) trains the tiny LSTM LM (20 AdamW steps of 8 × 64 bytes a round, int8 broadcasts) with real worker
processes: `tests/helpers/paced_worker.py`, the real Worker whose inner steps are padded to factor × max(their
time, `--floor-s`), factor 1 for the fast worker and `--slow-factor` (3) for the slow one, so that the
speeds do not depend on the load of a shared machine. Configurations, same model, seeds and data:

  (a) step-boxed rounds as before: every worker trains inner.steps, the round waits for both
      (sync.round_deadline_s = 120 s, late updates refused, sync.max_staleness = 0);
  (b) adaptive step counts (sync.adaptive_steps): each worker trains what it does in the time the fast
      worker needs for inner.steps;
  (c) time-boxed rounds (sync.round = "time") of inner.steps × the fast worker's step time;
  (d) the fast worker alone, step-boxed.

Each configuration runs `--seconds` of wall time from its first pull; every `--sample-s` the current
global parameters are kept, and after the run each is evaluated on the held-out split (the launcher's
`evaluate`: 4 fixed validation batches). The table gives the held-out loss at a few wall times, the
versions, the tokens trained and applied; the plot has loss against wall time. The benchmark is not
part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rcswarm.cli.run import evaluate
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.worker import CoordinatorClient, RetryPolicy

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hetero-bench-token-0123456789"
STEPS = 20
CONFIGS = {
    "a": ("(a) step-boxed, waits for the slow worker", {"max_staleness": 0}, 2),
    "b": ("(b) adaptive step counts", {"adaptive_steps": True}, 2),
    "c": ("(c) time-boxed rounds", {"round": "time"}, 2),
    "d": ("(d) the fast worker alone", {}, 1),
}


def bench_spec(sync: dict, round_seconds: float) -> RunSpec:
    """The benchmark's run: tiny LSTM, 20 steps of 8 × 64 bytes, unbounded rounds, with `sync` overrides."""
    if sync.get("round") == "time":
        sync = {**sync, "round_seconds": round_seconds}
    return RunSpec.from_dict({
        "run": {"name": "hetero", "rounds": 0, "workers": 2},
        "model": {"name": "lstm_lm", "preset": "tiny"},
        "data": {"seq_len": 64, "batch_size": 8, "max_bytes": 2_000_000},
        "inner": {"steps": STEPS, "lr": 1e-2},
        "sync": sync,
        "coordinator": {"lease_s": 15.0, "max_wait_s": 2.0, "durable": False},
    })


def spawn(target: str, name: str, factor: float, floor_s: float, log: Path) -> subprocess.Popen:
    """A paced worker process (one torch thread)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.paced_worker", "--factor", str(factor), "--floor-s", str(floor_s),
         "--coordinator", target, "--name", name, "--threads", "1"],
        cwd=ROOT, env={**os.environ, "RCSWARM_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"},
        stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )


def run_config(key: str, args: argparse.Namespace, work: Path) -> dict:
    """One configuration: its samples (seconds since the first pull, version, params) evaluated, and its totals."""
    label, sync, workers = CONFIGS[key]
    spec = bench_spec(sync, STEPS * args.floor_s)
    store = StateStore(work / f"state-{key}", 2, durable=False)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    service = running.coordinator
    target = f"127.0.0.1:{running.port}"
    procs = [spawn(target, "fast", 1.0, args.floor_s, work / f"{key}-fast.log")]
    if workers == 2:
        procs.append(spawn(target, "slow", args.slow_factor, args.floor_s, work / f"{key}-slow.log"))
    client = CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=30.0))
    samples = []
    try:
        deadline = time.monotonic() + 120
        while client.status().total_tokens == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        started = min((r.opened_at for r in client.status().rounds), default=time.time())
        while time.time() - started < args.seconds:
            samples.append(sample(service, started))
            time.sleep(args.sample_s)
        samples.append(sample(service, started))
        status = client.status()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        client.close()
        running.stop(grace=1.0)
    losses = [(t, v, evaluate(spec, params)) for t, v, params in samples]
    return {"label": label, "losses": losses, "status": status}


def sample(service: SwarmCoordinator, started: float) -> tuple[float, int, dict[str, torch.Tensor]]:
    """(seconds since `started`, version, a copy of θ): the coordinator reuses a version's buffers two
    closes later, so θ is copied now (one version's dict is replaced whole, never written in place)."""
    params = service.params
    return time.time() - started, service.version, {name: theta.clone() for name, theta in params.items()}


def loss_at(losses: list[tuple[float, int, float]], seconds: float) -> float:
    """The held-out loss of the newest sample at or before `seconds`."""
    return [loss for t, _, loss in losses if t <= seconds + 1e-9][-1]


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results.values():
        times = [t for t, _, _ in result["losses"]]
        ax.plot(times, [loss for _, _, loss in result["losses"]], label=result["label"])
    ax.set_xlabel("wall time since the first pull (s)")
    ax.set_ylabel("held-out loss (nats/byte)")
    ax.set_title("1 fast + 1 slow (3× slower) worker, tiny LSTM")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150.0, help="wall time per configuration")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--floor-s", type=float, default=0.05, help="the fast worker's seconds per step at least")
    parser.add_argument("--slow-factor", type=float, default=3.0, help="how many times slower the slow worker is")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between parameter samples")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "hetero_loss.png")
    args = parser.parse_args(argv)
    # SIGTERM as Ctrl-C: through run_config's finally, which stops the worker processes (else they outlive it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.configs:
            results[key] = run_config(key, args, Path(tmp))
            status = results[key]["status"]
            print(f"{key}: version {status.version}, tokens trained {status.total_tokens}, applied {status.applied_tokens}",
                  flush=True)
    marks = [args.seconds * f for f in (0.25, 0.5, 0.75, 1.0)]
    print("| configuration | " + " | ".join(f"loss at {m:.0f} s" for m in marks) + " | versions | tokens trained | tokens applied |")
    print("|---|" + "---|" * (len(marks) + 3))
    for result in results.values():
        status: pb.GetStatusResponse = result["status"]
        cells = " | ".join(f"{loss_at(result['losses'], m):.3f}" for m in marks)
        print(f"| {result['label']} | {cells} | {status.version} | {status.total_tokens:,} | {status.applied_tokens:,} |")
    plot(results, args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
