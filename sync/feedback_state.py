"""An error-feedback residual on disk, so that a restarted worker resumes what it has not sent yet (issue #28).

With the sparse codec a worker's residual holds most of its recent updates (only the `density` of each chunk
leaves per round), so a worker that restarts without it loses them. `save_feedback` writes the residuals of an
`ErrorFeedback` as one safetensors file (a temporary name, fsync, rename: a crash leaves the old file or the new
one), with metadata naming the run, the wire format and the decay; `load_feedback` gives them back only for the
same run, format and decay and the model's names and shapes, else None with the reason (a fresh start).
safetensors holds raw tensors and a JSON header: nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from rcswarm.sync.codec import ErrorFeedback, WireFormat
from rcswarm.sync.files import save_tensors

FEEDBACK_FILE = "error_feedback.safetensors"


def _metadata(run_id: str, fmt: WireFormat, decay: float) -> dict[str, str]:
    return {"run_id": run_id, "format": fmt.describe(), "decay": repr(float(decay))}


def save_feedback(directory: Path, run_id: str, fmt: WireFormat, feedback: ErrorFeedback) -> Path:
    """Write `feedback`'s residuals to `directory`/FEEDBACK_FILE atomically (the directory is created); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    residuals = {name: tensor.contiguous() for name, tensor in feedback.snapshot().items()}
    return save_tensors(residuals, directory / FEEDBACK_FILE, _metadata(run_id, fmt, feedback.decay))


def load_feedback(
    directory: Path, run_id: str, fmt: WireFormat, decay: float, shapes: Mapping[str, tuple[int, ...]],
) -> tuple[dict[str, torch.Tensor] | None, str]:
    """(the residuals saved for this run, format and decay, "") or (None, why not): no file, another run, format
    or decay, an unreadable file, a name or shape the model does not have, or a non-finite value."""
    path = directory / FEEDBACK_FILE
    if not path.is_file():
        return None, f"no {FEEDBACK_FILE} in {directory}"
    try:
        with safe_open(str(path), framework="pt") as handle:
            stored = handle.metadata() or {}
            want = _metadata(run_id, fmt, decay)
            differs = [f"{key} {stored.get(key)!r} (this run: {want[key]!r})" for key in want if stored.get(key) != want[key]]
            if differs:
                return None, f"{path} is another run's or setting's: {', '.join(differs)}"
            residuals = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc})"
    for name, tensor in residuals.items():
        if name not in shapes or tuple(tensor.shape) != tuple(shapes[name]) or tensor.dtype != torch.float32:
            return None, f"{path}: tensor {name!r} {tuple(tensor.shape)} {tensor.dtype} is not one of the model's"
        if not bool(torch.isfinite(tensor).all()):
            return None, f"{path}: tensor {name!r} holds non-finite values"
    return residuals, ""
