"""Whether the Ray head a following launcher talks to is gone (`head_lost`), and the follower's watch on it (`HeadWatch`).

A driver whose Ray head dies (`ray stop --force` on it, the head machine lost) does not learn it from Ray in time: its
calls to the GCS wait, and after `gcs_rpc_server_reconnect_timeout_s` (60 s) Ray ends the process itself with its own
"Failed to connect to GCS within 60 seconds" line (status 1), the launcher's one line never printed. Ray's timeout is
not changed (its `_system_config` cannot be given to a driver that joins a running cluster, and a GCS that comes back
within it, KubeRay's GCS fault tolerance, is no loss); instead the follower runs each poll in a thread and, while one
waits more than a probe interval (or after one fails), opens a TCP connection to the GCS address: once nothing has
answered there for `unreachable_after_s`, it ends with `HEAD_LOST_STATUS` and one line saying what that means
(`head_lost_line`). A healthy cluster costs no probe: a poll that returns within the interval is not watched.

`head_lost` is pure (now, what the probes saw, the options) -> the reason or None, tested without Ray.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rcswarm.launch.actors import split_address

# The launcher's exit status when it lost its Ray head while following (docs/DEPLOY.md, "On Ray").
HEAD_LOST_STATUS = 3
UNREACHABLE_AFTER_S = 10.0  # a GCS that answers nothing for this long is gone (Ray waits 60 s, then exits itself)
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0

T = TypeVar("T")


@dataclass(frozen=True)
class HeadOptions:
    """Where the GCS is (HOST:PORT) and how long it may answer nothing before the follower gives up on it."""

    address: str
    unreachable_after_s: float = UNREACHABLE_AFTER_S
    probe_timeout_s: float = PROBE_TIMEOUT_S


@dataclass(frozen=True)
class Probes:
    """What the probes of the GCS address saw: since when they fail without a success between (monotonic seconds;
    None while the last one answered), how many failed so, and why the last one failed."""

    failing_since: float | None = None
    failed: int = 0
    problem: str = ""

    def seen(self, now: float, problem: str | None) -> Probes:
        """These probes and one more at `now` (`problem` None: it answered)."""
        if problem is None:
            return Probes()
        return Probes(self.failing_since if self.failing_since is not None else now, self.failed + 1, problem)


def head_lost(now: float, probes: Probes, options: HeadOptions) -> str | None:
    """Why the Ray head is gone (pure), or None: at least two probes in a row failed and the first of them is
    `unreachable_after_s` old. One failed probe, or failures for less long (a GCS restarting in place), are no loss."""
    if probes.failing_since is None or probes.failed < 2 or now - probes.failing_since < options.unreachable_after_s:
        return None
    return (f"the Ray head at {options.address} is unreachable (its GCS: {probes.problem}, for "
            f"{now - probes.failing_since:.0f}s)")


def probe(address: str, timeout_s: float) -> str | None:
    """Why a TCP connection to the GCS at HOST:PORT failed within `timeout_s`, or None when it was accepted."""
    target = split_address(address)
    if target is None:
        return None  # not a HOST:PORT: nothing to probe (the follower then relies on Ray alone)
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return None
    except OSError as exc:
        return "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()


class OnThread:
    """`call()` run on a daemon thread of its own, its answer or what it raised kept for the thread that waits on it
    (`running`, then `result`): a wait that a signal or a probe can end while the call stays inside Ray
    (`HeadWatch.run`, the launcher's start-up steps)."""

    def __init__(self, call: Callable[[], Any], name: str) -> None:
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._target, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _target(self, call: Callable[[], Any]) -> None:
        try:
            self._box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._box["error"] = exc

    def running(self, wait_s: float) -> bool:
        """Whether the call still runs after waiting up to `wait_s` seconds for it."""
        self._thread.join(wait_s)
        return self._thread.is_alive()

    @property
    def failed(self) -> bool:
        """Whether the call (ended) raised."""
        return "error" in self._box

    def result(self) -> Any:
        """The ended call's answer; what it raised is raised here."""
        if self.failed:
            raise self._box["error"]
        return self._box["value"]


class HeadLost(Exception):
    """The Ray head of a following launcher is gone (`head_lost`'s reason)."""


def head_lost_line(reason: str, namespace: str, coordinator: str, state_dir: str, command: list[str]) -> str:
    """The launcher's one line when its Ray head is gone (pure): the reason, what it means for the workers and the
    run, and the command that resumes it."""
    if state_dir:
        run = (f"the coordinator actor died with it, and its state dir {state_dir} on the head keeps the run, which it "
               "resumes from")
    else:
        run = f"the coordinator at {coordinator} is outside Ray and keeps the run (it evicts their memberships)"
    return (f"{reason}: the worker actors of namespace {namespace} and their supervisor go with the head, so the "
            f"workers stop training; {run}. Once the Ray head is back, resume with: {shlex.join(command)}")


class HeadWatch:
    """The follower's watch on its Ray head: `run` a poll in a thread and raise `HeadLost` when the head is gone."""

    def __init__(self, options: HeadOptions, clock: Callable[[], float] = time.monotonic,
                 prober: Callable[[str, float], str | None] = probe, every_s: float = PROBE_EVERY_S) -> None:
        self.options, self.clock, self.prober, self.every_s = options, clock, prober, every_s
        self.probes = Probes()

    def check(self) -> None:
        """Probe the GCS once; HeadLost when `head_lost` says it is gone."""
        self.probes = self.probes.seen(self.clock(), self.prober(self.options.address, self.options.probe_timeout_s))
        reason = head_lost(self.clock(), self.probes, self.options)
        if reason is not None:
            raise HeadLost(reason)

    def run(self, poll: Callable[[], T], stop: threading.Event) -> T | None:
        """`poll()`'s answer, waited for in a thread while the head is probed every `every_s` (a poll Ray keeps
        waiting for the GCS of a dead head never returns in time); None when `stop` is set meanwhile. A poll that
        raised is raised again once the head answers (HeadLost when it does not come back)."""
        call = OnThread(poll, "launcher-poll")
        while call.running(self.every_s):
            if stop.is_set():
                return None
            self.check()
        if not call.failed:
            self.probes = Probes()
            return call.result()
        while True:  # the poll failed: because the head is gone? Probe until it answers or is given up on.
            self.check()
            if self.probes.failing_since is None:
                return call.result()  # raises what the poll raised
            if stop.wait(self.every_s):
                return None
