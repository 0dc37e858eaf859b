"""Tensor files written whole or not at all: a crash leaves the previous file or the new one, never a torn one.

`save_tensors` writes a safetensors file under a temporary name beside its destination, fsyncs it, renames it over
the destination and fsyncs the directory, so the rename itself survives a power cut. Used for what a run hands to
its user or to its own restart outside the coordinator's checkpoints (which have their own commit, state/store.py):
a worker's error-feedback residual, the exported final parameters, a hivemind peer's final replica.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write `tensors` (contiguous, CPU) with `metadata` to `path` atomically; `path`."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        save_file(dict(tensors), str(temporary), metadata=metadata)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path
