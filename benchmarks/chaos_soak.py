"""Chaos soak: a real swarm on loopback under random kills, stops and a connection-cutting proxy.

A `python -m rcswarm.cli coordinator` process and N `rcswarm worker` processes (tiny lstm_lm, short
windows, int8, a few inner steps, `run.rounds = 0`) run for `--minutes`, while a driver with a
seeded RNG, one action at a time:

* SIGKILLs a worker and starts it again after a random pause;
* SIGSTOPs a worker and SIGCONTs it after a random pause (longer than the lease: it is evicted
  and joins again);
* SIGKILLs the coordinator and restarts it on the same state dir and port after a random pause;
* SIGSTOPs the coordinator and SIGCONTs it well within the workers' patience;
* makes the loopback TCP proxy between the workers and the coordinator cut every connection,
  refuse new ones for a while, or delay every chunk for a while.

With `--sweep-lengths 16,32` the coordinator runs a sweep of those lengths instead of one run: its workers are
placed among the runs and moved between them as kills and evictions unbalance them, and every check below holds
per run (each run's versions, ledger and pulls; GetStatus's per-run versions).

Then the chaos stops, every worker is running again, and the swarm trains until each worker has
pulled a version newer than the last one seen under chaos. The report's checks:

* versions monotonic: every GetStatus the driver polled (directly, not through the proxy) is at or
  after the previous one, across restarts, and the rounds ledger holds each version once, 0..v-1;
* no committed version lost: a restarted coordinator serves a version at or after the last one
  announced, and every digest a worker or GetStatus reported for a version, and the ledger's digest of the newest
  version seen when the coordinator was SIGKILLed (read from the state dir while it is down), equals the ledger's
  at the end;
* replicas bit-identical at the end: each worker's `param_sha256` (from its metrics) for its last
  pull equals the coordinator's digest for that version;
* no worker gave up: no worker process exited on its own.

Exit status 0 only when every check holds (1 otherwise, 2 for bad arguments, 130 on Ctrl-C).
Every child runs in its own session and its process group is killed on exit, error or Ctrl-C.

    python benchmarks/chaos_soak.py --minutes 10 --seed 1
"""

from __future__ import annotations

import argparse
import atexit
import heapq
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.sweep import run_state_dirs
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.state.store import StateStore
from rcswarm.worker import CoordinatorClient, RetriesExhausted, RetryPolicy, Timeouts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link_proxy import LinkProxy  # noqa: E402  (benchmarks/ is no package: the proxy is its sibling)

TOKEN = "chaos-soak-token-0123456789"
HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.5
TICK_S = 0.05
PROGRESS_EVERY_S = 10.0
CONNECT_TIMEOUT_S = 5.0
# What the driver can do; each names a method `_<kind>` of Soak.
ACTIONS = ("worker_kill", "worker_stop", "coordinator_kill", "coordinator_stop", "proxy_cut", "proxy_refuse", "proxy_delay")


