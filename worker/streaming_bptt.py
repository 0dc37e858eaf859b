"""Streaming backpropagation through time with per-step encoder recomputation.

Exact full-window gradients for models shaped "per-step encoder + recurrent
core" (the frame model: a frame head per frame, an LSTM stack over time),
after Section 10.3 of "Recurrence-Complete Frame-based Action Models". Memory
grows with the number of steps L only through O(L * width) tensors (the
embeddings, their gradient and the core's saved states), never through the
encoder's activations:

1. The encoder runs on chunks of k steps under `torch.no_grad()`; only the
   embeddings [B, L, D] are kept.
2. The core runs on the embeddings as a leaf that requires grad. Its saved
   activations go through `torch.autograd.graph.saved_tensors_hooks` into a
   `HostPager`: on CUDA each saved tensor is copied on a side stream into a
   pinned host buffer, and during the backward pass the pages a few steps
   ahead are copied back on that stream before they are needed (prefetch).
   On the CPU the same hooks run and the copy is a no-op (the tensor already
   lives in host memory); they still count what they page. No GPU was
   available where this was written: the CUDA branch runs only on a CUDA
   model, and its test (tests/test_streaming_bptt.py) skips without a GPU.
3. `loss.backward()` through the core yields dloss/dembedding_t for every t
   (and accumulates the core's parameter gradients).
4. The encoder is recomputed with gradients k steps at a time, from the last
   chunk to the first, and each chunk is backpropagated at once with
   `torch.autograd.backward(chunk, grad_tensors=grad[:, chunk])`, so never more
   than k steps' encoder activations are alive.

The `.grad` fields end up as after `loss.backward()` of plain autograd over
the whole window (up to floating-point summation order), accumulating into
existing gradients the same way.

Unlike the paper, which overlaps each frame head's backward with the main
model's backward, the core's backward finishes before the first recomputation;
the price is one [B, L, D] gradient buffer, and the schedule stays a plain
sequence of autograd calls. On CUDA, kernels that are not bitwise
deterministic can make a recomputed embedding differ from the first pass in
the last bits; the gradient is then exact up to that rounding.

The model interface is `rcswarm.models.protocols.StepModel` (`encode`,
`core_loss`; see there).

A batch is the pair `(steps [B, L, *S], targets)` with targets' first two
dimensions [B, L]. Steps may stay on the CPU: each chunk is moved to the
model's device when it is encoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from rcswarm.models.protocols import StepModel

Batch = tuple[Tensor, Tensor]
"""(steps [B, L, *S], targets [B, L, ...])."""


@dataclass(frozen=True)
class StreamingStats:
    """What one `streaming_backward` call did.

    `max_grad_chunk_steps` is the largest number of steps encoded with
    gradients at once (never more than `chunk_steps`); `paged_tensors` and
    `paged_bytes` count the core's saved tensors that went through the pager,
    `resident_tensors` those it left in place (parameters and the embeddings
    leaf), `unpacked_tensors` the pages the backward pass read back, and
    `copied_to_host` whether pages were actually copied (CUDA) rather than
    already on the host.
    """

    n_steps: int
    chunk_steps: int
    n_chunks: int
    max_grad_chunk_steps: int
    paged_tensors: int
    paged_bytes: int
    resident_tensors: int
    unpacked_tensors: int
    copied_to_host: bool


class _Page:
    """One saved tensor in host memory, with its prefetched device copy if any."""

    __slots__ = ("device", "host", "index", "on_device", "ready", "taken")

    def __init__(self, index: int, device: torch.device, host: Tensor) -> None:
        self.index = index
        self.device = device
        self.host = host
        self.on_device: Tensor | None = None
        self.ready: torch.cuda.Event | None = None
        self.taken = False


class HostPager:
    """A saved-tensor pack/unpack pair that pages autograd's saved activations to host memory.

    Tensors sharing storage with one of `keep` (parameters, the embeddings
    leaf) stay where they are. Use as `with pager.hooks(): loss = f(x)`, then
    `loss.backward()`, then `pager.close()`. `prefetch` is how many pages
    ahead of the one the backward pass asks for are copied back to the GPU.
    """

    def __init__(self, keep: Iterable[Tensor] = (), prefetch: int = 2) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"HostPager.prefetch={prefetch!r}: expected an int >= 0")
        self.prefetch = prefetch
        self._keep = {t.untyped_storage().data_ptr() for t in keep}
        self._pages: list[_Page] = []
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self.paged_tensors = 0
        self.paged_bytes = 0
        self.resident_tensors = 0
        self.unpacked_tensors = 0
        self.copied_to_host = False

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context manager that routes saved tensors through `pack` / `unpack`."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device=device)
            self._streams[device] = stream
        return stream

    def _copy_to_host(self, tensor: Tensor) -> Tensor:
        stream = self._side_stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = torch.empty_like(tensor, device="cpu", pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(stream)
        self.copied_to_host = True
        return host

    def pack(self, tensor: Tensor) -> Tensor | _Page:
        """Autograd's pack hook: a page for `tensor`, or `tensor` itself if it is kept.

        A page holds a detached alias (CPU) or a copy (CUDA), never `tensor`
        itself: a saved output would otherwise reference its own grad_fn, a
        cycle that keeps the graph alive if backward never runs.
        """
        if tensor.untyped_storage().data_ptr() in self._keep:
            self.resident_tensors += 1
            return tensor
        host = self._copy_to_host(tensor) if tensor.is_cuda else tensor.detach()
        page = _Page(len(self._pages), tensor.device, host)
        self._pages.append(page)
        self.paged_tensors += 1
        self.paged_bytes += tensor.numel() * tensor.element_size()
        return page

    def _start_copy_back(self, page: _Page) -> None:
        stream = self._side_stream(page.device)
        with torch.cuda.stream(stream):
            page.on_device = torch.empty_like(page.host, device=page.device)
            page.on_device.copy_(page.host, non_blocking=True)
            page.ready = torch.cuda.Event()
            page.ready.record(stream)

    def _prefetch_before(self, index: int) -> None:
        for page in self._pages[max(index - self.prefetch, 0) : index]:
            if not page.taken and page.on_device is None:
                self._start_copy_back(page)

    def _take_on_device(self, page: _Page) -> Tensor:
        if page.on_device is None:
            self._start_copy_back(page)
        self._prefetch_before(page.index)
        current = torch.cuda.current_stream(page.device)
        assert page.ready is not None and page.on_device is not None
        current.wait_event(page.ready)
        tensor = page.on_device
        tensor.record_stream(current)
        page.on_device = None
        return tensor

    def unpack(self, packed: Tensor | _Page) -> Tensor:
        """Autograd's unpack hook: the saved tensor, on the device it was saved from."""
        if isinstance(packed, Tensor):
            return packed
        self.unpacked_tensors += 1
        packed.taken = True
        if packed.device.type != "cuda":
            return packed.host
        return self._take_on_device(packed)

    def close(self) -> None:
        """Drop every page (host buffers and prefetched device copies)."""
        self._pages.clear()


