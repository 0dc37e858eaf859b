"""Commands stop on SIGTERM/SIGINT through `StopSignal`, whose handler takes no lock (cli/signals.py). Before, each
handler called `Event.set` on the event the main thread waits on; a signal arriving while that thread held the event's
lock (entering or leaving `Event.wait`) deadlocked it, and a coordinator stopped by `timeout` (two signals) was once
seen hung, serving on (review of the Helm chart and deploy, 2026-11-28)."""

from __future__ import annotations

import os
import signal
import threading

from rcswarm.cli.signals import StopSignal


def test_the_handler_returns_while_the_event_lock_is_held_and_the_event_is_set_once_it_is_free() -> None:
    target = threading.Event()
    stop = StopSignal(target=target).install()
    returned = threading.Event()

    def signal_inside_wait() -> None:
        # What the interrupted main thread looks like: inside Event.wait, holding the event's lock (`_cond`).
        with stop._cond:
            stop.handle(signal.SIGTERM, None)
            returned.set()

    try:
        thread = threading.Thread(target=signal_inside_wait, daemon=True)
        thread.start()
        assert returned.wait(5.0), "the handler waited for the lock its own thread holds"
        thread.join(5.0)
        assert stop.wait(5.0) and target.wait(5.0) and stop.signum == signal.SIGTERM
    finally:
        stop.uninstall()


def test_a_real_signal_sets_it_and_uninstall_gives_the_earlier_handler_back() -> None:
    earlier = signal.getsignal(signal.SIGTERM)
    stop = StopSignal().install(signal.SIGTERM)
    try:
        assert signal.getsignal(signal.SIGTERM) == stop.handle
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5.0) and stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first's number
        assert stop.signum == signal.SIGTERM
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == earlier
    watchers = [t for t in threading.enumerate() if t.name == "stop-signal"]
    for watcher in watchers:
        watcher.join(5.0)
    assert not any(t.is_alive() for t in watchers), "the watcher thread outlived uninstall"


def test_a_second_signal_ends_a_command_that_asks_for_it_at_once(monkeypatch, capfd) -> None:
    """The Ray launcher's orderly stop reads the cluster (which may take its timeouts); a second Ctrl-C did nothing
    more. With `second_exits` it ends the process at once, status 128 + the signal's number."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    patient, hard = StopSignal(), StopSignal(second_exits=True)
    for stop in (patient, hard):
        stop.handle(signal.SIGINT, None)
        assert stop.is_set() and exits == []
    patient.handle(signal.SIGINT, None)
    assert exits == []
    hard.handle(signal.SIGINT, None)
    assert exits == [128 + signal.SIGINT]
    assert "SIGINT again: exiting now" in capfd.readouterr().err
