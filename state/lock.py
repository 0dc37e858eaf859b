"""One writer per state dir: an exclusive lock held for the writing process's life.

`StateDirLock.acquire(state_dir)` takes an exclusive, non-blocking `flock` on `<state_dir>/coordinator.lock`
and writes the holder into it (JSON: its role, pid, host, start time, and once it serves, its address,
`announce`). The writers are a coordinator, `rcswarm dht`'s mirror of a hivemind swarm (role "mirror") and a
worker in its own `--state-dir` (role "worker"); `rcswarm run` locks its run directory the same way in a file of
its own, `launcher.lock` (role "launcher", `LAUNCHER_LOCK_NAME`: its coordinator locks the run's state/ below it).
A second writer on the same state dir gets `StateDirBusy` naming the holder's role, pid and address. The
kernel drops the lock when the holder's process ends, however it ends (SIGKILL included), so a stale lock
never blocks a restart; the file stays (its content is only read while it is locked). Linux and other
POSIX systems (fcntl).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger("rcswarm.state")

LOCK_NAME = "coordinator.lock"
# The lock file of a run directory `rcswarm run` writes into (cli/run.py); its address is its coordinator's.
LAUNCHER_LOCK_NAME = "launcher.lock"
ROLES = ("coordinator", "mirror", "worker", "launcher")


class StateDirBusy(RuntimeError):
    """Another process holds the state dir's lock; the message names it."""


class StateDirLock:
    """The held lock of one state dir (`acquire`); `release` (or the process's end) gives it up. Not thread-safe:
    the coordinator's main thread acquires, announces and releases it."""

    def __init__(self, path: Path, handle: int, role: str) -> None:
        self.path = path
        self._fd: int | None = handle
        self._holder = {"role": role, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                        "address": ""}

    @classmethod
    def acquire(cls, state_dir: Path, role: str = "coordinator", name: str = LOCK_NAME) -> StateDirLock:
        """Lock `state_dir` (created if missing) for this process, a `role` (one of `ROLES`), in its file `name`;
        StateDirBusy when another process holds it."""
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        path = state_dir / name
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)
            raise StateDirBusy(f"state dir {state_dir} is in use by another {holder_role(path)} ({holder_text(path)}); "
                               "stop it first, or give this one another --state-dir") from None
        lock = cls(path, handle, role)
        try:
            lock._write()
        except OSError as exc:  # a full disk: the one-line refusal names the state dir
            lock.release()
            kind = "run dir" if role == "launcher" else "state dir"
            raise OSError(exc.errno, f"{kind} {state_dir}: cannot write its lock file {name} ({exc.strerror})") from None
        return lock

    def announce(self, address: str) -> None:
        """Record the address the holder serves on, for a coordinator that finds the state dir locked."""
        self._holder["address"] = address
        try:
            self._write()
        except OSError as exc:  # the address is a courtesy to the next coordinator, never a reason to stop serving
            log.warning("state dir lock %s: the address not recorded (%s)", self.path, exc)

    def _write(self) -> None:
        if self._fd is None:
            return
        data = json.dumps(self._holder).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _holder(path: Path) -> dict:
    """The lock file's JSON, {} when it cannot be read."""
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def holder_role(path: Path) -> str:
    """The holder's role as the lock file says ("coordinator" where it does not say: files written before roles)."""
    role = _holder(path).get("role")
    return role if role in ROLES else "coordinator"


def holder_text(path: Path) -> str:
    """Who holds the lock at `path`, as its file says: "pid N on HOST, serving on ADDRESS" (or what is known)."""
    holder = _holder(path)
    if "pid" not in holder:
        return "its pid is not written yet"
    where = f" on {holder['host']}" if holder.get("host") else ""
    if holder.get("role") in ("mirror", "worker"):
        serving = ""
    elif holder.get("role") == "launcher":
        serving = f", its coordinator serving on {holder['address']}" if holder.get("address") else ""
    else:
        serving = f", serving on {holder['address']}" if holder.get("address") else ", not serving yet"
    return f"pid {holder['pid']}{where}{serving}"
