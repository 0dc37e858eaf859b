"""Interfaces that models implement for the training layer, beside the registry's model contract.

`StepModel`: a model shaped "per-step encoder + recurrent core", which
`rcswarm.train.bptt.streaming.streaming_backward` trains over long windows with
activation memory flat in the window length:

- `encode(steps [B, k, *S]) -> embeddings [B, k, D]`: embedding t depends on
  steps[:, t] only, and the call has no side effects (no running statistics).
  It must be a deterministic function of its input and the RNG state: every
  chunk runs from a seed of its own (`train/bptt/encoder_chunks.WindowRng`),
  seeded again for the recomputation, so dropout draws the same masks twice.
- `core_loss(embeddings [B, L, D], targets) -> scalar loss`: any differentiable
  function of the whole embedding sequence.

`SegmentStepModel` adds the hook core checkpointing needs (streaming BPTT with a
`rcswarm.train.bptt.checkpointed.CheckpointPlan`), which runs the core one segment of k steps at a time, keeps
its state only at some segment boundaries and runs segments again from there:

- `core_segment(embeddings [B, T, D], targets [B, T] | None, state)` ->
  `(loss_sum, scored, new_state)`: the core over one segment from `state` (None:
  the initial state), `loss_sum` the sum of the per-step losses over the
  segment's scored targets and `scored` their number (both None when targets is
  None: only the state is wanted), `new_state` the state after the segment's
  last step. A state is a tuple of tensors (`CoreState`) whose first dimension
  or second is the batch; it must not be modified in place.
- For every split of [0, L) into consecutive segments, chaining the states,
  `core_loss(embeddings, targets)` equals sum(loss_sum) / sum(scored) (up to
  floating-point summation order). A core with dropout may be checkpointed:
  each segment runs from a seed of its own, the same in every run of it (its
  masks then differ from those `core_loss` would draw over the whole window).

The frame model (`rcswarm.models.frame.FrameActionModel`) implements both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from torch import Tensor, nn

CoreState = tuple[Tensor, ...]
"""A recurrent core's state between two segments, e.g. (h, c) of every LSTM layer."""


@runtime_checkable
class StepModel(Protocol):
    """A per-step encoder followed by a core over the whole sequence; see the module docstring."""

    def encode(self, steps: Tensor) -> Tensor: ...

    def core_loss(self, embeddings: Tensor, targets: Tensor) -> Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


@runtime_checkable
class SegmentStepModel(StepModel, Protocol):
    """A `StepModel` whose core also runs segment by segment from a carried state; see the module docstring."""

    def core_segment(
        self, embeddings: Tensor, targets: Tensor | None, state: CoreState | None
    ) -> tuple[Tensor | None, Tensor | None, CoreState]: ...
