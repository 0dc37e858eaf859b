"""Hivemind swarms of real processes on loopback for the tests under tests/swarm/: a bootstrap peer (`rcswarm dht`)
and `rcswarm worker --backend hivemind` peers (`swarm`), the check that no p2pd outlives its test (`no_new_p2pd`),
patient all-reduce timeouts, and the agreement of replicas."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.config.runspec import HivemindSection, RunSpec
from tests.helpers.processes import logs_of, worker_env
from tests.helpers.specs import write_spec
from tests.helpers.waiting import wait_for

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
RULES = HivemindSection()


P2PD_TAG_ENV = "RCSWARM_TEST_P2PD_TAG"


def p2pd_pids(tag: str) -> set[int]:
    """The running p2pd processes whose environment carries `tag` (those of one test: others' p2pd, of tests
    running beside it on the machine, do not count)."""
    pids, marker = set(), f"{P2PD_TAG_ENV}={tag}".encode()
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "p2pd" and marker in (comm.parent / "environ").read_bytes().split(b"\0"):
                pids.add(int(comm.parent.name))
        except OSError:
            continue
    return pids


@pytest.fixture
def no_new_p2pd(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fails the test when a p2pd it started is still running at its end: every process the test starts
    (workers, `rcswarm dht`, in-process peers) inherits a tag in its environment, and so do their p2pd.

    At its end it also resets hivemind's MPFuture backend in the suite's process. Its locks (`_update_lock`,
    SharedBytes') are shared with every hivemind process this one forks: a DHT process a test SIGKILLed between
    sending an answer and releasing the lock leaves it held, and the next test's DHT could never say it was ready (CI
    hung there for its whole 90 minutes; `start_dht` now gives up after DHT_START_S). Every peer of the test has been
    shut down by then, so no live future is broken."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(P2PD_TAG_ENV, tag)
    try:
        yield
        wait_for(lambda: not p2pd_pids(tag), 15.0, "the test's p2pd processes to exit")
    finally:
        from hivemind.utils import MPFuture

        MPFuture.reset_backend()


# Generous all-reduce timeouts (senders 40 s in the first round, 15 s after) for tests that check agreement,
# not drops: on this 2-core VM a fresh peer's averager sometimes stalls for seconds while the kernel pages
# its code back in (seen: a 35 s first all-reduce; 4 of 7 three-peer runs in a row dropped a peer or a
# part under the defaults' 15 s / 5 s). The wide stalled-peer and SIGKILL tests keep the defaults.
PATIENT = {"initial_allreduce_s": 160.0, "min_allreduce_s": 60.0}


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "rcswarm.cli", *args], env=worker_env(), stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


class Abandoned(Exception):
    """A scenario given up by its test (`Swarm.wait`'s `abandon`), with the peers' logs."""


class Swarm:
    """A bootstrap peer (`rcswarm dht`, mirroring into state/) and `rcswarm worker --backend hivemind` processes."""

    def __init__(self, tmp_path: Path, spec: RunSpec) -> None:
        self.tmp, self.config = tmp_path, write_spec(spec, tmp_path / "run.toml")
        self.procs: list[subprocess.Popen] = []
        maddrs = tmp_path / "maddrs.txt"
        self.dht = self._add(["dht", "--host-maddrs", LOOPBACK, "--maddrs-file", str(maddrs), "--config",
                              str(self.config), "--state-dir", str(tmp_path / "state"), "--poll-s", "0.5"], "dht")
        self.maddrs = wait_for(lambda: maddrs.is_file() and maddrs.read_text().split(), 60, "the bootstrap peer")

    def _add(self, args: list[str], name: str) -> subprocess.Popen:
        proc = _spawn(args, self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *extra: str, script: Path | None = None) -> subprocess.Popen:
        args = ["worker", "--backend", "hivemind", "--config", str(self.config), "--name", name, "--threads", "1",
                "--host-maddrs", LOOPBACK, "--initial-peers", *self.maddrs, "--out", str(self.tmp / name), *extra]
        if script is None:
            return self._add(args, name)
        proc = subprocess.Popen([sys.executable, str(script), *args[1:]], env=worker_env(), start_new_session=True,
                                stdout=open(self.tmp / f"{name}.log", "wb"), stderr=subprocess.STDOUT)
        proc.log_path = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def wait(self, procs: list[subprocess.Popen], timeout: float, abandon: Callable[[], bool] | None = None) -> None:
        """Wait for every one of `procs` to exit 0 within `timeout`; with `abandon`, checked every second meanwhile,
        raise Abandoned as soon as it says so."""
        deadline = time.monotonic() + timeout
        for proc in procs:
            while True:
                try:
                    proc.wait(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if abandon is not None and abandon():
                        raise Abandoned(logs_of(self.procs)) from None
                    if time.monotonic() >= deadline:
                        raise AssertionError(f"a peer did not finish in {timeout:.0f}s\n{logs_of(self.procs)}") from None
            assert proc.returncode == 0, logs_of(self.procs)

    def first_rounds_torn(self, names: list[str], torn_drift: float = 2 * RULES.drift_tolerance) -> bool:
        """Whether one of a peer's first two rounds averaged in less than the whole group of `names`, or tore (a drift
        above `torn_drift`, by default twice the tolerance: a part of the average missing): the known stall of a
        fresh swarm's first all-reduce on this VM (docs/RELIABILITY.md, "the three-peer test"), which leaves the
        stalled peer in a partial or torn first group or, tens of seconds late, outside the next round's group."""
        whole = len(names)
        for name in names:
            log = self.tmp / f"{name}.log"
            text = log.read_text(errors="replace") if log.is_file() else ""
            for group, drift in re.findall(r": version [12] \(group of (\d+), loss [^,]*, drift ([^)]*)\)", text):
                if int(group) < whole or float(drift) > torn_drift:
                    return True
        return False

    def summary(self, name: str) -> dict[str, Any]:
        return json.loads((self.tmp / name / "summary.json").read_text())

    def params(self, name: str) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(str(self.tmp / name / "final.safetensors"))

    def stop(self) -> None:
        """SIGTERM every peer still running (each stops its DHT, averager and p2pd), SIGKILL after 20 s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def swarm(tmp_path: Path, no_new_p2pd: None) -> Iterator[Any]:
    made: list[Swarm] = []

    def make(spec: RunSpec, subdir: str = "") -> Swarm:
        where = tmp_path / subdir if subdir else tmp_path
        where.mkdir(exist_ok=True)
        made.append(Swarm(where, spec))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def run_whole(make: Callable[..., Swarm], spec: RunSpec, names: list[str], timeout: float,
              torn_drift: float = 2 * RULES.drift_tolerance,
              worker_args: Callable[[int], Sequence[str]] = lambda attempt: ()) -> tuple[Swarm, list[subprocess.Popen]]:
    """Start the workers `names` in a swarm from `make` (the `swarm` fixture) and wait for them; when the known stall
    of a fresh swarm's first all-reduce strikes (`Swarm.first_rounds_torn` with `torn_drift`, checked while they
    run and at the end), start the scenario once more in a fresh swarm. A second occurrence, or any other failure,
    is the test's to fail. `worker_args(attempt)`: the workers' extra flags for that attempt (1 or 2), called once
    before it starts them (a fresh coordinator's address). Returns the swarm of the attempt that counts and its
    workers."""
    for attempt in (1, 2):
        peers = make(spec, f"attempt{attempt}")
        extra = worker_args(attempt)
        workers = [peers.worker(name, *extra) for name in names]
        def torn() -> bool:
            return attempt == 1 and peers.first_rounds_torn(names, torn_drift)

        try:
            peers.wait(workers, timeout=timeout, abandon=torn)
        except Abandoned:
            peers.stop()
            continue
        if attempt == 2 or not peers.first_rounds_torn(names, torn_drift):
            break
    return peers, workers


def assert_replicas_agree(swarm: Swarm, names: list[str], tolerance: float, drift: bool = True) -> float:
    """The largest |θ_a − θ_b| between the named peers' final parameters, asserted ≤ tolerance and finite;
    with `drift`, the drift each measured at its last version (against every peer; once the group settled on one
    replica, `settled_drift`) is within the re-sync tolerance."""
    first = swarm.params(names[0])
    worst = 0.0
    for name in names[1:]:
        other = swarm.params(name)
        assert other.keys() == first.keys()
        worst = max(worst, max(float((other[k] - first[k]).abs().max()) for k in first))
    assert all(torch.isfinite(t).all() for name in names for t in swarm.params(name).values())
    assert worst <= tolerance, f"replicas differ by {worst:.3g} > {tolerance:g}"
    drifts = {name: [h.get("settled_drift", h["drift"]) for h in swarm.summary(name)["history"]] for name in names}
    assert not drift or all(d[-1] <= RULES.drift_tolerance for d in drifts.values()), (
        f"drift per version {drifts} above {RULES.drift_tolerance:g} at the last version\n{logs_of(swarm.procs)}")
    return worst


# Replicas of one version: each peer applies the group's Δ̄ as its all-reduce delivered it (the
# reducers send each peer a compressed delta), so they differ by the codec's error (int8: up to
# absmax/254 of Δ̄ per element, times η (1 + μ) ≈ 1.3 per round, accumulated by the momentum).
# It grows about linearly with the rounds until the drift check re-syncs a peer. Measured on the
# tiny model with int8 (θ's rms 0.16): two peers, max 8e-4 after 3 rounds, 3.1e-3 after 16 (drift 0.087
# step); three peers (2/3 of each Δ̄ arrives compressed, against 1/2), 2.1e-3 after 5 rounds.
REPLICA_TOLERANCE_PER_ROUND = 8e-4


class ResyncDonors:
    """A HivemindPeer stand-in for `_resync`: its donors' states in the order `load_state` would ask them, each taken
    only when `accept` takes it (as `HivemindPeer.load_state` does)."""

    def __init__(self, *versions: int) -> None:
        self.states = [(v, [torch.full((2,), float(v)), torch.zeros(2)]) for v in versions]
        self.declared: list[tuple[float, bool]] = []

    def set_state_version(self, version: float, shareable: bool = True) -> None:
        self.declared.append((version, shareable))

    def load_state(self, names: Any, shapes: Any, timeout_s: float, accept: Any = None, stop: Any = None) -> Any:
        return next((s for s in self.states if accept is None or not accept(s)), None)
