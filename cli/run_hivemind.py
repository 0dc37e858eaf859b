"""`rcswarm run` for `[sync] backend = "hivemind"`: a local hivemind swarm, with a coordinator only where needed.

Starts `rcswarm dht` on loopback (the bootstrap peer, mirroring the metric records into
RUN_DIR/state, so `rcswarm fit RUN_DIR/state` works) and N `rcswarm worker --backend hivemind`
processes that dial it, all listening and announcing on 127.0.0.1 only. A run whose curriculum
the coordinator decides (`curriculum.worker_seq_lens`, `curriculum.policy = "adaptive"`;
`needs_coordinator`) also gets a coordinator on loopback as its control plane (the workers join
it with `--coordinator`; it keeps RUN_DIR/state and serves the dashboard; the bootstrap peer then
mirrors nothing), still off the data path. It waits until every worker has trained run.rounds
versions (or the budget or a signal ends the run), then stops the workers, then the coordinator
and the bootstrap peer. Each worker writes RUN_DIR/peers/<name>/ (final.safetensors, summary.json
with its per-round history: loss, group size, skipped step, measured drift); the run directory
gets final.safetensors (worker-0's replica), summary.json (per peer: version, first and last
round loss; the largest difference between replicas; held-out loss before and after) and the logs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from safetensors.torch import load_file

from rcswarm.cli.run import (
    POLL_S,
    START_TIMEOUT_S,
    Outcome,
    SummarySignals,
    Swarm,
    held_out_losses,
    held_out_text,
    interrupted_outcome,
    skippable_evaluation,
    summary_status,
    write_summary,
)
from rcswarm.cli.signals import StopSignal
from rcswarm.config.runspec import RunSpec
from rcswarm.worker.data_root import data_root_args

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
PRINT_S = 10.0


def needs_coordinator(spec: RunSpec) -> str:
    """Why the run needs a coordinator (its curriculum is decided there), or "" when the swarm trains alone."""
    curriculum = spec.curriculum
    if curriculum.worker_seq_lens:
        return f"curriculum.worker_seq_lens = {curriculum.worker_seq_lens} is assigned per worker"
    if curriculum.adaptive:
        return f"the adaptive curriculum over {curriculum.seq_lens} climbs as the workers report rounds"
    return ""


class HivemindSwarm(Swarm):
    """The bootstrap peer, the coordinator where the curriculum needs one, and the workers; `stop` ends the
    workers first (they Leave), then the coordinator and the bootstrap peer."""

    bootstrap: subprocess.Popen | None = None

    def services(self) -> list[subprocess.Popen]:
        return [p for p in (self.coordinator, self.bootstrap) if p is not None]

    @property
    def maddrs_file(self) -> Path:
        """Where the bootstrap peer writes its multiaddrs, one per line."""
        return self.run_dir / "maddrs.txt"

    def start_bootstrap(self, mirror: bool) -> list[str]:
        """Start `rcswarm dht` (mirroring the metrics into RUN_DIR/state with `mirror`); its multiaddrs."""
        maddrs = self.maddrs_file
        state = ["--config", str(self.run_dir / "run.toml"), "--state-dir", str(self.run_dir / "state")] if mirror else []
        self.bootstrap = self._spawn(
            ["-m", "rcswarm.cli", "dht", "--host-maddrs", LOOPBACK, "--maddrs-file", str(maddrs), *state], "dht.log",
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if maddrs.is_file() and maddrs.read_text().split():
                return maddrs.read_text().split()
            if self.bootstrap.poll() is not None:
                break
            time.sleep(0.1)
        tail = (self.logs / "dht.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the bootstrap peer did not start within {START_TIMEOUT_S:.0f}s:\n{tail}")

    def start_peers(self, maddrs: list[str], coordinator: str = "") -> None:
        """The workers, dialing `maddrs`; joining `coordinator` (HOST:PORT) for the control plane when given."""
        threads = max(1, (os.cpu_count() or 1) // self.n_workers)
        control = ["--coordinator", coordinator] if coordinator else []
        for rank in range(self.n_workers):
            self.workers.append(self._spawn(
                ["-m", "rcswarm.cli", "worker", "--backend", "hivemind", "--config", str(self.run_dir / "run.toml"),
                 *control, "--initial-peers", *maddrs, "--host-maddrs", LOOPBACK, "--name", f"worker-{rank}",
                 "--threads", str(threads), "--out", str(self.run_dir / "peers" / f"worker-{rank}"),
                 *data_root_args(self.spec), *self.limit_args],
                f"worker-{rank}.log",
            ))


def wait(swarm: HivemindSwarm, console: Console, stop: threading.Event, deadline: float) -> bool:
    """Until every worker exited, a stop, or the deadline; True when the deadline ended it."""
    printed = time.monotonic()
    while not stop.wait(POLL_S):
        now = time.monotonic()
        if now >= deadline:
            return True
        running = swarm.workers_running()
        if running == 0:
            return False
        if now - printed >= PRINT_S:
            console.print(f"{running} of {swarm.n_workers} workers training")
            printed = now
    return False


def summarize(spec: RunSpec, run_dir: Path, workers: int, evaluated: bool = True) -> dict:
    """Per peer its version and round losses; the replicas' largest difference; held-out loss before and after
    (`held_out_losses`: None with the reason when not `evaluated` or the evaluation cannot read the data)."""
    peers, finals = {}, {}
    for rank in range(workers):
        out = run_dir / "peers" / f"worker-{rank}"
        if not (out / "summary.json").is_file():
            continue
        summary = json.loads((out / "summary.json").read_text())
        history = summary["history"]
        peers[summary["name"]] = {
            "version": summary["version"], "first_round_loss": history[0]["loss"] if history else None,
            "last_round_loss": history[-1]["loss"] if history else None,
            "skipped_rounds": sum(1 for h in history if h["skipped"]),
            "max_drift": max((h["drift"] for h in history), default=0.0),
        }
        finals[summary["name"]] = load_file(str(out / "final.safetensors"))
    result: dict = {"peers": peers, "rounds": min((p["version"] for p in peers.values()), default=0)}
    if finals:
        first = next(iter(finals.values()))
        result["replica_max_abs_difference"] = max(
            (float((params[k] - first[k]).abs().max()) for params in finals.values() for k in first), default=0.0)
        if "worker-0" in finals:
            result["export_problem"] = export_replica(run_dir)
        result.update(held_out_losses(spec, {k: v.to(torch.float32) for k, v in first.items()}, evaluated))
    return result


def export_replica(run_dir: Path) -> str:
    """Copy worker-0's replica to RUN_DIR/final.safetensors (a temporary renamed over it); "" when done, else (a full
    disk) "final parameters not exported: why", which one line on stderr says too: the summary is written either
    way, as the coordinator's launch does (`cli/run.export_or_say`)."""
    final = run_dir / "final.safetensors"
    partial = final.with_name(f".{final.name}.partial")
    try:
        shutil.copyfile(run_dir / "peers" / "worker-0" / "final.safetensors", partial)
        os.replace(partial, final)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        problem = f"final parameters not exported: {exc}"
        print(f"rcswarm run: {problem}", file=sys.stderr)
        return problem
    return ""


