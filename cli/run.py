"""`rcswarm run [RUN.toml]`: a whole swarm on this machine from one command.

Starts a coordinator and N worker processes on loopback (each in its own session, so a
Ctrl-C reaches only this launcher, which then stops the workers and the coordinator in
order), shows live progress from GetStatus, and ends with a summary. The run directory
keeps run.toml, the coordinator's state (SQLite metrics, checkpoints), logs of every
process, final.safetensors (the final global parameters) and summary.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from safetensors.torch import load_file, save_file

from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.fits import fit_power_law
from rcswarm.coordinator.report import summarize
from rcswarm.coordinator.store import StateStore, split_checkpoint
from rcswarm.coordinator.sweep import run_state_dirs
from rcswarm.models import registry
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from rcswarm.worker.inner import make_sampler, masked_cross_entropy

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.5
EVAL_BATCHES = 8


class Swarm:
    """The coordinator and worker processes of one local run."""

    def __init__(self, spec: RunSpec, run_dir: Path, workers: int) -> None:
        self.spec, self.run_dir, self.n_workers = spec, run_dir, workers
        self.token = secrets.token_urlsafe(24)
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1"}
        self.coordinator: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._log_files: list[IO[bytes]] = []

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        log_file = open(self.logs / log_name, "wb")
        self._log_files.append(log_file)
        return subprocess.Popen(
            [sys.executable, *args], env=self.env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start_coordinator(self) -> int:
        port_file = self.run_dir / "coordinator.json"
        self.coordinator = self._spawn(
            ["-m", "rcswarm.coordinator", "--config", str(self.run_dir / "run.toml"), "--state-dir",
             str(self.run_dir / "state"), "--port", "0", "--port-file", str(port_file)],
            "coordinator.log",
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if port_file.exists():
                return int(json.loads(port_file.read_text())["port"])
            if self.coordinator.poll() is not None:
                break
            time.sleep(0.1)
        tail = (self.logs / "coordinator.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the coordinator did not start within {START_TIMEOUT_S:.0f}s:\n{tail}")

    def start_workers(self, port: int) -> None:
        threads = max(1, (os.cpu_count() or 1) // self.n_workers)
        for rank in range(self.n_workers):
            self.workers.append(self._spawn(
                ["-m", "rcswarm.worker", "--coordinator", f"127.0.0.1:{port}", "--name", f"worker-{rank}",
                 "--threads", str(threads)],
                f"worker-{rank}.log",
            ))

    def write_process_table(self) -> None:
        """processes.json: the pids of this run's processes, for operators and tests."""
        table = {"coordinator": self.coordinator.pid if self.coordinator else None, "workers": [p.pid for p in self.workers]}
        (self.run_dir / "processes.json").write_text(json.dumps(table))

    def workers_running(self) -> int:
        return sum(1 for p in self.workers if p.poll() is None)

    def stop(self) -> None:
        """SIGTERM the workers (they Leave), then the coordinator; SIGKILL what outlives the timeout."""
        for group in (self.workers, [self.coordinator] if self.coordinator else []):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        for log_file in self._log_files:
            log_file.close()


def _progress_line(status: pb.GetStatusResponse) -> str:
    active = sum(1 for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE)
    return f"loss {status.latest_loss:.3f}  {status.tokens_per_second:,.0f} tok/s  workers {active}"


def watch(
    swarm: Swarm, client: CoordinatorClient, rounds: int, console: Console, stop: threading.Event,
    deadline: float = math.inf,
) -> bool:
    """Show progress until the run finishes, every worker exits, a stop is requested, or the deadline.

    Returns True when the wall-time deadline (time.monotonic()) ended the watch.
    """
    columns = [TextColumn("round"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=rounds or None, info="starting")
        last_version = -1
        while not stop.wait(POLL_S):
            if time.monotonic() >= deadline:
                return True
            try:
                status = client.status()
            except grpc.RpcError:
                continue
            progress.update(task, completed=status.version, info=_progress_line(status))
            if not console.is_terminal and status.version != last_version:
                console.print(f"round {status.version}/{rounds or '∞'}  {_progress_line(status)}")
            last_version = status.version
            if swarm.workers_running() == 0:
                return False
    return False


def evaluate(spec: RunSpec, params: dict[str, torch.Tensor] | None) -> float:
    """Mean cross-entropy on the held-out split (the same batches for any params)."""
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides, seed=spec.run.seed)
    if params is not None:
        model.load_state_dict(params, strict=False)
    sampler = make_sampler(spec.data, seed=12345, split="val", model_config=model.config)
    losses = []
    with torch.no_grad():
        for _ in range(EVAL_BATCHES):
            inputs, targets = sampler.next_batch()  # [B, T], [B, T]
            losses.append(masked_cross_entropy(model(inputs), targets).item())  # logits [B, T, V]
    return sum(losses) / len(losses)


