"""`rcswarm run [RUN.toml]`: a whole swarm on this machine from one command.

Starts a coordinator (with its dashboard on a free loopback port, whose URL is printed) and
N worker processes on loopback (each in its own session, so a Ctrl-C reaches only this
launcher, which then stops the workers and the coordinator in order), shows live progress
from GetStatus (one line per run of a sweep), and ends with a summary that says how the run
ended. Without a config it runs the built-in demo (`cli/demo.py`), a sweep over sequence
lengths under a wall-time budget. The run directory keeps run.toml, the coordinator's state
(SQLite metrics, checkpoints), logs of every process, final.safetensors (the final global
parameters; final-L<L>.safetensors per run of a sweep; where that file cannot be written, a full disk,
summary.json's `export_problem` and one stderr line say so) and summary.json; a sweep's also
fit.png, the plot of the fitted law that `rcswarm fit RUN_DIR` draws. With `[sync] backend =
"hivemind"` it starts a local hivemind swarm instead (cli/run_hivemind.py). A launch holds launcher.lock in its run
directory for its life (`lock_run_dir`): a second launch there is refused (exit 2) before it writes or deletes a file.
Once its processes are stopped, a Ctrl-C, SIGTERM or SIGHUP during the held-out evaluation skips it; one after it
skips a sweep's fit and plot and ends the launcher (128 + its number) once summary.json is written (`SummarySignals`).

Every number shown says what it is: the progress line's train loss is the mean of the
workers' last reported training losses ("—" until one exists), tokens/s counts training
tokens of all workers since the run began serving; the summary's train loss is the mean loss
of all steps of the first and of the last completed round, its held-out loss the evaluation of
the initial and of the final parameters on held-out batches, and notes under its table say so.
A fit the data do not identify is followed by "not enough data" and its caveats (`observe/analysis.py`).
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import grpc
import torch
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from rcswarm.cli.demo import DEMO_MINUTES, demo_spec
from rcswarm.cli.fit import plot as plot_fit
from rcswarm.cli.fit import report as report_fit
from rcswarm.cli.signals import StopSignal
from rcswarm.cli.usage import empty_path_problem, new_parser, output_dir_problem, parse_or_status, path_arg, usage_error
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import ParameterLimit, model_problem, run_state_dirs
from rcswarm.coordinator.curriculum import law_of
from rcswarm.coordinator.sweep import served_before
from rcswarm.observe import traffic
from rcswarm.observe.analysis import (
    NOT_ENOUGH_DATA,
    FitReport,
    LengthLaw,
    analyse,
    length_curves,
    length_law,
    read_state_dirs,
)
from rcswarm.observe.dashboard.views import finite
from rcswarm.observe.forecast import was_pruned
from rcswarm.observe.report import forecast_rows, held_out_rows, prune_rows, served_note, summarize
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.state.errors import StoreError
from rcswarm.state.lock import LAUNCHER_LOCK_NAME, StateDirBusy, StateDirLock, holder_text
from rcswarm.state.store import StateStore
from rcswarm.sync.files import save_tensors
from rcswarm.train.inner import data_problem
from rcswarm.train.round import HELD_OUT_SEED, RoundTrainer
from rcswarm.worker import CoordinatorClient, RetriesExhausted, RetryPolicy
from rcswarm.worker.data_root import data_root_args
from rcswarm.worker.limits import DEFAULT_MAX_STEP_TOKENS, ModelLimit

T = TypeVar("T")

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.5
EVAL_BATCHES = 8
EVAL_SEED = HELD_OUT_SEED


LAUNCH_MARK = "--- rcswarm run: launched"


def this_launch(log: Path) -> str:
    """What `log` holds since this launch's line (`Swarm._spawn`): a resumed run directory keeps the earlier launches'
    output above it, which an error quoting the log's end must not show as this launch's."""
    text = log.read_text(errors="replace")
    start = text.rfind(LAUNCH_MARK)
    return text[start:] if start >= 0 else text


class Swarm:
    """The coordinator and worker processes of one local run."""

    def __init__(self, spec: RunSpec, run_dir: Path, workers: int, max_params: int = 0) -> None:
        self.spec, self.run_dir, self.n_workers = spec, run_dir, workers
        # --max-params for the coordinator and every worker (none: each takes what its memory holds).
        self.limit_args = ["--max-params", str(max_params)] if max_params else []
        self.token = secrets.token_urlsafe(24)
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1"}
        self.coordinator: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._log_files: list[IO[bytes]] = []

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        """Start `python args...` in its own session, its output appended to logs/`log_name` (a launch in the same
        run directory, a resume, keeps the earlier launches' logs above a line naming this one)."""
        log_file = open(self.logs / log_name, "ab")
        log_file.write(f"{LAUNCH_MARK} {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
        log_file.flush()
        self._log_files.append(log_file)
        return subprocess.Popen(
            [sys.executable, *args], env=self.env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def launching_config(self) -> Path:
        """run.toml.launching: this launch's config until the process started with it serves (`stage_config`)."""
        return self.run_dir / "run.toml.launching"

    def stage_config(self) -> Path:
        """Write the spec as run.toml.launching, for the process a launch starts first to read; its path. It becomes
        run.toml once that process serves (`adopt_config`) and is removed when it does not (`start_failure`): a
        config the process refuses (its state dir holds a run of another spec) leaves the run directory's run.toml,
        the config that state dir was trained with, as it was."""
        self.launching_config.write_text(self.spec.to_toml())
        return self.launching_config

    def adopt_config(self) -> None:
        """The staged config (`stage_config`) becomes the run directory's run.toml: the process started with it serves."""
        os.replace(self.launching_config, self.run_dir / "run.toml")

    def start_failure(self, what: str, process: subprocess.Popen, log_name: str) -> RuntimeError:
        """The error for `what` (its `process`, logging to logs/`log_name`) that did not serve within START_TIMEOUT_S:
        its exit code where it exited, and its log since this launch's line (`this_launch`); the staged config
        (`stage_config`) is removed."""
        self.launching_config.unlink(missing_ok=True)
        log = self.logs / log_name
        tail = this_launch(log)[-2000:].rstrip()
        code = process.poll()
        if code is not None:
            return RuntimeError(f"{what} exited with code {code} at start; {log} ends:\n{tail}")
        return RuntimeError(f"{what} did not start within {START_TIMEOUT_S:.0f}s; {log} ends:\n{tail}")

    def start_coordinator(self) -> tuple[int, int]:
        """Start the coordinator with its dashboard on free loopback ports; (gRPC port, dashboard port).

        Its config is staged as run.toml.launching and becomes run.toml once the coordinator serves (`stage_config`)."""
        port_file = self.run_dir / "coordinator.json"
        port_file.unlink(missing_ok=True)  # a previous launch's, naming a port nothing serves now
        launching = self.stage_config()
        self.coordinator = self._spawn(
            ["-m", "rcswarm.cli", "coordinator", "--config", str(launching), "--state-dir",
             str(self.run_dir / "state"), "--port", "0", "--port-file", str(port_file), "--http-port", "0",
             *self.limit_args],
            "coordinator.log",
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ports = json.loads(port_file.read_text()) if port_file.exists() else {}
            if ports.get("pid") == self.coordinator.pid:
                self.adopt_config()
                return int(ports["port"]), int(ports["http_port"])
            if self.coordinator.poll() is not None:
                break
            time.sleep(0.1)
        raise self.start_failure("the coordinator", self.coordinator, "coordinator.log")

    def start_workers(self, port: int) -> None:
        threads = max(1, (os.cpu_count() or 1) // self.n_workers)
        for rank in range(self.n_workers):
            self.workers.append(self._spawn(
                ["-m", "rcswarm.cli", "worker", "--coordinator", f"127.0.0.1:{port}", "--name", f"worker-{rank}",
                 "--threads", str(threads), "--state-dir", str(self.run_dir / "workers" / f"worker-{rank}"),
                 *data_root_args(self.spec), *self.limit_args],
                f"worker-{rank}.log",
            ))

    def write_process_table(self) -> None:
        """processes.json: the pids of this run's processes, for operators and tests."""
        table = {"coordinator": self.coordinator.pid if self.coordinator else None, "workers": [p.pid for p in self.workers]}
        (self.run_dir / "processes.json").write_text(json.dumps(table))

    def workers_running(self) -> int:
        return sum(1 for p in self.workers if p.poll() is None)

    def worker_failures(self, reported: set[int]) -> list[str]:
        """A line for each worker that exited with a non-zero status and is not in `reported` (its rank then added):
        its status and its log's last line, so that a launch whose workers die says so while it waits on."""
        lines = []
        for rank, process in enumerate(self.workers):
            code = process.poll()
            if code not in (None, 0) and rank not in reported:
                reported.add(rank)
                lines.append(failure_line(rank, code, self.logs / f"worker-{rank}.log"))
        return lines

    def coordinator_exited(self) -> bool:
        """Whether the coordinator's process ended (it serves until the launcher stops it)."""
        return self.coordinator is not None and self.coordinator.poll() is not None

    def services(self) -> list[subprocess.Popen]:
        """The processes `stop` ends after the workers: the coordinator."""
        return [self.coordinator] if self.coordinator else []

    def stop(self) -> None:
        """SIGTERM the workers (they Leave), then the services; SIGKILL what outlives the timeout, with the processes
        of its group (`kill_group`)."""
        for group in (self.workers, self.services()):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    proc.wait(timeout=5)
        for log_file in self._log_files:
            log_file.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` and, where it leads a process group of its own (`Swarm._spawn` starts each in its own session),
    that whole group: a hivemind worker's DHT and averager processes and their p2pd, forked into its group, would
    outlive a SIGKILL of its pid alone. A process in the caller's group, or in one it does not lead, is killed alone.
    A process already reaped is left alone, as `Popen.kill` does: its pid, and so its group's number, may be another's
    by now."""
    if proc.poll() is not None:
        return
    try:
        leads_own_group = os.getpgid(proc.pid) == proc.pid and proc.pid != os.getpgrp()
    except ProcessLookupError:  # it exited meanwhile; `proc.kill` then does nothing
        leads_own_group = False
    if not leads_own_group:
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


PROGRESS_LEGEND = (
    "progress: round = outer rounds closed; train loss = mean of the workers' last reported training loss "
    "(— until one arrives); tok/s = training tokens per second of all workers since the run began serving"
)
# Without a terminal, a run's progress line is printed when its round changes, at most this often.
PLAIN_PRINT_S = 10.0


def number(value: float | None, spec: str = ".3f") -> str:
    """A number for people: "—" where there is none yet (None, NaN, infinity)."""
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


@dataclass(frozen=True)
class RunProgress:
    """One run's line of progress, from GetStatus (a sweep's RunSummary, or the run's own status)."""

    label: str
    version: int
    loss: float
    tokens_per_second: float
    workers: int

    def info(self) -> str:
        return (f"train loss {number(self.loss)}  {self.tokens_per_second:,.0f} tok/s  "
                f"{self.workers} worker{'s' if self.workers != 1 else ''}")


def run_progress(status: pb.GetStatusResponse) -> list[RunProgress]:
    """A line per run: a sweep's runs by L, or the single run."""
    if status.runs:
        return [RunProgress(f"L={r.seq_len} × {r.batch_size}", r.version, r.latest_loss, r.tokens_per_second,
                            r.active_workers) for r in status.runs]
    active = sum(1 for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE)
    return [RunProgress("run", status.version, status.latest_loss, status.tokens_per_second, active)]


class ProgressView:
    """The live progress: under a wall-time budget a bar of the time, then one bar per run (of rounds, or
    open-ended under a budget); without a terminal, a plain line per run when its round changes, at most
    every PLAIN_PRINT_S seconds."""

    def __init__(self, progress: Progress, console: Console, rounds: int, budget: float) -> None:
        self.progress, self.console, self.budget = progress, console, budget
        self.total = None if math.isfinite(budget) else rounds or None
        self.clock = (progress.add_task("time", total=budget, count=f"of {budget:.0f} s", info="wall-time budget")
                      if math.isfinite(budget) else None)
        self.tasks: dict[str, TaskID] = {}
        self.printed: dict[str, tuple[int, float]] = {}

    @staticmethod
    def columns() -> list:
        return [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn()]

    def tick(self, remaining: float) -> None:
        if self.clock is not None:
            self.progress.update(self.clock, completed=self.budget - max(0.0, remaining))

    def show(self, status: pb.GetStatusResponse, now: float) -> None:
        for run in run_progress(status):
            if run.label not in self.tasks:
                self.tasks[run.label] = self.progress.add_task(run.label, total=self.total, count="", info="")
            count = f"round {run.version}" + (f"/{self.total}" if self.total else "")
            self.progress.update(self.tasks[run.label], completed=run.version, count=count, info=run.info())
            last_version, last_time = self.printed.get(run.label, (-1, -math.inf))
            if not self.console.is_terminal and run.version != last_version and now - last_time >= PLAIN_PRINT_S:
                self.console.print(f"{run.label}: {count}  {run.info()}")
                self.printed[run.label] = (run.version, now)


def failure_line(rank: int, code: int, log: Path) -> str:
    """worker-`rank` exited with `code`: the last line of its `log` (read from its last 4 KiB) and where the log is."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            tail = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        tail = []
    last = tail[-1][:300] if tail else "(its log is empty)"
    return f"worker-{rank} exited with status {code} while the run goes on: {last} (log: {log})"


def watch(
    swarm: Swarm, client: CoordinatorClient, rounds: int, console: Console, stop: threading.Event,
    deadline: float = math.inf,
) -> bool:
    """Show progress until the run finishes, every worker exits, the coordinator exits, a stop is requested, or the
    deadline; a worker that exits with an error is named at once (its log's last line). A coordinator that does not
    answer for a while (stalled, or busy closing a large round) is waited out, as the workers wait it out: the
    progress shows the last status meanwhile.

    Returns True when the wall-time deadline (time.monotonic()) ended the watch.
    """
    console.print(PROGRESS_LEGEND, style="dim")
    failed: set[int] = set()
    with Progress(*ProgressView.columns(), console=console, transient=False) as progress:
        view = ProgressView(progress, console, rounds, deadline - time.monotonic())
        while not stop.wait(POLL_S):
            for line in swarm.worker_failures(failed):
                console.print(line, style="yellow")
            now = time.monotonic()
            view.tick(deadline - now)
            if now >= deadline:
                return True
            try:
                view.show(client.status(), now)
            except (grpc.RpcError, RetriesExhausted):
                pass
            if swarm.workers_running() == 0 or swarm.coordinator_exited():
                return False
    return False


def evaluate(spec: RunSpec, params: dict[str, torch.Tensor] | None) -> float:
    """Mean cross-entropy on the held-out split (the same batches for any params), on the CPU."""
    trainer = RoundTrainer(torch.device("cpu"))
    model = trainer.build(spec, model_seed=spec.run.seed)
    if params is not None:
        model.load_state_dict(params, strict=False)
    return trainer.held_out_loss(EVAL_BATCHES, seed=EVAL_SEED)


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


def final_parameters(state_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
    """The parameters of the run's newest checkpoint that verifies against its ledger (the one a restart would
    serve, `StateStore.newest_verified`) and the metadata to export them with; None when the run committed none.
    Says on stderr when that is not the committed version."""
    store = StateStore.open_read_only(state_dir)
    try:
        if store.get("checkpoint") is None:
            return None
        entry, checkpoint, problems = store.newest_verified()
    finally:
        store.close()
    if problems:
        print(f"rcswarm run: state dir {state_dir}: exporting version {entry.version} from {entry.file}: "
              + "; ".join(problems), file=sys.stderr)
    return checkpoint.params, {"source": entry.file, "version": str(entry.version)}


def export_final(state_dir: Path, out: Path) -> dict[str, torch.Tensor] | None:
    """Write the run's `final_parameters` to `out`, atomically; them, or None when the run committed none. OSError
    naming `out` when it cannot be written (a full disk)."""
    final = final_parameters(state_dir)
    if final is None:
        return None
    save_tensors(final[0], out, final[1])
    return final[0]


def export_or_say(local: LocalRun) -> tuple[dict[str, torch.Tensor] | None, str]:
    """(the run's final parameters, exported to `local.final`, ""); or, when that file cannot be written (a full
    disk), (the same parameters, "final parameters not exported: why"), which one line on stderr says too; (None, "")
    when the run committed none."""
    final = final_parameters(local.state_dir)
    if final is None:
        return None, ""
    try:
        save_tensors(final[0], local.final, final[1])
    except OSError as exc:
        problem = f"final parameters not exported: {exc}"
        print(f"rcswarm run: {problem}", file=sys.stderr)
        return final[0], problem
    return final[0], ""


def held_out_losses(spec: RunSpec, final: dict[str, torch.Tensor] | None, evaluated: bool) -> dict:
    """The held-out loss of θ_0 and of `final` (θ_0's where the run committed no parameters), or None for both with
    the reason: not `evaluated` (the operator interrupted the summary), or data the evaluation cannot read (a
    held-out split shorter than the windows); the summary is written either way."""
    if not evaluated:
        return {"val_loss_initial": None, "val_loss_final": None, "val_loss_problem": "not evaluated: interrupted"}
    try:
        initial = evaluate(spec, None)
        return {"val_loss_initial": initial, "val_loss_final": initial if final is None else evaluate(spec, final),
                "val_loss_problem": ""}
    except ValueError as exc:
        return {"val_loss_initial": None, "val_loss_final": None, "val_loss_problem": str(exc)}


# The signals that stop a launch (`main`), and that its summary stretch takes over (`SummarySignals`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SummaryInterrupted(BaseException):
    """Raised by `SummarySignals.handle` inside `SummarySignals.skippable`: the work there is left undone. A
    BaseException, as KeyboardInterrupt is, so that no `except Exception` in the interrupted work keeps it."""


class SummarySignals:
    """Ctrl-C, SIGTERM and SIGHUP while a launch's summary is made (its processes stopped; the launch's stop handlers
    would only note them): none of them ends the launcher before summary.json is whole. Each is noted (`signum`: the
    first one's number); one that comes inside `skippable()` (the held-out evaluation, a sweep's fit and plot) ends
    that work at once with SummaryInterrupted, and one that comes outside it stays `pending` until `__exit__` gives
    it to the handlers from before (an enclosing SummarySignals, the launch's StopSignal, a test's).

    Entered, used and exited by the main thread alone, the thread Python runs signal handlers in: no lock. `_armed`
    is the one attribute the handler and the main thread both write, each write a single store."""

    def __init__(self) -> None:
        self.signum = 0
        self.pending = 0
        self._armed = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SummarySignals:
        """Route STOP_SIGNALS to `handle` (each signal has its earlier handler or this one, never the default action
        that would end the process), keeping the earlier handlers for `__exit__`."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Give the signals their earlier handlers back, then the `pending` signal to them."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self.pending:
            pending, self.pending = self.pending, 0
            signal.raise_signal(pending)

    def handle(self, signum: int, _frame: object) -> None:
        """The signal handler: note the signal; inside `skippable`, end that work (SummaryInterrupted)."""
        self.signum = self.signum or signum
        if self._armed:
            self._armed = False
            raise SummaryInterrupted(signum)
        self.pending = self.pending or signum

    @contextlib.contextmanager
    def skippable(self) -> Iterator[None]:
        """The work inside may be cut short by a signal (SummaryInterrupted); it is not begun (SummaryInterrupted at
        once) when one came already."""
        if self.signum:
            raise SummaryInterrupted(self.signum)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def name(self) -> str:
        """The noted signal's name ("SIGTERM"), "" when none came."""
        return signal.Signals(self.signum).name if self.signum else ""


def skippable_evaluation(console: Console, summarize_all: Callable[[bool], T]) -> T:
    """`summarize_all(True)`: the summary with its held-out evaluation, unless Ctrl-C, SIGTERM or SIGHUP comes while
    it runs (a process manager's stop, a closed terminal): then, announced, `summarize_all(False)`, without it, so
    that summary.json is written either way. Its own `SummarySignals` takes the signals meanwhile: a further one,
    while `summarize_all(False)` runs, waits for it to end and then goes to the handlers from before (`main`'s
    SummarySignals: the launcher then exits with it once summary.json is written)."""
    console.print("evaluating the held-out loss of θ_0 and of the final parameters (Ctrl-C skips it)")
    with SummarySignals() as signals:
        try:
            with signals.skippable():
                return summarize_all(True)
        except SummaryInterrupted:
            console.print("held-out evaluation interrupted: the summary is written without it", style="yellow")
        return summarize_all(False)


def summarize_run(local: LocalRun, evaluated: bool = True) -> dict:
    """One run's totals from its store, its final parameters exported (or, as `export_problem`, why they could not
    be: the summary is written either way), its held-out loss before and after (unless not `evaluated`)."""
    store = StateStore.open_read_only(local.state_dir)
    try:
        summary = summarize(store)
        forecasts, pruning, stopped = forecast_rows(store), prune_rows(store), store.get("stopped")
        val_losses, trained = held_out_rows(store), store.trained_shapes()
    finally:
        store.close()
    final, not_exported = export_or_say(local)
    fp32 = 4 * sum(t.numel() for t in final.values()) if final else 0
    return {"seq_len": local.spec.data.seq_len, "batch_size": local.spec.data.batch_size,
            "trained": [list(shape) for shape in trained], **dataclasses.asdict(summary),
            "fp32_bytes": fp32, "ratio_up": traffic.ratio(fp32, summary.bytes_up_per_worker_round),
            "ratio_down": traffic.ratio(fp32, summary.bytes_down_per_worker_round),
            **held_out_losses(local.spec, final, evaluated), "val_losses": val_losses, "forecasts": forecasts,
            "pruning": pruning, "stopped": stopped, "export_problem": not_exported}


def _train_loss(r: dict) -> str:
    """The mean training loss of the first and last closed rounds; no arrow where there is no trend to show."""
    if r["rounds"] == 0:
        return "— (no round completed)"
    if r["rounds"] == 1:
        return f"{number(r['last_round_loss'])} (one round)"
    return f"{number(r['first_round_loss'])} → {number(r['last_round_loss'])}"


def held_out_text(r: dict) -> str:
    if r.get("val_loss_problem"):
        return f"— ({r['val_loss_problem']})"
    if r["rounds"] == 0:
        return f"{number(r['val_loss_initial'])} (untrained: no round completed)"
    return f"{number(r['val_loss_initial'])} → {number(r['val_loss_final'])}"


def _shapes(r: dict) -> str:
    """The (L × batch) shapes a run trained (several under a curriculum; data.seq_len × batch_size, the config's,
    before any training row)."""
    shapes = r.get("trained") or [[r["seq_len"], r["batch_size"]]]
    return ", ".join(f"{length} × {batch}" for length, batch in shapes)


# The summary's columns: (header, cell of a run's row); SUMMARY_NOTES says what each marked number is.
SUMMARY_COLUMNS = (
    ("L ×\nbatch", lambda r: _shapes(r)),
    ("rounds", lambda r: f"{r['rounds']:,}"),
    ("train loss¹\nfirst → last", _train_loss),
    ("held-out loss²\ninitial → final", held_out_text),
    ("tok/s³", lambda r: f"{r['tokens_per_second']:,.0f}"),
    ("sync /\nbusy⁴", lambda r: " / ".join("—" if not math.isfinite(r.get(key, math.nan)) else f"{r[key]:.1%}"
                                            for key in ("sync_share", "utilization"))),
    ("MB/\nround⁵", lambda r: f"{(r['bytes_sent_per_round'] + r['bytes_received_per_round']) / 1e6:.2f}"),
    ("× below\nfp32⁶", lambda r: " / ".join(f"{x:.3g}" if math.isfinite(x) else "–" for x in (r["ratio_up"], r["ratio_down"]))),
    ("wall\ntime", lambda r: f"{r['wall_seconds']:.0f} s"),
)
SUMMARY_NOTES = (
    "¹ mean training loss of all steps of the first and of the last completed round",
    f"² cross-entropy of the initial and of the final parameters on {EVAL_BATCHES} held-out batches",
    "³ training tokens of all workers per second of the time the run was served (first round opened → last metric "
    "of each launch: the time between launches of a resumed run is left out)",
    ("⁴ share of wall time synchronizing: mean over workers of sync / (sync + compute) seconds; busy: their mean "
     "compute utilization, inner-step seconds over wall seconds from their first pull to their last row"),
    "⁵ megabytes all workers sent (pushes) and received (pulls) per round, together",
    ("⁶ θ's float32 bytes over one worker's bytes per round, up (its update) / down (its pull of the round's step; "
     "full pulls of θ, a worker's first included, are summary.json's full_pull_bytes)"),
)


def interrupted_outcome(stop: StopSignal, done: str) -> Outcome:
    """The outcome of a launch `stop` interrupted, `done` saying how far it got: it exits 128 plus the signal's number
    (130 for Ctrl-C, 143 for SIGTERM, 129 for a closed terminal), as a shell reports a process that signal ended."""
    name = signal.Signals(stop.signum).name if stop.signum else "a signal"
    return Outcome("interrupted", f"stopped by {name}: interrupted after {done}; every process was shut down",
                   128 + stop.signum)


@dataclass(frozen=True)
class Outcome:
    """How a launch ended: `kind` (completed, budget, interrupted, failed), one line saying so, the exit status."""

    kind: str
    message: str
    status: int


def rounds_done(rows: list[dict]) -> str:
    """The rounds each run completed: "12", or per length when a sweep's runs differ ("120 (L=2), 40 (L=16)")."""
    counts = {r["rounds"] for r in rows}
    if len(counts) == 1:
        return f"{counts.pop():,}"
    return ", ".join(f"{r['rounds']:,} (L={r['seq_len']})" for r in rows)


def outcome(rows: list[dict], spec: RunSpec, *, stop: StopSignal, out_of_time: bool, minutes: float | None,
            exit_codes: list[int | None], logs: Path, coordinator_code: int | None = None,
            before: Mapping[int, BeforeLaunch] | None = None) -> Outcome:
    """What really happened: interrupted after N of M rounds (`stop` set), stopped at the budget (or already at it
    when launched: `budget_outcome`), failed, or completed. `coordinator_code`: the coordinator's exit status when it
    ended before the launcher stopped it (None: it ran on). `before`: each run as it was before the launch, by its
    length (`before_launch`; None: a launch on a new run dir)."""
    done, target = rounds_done(rows), f"{spec.run.rounds:,}"
    failed = [code for code in exit_codes if code not in (0, -signal.SIGTERM)]
    if stop.is_set():
        return interrupted_outcome(stop, f"{done} of {target} rounds")
    if coordinator_code is not None:
        return Outcome("failed", f"the coordinator exited with status {coordinator_code} after {done} of {target} "
                                 f"rounds; see {logs / 'coordinator.log'}", 1)
    # The coordinator ends a run at [run] minutes (which --minutes sets) when that comes before the launcher's deadline.
    ended_at_budget = any(r.get("stopped") and not was_pruned(r["stopped"]) for r in rows)
    if (out_of_time or ended_at_budget) and not failed:
        return budget_outcome(rows, minutes or spec.run.minutes, done, before or {})
    # A length the sweep pruned ([sweep] prune, issue #30) ended by design before the rounds budget.
    pruned = [r for r in rows if was_pruned(r.get("stopped"))]
    if failed or min((r["rounds"] for r in rows if not r.get("stopped")), default=0) < spec.run.rounds:
        return Outcome("failed", f"the run did not complete: {done} of {target} rounds; worker exit codes "
                                 f"{exit_codes}; see {logs}", 1)
    note = "; pruned: " + ", ".join(f"L={r['seq_len']} after {r['rounds']:,}" for r in pruned) if pruned else ""
    return Outcome("completed", f"completed {done} rounds{note}", 0)


@dataclass(frozen=True)
class BeforeLaunch:
    """A run as its state dir held it before a launch's coordinator started (`before_launch`): its stop (None: not
    stopped) and the seconds it had been served, the wall-time budget's clock then (coordinator/sweep.py
    `served_before`, what the coordinator reads at its start)."""

    stopped: str | None
    served_s: float


def budget_outcome(rows: list[dict], minutes: float, done: str, before: Mapping[int, BeforeLaunch]) -> Outcome:
    """The outcome of a launch its wall-time budget (`minutes`) ended, after `done` rounds (`rounds_done`). The
    coordinator's budget counts the time each run was served over every launch on the run dir, so a run may have
    ended before this launch (`ended_before`). With every run so, nothing trained and the line says it; otherwise
    the runs that were already at the budget are named after "stopped at the M-minute budget after N rounds"."""
    already = [r for r in rows if ended_before(r, before.get(r["seq_len"]), minutes * 60.0)]
    budget = f"{minutes:g}-minute budget"
    if len(already) == len(rows):
        return Outcome("budget", f"already at the {budget} when launched: nothing trained, {done} rounds as before "
                                 "(the budget counts the time every launch on this run dir served the run; a larger "
                                 "--minutes trains on)", 0)
    at_it = ", ".join("L=" + str(r["seq_len"]) for r in already if not was_pruned(r.get("stopped")))
    note = f"; {at_it} already at it when launched" if at_it else ""
    return Outcome("budget", f"stopped at the {budget} after {done} rounds{note}", 0)


def ended_before(row: dict, before: BeforeLaunch | None, budget_s: float) -> bool:
    """Whether the run of summary row `row` had ended before the launch (`before`, None: a new run): it had been
    served its budget of `budget_s` seconds by then (its coordinator ends it at once), or it is still stopped as it
    was then (pruned, or at an earlier budget the launch did not raise)."""
    if before is None:
        return False
    return before.served_s >= budget_s or (before.stopped is not None and before.stopped == row.get("stopped"))


def before_launch(run_dir: Path, spec: RunSpec) -> dict[int, BeforeLaunch]:
    """Each run of the run dir as its state dir holds it before the launch's coordinator starts, by its length, for
    `budget_outcome`: none for a new run dir, nor for a state dir that cannot be read (its coordinator says why)."""
    runs: dict[int, BeforeLaunch] = {}
    for local in local_runs(run_dir, spec):
        try:
            store = StateStore.open_read_only(local.state_dir)
        except (OSError, StoreError):
            continue
        try:
            runs[local.spec.data.seq_len] = BeforeLaunch(store.get("stopped"), served_before(store))
        except (StoreError, ValueError, RuntimeError):  # an older schema's, or a damaged value
            continue
        finally:
            store.close()
    return runs


def fit_law(console: Console, run_dir: Path, held_out: LengthLaw | None = None) -> dict | None:
    """A sweep's law as `rcswarm fit RUN_DIR` fits it: α(s) at matched steps, the Eq. 11 crossovers, fit.png
    (whose law panel is `held_out`, the held-out losses against L, when there is one).

    Returns the fit's summary (`FitReport.summary`) with the plot's path, or None when no fit is possible.
    """
    skipped: list[str] = []
    try:
        curves = length_curves(run_dir, read_state_dirs(run_dir, skipped))
        analysis = analyse(curves)
    except ValueError as error:
        console.print(f"no fit of α(s) and the crossovers: {escape(str(error))}")
        return None
    for note in skipped:
        console.print(f"fit: {escape(note)}")
    report_fit(analysis, console)
    plot = run_dir / "fit.png"
    plot_fit(analysis, plot, held_out)
    console.print(f"plot of the fit: {plot}   (again, or on another run: rcswarm fit {run_dir})")
    return {**FitReport(curves, analysis, "").summary(), "plot": plot.name}


def print_table(console: Console, run_dir: Path, spec: RunSpec, rows: list[dict]) -> None:
    """The summary's table, one row per run, with the notes saying what each number is."""
    table = Table(title=f"rcswarm run {spec.run.name}: {run_dir}", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for header, _ in SUMMARY_COLUMNS:
        table.add_column(header, justify="right", no_wrap="loss" in header)
    for row in rows:
        table.add_row(*(cell(row) for _, cell in SUMMARY_COLUMNS))
    console.print(table)
    for note in SUMMARY_NOTES:
        console.print(note, style="dim")
    for row in rows:
        resumed = served_note(row.get("served_periods", 1), row.get("idle_seconds", 0.0))
        if resumed:
            console.print(f"L={row['seq_len']}: {resumed}" if len(rows) > 1 else resumed, style="dim")


def held_out_law(console: Console, rows: list[dict]) -> LengthLaw | None:
    """For 3+ runs that all have a held-out loss, its law ≈ A·L^(−α), printed with its caveats; else None."""
    if len(rows) < 3 or not all(r["rounds"] > 0 and r["val_loss_final"] is not None for r in rows):
        return None
    held_out = length_law("held-out loss of the final parameters", [r["seq_len"] for r in rows],
                          [r["val_loss_final"] for r in rows])
    fit = held_out.fit
    console.print(f"held-out loss of the final parameters ≈ {fit.formula(4)} "
                  f"(R² {fit.r_squared:.3f}; α 90% interval [{fit.alpha_low:.3f}, {fit.alpha_high:.3f}]; "
                  f"×{fit.per_doubling:.3f} per doubling of L)")
    for caveat in fit.caveats():
        console.print(f"{NOT_ENOUGH_DATA} for α of the held-out loss: {caveat}", style="bold red")
    return held_out


def write_summary(run_dir: Path, document: dict) -> None:
    """summary.json, atomically: a launcher killed while writing it leaves the previous one whole."""
    path = run_dir / "summary.json"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(finite(document), indent=2, allow_nan=False))
    os.replace(partial, path)


def skippable_law(console: Console, run_dir: Path, held_out: LengthLaw | None,
                  signals: SummarySignals) -> tuple[dict | None, str]:
    """(`fit_law`'s summary, ""), or, when a signal of `signals` comes before or while it fits and plots, (None,
    why): the fit is left undone, and a fit.png it had begun writing is removed (it may be cut short)."""
    plot = run_dir / "fit.png"
    before = file_stamp(plot)
    try:
        with signals.skippable():
            return fit_law(console, run_dir, held_out), ""
    except SummaryInterrupted:
        if file_stamp(plot) != before:
            plot.unlink(missing_ok=True)
        console.print(f"{signals.name()}: the sweep's law is not fitted; summary.json is written without it "
                      f"(again: rcswarm fit {run_dir})", style="yellow")
        return None, f"not fitted: interrupted by {signals.name()}"


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(modification time in ns, size) of `path`, None when there is none: whether a file was written since."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def print_summary(console: Console, run_dir: Path, spec: RunSpec, rows: list[dict], ended: Outcome,
                  signals: SummarySignals | None = None) -> None:
    """One row per run (a single run is a sweep of one) and notes saying what each number is; for 3+ runs
    the held-out loss ≈ A·L^(−α), and for a sweep the law of `fit_law`; then the outcome line. summary.json
    holds a single run's row itself, or a sweep's `runs`, `fit`, `law` and `law_problem` (why there is no law),
    with `outcome` and `outcome_message`.

    summary.json is written before a sweep's law is fitted and plotted (`law_problem` then says it is not fitted
    yet) and again after: a signal of `signals` (the launcher's, `main`) before or during the fit leaves the law
    out, and the launcher exits once summary.json is whole. Without `signals`, nothing cuts the fit short."""
    signals = signals if signals is not None else SummarySignals()  # not entered: it takes no signal
    print_table(console, run_dir, spec, rows)
    ending = {"outcome": ended.kind, "outcome_message": ended.message}
    held_out = held_out_law(console, rows)
    sweep: dict = {"runs": rows, **ending}
    if held_out is not None:
        sweep["fit"] = {**dataclasses.asdict(held_out.fit), "caveats": held_out.fit.caveats()}
    if not spec.is_sweep:
        write_summary(run_dir, {**rows[0], **ending})
    else:
        write_summary(run_dir, {**sweep, "law": None, "law_problem": "not fitted yet: the launcher fits it next"})
        sweep["law"], sweep["law_problem"] = skippable_law(console, run_dir, held_out, signals)
        write_summary(run_dir, sweep)
    console.print(ended.message)


def summary_status(ended: Outcome, signals: SummarySignals) -> int:
    """The launcher's exit status: the outcome's, but 128 plus the signal's number when a signal came while the
    summary was made (after summary.json is whole), as a shell reports a process that signal ended; an interrupted
    launch keeps the status of the signal that stopped it."""
    if signals.signum and ended.kind != "interrupted":
        return 128 + signals.signum
    return ended.status


def parser() -> argparse.ArgumentParser:
    parser = new_parser("rcswarm run", "Train with a local swarm: a coordinator and N workers.")
    parser.add_argument("config", nargs="?", type=path_arg,
                        help=f"RUN.toml (default: the built-in demo, a sweep over sequence lengths for "
                             f"{DEMO_MINUTES:g} minutes; its run.toml lands in the run directory)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: run.workers)")
    parser.add_argument("--rounds", type=int, default=None, help="outer rounds (default: run.rounds)")
    parser.add_argument("--run-dir", type=path_arg, default=None, help="where the run's files go (default: runs/<name>-<time>)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-time budget: stop every process after this many minutes, however many rounds ran "
                             "(a sweep's runs then share the same training time, the comparison of loss vs wall time; "
                             "the coordinator ends each run once it was served this long, counted over every launch on "
                             "the run dir; a hivemind run's from each launch, which starts from θ_0 again; "
                             f"default: none with a config, {DEMO_MINUTES:g} for the demo)")
    parser.add_argument("--max-params", type=int, default=0, metavar="N",
                        help="the most parameters the coordinator and each worker build (each run of a sweep holds "
                             "its own copy at the coordinator); default 0: what each one's memory holds")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace | int:
    """The arguments, or the exit status after --help (0) or a usage error (2)."""
    parser_ = parser()
    args = parse_or_status(parser_, argv)
    if isinstance(args, int):
        return args
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        parser_.error(f"--minutes must be a positive number of minutes, got {args.minutes}")
    if args.max_params < 0:
        return usage_error("rcswarm run", f"--max-params {args.max_params}: expected >= 0 (0: what each process's "
                                          "memory holds)")
    problem = empty_path_problem("RUN.toml", args.config)
    if problem is None and args.run_dir is not None:
        problem = output_dir_problem("--run-dir", args.run_dir)
    if problem is not None:
        return usage_error("rcswarm run", problem)
    return args


def load_spec(args: argparse.Namespace) -> RunSpec:
    spec = RunSpec.from_toml(args.config) if args.config else demo_spec()
    run = spec.run
    if args.workers is not None:
        run = dataclasses.replace(run, workers=args.workers)
    if args.rounds is not None:
        run = dataclasses.replace(run, rounds=args.rounds)
    minutes = budget_minutes(args)
    if minutes is not None:
        # The coordinator knows the budget too: its forecasts are of the loss at its end (issue #30).
        run = dataclasses.replace(run, minutes=minutes)
    runs = len(spec.sweep.seq_lens) or 1
    most = spec.coordinator.max_workers
    if run.workers // runs > most:
        given = "--workers" if args.workers is not None else "run.workers"
        raise ValueError(f"{given} = {run.workers}: {run.workers // runs} workers per run is more than "
                         f"coordinator.max_workers = {most} admits; expected at most {most * runs} workers")
    given = "--workers" if args.workers is not None else "run.workers"
    if spec.is_sweep and run.minutes > 0 and run.workers < runs:
        raise ValueError(f"{given} = {run.workers}: fewer workers than the sweep's {runs} lengths under a wall-time "
                         f"budget ({run.minutes:g} minutes) leaves some lengths untrained when it ends; expected at "
                         f"least {runs} workers")
    per_run = max(run.workers // runs, 1)  # fewer workers than runs: the runs train in turn, one worker each
    if spec.sync.min_reports > per_run:
        raise ValueError(f"sync.min_reports = {spec.sync.min_reports}: more than the {per_run} worker"
                         f"{'s' if per_run > 1 else ''} each run has ({given} = {run.workers} over {runs} runs): every "
                         f"round would wait sync.round_deadline_s = {spec.sync.round_deadline_s:g} s for reports that "
                         f"never come; expected at most {per_run}")
    sync = dataclasses.replace(spec.sync, min_reports=max(spec.sync.min_reports, run.workers // runs))
    if run.rounds == 0:
        raise ValueError("run.rounds = 0 (until stopped) is for `rcswarm coordinator`; `rcswarm run` needs a number of rounds")
    problem = (data_problem(spec, open_dataset=True) or model_problem(spec, ParameterLimit.of(args.max_params))
               or step_problem(spec))
    if problem:  # its coordinator would refuse the model, or its workers a window: said before the run dir is made
        raise ValueError(problem)
    if spec.curriculum.adaptive:
        law_of(spec.curriculum)  # a law_from fit that cannot decide: refused before the run dir is made
    return dataclasses.replace(spec, run=run, sync=sync)


def step_problem(spec: RunSpec) -> str:
    """Why the workers `rcswarm run` starts (each with the default step limit, DEFAULT_MAX_STEP_TOKENS) would refuse
    a window of `spec`, any of its runs' ("" when none would): a worker refuses one beyond it at its start or when
    assigned, and the launcher's final held-out evaluation would run it in its own process."""
    limit = ModelLimit(0, "rcswarm run's workers", DEFAULT_MAX_STEP_TOKENS)
    for run_spec in spec.sweep_runs():
        problem = limit.windows_problem(run_spec, assigned=True)
        if problem:
            return f"{problem}: every worker `rcswarm run` starts has the default limit"
    return ""


def budget_minutes(args: argparse.Namespace) -> float | None:
    """The wall-time budget: --minutes, else the demo's when no config is given, else none."""
    if args.minutes is not None or args.config:
        return args.minutes
    return DEMO_MINUTES


def lock_run_dir(run_dir: Path) -> StateDirLock:
    """The launcher's lock on `run_dir` (made if missing), held for the launch's life: a second `rcswarm run` there
    would delete this one's coordinator.json and mix its log lines into this one's. StateDirBusy naming the holder
    (its pid, and its coordinator's address once that serves) when another launch holds it."""
    try:
        return StateDirLock.acquire(run_dir, role="launcher", name=LAUNCHER_LOCK_NAME)
    except StateDirBusy:
        holder = holder_text(run_dir / LAUNCHER_LOCK_NAME)
        raise StateDirBusy(f"--run-dir {str(run_dir)!r} is in use by another rcswarm run ({holder}); stop it first, "
                           "or give this one another --run-dir") from None


def start_and_watch(swarm: Swarm, spec: RunSpec, minutes: float | None, console: Console, stop: StopSignal,
                    lock: StateDirLock) -> tuple[bool, int | None] | None:
    """Start the coordinator (its address announced in the run dir's `lock`) and the workers, and watch them until
    the run ends; (whether the wall-time budget ended it, the coordinator's exit status when it ended by itself), or
    None when the coordinator did not start (said on stderr). The caller stops the processes."""
    try:
        port, http_port = swarm.start_coordinator()
    except RuntimeError as exc:
        print(f"rcswarm run: {exc}", file=sys.stderr)
        return None
    lock.announce(f"127.0.0.1:{port}")
    run_dir = swarm.run_dir
    what = f"a sweep over L = {', '.join(map(str, spec.sweep.seq_lens))}" if spec.is_sweep else "one run"
    budget = f" for {minutes:g} minutes" if minutes else ""
    console.print(f"rcswarm run {spec.run.name}: {what}{budget}; run directory {run_dir}")
    console.print(f"coordinator on 127.0.0.1:{port}; starting {spec.run.workers} workers; logs in {swarm.logs}")
    console.print(f"dashboard: http://127.0.0.1:{http_port}/  (live plots and fits while the run lasts)")
    for caution in spec.cautions():
        console.print(f"caution: {caution}", style="yellow")
    swarm.start_workers(port)
    swarm.write_process_table()
    client = CoordinatorClient(f"127.0.0.1:{port}", swarm.token, retry=RetryPolicy(max_elapsed_s=10.0))
    deadline = time.monotonic() + minutes * 60.0 if minutes else math.inf
    try:
        out_of_time = watch(swarm, client, spec.run.rounds, console, stop, deadline)
    finally:
        client.close()
    return out_of_time, swarm.coordinator.poll()


def launch_with_coordinator(swarm: Swarm, spec: RunSpec, minutes: float | None, console: Console, stop: StopSignal,
                            lock: StateDirLock) -> int:
    """The coordinator's launch: start and watch the swarm, stop it, then the summary under `SummarySignals` (a
    signal then ends the launcher only once summary.json is whole); the exit status."""
    before = before_launch(swarm.run_dir, spec)
    try:
        watched = start_and_watch(swarm, spec, minutes, console, stop, lock)
    finally:
        swarm.stop()
    if watched is None:
        return 1
    out_of_time, coordinator_code = watched
    run_dir = swarm.run_dir
    with SummarySignals() as signals:
        rows = skippable_evaluation(
            console, lambda evaluated: [summarize_run(local, evaluated) for local in local_runs(run_dir, spec)])
        ended = outcome(rows, spec, stop=stop, out_of_time=out_of_time, minutes=minutes,
                        exit_codes=[p.returncode for p in swarm.workers], logs=swarm.logs,
                        coordinator_code=coordinator_code, before=before)
        print_summary(console, run_dir, spec, rows, ended, signals)
    return summary_status(ended, signals)


def launch_in(run_dir: Path, spec: RunSpec, args: argparse.Namespace, console: Console, lock: StateDirLock) -> int:
    """The launch in the locked `run_dir`, with its stop signals routed to a StopSignal for its whole life; the exit
    status."""
    minutes = budget_minutes(args)
    # A closed terminal or a dropped ssh session (SIGHUP) stops the run as Ctrl-C does: the workers and the
    # coordinator run in sessions of their own and would otherwise train on with nobody to stop them.
    stop = StopSignal().install(*STOP_SIGNALS)
    try:
        if spec.sync.backend == "hivemind":
            from rcswarm.cli.run_hivemind import launch

            return launch(spec, run_dir, minutes, console, stop, args.max_params)
        swarm = Swarm(spec, run_dir, spec.run.workers, args.max_params)
        return launch_with_coordinator(swarm, spec, minutes, console, stop, lock)
    finally:
        stop.uninstall()


def main(argv: list[str] | None = None) -> int:
    """`rcswarm run`: the exit status (0 completed or at the budget, 1 failed, 2 a usage error or a run directory
    another launch holds, 128 plus a signal's number when one stopped it)."""
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    # Not a terminal (a pipe, a log file): wide enough that no table cell is cut ("9,3…") at rich's default 80.
    console = Console(emoji=False) if sys.stdout.isatty() else Console(width=200, emoji=False)
    try:
        spec = load_spec(args)
    except ValueError as exc:
        return usage_error("rcswarm run", str(exc))
    run_dir = args.run_dir if args.run_dir is not None else Path("runs") / f"{spec.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        lock = lock_run_dir(run_dir)  # before anything in the run dir is written or deleted
    except StateDirBusy as exc:
        return usage_error("rcswarm run", str(exc))
    except OSError as exc:
        print(f"rcswarm run: --run-dir {str(run_dir)!r}: cannot lock it for this launch: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    try:
        return launch_in(run_dir, spec, args, console, lock)
    finally:
        lock.release()
