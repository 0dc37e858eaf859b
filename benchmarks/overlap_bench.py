"""Overlapped rounds against blocking ones through a slow link (issue #29): utilization, wall time, held-out loss.

    python benchmarks/overlap_bench.py [--workers 2] [--rounds 12] [--steps 20] [--links 100,1000] [--rtt-ms 50]
                                       [--codecs int8,sparse] [--model lm|frame] [--preset tiny] [--on-extra 0.5]
                                       [--out R.json]

For each (link, codec, overlap off/on): a coordinator in this process (`RunningCoordinator`, a fresh state dir), a
`LinkProxy` (benchmarks/link_proxy.py) in front of it giving every connection its own `--links` Mbit/s link with
`--rtt-ms` RTT (± 10 % jitter), and `--workers` `rcswarm worker` processes (one torch thread each) connecting through
the proxy. Every configuration trains the same `--rounds` rounds of `--steps` inner steps per worker from the same
seed (θ_0, data seeds), so equal tokens; `[sync] min_reports` = the workers, so every round waits for all. The
table gives per configuration: the wall time from the first round's opening to the last round's close, the
workers' mean compute utilization (inner-step seconds over wall seconds from their first pull to their last row,
`WorkerUsage.utilization`), their sync share (seconds the training thread waited on the wire over sync + compute),
and the held-out loss of θ after `--rounds` rounds (cli/run.py `evaluate`); then the ratios on/off at equal tokens,
and the wall time to the same loss: the bench copies the coordinator's θ at every version, so each run has a curve
(seconds from the first round's opening to the close that made θ_k, held-out loss of θ_k); the overlap-on run
trains `--on-extra` × `--rounds` rounds more, and the time at which its curve first reaches the off run's loss
after `--rounds` rounds is divided by the off run's time to it. The machine and its load
average are printed first: on a shared machine the worker processes compete for cores with other work.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rcswarm.cli.run import evaluate
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
from rcswarm.observe.report import summarize
from rcswarm.state.store import StateStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link_proxy import Link, LinkProxy  # noqa: E402  (benchmarks/ is no package: the proxy is its sibling)

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "overlap-bench-token-0123456789"
RUN_TIMEOUT_S = 600.0
POLL_S = 0.01


MODELS = {
    # The byte LSTM of the LM sweep on the stdlib text, windows of 64 × 8 bytes.
    "lm": lambda args: {"model": {"name": "lstm_lm", "preset": args.preset},
                        "data": {"seq_len": 64, "batch_size": 8, "max_bytes": 2_000_000},
                        "inner": {"steps": args.steps, "lr": 3e-3}},
    # The frame-based action model on the typing task (examples/frame_sweep.toml's data), 16 frames × 8.
    "frame": lambda args: {"model": {"name": "frame", "preset": args.preset},
                           "data": {"source": "typing", "seq_len": 16, "batch_size": 8,
                                    "task_config": {"n_documents": 16}},
                           "inner": {"steps": args.steps, "lr": 3e-3, "weight_decay": 0.0, "bptt_chunk": 4}},
}


def bench_spec(args: argparse.Namespace, codec: str, overlap: bool) -> RunSpec:
    """The benchmark's run: `--model` (`MODELS`) at `--preset`, `--rounds` rounds of `--steps` steps (with
    overlap on, `--on-extra` more, so that the time it takes to reach the off run's final loss can be read)."""
    rounds = args.rounds + (round(args.on_extra * args.rounds) if overlap else 0)
    return RunSpec.from_dict({
        "run": {"name": "overlap", "rounds": rounds, "workers": args.workers, "seed": args.seed},
        **MODELS[args.model](args),
        "sync": {"codec": codec, "min_reports": args.workers, "overlap": overlap, "round_deadline_s": 120.0},
        "coordinator": {"lease_s": 30.0, "max_wait_s": 2.0, "durable": False},
    })


def run_config(args: argparse.Namespace, link: Link, codec: str, overlap: bool, work: Path) -> dict:
    """One configuration run to its last round; its measurements."""
    key = f"{link.bandwidth_bps / 1e6:g}M-{codec}-{'on' if overlap else 'off'}"
    spec = bench_spec(args, codec, overlap)
    state_dir = work / f"state-{key}"
    running = RunningCoordinator(SwarmCoordinator(spec, StateStore(state_dir, 2, durable=False)), TOKEN).start()
    proxy = LinkProxy(running.port, link=link, seed=args.seed)
    proxy.start()
    env = {**os.environ, "RCSWARM_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", f"127.0.0.1:{proxy.port}", "--name", f"w{i}",
         "--threads", "1"], cwd=ROOT, env=env, stdout=open(work / f"{key}-w{i}.log", "wb"), stderr=subprocess.STDOUT,
    ) for i in range(args.workers)]
    versions: dict[int, dict] = {}
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not snapshot_versions(running.coordinator, versions, spec.run.rounds):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{key}: the run did not finish within {RUN_TIMEOUT_S:g} s")
            time.sleep(POLL_S)
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        proc_params = {name: theta.clone() for name, theta in running.coordinator.params.items()}
        running.stop(grace=1.0)
        proxy.close()
    store = StateStore.open_read_only(state_dir)
    try:
        summary = summarize(store)
        rounds = store.rounds()  # every closed round (GetStatus lists the latest 20 only)
    finally:
        store.close()
    start = min(r.opened_at for r in rounds)
    # θ_k is what round k − 1 closed to: (seconds from the first round's opening, held-out loss) per version.
    closed = {r.version + 1: r.closed_at - start for r in rounds}
    curve = [(closed[v], evaluate(spec, versions[v])) for v in sorted(versions) if v in closed]
    equal = min(args.rounds, len(rounds))
    return {"key": key, "link_mbit": link.bandwidth_bps / 1e6, "rtt_ms": link.rtt_s * 1e3, "codec": codec,
            "overlap": overlap, "rounds": len(rounds), "wall_s": closed[equal], "utilization": summary.utilization,
            "sync_share": summary.sync_share, "tokens": summary.tokens,
            "held_out": evaluate(spec, versions.get(equal, proc_params)), "curve": curve,
            "bytes_up_per_worker_round": summary.bytes_up_per_worker_round}


def snapshot_versions(coordinator: SwarmCoordinator, versions: dict[int, dict], last: int) -> bool:
    """Copy the coordinator's θ when its version is new (under its lock: a close replaces θ under it); True once
    the last version is held. The bench polls every `POLL_S`, far below a round of `--steps` steps."""
    with coordinator._lock:
        version = coordinator.version
        if version not in versions:
            versions[version] = {name: theta.clone() for name, theta in coordinator.params.items()}
    return version >= last


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Seconds until the held-out loss first reached `target`, linear between the two versions around it (None if it
    never did)."""
    before = None
    for seconds, loss in curve:
        if loss <= target:
            if before is None:
                return seconds
            return before[0] + (seconds - before[0]) * (before[1] - target) / (before[1] - loss)
        before = (seconds, loss)
    return None


def table(results: list[dict]) -> str:
    lines = ["| link | codec | overlap | wall (s) | utilization | sync share | held-out loss | tokens |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r['link_mbit']:g} Mbit/s, {r['rtt_ms']:g} ms | {r['codec']} | {'on' if r['overlap'] else 'off'} "
                     f"| {r['wall_s']:.1f} | {r['utilization']:.1%} | {r['sync_share']:.1%} | {r['held_out']:.4f} "
                     f"| {r['tokens']} |")
    by_key = {(r["link_mbit"], r["codec"], r["overlap"]): r for r in results}
    lines += ["", "| link | codec | wall on/off at equal tokens | held-out on − off (%) | time to off's final loss, on/off |",
              "| --- | --- | ---: | ---: | ---: |"]
    for (mbit, codec, overlap), on in by_key.items():
        off = by_key.get((mbit, codec, False))
        if overlap and off is not None:
            reached, own = time_to(on["curve"], off["held_out"]), time_to(off["curve"], off["held_out"])
            to_loss = f"{reached / own:.2f}" if reached is not None else f"not within {on['rounds']} rounds"
            lines.append(f"| {mbit:g} Mbit/s | {codec} | {on['wall_s'] / off['wall_s']:.2f} "
                         f"| {100 * (on['held_out'] - off['held_out']) / off['held_out']:+.2f} | {to_loss} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="overlap_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", choices=sorted(MODELS), default="lm")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--links", default="100,1000", help="Mbit/s per connection, comma-separated")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--codecs", default="int8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--on-extra", type=float, default=0.5,
                        help="overlap-on runs train this fraction more rounds (the time to the off run's loss)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    # SIGTERM as Ctrl-C: through run_config's finally, which stops the worker processes (else they outlive it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.workers < 1 or args.rounds < 1 or args.steps < 1 or args.rtt_ms < 0 or args.on_extra < 0:
        parser.error("--workers, --rounds and --steps must be >= 1, --rtt-ms and --on-extra >= 0")
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.workers} workers × 1 torch thread, "
          f"{args.model} {args.preset}, {args.rounds} rounds × {args.steps} steps", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="overlap-bench-") as tmp:
        for mbit in (float(x) for x in args.links.split(",")):
            rtt = args.rtt_ms / 1e3
            link = Link(bandwidth_bps=mbit * 1e6, rtt_s=rtt, jitter_s=0.1 * rtt / 2)
            for codec in args.codecs.split(","):
                for overlap in (False, True):
                    result = run_config(args, link, codec, overlap, Path(tmp))
                    print(json.dumps(result), flush=True)
                    results.append(result)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table(results))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