@dataclass(frozen=True)
class LocalRun:
    """One run of a launch: its spec, its coordinator state dir, and the file its final parameters go to."""

    spec: RunSpec
    state_dir: Path
    final: Path


def local_runs(run_dir: Path, spec: RunSpec) -> list[LocalRun]:
    """The runs of a launch: the coordinator's state dirs below state/ (`sweep.run_state_dirs`) and the
    final parameters, final.safetensors for a single run, final-L<L>.safetensors for each run of a sweep."""
    return [LocalRun(run, state_dir, run_dir / (f"final-L{run.data.seq_len}.safetensors" if spec.is_sweep
                                                 else "final.safetensors"))
            for run, state_dir in run_state_dirs(spec, run_dir / "state")]


def export_final(state_dir: Path, out: Path) -> dict[str, torch.Tensor] | None:
    """Write the run's newest checkpoint's parameters to `out`; None when it has none."""
    store = StateStore.open_read_only(state_dir)
    try:
        path = store.checkpoint_path()
    finally:
        store.close()
    if path is None:
        return None
    params, _ = split_checkpoint(load_file(str(path)))
    save_file(params, str(out), metadata={"source": path.name})
    return params


def summarize_run(local: LocalRun) -> dict:
    """One run's totals from its store, its final parameters exported, its held-out loss before and after."""
    store = StateStore.open_read_only(local.state_dir)
    try:
        summary = summarize(store)
    finally:
        store.close()
    final = export_final(local.state_dir, local.final)
    return {"seq_len": local.spec.data.seq_len, "batch_size": local.spec.data.batch_size, **dataclasses.asdict(summary),
            "val_loss_initial": evaluate(local.spec, None), "val_loss_final": evaluate(local.spec, final)}


SUMMARY_ROWS = (
    ("rounds", lambda r: f"{r['rounds']}"),
    ("workers", lambda r: f"{r['workers']}"),
    ("train loss, first → last round", lambda r: f"{r['first_round_loss']:.3f} → {r['last_round_loss']:.3f}"),
    ("held-out loss, initial → final", lambda r: f"{r['val_loss_initial']:.3f} → {r['val_loss_final']:.3f}"),
    ("tokens", lambda r: f"{r['tokens']:,}"),
    ("tokens/s", lambda r: f"{r['tokens_per_second']:,.0f}"),
    ("bytes sent per round (all workers)", lambda r: f"{r['bytes_sent_per_round']:,.0f}"),
    ("bytes received per round", lambda r: f"{r['bytes_received_per_round']:,.0f}"),
    ("share of wall time synchronizing", lambda r: f"{r['sync_share']:.1%}"),
    ("wall time", lambda r: f"{r['wall_seconds']:.1f}s"),
)


