"""The per-step encoder, k steps at a time: the chunks, their RNG states, and the two encoder passes.

Both modes of streaming BPTT (`rcswarm.train.bptt.streaming`) encode a window's chunks of k steps
once without gradients (`encode_without_grad`, keeping the embeddings and the RNG state before each
chunk) and, once dloss/dembeddings is known, again with gradients, last chunk first, each chunk
backpropagated at once (`recompute_backward`), from the RNG state it first drew from.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from rcswarm.data.diagnostics import IGNORE_INDEX
from rcswarm.data.frames.window import FrameWindow
from rcswarm.models.protocols import StepModel


def chunk_bounds(n_steps: int, k: int) -> list[tuple[int, int]]:
    """[(start, stop)] covering range(n_steps) in chunks of k steps (the last may be shorter)."""
    return [(start, min(start + k, n_steps)) for start in range(0, n_steps, k)]


RngSnapshot = tuple[Tensor, Tensor | None]


def rng_snapshot(device: torch.device) -> RngSnapshot:
    """The CPU RNG state and, on CUDA, the device's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def rng_moved(snapshot: RngSnapshot, device: torch.device) -> bool:
    """Whether the RNG state differs from `snapshot` (something drew random numbers since)."""
    now = rng_snapshot(device)
    return not torch.equal(now[0], snapshot[0]) or (now[1] is not None and not torch.equal(now[1], snapshot[1]))


@contextmanager
def rng_restored(snapshot: RngSnapshot, device: torch.device) -> Iterator[None]:
    """Run the body from the RNG state in `snapshot`; the caller's RNG state is kept."""
    cpu, cuda = snapshot
    with torch.random.fork_rng(devices=[device] if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield


def scored_count(targets: Tensor) -> int:
    """The number of targets the loss averages over (those not IGNORE_INDEX)."""
    return int((targets != IGNORE_INDEX).sum())


def encode_without_grad(
    model: StepModel, window: FrameWindow, bounds: list[tuple[int, int]], device: torch.device
) -> tuple[Tensor, Tensor, list[RngSnapshot]]:
    """Embeddings [B, L, D] chunk by chunk, the targets [B, L, ...], and the RNG state before each chunk."""
    snapshots: list[RngSnapshot] = []
    embeddings: Tensor | None = None
    targets: list[Tensor] = []
    with torch.no_grad():
        for start, stop in bounds:
            steps, chunk_targets = window.chunk(start, stop)
            targets.append(chunk_targets)
            snapshots.append(rng_snapshot(device))
            chunk = model.encode(steps.to(device))  # [B, k, D]
            if embeddings is None:
                embeddings = chunk.new_empty((chunk.shape[0], window.length, *chunk.shape[2:]))
            embeddings[:, start:stop] = chunk  # [B, L, D]
    assert embeddings is not None
    return embeddings, torch.cat(targets, dim=1), snapshots


def recompute_backward(
    model: StepModel,
    window: FrameWindow,
    grad: Tensor,
    bounds: list[tuple[int, int]],
    snapshots: list[RngSnapshot] | list[None],
    device: torch.device,
) -> None:
    """Re-encode each chunk with gradients (last chunk first, from its RNG snapshot if any) and backpropagate its share."""
    for (start, stop), snapshot in reversed(list(zip(bounds, snapshots, strict=True))):
        steps, _ = window.chunk(start, stop)
        with rng_restored(snapshot, device) if snapshot is not None else nullcontext():
            chunk = model.encode(steps.to(device))  # [B, k, D]
        if chunk.requires_grad:
            torch.autograd.backward(chunk, grad_tensors=grad[:, start:stop])
        del chunk
