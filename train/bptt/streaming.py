"""Streaming backpropagation through time: per-step encoders recomputed, the core paged or checkpointed.

Exact full-window gradients for models shaped "per-step encoder + recurrent
core" (the frame model: a frame head per frame, an LSTM stack over time),
after Section 10.3 of "Recurrence-Complete Frame-based Action Models". The
encoder's activations are never kept for more than k steps. What the core
keeps depends on the mode.

Paged (`streaming_backward(model, batch, k)`, the paper's schedule). Memory
grows with the number of steps L only through O(L * width) tensors (the
embeddings, their gradient and the core's saved states):

1. The encoder runs on chunks of k steps under `torch.no_grad()`; only the
   embeddings [B, L, D] are kept.
2. The core runs on the embeddings as a leaf that requires grad. Its saved
   activations go through `torch.autograd.graph.saved_tensors_hooks` into a
   `HostPager`: on CUDA each saved tensor is copied on a side stream into a
   pinned host buffer, and during the backward pass the pages a few steps
   ahead are copied back on that stream before they are needed (prefetch).
   On the CPU the same hooks run and the copy is a no-op (the tensor already
   lives in host memory); they still count what they page.
3. `loss.backward()` through the core yields dloss/dembedding_t for every t
   (and accumulates the core's parameter gradients).
4. The encoder is recomputed with gradients k steps at a time, from the last
   chunk to the first, and each chunk is backpropagated at once with
   `torch.autograd.backward(chunk, grad_tensors=grad[:, chunk])`, so never more
   than k steps' encoder activations are alive.

Checkpointed (`streaming_backward(..., checkpoints=CheckpointPlan(...))`,
issue #19), for `SegmentStepModel`s: nothing of size O(L) need stay in memory.
The window is a chain of n = ceil(L / S) segments of S steps (S a multiple of
k, by default 8 k); the core's state (h and c of every LSTM layer, [B, H]
each) is kept only at the segment boundaries a checkpoint schedule
(`rcswarm.train.bptt.schedule`: store-all, uniform √n or
binomial/revolve) chooses from a memory budget, in slots allocated once:

1. Forward sweep: every segment is encoded once under `torch.no_grad()`, k
   steps at a time (each chunk from a seed of its own, below),
   and its embeddings [B, S, D] are kept in an `EmbeddingStore` (host memory,
   or a temporary file when they do not fit the budget); the core runs on them
   from the carried state, without gradients, accumulating the summed loss and
   the scored targets. The schedule stores the states it wants on the way.
2. Backward, segment n - 1 first: from the state at its input boundary
   (restored from a checkpoint and, where the schedule says so, advanced from
   there again over stored embeddings, without gradients), the core runs with
   gradients on the stored embeddings and that state, both made leaves; one
   `torch.autograd.backward` of (summed loss, state after) with the seed
   (1 / total scored, dloss/dstate from the segment after) accumulates the
   core's parameter gradients and yields dloss/dstate at its input and
   dloss/dembeddings. Then the segment's encoder is recomputed with gradients
   k steps at a time, last chunk first (from the chunks' seeds), each chunk
   backpropagated with its share of dloss/dembeddings, as in the paged mode.
3. Window chunks come from a `FrameWindow` (`chunk(start, stop)`), so a 10^5
   step window is never materialized. The schedule's next actions are known,
   so what they need is prefetched: on CUDA, chunks and embeddings read from
   disk on a background thread (into pinned buffers) and checkpointed states
   and embeddings copied back from pinned host memory on the side stream; on
   the CPU, the kernel reads the embedding file ahead (posix_fadvise) and the
   rest loads when needed (see `segment_store.Prefetcher` for why).

Random numbers (dropout) in both modes: every encoder chunk, and in the
checkpointed mode every core segment, draws from a seed of its own derived from
one base seed per window (`encoder_chunks.WindowRng`), under
`torch.random.fork_rng`, so each recomputation draws what the first run drew
(the same masks) at O(1) bytes per window; the caller's generator advances by
one draw per window that drew any. A core with dropout thus gets the same masks
in the checkpointed mode's up to three runs of a segment; they differ from the
masks of `core_loss` over the whole window. `plain_backward(..., chunk_steps=k)`
seeds its chunks as the paged mode does.

So the live memory is one segment's core activations (O(S)), one chunk's
encoder activations (O(k)), the stored states the schedule allows and the
embeddings the budget allows. The gradient
equals plain autograd's up to floating-point summation order for every schedule
(the tests compare in float64 to 1e-10 relative). The first segment is run
before the schedule is chosen: its embeddings and state give the sizes the plan
needs.

The `.grad` fields end up as after `loss.backward()` of plain autograd over the
whole window, accumulating into existing gradients the same way. On CUDA,
kernels that are not bitwise deterministic can make a recomputed embedding or
state differ from the first pass in the last bits; the gradient is then exact up
to that rounding. No GPU was available where this was written: the CUDA
branches run only on a CUDA model, and their tests skip without a GPU.

The model interface is `rcswarm.models.protocols.StepModel` (`encode`,
`core_loss`) and, for checkpointing, `SegmentStepModel` (`core_segment`).

A batch is the pair `(steps [B, L, *S], targets)` with targets' first two
dimensions [B, L], or a `rcswarm.data.frames.FrameWindow`. Steps may stay on the
CPU: each chunk is moved to the model's device when it is encoded.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rcswarm.data.frames.window import FrameWindow, TensorWindow
from rcswarm.models.protocols import SegmentStepModel, StepModel
from rcswarm.train.bptt.checkpointed import CheckpointedRun, CheckpointPlan
from rcswarm.train.bptt.encoder_chunks import ENCODE, WindowRng, chunk_bounds
from rcswarm.train.bptt.paged import paged_backward
from rcswarm.train.bptt.stats import StreamingStats

Batch = tuple[Tensor, Tensor]
"""(steps [B, L, *S], targets [B, L, ...])."""


def _check_model(model: object) -> StepModel:
    if not isinstance(model, StepModel):
        raise TypeError(
            f"model of type {type(model).__name__}: expected encode(steps), "
            "core_loss(embeddings, targets) and parameters() (the StepModel protocol)"
        )
    return model


def _as_window(batch: Batch | FrameWindow) -> FrameWindow:
    """`batch` as a FrameWindow: a (steps, targets) pair is wrapped (and its shapes checked)."""
    if isinstance(batch, tuple):
        if len(batch) != 2:
            raise ValueError(f"batch of type {type(batch).__name__}: expected a pair (steps, targets)")
        return TensorWindow(*batch)
    if not isinstance(batch, FrameWindow):
        raise ValueError(f"batch of type {type(batch).__name__}: expected a pair (steps, targets) or a FrameWindow")
    if batch.length < 1 or batch.batch_size < 1:
        raise ValueError(f"window of {batch.batch_size} x {batch.length} steps: expected B >= 1 and L >= 1")
    return batch


def _check_inputs(model: object, batch: Batch) -> tuple[Tensor, Tensor]:
    _check_model(model)
    window = _as_window(batch)
    assert isinstance(window, TensorWindow)
    return window.steps, window.targets


def _check_chunk_steps(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: expected a positive int (steps per encoder chunk)")
    return value


def _model_device(model: StepModel) -> torch.device:
    for param in model.parameters():
        return param.device
    raise ValueError("model has no parameters: expected at least one to place the steps on")


def streaming_backward(
    model: StepModel, batch: Batch | FrameWindow, k: int, *, prefetch: int = 2,
    checkpoints: CheckpointPlan | None = None,
) -> tuple[float, StreamingStats]:
    """Accumulate the full-window gradients of `model.core_loss` into `.grad`, k steps at a time.

    Returns the loss (a float) and `StreamingStats`. `k` is the number of
    steps whose encoder activations may be alive at once (and, checkpointed,
    the segment length); `prefetch` the number of pages (paged) or schedule
    actions (checkpointed) looked at ahead. Without `checkpoints` the paged mode
    runs; with a `CheckpointPlan` the checkpointed mode, which needs a
    `SegmentStepModel` (see the module docstring).
    """
    _check_model(model)
    window = _as_window(batch)
    k = _check_chunk_steps("k", k)
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch={prefetch!r}: expected an int >= 0")
    device = _model_device(model)
    if checkpoints is None:
        return paged_backward(model, window, k, prefetch, device)
    if not isinstance(model, SegmentStepModel):
        raise TypeError(
            f"model of type {type(model).__name__}: core checkpointing needs core_segment(embeddings, "
            "targets, state) (the SegmentStepModel protocol)"
        )
    if not isinstance(checkpoints, CheckpointPlan):
        raise TypeError(f"checkpoints of type {type(checkpoints).__name__}: expected a CheckpointPlan or None")
    return CheckpointedRun(model, window, k, checkpoints, prefetch, device).run()


def plain_backward(model: StepModel, batch: Batch, chunk_steps: int | None = None) -> float:
    """The reference: one autograd graph over the whole window, then `loss.backward()`.

    With `chunk_steps` the encoder is called on chunks of that many steps (all
    kept in the graph), each chunk from the seed `streaming_backward` gives it,
    so with the same k both draw the same random numbers and leave the RNG alike.
    """
    steps, targets = _check_inputs(model, batch)
    device = _model_device(model)
    n_steps = steps.shape[1]
    k = n_steps if chunk_steps is None else _check_chunk_steps("chunk_steps", chunk_steps)
    rng = WindowRng(device)
    pieces = []
    for index, (a, b) in enumerate(chunk_bounds(n_steps, k)):
        with rng.seeded(ENCODE, index, first=True):
            pieces.append(model.encode(steps[:, a:b].to(device)))  # [B, k, D]
    rng.finish()
    embeddings = torch.cat(pieces, dim=1)  # [B, L, D]
    loss = model.core_loss(embeddings, targets.to(device))
    loss.backward()
    return loss.item()
