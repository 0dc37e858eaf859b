"""SIGKILL of a hivemind peer's main process alone (the OOM killer, `kill -9 PID`): its forked DHT and averager
processes, their p2pd and torch_shm_manager end within seconds (`hivemind_sync.end_when_orphaned`). Before (a review,
2026-11-29) they ran on for good, and the orphaned averager went on declaring the dead peer's state, so a live peer
never found itself alone and waited out its all-reduce timeouts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.hivemind import LOOPBACK
from tests.helpers.processes import logs_of, worker_env
from tests.helpers.specs import hivemind_spec, write_spec
from tests.helpers.waiting import wait_for

pytest.importorskip("hivemind")

# How long the children of a killed main process may take to end: a poll (1 s), the DHT's SIGTERM handler ending p2pd,
# at worst the grace before SIGKILL (5 s), on a loaded machine.
ORPHANS_END_S = 15.0


def descendants(pid: int) -> list[int]:
    """The pids of every process below `pid` (read from /proc/<pid>/task/*/children, recursively)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def running(pid: int) -> str:
    """The name of process `pid` while it runs ("" once it has exited, a zombie included)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return "" if stat[stat.rindex(")") + 2] in "ZX" else stat[stat.index("(") + 1:stat.rindex(")")]


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    """`python -m rcswarm.cli *args` in a session of its own, its output into `log`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rcswarm.cli", *args], env=worker_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def children_named(pid: int, expected: Counter[str]) -> dict[int, str]:
    """The processes below `pid` by pid with their names, once there are at least `expected` of each name ({} before)."""
    found = {child: running(child) for child in descendants(pid)}
    names = Counter(name.rstrip("0123456789.") for name in found.values())  # python3.11: python
    return found if names >= expected else {}


def kill_main_and_wait_for_children(proc: subprocess.Popen, expected: Counter[str]) -> None:
    """SIGKILL `proc` alone once at least `expected` of its children run (a count by process name), then assert they
    all end within ORPHANS_END_S; whatever still runs of its process group is killed afterwards."""
    try:
        children = wait_for(lambda: children_named(proc.pid, expected), 60, f"the processes {dict(expected)}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + ORPHANS_END_S
        while time.monotonic() < deadline and any(running(p) for p in children):
            time.sleep(0.2)
        left = {p: running(p) for p in children if running(p)}
        assert not left, (f"{ORPHANS_END_S:g} s after SIGKILL of pid {proc.pid} these of its children still run: "
                          f"{left}\n{logs_of([proc])}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its children are in its process group: any the fix left running
        except ProcessLookupError:
            pass


@pytest.mark.wide  # the worker's test below covers the DHT process too (about 10 s)
def test_the_processes_of_a_sigkilled_bootstrap_peer_end(tmp_path: Path, no_new_p2pd: None) -> None:
    maddrs = tmp_path / "maddrs.txt"
    dht = spawn(["dht", "--host-maddrs", LOOPBACK, "--maddrs-file", str(maddrs)], tmp_path / "dht.log")
    wait_for(lambda: maddrs.is_file() and maddrs.read_text().split(), 60, "the bootstrap peer")
    kill_main_and_wait_for_children(dht, Counter(python=1, p2pd=1))


def test_the_dht_averager_p2pd_and_shm_manager_of_a_sigkilled_worker_end(tmp_path: Path, no_new_p2pd: None) -> None:
    config = write_spec(hivemind_spec(run={"name": "orphans", "rounds": 100}), tmp_path / "run.toml")
    worker = spawn(["worker", "--backend", "hivemind", "--config", str(config), "--name", "w", "--threads", "1",
                    "--host-maddrs", LOOPBACK], tmp_path / "w.log")
    wait_for(lambda: "listening on" in worker.log_path.read_text(errors="replace") or worker.poll() is not None, 90,
             "the worker's hivemind peer")
    assert worker.poll() is None, logs_of([worker])
    # The DHT's and the averager's processes are forks of the worker (named as it is), p2pd the DHT's child.
    kill_main_and_wait_for_children(worker, Counter(python=2, p2pd=1, torch_shm_manag=1))


WATCH_AS_FORKSERVER = """
import sys, time
from rcswarm.worker import hivemind_sync as hs
hs.end_when_orphaned("test", int(sys.argv[1]), poll_s=0.1, grace_s=1.0)
print("watching", flush=True)
time.sleep(60)
"""


def test_a_process_whose_parent_is_not_its_starter_ends_only_once_the_starter_is_gone(tmp_path: Path) -> None:
    """A forkserver or spawn start: the hivemind process's parent is a server, not the process that started it, from
    its first moment. It watches whether the starter still runs; before, its parent differing read as the starter
    gone, and it ended at once."""
    starter = subprocess.Popen(["sleep", "60"])
    log = tmp_path / "watch.log"
    with open(log, "wb") as out:
        watched = subprocess.Popen([sys.executable, "-c", WATCH_AS_FORKSERVER, str(starter.pid)], env=worker_env(),
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "watching" in log.read_text() or watched.poll() is not None, 60, "the watch to begin")
        time.sleep(1.0)  # ten polls
        assert watched.poll() is None, f"it ended with its starter running:\n{log.read_text()}"
        starter.kill()
        starter.wait(timeout=10)  # reaped: a zombie starter still answers signal 0
        assert watched.wait(timeout=10) == -signal.SIGTERM, log.read_text()
    finally:
        for proc in (starter, watched):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
