"""Stopping a command on a signal without taking a lock in the signal handler.

Python runs a signal handler in the main thread between two bytecodes, possibly while that thread holds the lock of
the very Event the handler would set (inside `Event.wait`, entering or leaving it): `Event.set` from the handler then
waits for a lock its own thread holds, and the process hangs instead of stopping (a coordinator stopped by `timeout`,
which signals twice, was seen hung so, serving on). `StopSignal.handle` only writes one byte to a pipe; a watcher
thread reads it and sets the event (and the `target` event a command waits on, such as a worker's stop).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

_SIGNALLED, _UNINSTALLED = b"s", b"u"


class StopSignal(threading.Event):
    """Set by the first of the signals `install` routes to `handle`, whose number it keeps (`signum`), and sets
    `target` too. `handle` may run in a signal handler at any point of the main thread (it takes no lock once
    installed); `install` and `uninstall` are called by the main thread, once each."""

    signum = 0

    def __init__(self, target: threading.Event | None = None, second_exits: bool = False) -> None:
        super().__init__()
        self.target = target
        # A second signal ends the process at once (status 128 + its number), for a command whose orderly stop may
        # itself wait (the Ray launcher's report reads the cluster): the harder stop a second Ctrl-C asks for.
        self.second_exits = second_exits
        self._write_fd: int | None = None
        self._previous: dict[int, Callable[..., Any] | int | None] = {}

    def install(self, *signals: int) -> StopSignal:
        """Route `signals` to `handle` and start the watcher thread; the handlers they had are kept for `uninstall`."""
        read_fd, self._write_fd = os.pipe()
        threading.Thread(target=self._watch, args=(read_fd,), name="stop-signal", daemon=True).start()
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum: int, _frame: object) -> None:
        """The signal handler: note the first signal's number and wake the watcher (one byte, no lock)."""
        if self.signum and self.second_exits:
            os.write(2, f"\n{signal.Signals(signum).name} again: exiting now\n".encode())
            os._exit(128 + signum)
        if not self.signum:
            self.signum = signum
        if self._write_fd is None:  # not installed: called directly, not from a handler
            self._set_all()
            return
        os.write(self._write_fd, _SIGNALLED)

    def uninstall(self) -> None:
        """Give the signals their earlier handlers back and end the watcher."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._write_fd is not None:
            write_fd, self._write_fd = self._write_fd, None
            os.write(write_fd, _UNINSTALLED)
            os.close(write_fd)

    def _watch(self, read_fd: int) -> None:
        """The watcher thread: set the events at each signal's byte, until `uninstall` (or the pipe's end)."""
        try:
            while os.read(read_fd, 1) == _SIGNALLED:
                self._set_all()
        finally:
            os.close(read_fd)

    def _set_all(self) -> None:
        self.set()
        if self.target is not None:
            self.target.set()