def print_summary(console: Console, run_dir: Path, spec: RunSpec) -> list[dict]:
    """One column per run (a single run is a sweep of one), loss ≈ A·L^(−α) over 3+ runs' held-out
    losses, and summary.json: a single run's row itself, a sweep's `runs` and `fit`."""
    rows = [summarize_run(local) for local in local_runs(run_dir, spec)]
    table = Table(title=f"rcswarm run {spec.run.name}: {run_dir}")
    table.add_column("", no_wrap=True)
    for row in rows:
        table.add_column(f"L={row['seq_len']} × {row['batch_size']}", justify="right")
    for name, cell in SUMMARY_ROWS:
        table.add_row(name, *(cell(row) for row in rows))
    console.print(table)
    sweep: dict = {"runs": rows}
    if len(rows) >= 3:
        fit = fit_power_law([r["seq_len"] for r in rows], [r["val_loss_final"] for r in rows])
        sweep["fit"] = dataclasses.asdict(fit)
        console.print(f"held-out loss ≈ {fit.amplitude:.3f} · L^-{fit.alpha:.4f} (R² {fit.r_squared:.3f}; "
                      f"α 90% interval [{fit.alpha_low:.3f}, {fit.alpha_high:.3f}])")
    document = sweep if spec.is_sweep else rows[0]
    (run_dir / "summary.json").write_text(json.dumps(document, indent=2, default=lambda v: None if math.isnan(v) else v))
    return rows


def parser() -> argparse.ArgumentParser:
    parser = new_parser("rcswarm run", "Train with a local swarm: a coordinator and N workers.")
    parser.add_argument("config", nargs="?", type=Path, help="RUN.toml (default: the built-in demo run)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: run.workers)")
    parser.add_argument("--rounds", type=int, default=None, help="outer rounds (default: run.rounds)")
    parser.add_argument("--run-dir", type=Path, default=None, help="where the run's files go (default: runs/<name>-<time>)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-time budget: stop every process after this many minutes, however many rounds ran "
                             "(a sweep's runs then share the same training time, the comparison of loss vs wall time)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace | int:
    """The arguments, or the exit status after --help (0) or a usage error (2)."""
    parser_ = parser()
    args = parse_or_status(parser_, argv)
    if isinstance(args, int):
        return args
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        parser_.error(f"--minutes must be a positive number of minutes, got {args.minutes}")
    return args


def load_spec(args: argparse.Namespace) -> RunSpec:
    spec = RunSpec.from_toml(args.config) if args.config else RunSpec()
    run = spec.run
    if args.workers is not None:
        run = dataclasses.replace(run, workers=args.workers)
    if args.rounds is not None:
        run = dataclasses.replace(run, rounds=args.rounds)
    runs = len(spec.sweep.seq_lens) or 1
    sync = dataclasses.replace(spec.sync, min_reports=max(spec.sync.min_reports, run.workers // runs))
    if run.rounds == 0:
        raise ValueError("run.rounds = 0 (until stopped) is for `rcswarm coordinator`; `rcswarm run` needs a number of rounds")
    return dataclasses.replace(spec, run=run, sync=sync)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    console = Console()
    try:
        spec = load_spec(args)
    except ValueError as exc:
        return usage_error("rcswarm run", str(exc))
    run_dir = args.run_dir or Path("runs") / f"{spec.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.toml").write_text(spec.to_toml())
    swarm = Swarm(spec, run_dir, spec.run.workers)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupted = out_of_time = False
    try:
        port = swarm.start_coordinator()
        console.print(f"coordinator on 127.0.0.1:{port}; starting {spec.run.workers} workers; logs in {swarm.logs}")
        swarm.start_workers(port)
        swarm.write_process_table()
        client = CoordinatorClient(f"127.0.0.1:{port}", swarm.token, retry=RetryPolicy(max_elapsed_s=10.0))
        deadline = time.monotonic() + args.minutes * 60.0 if args.minutes else math.inf
        try:
            out_of_time = watch(swarm, client, spec.run.rounds, console, stop, deadline)
        finally:
            client.close()
        interrupted = stop.is_set()
    finally:
        swarm.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    rounds = min(r["rounds"] for r in print_summary(console, run_dir, spec))
    failed = [p.returncode for p in swarm.workers if p.returncode not in (0, -signal.SIGTERM)]
    if interrupted:
        console.print("stopped by a signal; every process was shut down")
        return 130
    if out_of_time and not failed:
        console.print(f"stopped at the {args.minutes:g}-minute budget after {rounds} rounds")
        return 0
    if failed or rounds < spec.run.rounds:
        console.print(f"the run did not complete: worker exit codes {[p.returncode for p in swarm.workers]}; see {swarm.logs}")
        return 1
    return 0
