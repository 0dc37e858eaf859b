"""Reading a state dir in tests: through the store's named reads, as the package does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rcswarm.state.store import StateStore

T = TypeVar("T")


def read_state(state_dir: Path, read: Callable[[StateStore], T]) -> T:
    """What `read` reads from a state dir through the store's named reads, on a read-only store opened for it
    (a live coordinator may keep writing the state dir meanwhile)."""
    store = StateStore.open_read_only(state_dir)
    try:
        return read(store)
    finally:
        store.close()