def print_bootstrap(console: Console, maddrs: list[str], written: Path) -> None:
    """The bootstrap peer's multiaddrs on one line that is never wrapped (a copied address must be whole), and
    the file that holds them."""
    console.print(f"bootstrap peer (in {written}): --initial-peers {' '.join(maddrs)}", soft_wrap=True)


def launch(spec: RunSpec, run_dir: Path, minutes: float | None, console: Console, stop: StopSignal,
           max_params: int = 0) -> int:
    """Run the swarm and print its summary; the exit status (0 completed or at the budget, 1 failed, 128 + the
    signal's number when one stopped it)."""
    swarm = HivemindSwarm(spec, run_dir, spec.run.workers, max_params)
    out_of_time = False
    why = needs_coordinator(spec)
    try:
        maddrs = swarm.start_bootstrap(mirror=not why)
        target = ""
        if why:
            port, http_port = swarm.start_coordinator()
            target = f"127.0.0.1:{port}"
            console.print(f"rcswarm run {spec.run.name}: a hivemind swarm of {spec.run.workers} workers and a coordinator "
                          f"on {target} as its control plane ({why}); run directory {run_dir}")
            console.print(f"dashboard http://127.0.0.1:{http_port}/; logs in {swarm.logs}")
        else:
            console.print(f"rcswarm run {spec.run.name}: a hivemind swarm of {spec.run.workers} workers, no coordinator; "
                          f"run directory {run_dir}")
            console.print(f"metrics mirrored into {run_dir / 'state'}; logs in {swarm.logs}")
        print_bootstrap(console, maddrs, swarm.maddrs_file)
        swarm.start_peers(maddrs, target)
        swarm.write_process_table()
        deadline = time.monotonic() + minutes * 60.0 if minutes else math.inf
        out_of_time = wait(swarm, console, stop, deadline)
    finally:
        swarm.stop()
    with SummarySignals() as signals:  # a signal now ends the launcher only once summary.json is written
        ended = summarize_and_write(spec, run_dir, swarm, console, stop, out_of_time, minutes)
    return summary_status(ended, signals)


def summarize_and_write(spec: RunSpec, run_dir: Path, swarm: HivemindSwarm, console: Console, stop: StopSignal,
                        out_of_time: bool, minutes: float | None) -> Outcome:
    """The stopped swarm's summary (the held-out evaluation skippable), printed and written to summary.json; how the
    run ended."""
    result = skippable_evaluation(console, lambda evaluated: summarize(spec, run_dir, spec.run.workers, evaluated))
    codes = [p.returncode for p in swarm.workers]
    if stop.is_set():
        ended = interrupted_outcome(stop, f"{result['rounds']} of {spec.run.rounds} rounds")
    elif out_of_time:
        ended = Outcome("budget", f"stopped at the {minutes:g}-minute budget after {result['rounds']} rounds", 0)
    elif result["rounds"] < spec.run.rounds or any(code != 0 for code in codes):
        ended = Outcome("failed", f"the run did not complete: {result['rounds']} of {spec.run.rounds} rounds; "
                                  f"worker exit codes {codes}; see {swarm.logs}", 1)
    else:
        ended = Outcome("completed", f"completed {result['rounds']} rounds", 0)
    for name, peer in result["peers"].items():
        console.print(f"{escape(name)}: version {peer['version']}, round loss {peer['first_round_loss']:.3f} → "
                      f"{peer['last_round_loss']:.3f}, {peer['skipped_rounds']} skipped, max drift {peer['max_drift']:.3g}")
    if "val_loss_final" in result:
        console.print(f"held-out loss {held_out_text(result)}; replicas differ by at most "
                      f"{result['replica_max_abs_difference']:.3g}")
    write_summary(run_dir, {**result, "outcome": ended.kind, "outcome_message": ended.message})
    console.print(ended.message)
    return ended