def _check_inputs(model: object, batch: Batch) -> tuple[Tensor, Tensor]:
    if not isinstance(model, StepModel):
        raise TypeError(
            f"model of type {type(model).__name__}: expected encode(steps), "
            "core_loss(embeddings, targets) and parameters() (the StepModel protocol)"
        )
    if not (isinstance(batch, tuple) and len(batch) == 2):
        raise ValueError(f"batch of type {type(batch).__name__}: expected a pair (steps, targets)")
    steps, targets = batch
    if steps.dim() < 2 or steps.shape[1] < 1:
        raise ValueError(f"steps has shape {tuple(steps.shape)}: expected [B, L, ...] with L >= 1")
    if targets.dim() < 2 or targets.shape[:2] != steps.shape[:2]:
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}: expected its first two dimensions "
            f"to be [B, L] = {tuple(steps.shape[:2])}"
        )
    return steps, targets


def _check_chunk_steps(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: expected a positive int (steps per encoder chunk)")
    return value


def _model_device(model: StepModel) -> torch.device:
    for param in model.parameters():
        return param.device
    raise ValueError("model has no parameters: expected at least one to place the steps on")


def chunk_bounds(n_steps: int, k: int) -> list[tuple[int, int]]:
    """[(start, stop)] covering range(n_steps) in chunks of k steps (the last may be shorter)."""
    return [(start, min(start + k, n_steps)) for start in range(0, n_steps, k)]


RngSnapshot = tuple[Tensor, Tensor | None]


def _rng_snapshot(device: torch.device) -> RngSnapshot:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextmanager
def _rng_restored(snapshot: RngSnapshot, device: torch.device) -> Iterator[None]:
    """Run the body from the RNG state in `snapshot`; the caller's RNG state is kept."""
    cpu, cuda = snapshot
    with torch.random.fork_rng(devices=[device] if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield


def _encode_without_grad(
    model: StepModel, steps: Tensor, bounds: list[tuple[int, int]], device: torch.device
) -> tuple[Tensor, list[RngSnapshot]]:
    """Embeddings [B, L, D] chunk by chunk, and the RNG state before each chunk."""
    snapshots: list[RngSnapshot] = []
    embeddings: Tensor | None = None
    with torch.no_grad():
        for start, stop in bounds:
            snapshots.append(_rng_snapshot(device))
            chunk = model.encode(steps[:, start:stop].to(device))  # [B, k, D]
            if embeddings is None:
                embeddings = chunk.new_empty((chunk.shape[0], steps.shape[1], *chunk.shape[2:]))
            embeddings[:, start:stop] = chunk  # [B, L, D]
    assert embeddings is not None
    return embeddings, snapshots


def _core_backward(
    model: StepModel, embeddings: Tensor, targets: Tensor, prefetch: int
) -> tuple[float, Tensor | None, HostPager]:
    """Core forward with paged saved tensors and its backward; (loss, dloss/dembeddings, pager)."""
    leaf = embeddings.requires_grad_()  # [B, L, D]
    pager = HostPager(keep=[*model.parameters(), leaf], prefetch=prefetch)
    with pager.hooks():
        loss = model.core_loss(leaf, targets)
    loss.backward()
    pager.close()
    return loss.item(), leaf.grad, pager


def _recompute_backward(
    model: StepModel,
    steps: Tensor,
    grad: Tensor,
    bounds: list[tuple[int, int]],
    snapshots: list[RngSnapshot],
    device: torch.device,
) -> None:
    """Re-encode each chunk with gradients (last chunk first) and backpropagate its share."""
    for (start, stop), snapshot in reversed(list(zip(bounds, snapshots, strict=True))):
        with _rng_restored(snapshot, device):
            chunk = model.encode(steps[:, start:stop].to(device))  # [B, k, D]
        if chunk.requires_grad:
            torch.autograd.backward(chunk, grad_tensors=grad[:, start:stop])
        del chunk


def streaming_backward(
    model: StepModel, batch: Batch, k: int, *, prefetch: int = 2
) -> tuple[float, StreamingStats]:
    """Accumulate the full-window gradients of `model.core_loss` into `.grad`, k steps at a time.

    Returns the loss (a float) and `StreamingStats`. `k` is the number of
    steps whose encoder activations may be alive at once; `prefetch` the
    number of pages copied back ahead of the backward pass on CUDA.
    """
    steps, targets = _check_inputs(model, batch)
    k = _check_chunk_steps("k", k)
    device = _model_device(model)
    bounds = chunk_bounds(steps.shape[1], k)
    embeddings, snapshots = _encode_without_grad(model, steps, bounds, device)
    loss, grad, pager = _core_backward(model, embeddings, targets.to(device), prefetch)
    if grad is not None:
        _recompute_backward(model, steps, grad, bounds, snapshots, device)
    stats = StreamingStats(
        n_steps=steps.shape[1],
        chunk_steps=k,
        n_chunks=len(bounds),
        max_grad_chunk_steps=max(stop - start for start, stop in bounds),
        paged_tensors=pager.paged_tensors,
        paged_bytes=pager.paged_bytes,
        resident_tensors=pager.resident_tensors,
        unpacked_tensors=pager.unpacked_tensors,
        copied_to_host=pager.copied_to_host,
    )
    return loss, stats


def plain_backward(model: StepModel, batch: Batch, chunk_steps: int | None = None) -> float:
    """The reference: one autograd graph over the whole window, then `loss.backward()`.

    With `chunk_steps` the encoder is called on chunks of that many steps (all
    kept in the graph), consuming the RNG as `streaming_backward` does.
    """
    steps, targets = _check_inputs(model, batch)
    device = _model_device(model)
    n_steps = steps.shape[1]
    k = n_steps if chunk_steps is None else _check_chunk_steps("chunk_steps", chunk_steps)
    pieces = [model.encode(steps[:, a:b].to(device)) for a, b in chunk_bounds(n_steps, k)]
    embeddings = torch.cat(pieces, dim=1)  # [B, L, D]
    loss = model.core_loss(embeddings, targets.to(device))
    loss.backward()
    return loss.item()
