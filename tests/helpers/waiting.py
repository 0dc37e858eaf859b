"""Polling until a condition holds, with a deadline that fails the test naming what it waited for."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def timed(call: Callable[[], Any]) -> float:
    """Seconds `call()` took."""
    started = time.monotonic()
    call()
    return time.monotonic() - started


def in_thread(call: Callable[[], Any]) -> threading.Thread:
    """`call()` on a started daemon thread."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread
