"""Worker processes: what callers outside worker/ use, one entry per subsystem.

- the coordinator backend: `Worker`, the loop of one worker process (worker/worker.py), and its options
  `WorkerOptions` with the `ClientOptions` any client has (worker/options.py);
- the client of the wire: `CoordinatorClient`, `RetryPolicy`, `Timeouts`, `Identity`, `classify` and its
  `Action`, `RetriesExhausted`, `Stopped` (worker/client.py);
- the hivemind backend: `HivemindWorker` (worker/hivemind_worker.py), its coordinator `ControlPlane`
  (worker/hivemind_control.py) and `hivemind_sync`, the peer-to-peer layer (DHT records, averaging);
- the Ray actor: `RayWorker`, `RayWorkerConfig` and the states its `info()` reports (worker/ray_worker.py).

Import-light: `import rcswarm.worker` loads none of them; each name loads its module (torch, grpc, hivemind
or Ray with it) when first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_HOMES = {
    "rcswarm.worker.worker": ("Worker",),
    "rcswarm.worker.options": ("ClientOptions", "WorkerOptions"),
    "rcswarm.worker.client": (
        "Action", "CoordinatorClient", "Identity", "RetriesExhausted", "RetryPolicy", "Stopped", "Timeouts", "classify",
    ),
    "rcswarm.worker.hivemind_worker": ("HivemindWorker",),
    "rcswarm.worker.hivemind_control": ("ControlPlane",),
    "rcswarm.worker.ray_worker": (
        "FAILED", "FINISHED", "STARTING", "STOPPED", "TRAINING", "RayWorker", "RayWorkerConfig",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = [
    "FAILED", "FINISHED", "STARTING", "STOPPED", "TRAINING", "Action", "ClientOptions", "ControlPlane",
    "CoordinatorClient", "HivemindWorker", "Identity", "RayWorker", "RayWorkerConfig", "RetriesExhausted",
    "RetryPolicy", "Stopped", "Timeouts", "Worker", "WorkerOptions", "classify", "hivemind_sync",
]

if TYPE_CHECKING:
    from rcswarm.worker import hivemind_sync
    from rcswarm.worker.client import (
        Action,
        CoordinatorClient,
        Identity,
        RetriesExhausted,
        RetryPolicy,
        Stopped,
        Timeouts,
        classify,
    )
    from rcswarm.worker.hivemind_control import ControlPlane
    from rcswarm.worker.hivemind_worker import HivemindWorker
    from rcswarm.worker.options import ClientOptions, WorkerOptions
    from rcswarm.worker.ray_worker import FAILED, FINISHED, STARTING, STOPPED, TRAINING, RayWorker, RayWorkerConfig
    from rcswarm.worker.worker import Worker


def __getattr__(name: str) -> Any:
    """A name of `__all__`, from its module (imported now if it was not); looked up on every use, so a test that
    replaces a class in its module (a cheating HivemindWorker) is seen here too."""
    if name == "hivemind_sync":
        return import_module("rcswarm.worker.hivemind_sync")
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOME_OF[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
