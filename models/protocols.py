"""Interfaces that models implement for the training layer, beside the registry's model contract.

`StepModel`: a model shaped "per-step encoder + recurrent core", which
`rcswarm.worker.streaming_bptt.streaming_backward` trains over long windows with
activation memory flat in the window length:

- `encode(steps [B, k, *S]) -> embeddings [B, k, D]`: embedding t depends on
  steps[:, t] only, and the call has no side effects (no running statistics).
  It must be a deterministic function of its input and the RNG state: before
  every chunk the CPU (and CUDA) RNG state is recorded and restored for the
  recomputation, so dropout draws the same masks twice.
- `core_loss(embeddings [B, L, D], targets) -> scalar loss`: any differentiable
  function of the whole embedding sequence.

The frame model (`rcswarm.models.frame.FrameActionModel`) implements it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from torch import Tensor, nn


@runtime_checkable
class StepModel(Protocol):
    """A per-step encoder followed by a core over the whole sequence; see the module docstring."""

    def encode(self, steps: Tensor) -> Tensor: ...

    def core_loss(self, embeddings: Tensor, targets: Tensor) -> Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...
