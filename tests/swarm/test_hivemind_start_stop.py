"""The worker's stop during its hivemind peer's start is seen within a poll (STOP_POLL_S), not when the phase ends: in
the DHT's start (the half-started DHT terminated with its p2pd at once, `_DHT.shutdown`), in the check of the initial
peers (their pings waited for in slices) and in the averager's start. An initial peer whose DHT process is stopped
(SIGSTOP; its p2pd still answers) makes the first two slow for real: the DHT's bootstrap waits 3 s for its ping, the
check 10 s; the averager's start is made endless in its forked process."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rcswarm.worker import hivemind_sync as hs
from tests.helpers.hivemind import P2PD_TAG_ENV, p2pd_pids
from tests.helpers.waiting import in_thread, timed, wait_for

pytest.importorskip("hivemind")

STOPPED_WITHIN_S = 1.5  # from the stop to PeerStopped, the DHT shut down (before: the phase's end, 3 s and 10 s)


@pytest.fixture
def silent_peer(no_new_p2pd: None) -> Iterator[tuple[hs.hivemind.DHT, Callable[[], None]]]:
    """A DHT to give as the initial peer, and what makes it silent: its process stopped (SIGSTOP), its p2pd running."""
    peer = hs.start_dht(hs.HivemindOptions.loopback())
    try:
        yield peer, lambda: os.kill(peer.pid, signal.SIGSTOP)
    finally:
        os.kill(peer.pid, signal.SIGCONT)
        peer.shutdown()


def stopped_within(call: Callable[[], Any], set_stop: Callable[[], float], bound_s: float = 30.0) -> tuple[float, Any]:
    """(seconds from `set_stop()`, which sets the stop and returns when, to the end of `call()` on another thread,
    what it raised)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - the outcome the test checks
            outcome["error"] = exc
        outcome["ended"] = time.monotonic()

    thread = in_thread(run)
    stopped_at = set_stop()
    thread.join(bound_s)
    assert not thread.is_alive(), f"still running {bound_s:g} s after the stop"
    return outcome["ended"] - stopped_at, outcome.get("error")


def test_a_stop_during_the_dhts_start_ends_it_at_once(silent_peer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DHT's bootstrap pings a silent initial peer (3 s); the stop comes once its p2pd runs. The DHT's process and
    its p2pd end with the start (before: the start's failure was waited for, and the stop seen after it)."""
    peer, silence = silent_peer
    started: list[tuple[int, str, Any]] = []
    monkeypatch.setattr(hs, "_STARTED", started)
    options = hs.HivemindOptions.loopback(initial_peers=[str(a) for a in peer.get_visible_maddrs()])
    silence()
    tag, before = os.environ[P2PD_TAG_ENV], p2pd_pids(os.environ[P2PD_TAG_ENV])
    stop = threading.Event()

    def stop_once_p2pd_runs() -> float:
        wait_for(lambda: p2pd_pids(tag) - before, 30, "the starting DHT's p2pd")
        stop.set()
        return time.monotonic()

    seconds, error = stopped_within(lambda: hs.start_dht(options, stop), stop_once_p2pd_runs)
    assert seconds < STOPPED_WITHIN_S, f"{error!r} {seconds:.2f} s after the stop"
    assert isinstance(error, hs.PeerStopped) and "during its start" in str(error), repr(error)
    (_, _, dht), = started
    assert not dht.is_alive()
    wait_for(lambda: p2pd_pids(tag) == before, 2.0, "the half-started DHT's p2pd to exit with it")


def test_a_stop_during_the_check_of_the_initial_peers_ends_it_at_once(silent_peer: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer's DHT starts (its initial peer answers), then the initial peer falls silent and the check's ping
    waits (10 s); the stop comes half a second into it (before: seen after the ping's timeout)."""
    peer, silence = silent_peer
    options = hs.HivemindOptions.loopback(initial_peers=[str(a) for a in peer.get_visible_maddrs()])
    stop, checking = threading.Event(), threading.Event()
    start_dht = hs.start_dht

    def start_then_silence(*args: Any) -> Any:
        dht = start_dht(*args)
        silence()
        checking.set()
        return dht

    def stop_into_the_check() -> float:
        assert checking.wait(60), "the peer's DHT did not start"
        time.sleep(0.5)
        stop.set()
        return time.monotonic()

    monkeypatch.setattr(hs, "start_dht", start_then_silence)
    state = ({"run": "c", "version": 0}, [])
    seconds, error = stopped_within(
        lambda: hs.HivemindPeer("c", [(8,)], "fp32", 256, options, lambda: state, stop=stop), stop_into_the_check)
    assert seconds < STOPPED_WITHIN_S + hs.DHT_HANDLERS_S, f"{error!r} {seconds:.2f} s after the stop"
    assert isinstance(error, hs.PeerStopped) and "during a ping of an initial peer" in str(error), repr(error)


def test_a_stop_during_the_averagers_start_ends_it_at_once(no_new_p2pd: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The averager's process never says it is ready (its `run`, in the forked process, only sleeps); the stop comes
    half a second into its start: PeerStopped at once, the averager's process and the DHT's ended (before: the start
    was waited for, AVERAGER_START_S = 60 s)."""
    started: list[tuple[int, str, Any]] = []
    monkeypatch.setattr(hs, "_STARTED", started)
    monkeypatch.setattr(hs._StateAverager, "run", lambda self: time.sleep(120))
    stop = threading.Event()

    def stop_into_the_averagers_start() -> float:
        wait_for(lambda: any(kind == "averager" for _, kind, _ in started), 60, "the averager's process to start")
        time.sleep(0.5)
        stop.set()
        return time.monotonic()

    state = ({"run": "c", "version": 0}, [])
    seconds, error = stopped_within(
        lambda: hs.HivemindPeer("c", [(8,)], "fp32", 256, hs.HivemindOptions.loopback(), lambda: state, stop=stop),
        stop_into_the_averagers_start)
    assert seconds < STOPPED_WITHIN_S + hs.DHT_HANDLERS_S, f"{error!r} {seconds:.2f} s after the stop"
    assert isinstance(error, hs.PeerStopped) and "averager" in str(error), repr(error)
    assert [kind for _, kind, process in started if process.is_alive()] == []


def test_silent_initial_peers_cost_one_ping_timeout_together(no_new_p2pd: None) -> None:
    """Two initial peers fall silent (their p2pd stopped: SIGSTOP; not their DHT processes, which share hivemind's
    locks with this one) after the peer's DHT started: the check pings them at once, so it takes one ping's timeout,
    not one each (before: one after the other, 10 s each in the worker's start)."""
    silent = [hs.start_dht(hs.HivemindOptions.loopback()) for _ in range(2)]
    options = hs.HivemindOptions.loopback(initial_peers=[str(a) for peer in silent for a in peer.get_visible_maddrs()])
    dht = hs.start_dht(options)
    daemons = [pid for peer in silent for pid in hs.child_pids(peer.pid)]
    try:
        assert len(daemons) == 2, daemons
        for pid in daemons:
            os.kill(pid, signal.SIGSTOP)
        took = timed(lambda: hs.check_peer(dht, options, timeout_s=2.0))
        assert 1.9 < took < 3.5, f"{took:.2f} s"
    finally:
        for pid in daemons:
            os.kill(pid, signal.SIGCONT)
        for each in (dht, *silent):
            each.shutdown()
