"""The interface every frame data source implements: seeded windows of frames and actions.

A frame data source (`FrameWindowSource`) turns some recorded or generated
interaction (text typed into a frame, git histories replayed in an editor, ...)
into training batches for the frame model:

    frames  LongTensor [B, L, rows, cols, 2]   cell = (char id, style id)
    actions LongTensor [B, L]                  ids in [0, action_vocab_size)

Alignment, for every row b and step t of a window:

- `frames[b, t]` shows the state BEFORE action t is taken;
- `actions[b, t]` is the action taken while frame t is shown, i.e. the target
  the model predicts at step t (logits[:, t] against actions[:, t]);
- taking action t produces frame t + 1, so `frames[b, t + 1]` shows the effect
  of `actions[b, t]` (unless the source documents a reset between episodes at
  that step).

So the model sees frames[:, : t + 1] when it predicts actions[:, t], and the
previous action is never an input: its effect is visible in the current frame.
A window is L consecutive steps of the source's stream, drawn at seeded random
offsets; `FrameWindowSpec` says how many windows (batch_size), how long (L) and
from which seed.

A batch need not be materialized: `FrameWindow` is the lazy form of one batch,
B windows of L steps served a chunk of steps at a time (`chunk(start, stop)`),
so a window of 10^5 frames is never held at once (a tiny-preset batch of 8
such windows would take 1.6 GB as int64). Streaming BPTT with core
checkpointing (`rcswarm.train.bptt.checkpointed`) reads it twice per chunk: once
in its forward sweep and once in the backward pass. Sources that can render or
decode any stretch of their stream offer `next_window()` beside `next_batch()`;
`next_batch()` is `next_window()` read whole, so both draw the same windows from
the same seed. `TensorWindow` wraps a materialized batch.

Cells follow the frame model's convention: the char id of a code point c is
c mod char_vocab, and style ids are small ints in [0, n_styles) whose meaning
each source documents. This package imports nothing else of rcswarm, so it
states the convention rather than importing `rcswarm.models.frame.frame_cells`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from rcswarm.data.validation import check_int

FrameBatch = tuple[Tensor, Tensor]
"""(frames LongTensor [B, L, rows, cols, 2], actions LongTensor [B, L])."""


@dataclass(frozen=True)
class FrameWindowSpec:
    """How a source draws batches: `batch_size` windows of `window` (L) steps from `seed`.

    The same spec and source configuration give the same sequence of batches
    in every process; workers of a swarm differ only by `seed`.
    """

    batch_size: int
    window: int
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("FrameWindowSpec", "batch_size", self.batch_size, 1)
        check_int("FrameWindowSpec", "window", self.window, 1)
        check_int("FrameWindowSpec", "seed", self.seed, 0)


@runtime_checkable
class FrameWindowSource(Protocol):
    """A seeded, endless stream of frame/action windows; see the module docstring.

    - `geometry`: (rows, cols) of every frame.
    - `action_vocab_size`: actions are ids in [0, action_vocab_size).
    - `next_batch()`: the next (frames [B, L, rows, cols, 2], actions [B, L]),
      both int64, B and L from the source's `FrameWindowSpec`.
    """

    @property
    def geometry(self) -> tuple[int, int]: ...

    @property
    def action_vocab_size(self) -> int: ...

    def next_batch(self) -> FrameBatch: ...


@runtime_checkable
class FrameWindow(Protocol):
    """One batch served lazily: B windows of L steps, `chunk(start, stop)` at a time.

    - `batch_size` (B) and `length` (L).
    - `chunk(start, stop)`: (steps [B, stop - start, ...], targets [B, stop - start])
      for 0 <= start < stop <= L; the same arguments give equal tensors every time.
    """

    @property
    def batch_size(self) -> int: ...

    @property
    def length(self) -> int: ...

    def chunk(self, start: int, stop: int) -> FrameBatch: ...


def check_chunk(window: FrameWindow, start: int, stop: int) -> None:
    """Raise ValueError unless 0 <= start < stop <= window.length (ints)."""
    for name, value in (("start", start), ("stop", stop)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"chunk {name}={value!r}: expected an int")
    if not 0 <= start < stop <= window.length:
        raise ValueError(f"chunk [{start}, {stop}): expected 0 <= start < stop <= {window.length} (the window's length)")


@dataclass(frozen=True)
class TensorWindow:
    """A materialized batch (steps [B, L, ...], targets [B, L, ...]) as a `FrameWindow`."""

    steps: Tensor
    targets: Tensor

    def __post_init__(self) -> None:
        if self.steps.dim() < 2 or self.steps.shape[1] < 1:
            raise ValueError(f"steps has shape {tuple(self.steps.shape)}: expected [B, L, ...] with L >= 1")
        if self.targets.dim() < 2 or self.targets.shape[:2] != self.steps.shape[:2]:
            raise ValueError(
                f"targets has shape {tuple(self.targets.shape)}: expected its first two dimensions "
                f"to be [B, L] = {tuple(self.steps.shape[:2])}"
            )

    @property
    def batch_size(self) -> int:
        return self.steps.shape[0]

    @property
    def length(self) -> int:
        return self.steps.shape[1]

    def chunk(self, start: int, stop: int) -> FrameBatch:
        check_chunk(self, start, stop)
        return self.steps[:, start:stop], self.targets[:, start:stop]


def check_frame_batch(source: FrameWindowSource, spec: FrameWindowSpec, batch: FrameBatch) -> None:
    """Raise ValueError unless `batch` has the shapes, dtypes and id ranges `source` promises."""
    frames, actions = batch
    rows, cols = source.geometry
    expected = (spec.batch_size, spec.window, rows, cols, 2)
    if tuple(frames.shape) != expected or frames.dtype != torch.int64:
        raise ValueError(
            f"frames has shape {tuple(frames.shape)} and dtype {frames.dtype}: "
            f"expected {expected} int64"
        )
    if tuple(actions.shape) != expected[:2] or actions.dtype != torch.int64:
        raise ValueError(
            f"actions has shape {tuple(actions.shape)} and dtype {actions.dtype}: "
            f"expected {expected[:2]} int64"
        )
    low, high = int(actions.min()), int(actions.max())
    if low < 0 or high >= source.action_vocab_size:
        raise ValueError(
            f"actions span [{low}, {high}]: expected ids in [0, {source.action_vocab_size})"
        )
    if int(frames.min()) < 0:
        raise ValueError(f"frames has a negative id ({int(frames.min())}): expected ids >= 0")
