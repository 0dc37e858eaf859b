"""Hivemind soak: a peer-to-peer swarm on loopback whose peers are killed, stopped and restarted, then judged.

A bootstrap peer (`rcswarm dht`) and N `rcswarm worker --backend hivemind` processes (tiny lstm_lm, 32 × 4 windows,
int8, 5 inner steps, `run.rounds` = --rounds, the patient all-reduce timeouts of the agreement tests) train while a
driver with a seeded RNG takes one action every ~`--action-every-s` (exponential gaps): SIGKILL a peer (its DHT,
averager and p2pd: the whole process group) and start it again after 0.2 s-`--pause-s` (it loads the swarm's state
from the others); or SIGSTOP a peer and SIGCONT it after 0.2 s-`--pause-s` (its groupmates drop it after hivemind's
sender and reducer timeouts; it falls behind and re-syncs). One peer is always left alone. The chaos ends after
`--minutes`, after `--max-faults` actions, or once the swarm is within `--calm-rounds` of the last version, so that
every peer ends on the majority's state; then every peer runs to `run.rounds` and writes its final θ.

Checks: every peer finished (exit 0 at the last version); no peer gave up on its own; at the last version each
peer's drift from the others (`hivemind_sync.drift`, in units of one round's step), measured once the group settled
on one replica (`settled_drift`, `HivemindWorker._settle`), is within `hivemind.drift_tolerance`; every θ finite;
the loss fell. Reported: the largest |θ_a − θ_b| between two peers.

    python benchmarks/hivemind_soak.py --minutes 10 --peers 4 --rounds 400 --seed 1
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from rcswarm.config.runspec import RunSpec
from rcswarm.protos.wire import TOKEN_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_soak import Child  # noqa: E402 - a benchmark's sibling: the restartable child process

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
START_TIMEOUT_S = 180.0
TICK_S = 0.1
PROGRESS_EVERY_S = 15.0
VERSION = re.compile(r": version (\d+) \(group of (\d+)")


@dataclass(frozen=True)
class HivemindSoakOptions:
    minutes: float = 10.0
    peers: int = 4
    rounds: int = 400
    calm_rounds: int = 25
    seed: int = 0
    action_every_s: float = 15.0
    pause_s: float = 10.0
    max_faults: int = 0
    settle_s: float = 900.0

    def __post_init__(self) -> None:
        if not 2 <= self.peers <= 16:
            raise ValueError(f"--peers {self.peers}: expected 2..16")
        if not 0 < self.calm_rounds < self.rounds:
            raise ValueError(f"--calm-rounds {self.calm_rounds}, --rounds {self.rounds}: expected 0 < calm < rounds")
        for name in ("minutes", "action_every_s", "pause_s", "settle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected a number > 0")
        if self.max_faults < 0:
            raise ValueError(f"--max-faults {self.max_faults}: expected >= 0")

    def spec(self) -> RunSpec:
        return RunSpec.from_dict({
            "run": {"name": "hm-soak", "rounds": self.rounds, "workers": self.peers},
            "model": {"name": "lstm_lm", "preset": "tiny"},
            "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
            "inner": {"steps": 5, "lr": 1e-2},
            "sync": {"backend": "hivemind", "codec": "int8"},
            "hivemind": {"initial_allreduce_s": 160.0, "min_allreduce_s": 60.0},
        })


@dataclass
class HivemindTally:
    kills: int = 0
    stops: int = 0
    gave_up: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def faults(self) -> int:
        return self.kills + self.stops


class HivemindSoak:
    """The bootstrap peer, the workers and the driver's schedule (the driver's thread only)."""

    def __init__(self, options: HivemindSoakOptions, work: Path) -> None:
        self.options, self.work = options, work
        self.rng = random.Random(options.seed)
        self.tally = HivemindTally()
        self.config = work / "run.toml"
        self.config.write_text(options.spec().to_toml())
        self.env = {**os.environ, TOKEN_ENV: "unused", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        maddrs = work / "maddrs.txt"
        self.dht = Child("dht", [sys.executable, "-m", "rcswarm.cli", "dht", "--host-maddrs", LOOPBACK,
                                 "--maddrs-file", str(maddrs)], work / "dht.log", self.env)
        self.maddrs_file = maddrs
        self.peers: list[Child] = []
        self.events: list[tuple[float, int, Any]] = []
        self._seq = 0
        self.busy: set[str] = set()

    def start(self) -> None:
        self.dht.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.maddrs_file.exists() and self.maddrs_file.read_text().split()):
            if time.monotonic() > deadline or not self.dht.alive():
                raise RuntimeError(f"the bootstrap peer did not start:\n{self.dht.log_tail()}")
            time.sleep(TICK_S)
        maddrs = self.maddrs_file.read_text().split()
        for index in range(self.options.peers):
            name = f"p{index}"
            self.peers.append(Child(name, [
                sys.executable, "-m", "rcswarm.cli", "worker", "--backend", "hivemind", "--config", str(self.config),
                "--name", name, "--threads", "1", "--host-maddrs", LOOPBACK, "--initial-peers", *maddrs,
                "--out", str(self.work / name)], self.work / f"{name}.log", self.env))
        for peer in self.peers:
            peer.start()

    def version_of(self, peer: Child) -> int:
        versions = VERSION.findall(peer.log_tail(20000))
        return int(versions[-1][0]) if versions else 0

    def swarm_version(self) -> int:
        return max((self.version_of(p) for p in self.peers), default=0)

    def _schedule(self, delay_s: float, action: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (time.monotonic() + delay_s, self._seq, action))

    def _run_due(self) -> None:
        while self.events and self.events[0][0] <= time.monotonic():
            heapq.heappop(self.events)[2]()

    def _watch(self, finishing: bool = False) -> None:
        for peer in self.peers:
            code = peer.exit_code()
            if code is None or peer.killed_by_driver:
                continue
            if finishing and code == 0:
                continue
            if code != 0 or self.version_of(peer) < self.options.rounds:
                self.tally.gave_up += 1
                self.tally.failures.append(f"{peer.name} exited with {code} on its own:\n{peer.log_tail()}")
                peer.start()

    def _act(self) -> None:
        idle = [p for p in self.peers if p.name not in self.busy and p.alive()]
        if len(idle) <= 1:
            return
        peer = self.rng.choice(idle)
        self.busy.add(peer.name)
        pause = self.rng.uniform(0.2, self.options.pause_s)
        if self.rng.random() < 0.5:
            peer.kill()
            self.tally.kills += 1
            self._schedule(pause, lambda: (peer.start(), self.busy.discard(peer.name)))
        else:
            peer.pause()
            self.tally.stops += 1
            self._schedule(pause, lambda: (peer.resume(), self.busy.discard(peer.name)))

    def run_chaos(self, progress: Any) -> None:
        o = self.options
        end = time.monotonic() + o.minutes * 60.0
        next_action = time.monotonic() + self.rng.expovariate(1.0 / o.action_every_s)
        next_progress = time.monotonic()
        while time.monotonic() < end and self.swarm_version() < o.rounds - o.calm_rounds:
            if o.max_faults and self.tally.faults >= o.max_faults:
                break
            self._run_due()
            self._watch()
            now = time.monotonic()
            if now >= next_action:
                self._act()
                next_action = now + self.rng.expovariate(1.0 / o.action_every_s)
            if now >= next_progress:
                progress(f"{end - now:5.0f}s left  version {self.swarm_version()} of {o.rounds}  kills "
                         f"{self.tally.kills} stops {self.tally.stops}  gave up {self.tally.gave_up}")
                next_progress = now + PROGRESS_EVERY_S
            time.sleep(TICK_S)

    def finish(self, progress: Any) -> None:
        """Run every pending restart and resume now, then wait until every peer exits at the last version."""
        while self.events:
            heapq.heappop(self.events)[2]()
        deadline = time.monotonic() + self.options.settle_s
        next_progress = time.monotonic()
        while any(p.alive() for p in self.peers):
            self._watch(finishing=True)
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every peer finished within {self.options.settle_s:g}s")
            if time.monotonic() >= next_progress:
                progress(f"settling: versions {[self.version_of(p) for p in self.peers]}")
                next_progress = time.monotonic() + PROGRESS_EVERY_S
            time.sleep(TICK_S)

    def stop_all(self) -> None:
        for child in [*self.peers, self.dht]:
            child.terminate(grace_s=20.0)


@dataclass
class HivemindVerdict:
    peers: int
    rounds: int
    seed: int
    tally: HivemindTally
    finished: dict[str, int]
    final_drift: dict[str, float]
    max_abs_diff: float
    finite: bool
    first_loss: float
    last_loss: float
    drift_tolerance: float
    load_average: tuple[float, float]

    @property
    def ok(self) -> bool:
        return (all(v == self.rounds for v in self.finished.values()) and len(self.finished) == self.peers
                and all(d <= self.drift_tolerance for d in self.final_drift.values()) and self.finite
                and self.tally.gave_up == 0 and self.last_loss < self.first_loss)

    def table(self) -> str:
        rows = [
            ("peers (seed)", f"{self.peers} ({self.seed})"),
            ("rounds", self.rounds),
            ("faults injected: SIGKILL + restart, SIGSTOP + SIGCONT",
             f"{self.tally.faults}: {self.tally.kills}, {self.tally.stops}"),
            ("peers that finished at the last version", f"{sum(v == self.rounds for v in self.finished.values())} "
                                                        f"of {self.peers}"),
            ("peers that gave up on their own", self.tally.gave_up),
            ("largest drift at the last version (tolerance)",
             f"{max(self.final_drift.values(), default=float('nan')):.3g} ({self.drift_tolerance:g})"),
            ("largest |θ_a − θ_b| between two peers", f"{self.max_abs_diff:.3g}"),
            ("every θ finite", "yes" if self.finite else "NO"),
            ("mean loss of the first and the last round", f"{self.first_loss:.3f} → {self.last_loss:.3f}"),
            ("load average (1 min) at the start, at the end",
             f"{self.load_average[0]:.1f}, {self.load_average[1]:.1f}"),
            ("verdict", "PASS" if self.ok else "FAIL"),
        ]
        return "\n".join(["| check | value |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows])


def judge(soak: HivemindSoak, load_at_start: float) -> HivemindVerdict:
    o = soak.options
    finished, drifts, params, losses = {}, {}, {}, []
    for peer in soak.peers:
        out = soak.work / peer.name
        try:
            summary = json.loads((out / "summary.json").read_text())
            params[peer.name] = load_file(str(out / "final.safetensors"))
        except (OSError, ValueError) as exc:
            soak.tally.failures.append(f"{peer.name}: no final state ({exc})")
            continue
        finished[peer.name] = summary["version"]
        history = summary["history"]
        if history:
            drifts[peer.name] = float(history[-1].get("settled_drift", history[-1]["drift"]))
            losses.append((history[0]["loss"], history[-1]["loss"]))
    names = sorted(params)
    worst = 0.0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            worst = max(worst, max(float((params[a][k] - params[b][k]).abs().max()) for k in params[a]))
    finite = all(torch.isfinite(t).all() for p in params.values() for t in p.values())
    first = sum(x for x, _ in losses) / max(len(losses), 1)
    last = sum(y for _, y in losses) / max(len(losses), 1)
    return HivemindVerdict(o.peers, o.rounds, o.seed, soak.tally, finished, drifts, worst, finite, first, last,
                           o.spec().hivemind.drift_tolerance, (load_at_start, os.getloadavg()[0]))


def main(argv: list[str] | None = None) -> int:
    defaults = HivemindSoakOptions()
    parser = argparse.ArgumentParser(prog="hivemind_soak", description=__doc__.split("\n\n")[0])
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help=f"(default {value})")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep logs and outputs here")
    parser.add_argument("--json", type=Path, default=None, help="also write the verdict here as JSON")
    args = parser.parse_args(argv)
    try:
        options = HivemindSoakOptions(**{name: getattr(args, name) for name in asdict(defaults)})
    except ValueError as exc:
        print(f"hivemind_soak: {exc}", file=sys.stderr)
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rcswarm-hm-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    soak = HivemindSoak(options, work)
    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    progress = lambda line: print(f"hivemind_soak: {line}", flush=True)  # noqa: E731
    load_at_start = os.getloadavg()[0]
    progress(f"work dir {work}; {options.peers} peers; {options.rounds} rounds; seed {options.seed}")
    try:
        soak.start()
        soak.run_chaos(progress)
        progress("chaos over; every peer runs to the last version")
        soak.finish(progress)
    except KeyboardInterrupt:
        soak.stop_all()
        return 130
    except RuntimeError as exc:
        soak.stop_all()
        print(f"hivemind_soak: FAIL: {exc}\nlogs in {work}", file=sys.stderr)
        return 1
    soak.stop_all()
    verdict = judge(soak, load_at_start)
    print(verdict.table(), flush=True)
    for failure in verdict.tally.failures:
        print(f"hivemind_soak: {failure}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({**asdict(verdict), "ok": verdict.ok}, indent=1, default=str))
    if verdict.ok and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    elif not verdict.ok:
        print(f"hivemind_soak: logs in {work}", file=sys.stderr)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
