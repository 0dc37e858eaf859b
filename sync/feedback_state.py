"""An error-feedback residual on disk, so that a restarted worker resumes what it has not sent yet (issue #28).

With the sparse codec a worker's residual holds most of its recent updates (only the `density` of each chunk
leaves per round), so a worker that restarts without it loses them. `save_feedback` writes the residuals of an
`ErrorFeedback` as one safetensors file (a temporary name, fsync, rename: a crash leaves the old file or the new
one), with metadata naming the run, the wire format and the decay, and the update it was saved for (its base
version, and whether it was about to be pushed or had been refused); `load_feedback` gives them back only for the
same run, format and decay and the model's names and shapes, else None with the reason (a fresh start).
`remove_feedback` deletes the file (a save that failed must not leave an older residual behind).
safetensors holds raw tensors and a JSON header: nothing is unpickled.

When the worker writes it (worker/worker.py, `Worker._push_deltas`): before each push, the residual that holds
once that push lands (the file never holds a residual that an update which may have landed already carried, so a
restart never sends it twice), and again after a refused push, the residual put back. The price: a process killed
while a push that then did not land was on the wire resumes without what that push carried (stated at the resume).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from rcswarm.sync.codec import ErrorFeedback, WireFormat
from rcswarm.sync.files import save_tensors

FEEDBACK_FILE = "error_feedback.safetensors"
# `save_feedback`'s `held`: the residual holds once the update from `base_version` lands (written before its push),
# or it is the one put back after that update was refused.
PUSHING, REFUSED = "pushing", "refused"


def _metadata(run_id: str, fmt: WireFormat, decay: float) -> dict[str, str]:
    return {"run_id": run_id, "format": fmt.describe(), "decay": repr(float(decay))}


def save_feedback(directory: Path, run_id: str, fmt: WireFormat, feedback: ErrorFeedback,
                  base_version: int | None = None, held: str = PUSHING) -> Path:
    """Write `feedback`'s residuals to `directory`/FEEDBACK_FILE atomically (the directory is created); its path.
    `base_version` and `held` (PUSHING or REFUSED) name the update it was saved for (kept in the metadata). Any
    failure to write raises OSError naming the file (`save_tensors`), a full disk included."""
    directory.mkdir(parents=True, exist_ok=True)
    residuals = {name: tensor.contiguous() for name, tensor in feedback.snapshot().items()}
    metadata = _metadata(run_id, fmt, feedback.decay)
    if base_version is not None:
        metadata.update(base_version=str(base_version), held=held)
    return save_tensors(residuals, directory / FEEDBACK_FILE, metadata)


def remove_feedback(directory: Path) -> str:
    """Delete `directory`/FEEDBACK_FILE if there is one; "" or why it could not be deleted."""
    try:
        (directory / FEEDBACK_FILE).unlink(missing_ok=True)
    except OSError as exc:
        return str(exc)
    return ""


def _saved_for(stored: Mapping[str, str]) -> str:
    """What update the file was saved for, in words ("" for a file from before that was recorded)."""
    version, held = stored.get("base_version"), stored.get("held")
    if version is None:
        return ""
    if held == REFUSED:
        return f"saved after its update from version {version} was refused, with the residual put back"
    return (f"saved before its update from version {version} was answered: what that update carried is not sent "
            "again (had it not landed, that part of the earlier residual is lost with it)")


def load_feedback(
    directory: Path, run_id: str, fmt: WireFormat, decay: float, shapes: Mapping[str, tuple[int, ...]],
) -> tuple[dict[str, torch.Tensor] | None, str]:
    """(the residuals saved for this run, format and decay, what update they were saved for in words, "" when the
    file does not say) or (None, why not): no file, another run, format or decay, an unreadable file, a name or
    shape the model does not have, or a non-finite value."""
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
    return residuals, _saved_for(stored)
