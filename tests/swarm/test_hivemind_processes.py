"""A hivemind peer's own processes (its DHT and averager): a command the worker writes in two parts reaches them
whole (hivemind#660, issue #31), a worker whose DHT process died exits instead of training on alone, and the averager
renews torch's thread pool before its threads start (the first all-reduce's "Invalid thread pool!")."""

from __future__ import annotations

import glob
import logging
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rcswarm.worker import hivemind_sync as hs
from rcswarm.worker import startup
from rcswarm.worker.hivemind_worker import HivemindWorker
from tests.helpers.specs import hivemind_spec
from tests.helpers.waiting import wait_for

pytest.importorskip("hivemind")

from hivemind.utils import get_dht_time  # noqa: E402

HEADER_BYTES = 4  # multiprocessing.Connection's length prefix
PAUSE_S = 0.5


def pause_after_each_header(pipe: Any) -> None:
    """Make `pipe` (a process's command pipe, the writing end) stop between a message's header and its body, as a
    worker paused (SIGSTOP) or descheduled mid-send does: Connection writes a message over 16 KiB in these two
    parts, and the reader used to fail on the second (EAGAIN) and die on the next."""
    send = pipe._send

    def send_then_pause(buf: Any, write: Any = os.write) -> None:
        send(buf, write)
        if len(buf) == HEADER_BYTES:
            time.sleep(PAUSE_S)

    pipe._send = send_then_pause


def test_a_dht_command_split_by_a_pause_reaches_the_dht_whole(no_new_p2pd: None) -> None:
    dht = hs.start_dht(hs.HivemindOptions.loopback())
    try:
        pause_after_each_header(dht._outer_pipe)
        value = b"r" * 40_000  # over 16 KiB: header and body are two writes
        for attempt in range(3):
            stored = dht.store(f"probe-{attempt}", value, get_dht_time() + 60, return_future=True)
            assert stored.result(timeout=30) is True, "the DHT refused or lost a command sent in two parts"
        found = dht.get("probe-2", latest=True, return_future=True).result(timeout=30)
        assert found is not None and found.value == value
        assert dht.is_alive()
    finally:
        dht.shutdown()


class DHTKilledAtVersionOne(HivemindWorker):
    """The real hivemind worker, whose DHT process is killed (as by the OOM killer) before its second round."""

    def _round(self) -> None:
        if self.version == 1 and self.peer.dht.is_alive():
            os.kill(self.peer.dht.pid, signal.SIGKILL)
            self.peer.dht.join(timeout=10)
        super()._round()


def test_a_worker_whose_dht_process_died_exits_for_its_supervisor(no_new_p2pd: None, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # Short all-reduce timeouts: alone, its first round waits for a group that never forms. Built in a process 1,000 s
    # old, as this test's is late in a suite: the first matchmaking window is a fraction of the worker's own
    # start-up, not of its host process's age (it was, and this test took 204 s in the default suite).
    monkeypatch.setattr(startup, "process_age_s", lambda: 1000.0)
    spec = hivemind_spec(run={"name": "hm", "rounds": 5}, hivemind={"initial_allreduce_s": 2.0, "min_allreduce_s": 1.0})
    worker = DHTKilledAtVersionOne(spec, hs.HivemindOptions.loopback(matchmaking_s=1.0), name="alone")
    with caplog.at_level(logging.INFO):
        code = worker.run()
    assert code == 1 and worker.version == 1
    ready_s, window_s = map(float, re.search(r"alone: ready ([\d.]+)s after its start; first matchmaking window "
                                             r"([\d.]+)s", caplog.text).groups())
    assert ready_s < 60.0 and window_s < 20.0, caplog.text  # from the process's age: 1,000 s and 300 s
    assert "alone leaves the swarm at version 1: its hivemind DHT process" in caplog.text
    assert "exited with code -9" in caplog.text


def nonblocking(pid: int, fd: int) -> bool:
    """Whether process `pid`'s file descriptor `fd` is in non-blocking mode (its flags in /proc, octal)."""
    for line in open(f"/proc/{pid}/fdinfo/{fd}").read().splitlines():
        if line.startswith("flags:"):
            return bool(int(line.split()[1], 8) & os.O_NONBLOCK)
    raise AssertionError(f"no flags in /proc/{pid}/fdinfo/{fd}")


def test_the_dht_and_averager_processes_read_their_commands_blocking(no_new_p2pd: None) -> None:
    state = ({"run": "b", "version": 0}, [])
    peer = hs.HivemindPeer("b", [(8,)], "fp32", 256, hs.HivemindOptions.loopback(), lambda: state)
    try:
        for process in (peer.dht, peer.averager):
            assert not nonblocking(process.pid, process._inner_pipe.fileno()), type(process).__name__
        assert peer.failure() == ""
    finally:
        peer.shutdown()


def test_the_averager_renews_torchs_thread_pool_in_its_own_process_before_its_threads(
        no_new_p2pd: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`renew_torch_thread_pool` runs in the averager's process (forked from this one, which used torch's pool) while
    that process has one thread. The race it closes, a second thread's first parallel op meeting torch's half-replaced
    pool ("Invalid thread pool!" in a compressing executor thread of a first all-reduce, docs/RELIABILITY.md), did not
    happen on demand here (0 of 200 forked children with 16 threads starting together), so this checks where and
    when the renewal runs."""
    marker = tmp_path / "renewed"
    renew = hs.renew_torch_thread_pool

    def renew_and_mark() -> None:
        renew()
        marker.write_text(f"{os.getpid()} {threading.active_count()}")

    monkeypatch.setattr(hs, "renew_torch_thread_pool", renew_and_mark)
    state = ({"run": "t", "version": 0}, [])
    peer = hs.HivemindPeer("t", [(8,)], "fp32", 256, hs.HivemindOptions.loopback(), lambda: state)
    try:
        pid, threads = (int(word) for word in marker.read_text().split())
        assert pid == peer.averager.pid != os.getpid()
        assert threads == 1
    finally:
        peer.shutdown()


def test_a_peer_that_shuts_down_leaves_no_socket_files(no_new_p2pd: None) -> None:
    """The DHT's p2pd, its client and the averager's replica of it each listen on a Unix socket in the temporary
    directory; hivemind left the averager's (one file per peer that ever ran: CI's machine held a hundred)."""
    pattern = str(Path(tempfile.gettempdir()) / "hivemind-*.sock")
    before = set(glob.glob(pattern))
    state = ({"run": "s", "version": 0}, [])
    peer = hs.HivemindPeer("s", [(8,)], "fp32", 256, hs.HivemindOptions.loopback(), lambda: state)
    try:
        ours = set(glob.glob(pattern)) - before
        assert ours, "no socket of its own while it runs"
    finally:
        peer.shutdown()
    wait_for(lambda: not ours & set(glob.glob(pattern)), 10.0, f"the sockets {sorted(ours)} removed")