@dataclass(frozen=True)
class SoakOptions:
    """The soak's knobs; each pause is drawn uniformly from (0.2 s, its maximum)."""

    minutes: float = 2.0
    workers: int = 4
    seed: int = 0
    codec: str = "int8"
    inner_steps: int = 5
    lease_s: float = 5.0
    round_deadline_s: float = 5.0
    action_every_s: float = 3.0
    worker_pause_s: float = 8.0
    coordinator_pause_s: float = 3.0
    proxy_window_s: float = 3.0
    proxy_delay_s: float = 0.2
    patience_s: float = 300.0
    rpc_timeout_s: float = 3.0
    settle_s: float = 120.0
    # Which kinds of ACTIONS the driver takes (comma-separated), and how: at exactly every action_every_s
    # (fixed_period, the first at the chaos' start) instead of exponential gaps; a killed worker started again as
    # soon as it is reaped (restart_at_once: a supervisor, as `rcswarm launch ray` or a Kubernetes Deployment
    # restarts it) instead of after 0.2 s-worker_pause_s; the chaos ends after max_faults actions (0: no limit).
    actions: str = ",".join(ACTIONS)
    fixed_period: bool = False
    restart_at_once: bool = False
    max_faults: int = 0
    # Goodput (issue #31): goodput_cycles > 0 replaces the one chaos phase by cycles of a fault-free phase and a
    # chaos phase of phase_s each, then gap_s without faults that neither counts; goodput = the tokens the
    # outer steps applied during the chaos phases / those applied during the fault-free ones.
    goodput_cycles: int = 0
    phase_s: float = 60.0
    gap_s: float = 10.0
    # Each worker keeps its membership in a file (`rcswarm worker --membership-file`), so that its restart ends
    # the killed process's membership at once instead of the round waiting a lease for it.
    membership_files: bool = False
    # A sweep of these lengths (comma-separated) instead of one run of length 32.
    sweep_lengths: str = ""

    def __post_init__(self) -> None:
        for name in ("minutes", "lease_s", "round_deadline_s", "action_every_s", "worker_pause_s",
                     "coordinator_pause_s", "proxy_window_s", "proxy_delay_s", "patience_s", "rpc_timeout_s", "settle_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"--{name.replace('_', '-')} {value}: expected a number > 0")
        if not 1 <= self.workers <= 16:
            raise ValueError(f"--workers {self.workers}: expected 1..16")
        if self.inner_steps < 1:
            raise ValueError(f"--inner-steps {self.inner_steps}: expected an integer >= 1")
        unknown = sorted(set(self.action_kinds()) - set(ACTIONS))
        if unknown or not self.action_kinds():
            raise ValueError(f"--actions {self.actions!r}: expected a comma-separated subset of {', '.join(ACTIONS)}")
        for name in ("max_faults", "goodput_cycles"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected an integer >= 0")
        if not (self.phase_s > 0 and self.gap_s >= 0):
            raise ValueError(f"--phase-s {self.phase_s}, --gap-s {self.gap_s}: expected > 0 and >= 0")
        # A stopped or restarting coordinator must come back within one call's patience, or the
        # workers would give up by design rather than by a fault.
        lengths = self.lengths()
        if self.sweep_lengths and (len(lengths) < 2 or len(set(lengths)) != len(lengths)
                                   or not all(4 <= n <= 256 for n in lengths)):
            raise ValueError(f"--sweep-lengths {self.sweep_lengths!r}: expected two or more distinct lengths in "
                             f"4..256, comma-separated")
        if self.coordinator_pause_s + START_TIMEOUT_S >= self.patience_s:
            raise ValueError(f"--patience-s {self.patience_s}: expected more than --coordinator-pause-s "
                             f"{self.coordinator_pause_s} + the {START_TIMEOUT_S:g} s a restart may take")

    def action_kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind in self.actions.split(",") if kind)

    def lengths(self) -> list[int]:
        """The sweep's lengths (`sweep_lengths`; empty: one run). ValueError naming the flag for a non-integer."""
        try:
            return [int(part) for part in self.sweep_lengths.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--sweep-lengths {self.sweep_lengths!r}: expected comma-separated integers") from None

    def spec(self) -> RunSpec:
        """The run (or the sweep's runs): tiny LSTM on short windows, rounds until stopped, leases shorter than a
        worker's stop."""
        sweep = {"sweep": {"seq_lens": self.lengths()}} if self.sweep_lengths else {}
        return RunSpec.from_dict({**sweep,
            "run": {"name": "chaos-soak", "rounds": 0, "workers": self.workers},
            "model": {"name": "lstm_lm", "preset": "tiny"},
            "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
            "inner": {"steps": self.inner_steps, "lr": 1e-2},
            "sync": {"codec": self.codec, "round_deadline_s": self.round_deadline_s, "min_reports": 1},
            "coordinator": {"lease_s": self.lease_s, "max_wait_s": 2.0},
        })


class Child:
    """One restartable child process leading its own session; its output appends to one log.

    Only the driver's thread calls it.
    """

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log_path, self.env = name, argv, log_path, env
        self.proc: subprocess.Popen | None = None
        self.stopped = False
        self.killed_by_driver = False

    def start(self) -> None:
        """Start the process (again)."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.stopped = self.killed_by_driver = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        """Send `sig` to the child's process group (nothing when it is gone)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the group and reap the child."""
        self.killed_by_driver = True
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=STOP_GRACE_S)
        self.stopped = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGCONT and SIGTERM the group, wait up to `grace_s`, then SIGKILL it; the exit code."""
        if not self.alive():
            return self.exit_code()
        self.resume()
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.exit_code()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Tally:
    """What the driver did and saw."""

    worker_kills: int = 0
    worker_stops: int = 0
    coordinator_kills: int = 0
    coordinator_stops: int = 0
    proxy_cuts: int = 0
    connections_cut: int = 0
    proxy_refusals: int = 0
    connections_refused: int = 0
    proxy_delays: int = 0
    workers_gave_up: int = 0
    coordinator_crashes: int = 0
    restart_regressions: int = 0
    status_regressions: int = 0
    polls: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def faults(self) -> int:
        """Faults injected: every kill, stop, cut, refusal window and delay window."""
        return (self.worker_kills + self.worker_stops + self.coordinator_kills + self.coordinator_stops
                + self.proxy_cuts + self.proxy_refusals + self.proxy_delays)


@dataclass(frozen=True)
class Window:
    """One phase of a goodput soak: its kind ("calm" or "chaos"), when it ran (seconds since the soak's start),
    the tokens the outer steps applied and the versions made during it, and the faults injected."""

    kind: str
    cycle: int
    start_s: float
    end_s: float
    tokens: int
    versions: int
    faults: int


class Soak:
    """The swarm, the proxy and the driver's schedule. Only the driver's thread calls it."""

    def __init__(self, options: SoakOptions, work: Path) -> None:
        self.options, self.work = options, work
        self.rng = random.Random(options.seed)
        self.tally = Tally()
        self.state_dir = work / "state"
        self.port_file = work / "port.json"
        self.events: list[tuple[float, int, str, Callable[[], None]]] = []
        self._event_seq = 0
        self.allowed = options.action_kinds()
        self._untried = self.rng.sample(self.allowed, len(self.allowed))
        # (seconds since the start, version, applied tokens) of every GetStatus answered; (seconds, kind) of faults.
        self.series: list[tuple[float, int, int]] = []
        self.fault_times: list[tuple[float, str]] = []
        self.windows: list[Window] = []
        self.busy: set[str] = set()
        spec = options.spec()
        # Each run's state dir (one for a single run); each run's newest version seen and the versions announced before
        # the coordinator's last SIGKILL (one per run, in the runs' order: GetStatus's `runs`, else the run itself).
        self.run_dirs = [run_dir for _, run_dir in run_state_dirs(spec, self.state_dir)]
        self.last_versions = [-1] * len(self.run_dirs)
        self.announced_before_kill: list[int] = []
        self.digests: dict[tuple[int, int], str] = {}  # (run, version) → the digest GetStatus reported (single run)
        self.coordinator_port = _free_port()
        config = work / "run.toml"
        config.write_text(spec.to_toml())
        env = {**os.environ, TOKEN_ENV: TOKEN, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.coordinator = Child("coordinator", [
            sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config),
            "--state-dir", str(self.state_dir),
            "--host", HOST, "--port", str(self.coordinator_port), "--port-file", str(self.port_file),
        ], work / "coordinator.log", env)
        self.proxy = LinkProxy(self.coordinator_port)
        self.workers: list[Child] = []
        self._env = env
        self._stopped = False
        self._started_at = self.began = time.monotonic()
        self.load_at_start = os.getloadavg()[0]
        self.coordinator_up_at: float | None = None
        self.client = CoordinatorClient(f"{HOST}:{self.coordinator_port}", TOKEN,
                                        retry=RetryPolicy(max_elapsed_s=0.01), timeouts=Timeouts(unary_s=2.0))

    @property
    def last_version(self) -> int:
        """The lowest of the runs' newest versions seen (-1 before the first poll)."""
        return min(self.last_versions)

    def _worker(self, index: int) -> Child:
        o = self.options
        return Child(f"w{index}", [
            sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", f"{HOST}:{self.proxy.port}", "--name", f"w{index}",
            "--threads", "1", "--patience-s", str(o.patience_s), "--rpc-timeout-s", str(o.rpc_timeout_s),
            "--transfer-timeout-s", "30",
            *(["--membership-file", str(self.work / f"w{index}.membership")] if o.membership_files else []),
        ], self.work / f"w{index}.log", self._env)

    def start(self) -> None:
        """Start the coordinator (waiting until it serves), the proxy and the workers; wait for a first round."""
        self._start_coordinator()
        self._await_coordinator(time.monotonic() + START_TIMEOUT_S)
        self.proxy.start()
        self.workers = [self._worker(i) for i in range(self.options.workers)]
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.last_version < 1:
            self._watch_processes()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no round closed within {START_TIMEOUT_S:g}s of the start")
            self.poll_status()
            time.sleep(POLL_INTERVAL_S)

    def _start_coordinator(self) -> None:
        self.port_file.unlink(missing_ok=True)
        self.coordinator.start()
        self.coordinator_up_at = None
        self._started_at = time.monotonic()

    def _await_coordinator(self, deadline: float) -> None:
        while not self._coordinator_serving():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator did not serve within {START_TIMEOUT_S:g}s:\n{self.coordinator.log_tail()}")
            time.sleep(TICK_S)

    def _coordinator_serving(self) -> bool:
        """Whether the (re)started coordinator wrote its port file; records when it did."""
        if self.coordinator_up_at is None and self.port_file.exists():
            self.coordinator_up_at = time.monotonic()
        return self.coordinator_up_at is not None

    def _schedule(self, delay_s: float, what: str, action: Callable[[], None]) -> None:
        self._event_seq += 1
        heapq.heappush(self.events, (time.monotonic() + delay_s, self._event_seq, what, action))

    def _run_due_events(self) -> None:
        while self.events and self.events[0][0] <= time.monotonic():
            _, _, _, action = heapq.heappop(self.events)
            action()

    def _pause_s(self, maximum: float) -> float:
        return self.rng.uniform(0.2, maximum)

    def _chaos_action(self) -> None:
        """One action on a process or the proxy that nothing else is disturbing now.

        Until every kind of action ran once, the first possible kind of a seeded shuffle runs, so a
        soak of a few minutes exercises each; then kinds are drawn at random (worker actions twice
        as likely as the others).
        """
        possible = [kind for kind in self.allowed if self._possible(kind)]
        if not possible:
            return
        untried = [kind for kind in self._untried if kind in possible]
        kind = untried[0] if untried else self.rng.choice(
            [k for k in possible for _ in range(2 if k.startswith("worker") else 1)])
        if kind in self._untried:
            self._untried.remove(kind)
        self.fault_times.append((time.monotonic() - self.began, kind))
        getattr(self, f"_{kind}")()

    def _idle_workers(self) -> list[Child]:
        return [w for w in self.workers if w.name not in self.busy and w.alive()]

    def _possible(self, kind: str) -> bool:
        """Whether `kind` may run now: one disturbance per process at a time, one worker always left alone."""
        if kind.startswith("worker"):
            return len(self._idle_workers()) > 1
        if kind.startswith("coordinator"):
            return "coordinator" not in self.busy and self.coordinator_up_at is not None
        return True

    def _worker_kill(self) -> None:
        self._kill_worker(self.rng.choice(self._idle_workers()))

    def _worker_stop(self) -> None:
        self._stop_worker(self.rng.choice(self._idle_workers()))

    def _kill_worker(self, worker: Child) -> None:
        worker.kill()
        self.tally.worker_kills += 1
        self.busy.add(worker.name)
        delay = 0.0 if self.options.restart_at_once else self._pause_s(self.options.worker_pause_s)
        self._schedule(delay, f"restart {worker.name}", lambda: self._restart_worker(worker))

    def _restart_worker(self, worker: Child) -> None:
        worker.start()
        self.busy.discard(worker.name)

    def _stop_worker(self, worker: Child) -> None:
        worker.pause()
        self.tally.worker_stops += 1
        self.busy.add(worker.name)
        self._schedule(self._pause_s(self.options.worker_pause_s), f"resume {worker.name}",
                       lambda: self._resume(worker))

    def _resume(self, child: Child) -> None:
        child.resume()
        self.busy.discard(child.name)

    def _coordinator_kill(self) -> None:
        self.announced_before_kill = list(self.last_versions)
        self.coordinator.kill()
        self._note_ledger_digests()
        self.coordinator_up_at = None
        self.tally.coordinator_kills += 1
        self.busy.add("coordinator")
        self._schedule(self._pause_s(self.options.coordinator_pause_s), "restart the coordinator",
                       self._start_coordinator)

    def _coordinator_stop(self) -> None:
        self.coordinator.pause()
        self.tally.coordinator_stops += 1
        self.busy.add("coordinator")
        self._schedule(self._pause_s(self.options.coordinator_pause_s), "resume the coordinator",
                       lambda: self._resume(self.coordinator))

    def _proxy_cut(self) -> None:
        self.tally.connections_cut += self.proxy.cut()
        self.tally.proxy_cuts += 1

    def _proxy_refuse(self) -> None:
        self.proxy.refuse_for(self._pause_s(self.options.proxy_window_s))
        self.tally.proxy_refusals += 1

    def _proxy_delay(self) -> None:
        self.proxy.delay_for(self._pause_s(self.options.proxy_window_s), self.rng.uniform(0.01, self.options.proxy_delay_s))
        self.tally.proxy_delays += 1

    def _watch_processes(self) -> None:
        """Count and restart workers that exited on their own; count a coordinator that did."""
        for worker in self.workers:
            code = worker.exit_code()
            if code is not None and not worker.killed_by_driver:
                self.tally.workers_gave_up += 1
                self.tally.failures.append(f"{worker.name} exited with {code} on its own:\n{worker.log_tail()}")
                worker.start()
        code = self.coordinator.exit_code()
        if code is not None and not self.coordinator.killed_by_driver:
            self.tally.coordinator_crashes += 1
            self.tally.failures.append(f"the coordinator exited with {code} on its own:\n{self.coordinator.log_tail()}")
            self._start_coordinator()
        if "coordinator" in self.busy and self.coordinator.alive() and not self.coordinator.stopped \
                and self._coordinator_serving():
            self.busy.discard("coordinator")
        if self.coordinator.alive() and not self._coordinator_serving() \
                and time.monotonic() - self._started_at > START_TIMEOUT_S:
            raise RuntimeError(f"the coordinator did not serve within {START_TIMEOUT_S:g}s of its restart:\n"
                               f"{self.coordinator.log_tail()}")

    def poll_status(self) -> pb.GetStatusResponse | None:
        """GetStatus straight from the coordinator (one short attempt); checks versions never go back."""
        if not self.coordinator.alive() or self.coordinator.stopped or not self._coordinator_serving():
            return None
        try:
            status = self.client.status()
        except (grpc.RpcError, RetriesExhausted):
            return None
        self.tally.polls += 1
        versions = run_versions(status)
        if len(versions) != len(self.run_dirs):
            raise RuntimeError(f"GetStatus reports {len(versions)} runs: expected {len(self.run_dirs)}")
        for run, (version, before) in enumerate(zip(versions, self.announced_before_kill)):
            if version < before:
                self.tally.restart_regressions += 1
                self.tally.failures.append(f"the restarted coordinator serves version {version} of run {run}, "
                                           f"before the {before} it had announced")
        self.announced_before_kill = []
        for run, (version, last) in enumerate(zip(versions, self.last_versions)):
            if version < last:
                self.tally.status_regressions += 1
                self.tally.failures.append(f"GetStatus went back from version {last} to {version} (run {run})")
        self.last_versions = [max(version, last) for version, last in zip(versions, self.last_versions)]
        if not status.runs:  # a sweep's GetStatus has no digest per run: its pulls are checked against its ledger
            self._note_digest(0, status.version, status.param_sha256, "GetStatus")
        self.series.append((time.monotonic() - self.began, status.version, status.applied_tokens))
        return status

    def _note_ledger_digests(self) -> None:
        """Each run's ledger digest of the newest version seen of it, read from its state dir while the coordinator
        is down: `judge` checks the ledger still records it at the end (a sweep's GetStatus has no digest per run,
        so for a sweep this is what a version lost or rewritten by a restart is caught by)."""
        for run, run_dir in enumerate(self.run_dirs):
            version = self.last_versions[run]
            digest = ledger(run_dir).get(version) if version > 0 else None
            if digest:
                self._note_digest(run, version, digest, "the ledger at a coordinator SIGKILL")

    def _note_digest(self, run: int, version: int, digest: str, source: str) -> None:
        known = self.digests.setdefault((run, version), digest)
        if known != digest:
            self.tally.failures.append(f"{source} reports digest {digest[:16]} for version {version}, "
                                       f"{known[:16]} was reported before")

    def _gap(self) -> float:
        every = self.options.action_every_s
        return every if self.options.fixed_period else self.rng.expovariate(1.0 / every)

    def run_chaos(self, seconds: float, progress: Callable[[str], None], act: bool = True) -> None:
        """Actions every ~`action_every_s` for `seconds` (none without `act`), polling status and watching
        processes; with `max_faults`, it ends once that many were injected and undone."""
        end = time.monotonic() + seconds
        next_action = time.monotonic() + (0.0 if self.options.fixed_period else self._gap())
        next_poll = next_progress = time.monotonic()
        limit = self.options.max_faults
        while time.monotonic() < end:
            self._run_due_events()
            self._watch_processes()
            if act and limit and self.tally.faults >= limit and not self.events:
                return  # the chaos is over once every fault injected has been undone (restarts, SIGCONTs)
            now = time.monotonic()
            if act and now >= next_action and not (limit and self.tally.faults >= limit):
                self._chaos_action()
                next_action = now + self._gap()
            if now >= next_poll:
                self.poll_status()
                next_poll = now + POLL_INTERVAL_S
            if now >= next_progress:
                progress(self._progress_line(end - now))
                next_progress = now + PROGRESS_EVERY_S
            time.sleep(TICK_S)

    def _progress_line(self, left_s: float) -> str:
        t = self.tally
        return (f"{left_s:6.0f}s left  version {self.last_version}  faults {t.faults}  "
                f"worker kills {t.worker_kills} stops {t.worker_stops}  "
                f"coordinator kills {t.coordinator_kills} stops {t.coordinator_stops}  proxy cuts {t.proxy_cuts} "
                f"refusals {t.proxy_refusals} delays {t.proxy_delays}  gave up {t.workers_gave_up}")

    def applied_now(self, timeout_s: float = START_TIMEOUT_S) -> pb.GetStatusResponse:
        """GetStatus, retried until the coordinator answers (at most `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._run_due_events()
            self._watch_processes()
            status = self.poll_status()
            if status is not None:
                return status
            if time.monotonic() > deadline:
                raise RuntimeError(f"GetStatus unanswered for {timeout_s:g}s")
            time.sleep(TICK_S)

    def run_goodput(self, progress: Callable[[str], None]) -> None:
        """`goodput_cycles` × (a fault-free phase, a chaos phase, a gap), each phase's applied tokens measured."""
        o = self.options
        for cycle in range(o.goodput_cycles):
            for kind in ("calm", "chaos"):
                first, faults = self.applied_now(), self.tally.faults
                started = time.monotonic() - self.began
                self.run_chaos(o.phase_s, lambda line: progress(f"cycle {cycle + 1} {kind}: {line}"),
                               act=kind == "chaos")
                last = self.applied_now()
                self.windows.append(Window(kind, cycle, started, time.monotonic() - self.began,
                                           last.applied_tokens - first.applied_tokens, last.version - first.version,
                                           self.tally.faults - faults))
                progress(f"cycle {cycle + 1} {kind}: {self.windows[-1].tokens} tokens applied in "
                         f"{self.windows[-1].end_s - started:.1f}s, {self.windows[-1].versions} versions")
            self.run_chaos(o.gap_s, progress, act=False)

    def calm(self) -> None:
        """End the chaos: run every pending restart and resume at once, and wait for the coordinator."""
        while self.events:
            _, _, _, action = heapq.heappop(self.events)
            action()
        self.proxy.refuse_for(0.0)
        self.proxy.delay_for(0.0, 0.0)
        self._watch_processes()
        self._await_coordinator(time.monotonic() + START_TIMEOUT_S)

    def settle(self) -> dict[str, tuple[int, int, str]]:
        """Train until every worker pulled a version of its run newer than the newest seen of that run so far; per
        worker name, (run, version, digest) of its newest pull. Raises RuntimeError after `settle_s`."""
        deadline = time.monotonic() + self.options.settle_s
        targets: list[int] = []
        while time.monotonic() < deadline:
            self._watch_processes()
            status = self.poll_status()
            if status is not None and not targets:
                targets = [version + 1 for version in run_versions(status)]
            if status is not None:
                pulls = self._newest_pulls(status)
                if all(w.name in pulls and pulls[w.name][1] >= targets[pulls[w.name][0]] for w in self.workers):
                    return pulls
            time.sleep(POLL_INTERVAL_S)
        raise RuntimeError(f"not every worker pulled a version >= {targets} of its run within "
                           f"{self.options.settle_s:g}s")

    def _newest_pulls(self, status: pb.GetStatusResponse) -> dict[str, tuple[int, int, str]]:
        """Per active worker's name: (run, version, digest) of its newest pull that reached its run's metrics table
        (a membership's id is one run's: an active one's rows are in the run it trains)."""
        names = {w.worker_id: w.name for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE}
        newest: dict[str, tuple[int, int, str]] = {}
        for run, run_dir in enumerate(self.run_dirs):
            for row in pull_rows(run_dir):
                name = names.get(row["worker_id"])
                if name is not None and row["version"] >= newest.get(name, (run, -1, ""))[1]:
                    newest[name] = (run, row["version"], row["param_sha256"])
        return newest

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM the workers (they leave) and then the coordinator; each one's exit code. Idempotent."""
        if self._stopped:
            return {}
        self._stopped = True
        codes = {w.name: w.terminate() for w in self.workers}
        codes["coordinator"] = self.coordinator.terminate()
        self.client.close()
        self.proxy.close()
        return codes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def run_versions(status: pb.GetStatusResponse) -> list[int]:
    """Each run's version: a sweep's from its RunSummaries, a single run's its own."""
    return [run.version for run in status.runs] if status.runs else [status.version]


def pull_rows(state_dir: Path) -> list[dict[str, Any]]:
    """Every metric row that records a pull (a non-empty param_sha256), oldest first."""
    store = StateStore.open_read_only(state_dir)
    rows: list[dict[str, Any]] = []
    try:
        since = 0
        while True:
            page = store.metrics_since(since, 10_000)
            if not page:
                return rows
            rows += [row for row in page if row["param_sha256"]]
            since = page[-1]["rowid"]
    finally:
        store.close()


def ledger(state_dir: Path) -> dict[int, str]:
    """The coordinator's digest of every committed version after 0, from its rounds table (round v made v + 1)."""
    store = StateStore.open_read_only(state_dir)
    try:
        rounds = store.recent_rounds(1 << 30)
    finally:
        store.close()
    return {r.version + 1: r.param_sha256 for r in rounds}


def moves(run_dirs: list[Path]) -> int:
    """How many memberships a sweep moved to another run (its runs' "reassign" events)."""
    count = 0
    for run_dir in run_dirs:
        store = StateStore.open_read_only(run_dir)
        try:
            count += len(store.events("reassign"))
        finally:
            store.close()
    return count


@dataclass
class Verdict:
    """The soak's figures and checks; `ok` when every check holds."""

    minutes: float
    seed: int
    workers: int
    runs: int
    moves: int
    rounds_completed: int
    tally: Tally
    versions_monotonic: bool
    committed_versions_lost: int
    digest_mismatches: int
    replicas_checked: int
    replicas_identical: bool
    final_pulls: dict[str, tuple[int, int, str]]
    exit_codes: dict[str, int | None]
    windows: list[Window] = field(default_factory=list)
    load_average: tuple[float, float] = (0.0, 0.0)

    @property
    def goodput(self) -> float | None:
        """Tokens applied during the chaos phases / during the fault-free ones (None without a goodput soak)."""
        calm = sum(w.tokens for w in self.windows if w.kind == "calm")
        chaos = sum(w.tokens for w in self.windows if w.kind == "chaos")
        return chaos / calm if calm else None

    @property
    def ok(self) -> bool:
        return (self.versions_monotonic and self.committed_versions_lost == 0 and self.digest_mismatches == 0
                and self.replicas_identical and self.tally.workers_gave_up == 0 and self.tally.coordinator_crashes == 0
                and not self.tally.failures and self.rounds_completed > 0)

    def table(self) -> str:
        t = self.tally
        rows = [
            ("minutes of chaos (seed)", f"{self.minutes:g} ({self.seed})" if not self.windows else
             f"{sum(w.end_s - w.start_s for w in self.windows if w.kind == 'chaos') / 60:.1f} ({self.seed})"),
            ("workers", self.workers),
            *([("runs of the sweep (workers moved between them)", f"{self.runs} ({self.moves})")]
              if self.runs > 1 else []),
            ("faults injected", t.faults),
            ("rounds completed", self.rounds_completed),
            ("coordinator restarts after SIGKILL", t.coordinator_kills),
            ("coordinator SIGSTOP/SIGCONT", t.coordinator_stops),
            ("worker SIGKILLs (restarted)", t.worker_kills),
            ("worker SIGSTOP/SIGCONT", t.worker_stops),
            ("proxy cuts (connections cut)", f"{t.proxy_cuts} ({t.connections_cut})"),
            ("proxy refusal windows (connections refused)", f"{t.proxy_refusals} ({t.connections_refused})"),
            ("proxy delay windows", t.proxy_delays),
            ("GetStatus polls", t.polls),
            ("versions monotonic", "yes" if self.versions_monotonic else "NO"),
            ("committed versions lost across restarts", self.committed_versions_lost),
            ("pulls whose digest differs from the ledger", self.digest_mismatches),
            ("replicas bit-identical at the end", f"{'yes' if self.replicas_identical else 'NO'} "
                                                  f"({self.replicas_checked} workers)"),
            ("workers that gave up", t.workers_gave_up),
            ("coordinator exits on its own", t.coordinator_crashes),
            ("load average (1 min) at the start, at the end",
             f"{self.load_average[0]:.1f}, {self.load_average[1]:.1f}"),
            ("verdict", "PASS" if self.ok else "FAIL"),
        ]
        if self.goodput is not None:
            rows.insert(-1, ("goodput (applied tokens, chaos ÷ fault-free)", f"{self.goodput:.3f}"))
        lines = ["| check | value |", "| --- | --- |"] + [f"| {name} | {value} |" for name, value in rows]
        return "\n".join(lines)

    def goodput_table(self) -> str:
        """Per cycle: the tokens applied in its fault-free and its chaos phase, their ratio and the faults."""
        lines = ["| cycle | fault-free: tokens (versions) | chaos: tokens (versions) | faults | ratio |",
                 "| --- | --- | --- | --- | --- |"]
        for cycle in sorted({w.cycle for w in self.windows}):
            calm = [w for w in self.windows if w.cycle == cycle and w.kind == "calm"]
            chaos = [w for w in self.windows if w.cycle == cycle and w.kind == "chaos"]
            if not (calm and chaos):
                continue
            ratio = chaos[0].tokens / calm[0].tokens if calm[0].tokens else float("nan")
            lines.append(f"| {cycle + 1} | {calm[0].tokens:,} ({calm[0].versions}) | {chaos[0].tokens:,} "
                         f"({chaos[0].versions}) | {chaos[0].faults} | {ratio:.3f} |")
        calm = [w for w in self.windows if w.kind == "calm"]
        chaos = [w for w in self.windows if w.kind == "chaos"]
        lines.append(f"| all | {sum(w.tokens for w in calm):,} ({sum(w.versions for w in calm)}) | "
                     f"{sum(w.tokens for w in chaos):,} ({sum(w.versions for w in chaos)}) | "
                     f"{sum(w.faults for w in chaos)} | {self.goodput or float('nan'):.3f} |")
        return "\n".join(lines)


def judge(soak: Soak, final_pulls: dict[str, tuple[int, int, str]], exit_codes: dict[str, int | None]) -> Verdict:
    """Check each run's ledger and every pull the workers reported against each other and the polls."""
    soak.tally.connections_refused = soak.proxy.refused
    ledgers = [ledger(run_dir) for run_dir in soak.run_dirs]
    contiguous = all(sorted(digests) == list(range(1, len(digests) + 1)) for digests in ledgers)
    for (run, version), digest in soak.digests.items():
        if version in ledgers[run] and ledgers[run][version] != digest:
            soak.tally.failures.append(f"digest {digest[:16]} was seen for version {version} of run {run} (GetStatus, "
                                       f"or the ledger at a SIGKILL); the ledger records {ledgers[run][version][:16]}")
    lost = sum(1 for (run, v), d in soak.digests.items() if v > 0 and ledgers[run].get(v) != d)
    lost += soak.tally.restart_regressions
    mismatches = 0
    for run, run_dir in enumerate(soak.run_dirs):
        first_pull: dict[int, str] = {}  # a sweep's version 0, which no GetStatus digest names: its pulls agree
        for row in pull_rows(run_dir):
            version = row["version"]
            expected = ledgers[run].get(version) if version > 0 else \
                soak.digests.get((run, 0)) or first_pull.setdefault(version, row["param_sha256"])
            if expected is not None and row["param_sha256"] != expected:
                mismatches += 1
                if mismatches <= 5:
                    soak.tally.failures.append(f"{row['worker_id']} pulled version {version} of run {run} with "
                                               f"digest {row['param_sha256'][:16]}; the coordinator's is {expected[:16]}")
    identical = bool(final_pulls) and all(ledgers[run].get(v) == d for run, v, d in final_pulls.values())
    return Verdict(
        minutes=soak.options.minutes, seed=soak.options.seed, workers=soak.options.workers,
        runs=len(soak.run_dirs), moves=moves(soak.run_dirs) if len(soak.run_dirs) > 1 else 0,
        rounds_completed=sum(len(digests) for digests in ledgers), tally=soak.tally,
        versions_monotonic=contiguous and soak.tally.status_regressions == 0,
        committed_versions_lost=lost, digest_mismatches=mismatches, replicas_checked=len(final_pulls),
        replicas_identical=identical, final_pulls=final_pulls, exit_codes=exit_codes, windows=list(soak.windows),
        load_average=(soak.load_at_start, os.getloadavg()[0]),
    )


def draw_goodput(ax: Any, windows: list[Window], series: list[tuple[float, int, int]],
                 faults: list[tuple[float, str]], title: str) -> None:
    """Applied tokens over the soak's time on `ax`, the chaos phases shaded and each worker SIGKILL marked."""
    if series:
        ax.plot([t for t, _, _ in series], [tokens / 1e6 for _, _, tokens in series], lw=1.2, color="C0",
                label="tokens applied to θ")
    for index, window in enumerate(w for w in windows if w.kind == "chaos"):
        ax.axvspan(window.start_s, window.end_s, color="C3", alpha=0.12, label="chaos phase" if index == 0 else None)
    kills = [t for t, kind in faults if kind == "worker_kill"]
    if kills:
        ax.plot(kills, [0.0] * len(kills), "|", color="C3", ms=12, label="worker SIGKILL (restarted at once)")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("applied tokens (millions)")
    ax.set_title(title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)


def plot_goodput(verdict: Verdict, series: list[tuple[float, int, int]], faults: list[tuple[float, str]],
                 path: Path) -> None:
    """`draw_goodput` of one soak as a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.2))
    draw_goodput(ax, verdict.windows, series, faults, f"goodput {verdict.goodput:.3f}: {verdict.workers} workers, "
                                                      f"{verdict.tally.worker_kills} SIGKILLs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> tuple[SoakOptions, Path | None, Path | None, Path | None]:
    """The command line, as validated SoakOptions (ValueError names the flag and value)."""
    defaults = SoakOptions()
    parser = argparse.ArgumentParser(prog="chaos_soak", description=__doc__.split("\n\n")[0])
    for name, value in asdict(defaults).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value, help=f"(default {value})")
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"(default {value})")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep logs and state here (default: a temp dir, "
                                                                      "removed when the soak passes)")
    parser.add_argument("--json", type=Path, default=None, help="also write the verdict here as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="with --goodput-cycles: the applied tokens over time "
                                                                  "as a PNG")
    args = parser.parse_args(argv)
    options = SoakOptions(**{name: getattr(args, name) for name in asdict(defaults)})
    return options, args.work_dir, args.json, args.plot


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print progress and the verdict's table; 0 when every check holds."""
    try:
        options, work_dir, json_path, plot_path = parse_args(argv)
    except ValueError as exc:
        print(f"chaos_soak: {exc}", file=sys.stderr)
        return 2
    work = work_dir or Path(tempfile.mkdtemp(prefix="rcswarm-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    soak = Soak(options, work)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    atexit.register(soak.stop_all)
    progress = lambda line: print(f"chaos_soak: {line}", flush=True)  # noqa: E731
    progress(f"work dir {work}; {options.workers} workers; {options.minutes:g} min; seed {options.seed}")
    try:
        soak.start()
        if options.goodput_cycles:
            soak.run_goodput(progress)
        else:
            soak.run_chaos(options.minutes * 60.0, progress)
        progress("chaos over; settling until every worker pulls a newer version")
        soak.calm()
        final_pulls = soak.settle()
        exit_codes = soak.stop_all()
    except KeyboardInterrupt:
        print("chaos_soak: interrupted; stopping child processes", file=sys.stderr)
        soak.stop_all()
        return 130
    except RuntimeError as exc:
        soak.stop_all()
        print(f"chaos_soak: FAIL: {exc}\nlogs in {work}", file=sys.stderr)
        return 1
    verdict = judge(soak, final_pulls, exit_codes)
    print(verdict.table(), flush=True)
    if verdict.windows:
        print(verdict.goodput_table(), flush=True)
        if plot_path is not None:
            plot_goodput(verdict, soak.series, soak.fault_times, plot_path)
    for failure in verdict.tally.failures:
        print(f"chaos_soak: {failure}", file=sys.stderr)
    if json_path is not None:
        extra = {"ok": verdict.ok, "goodput": verdict.goodput, "series": soak.series, "fault_times": soak.fault_times}
        json_path.write_text(json.dumps({**asdict(verdict), **extra}, indent=1, default=str))
    if verdict.ok and work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    elif not verdict.ok:
        print(f"chaos_soak: logs in {work}", file=sys.stderr)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
