"""The paged mode of streaming BPTT: the core's saved activations paged to host memory (`HostPager`).

See `rcswarm.train.bptt.streaming` for the schedule: the encoder runs on chunks of k steps
without gradients, the core runs once with gradients on the embeddings with its saved tensors
routed through a `HostPager` (on CUDA copied to pinned host memory on a side stream and copied back
a few pages ahead of the backward pass; on the CPU a no-op that still counts), and the encoder is
recomputed with gradients k steps at a time.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from rcswarm.data.frames.window import FrameWindow
from rcswarm.models.protocols import StepModel
from rcswarm.train.bptt.encoder_chunks import chunk_bounds, encode_without_grad, recompute_backward, scored_count
from rcswarm.train.bptt.segment_store import HostCopies
from rcswarm.train.bptt.stats import StreamingStats


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
        self._copies = HostCopies()
        self.paged_tensors = 0
        self.paged_bytes = 0
        self.resident_tensors = 0
        self.unpacked_tensors = 0

    @property
    def copied_to_host(self) -> bool:
        return self._copies.copied

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context manager that routes saved tensors through `pack` / `unpack`."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: Tensor) -> Tensor | _Page:
        """Autograd's pack hook: a page for `tensor`, or `tensor` itself if it is kept.

        A page holds a detached alias (CPU) or a copy (CUDA), never `tensor`
        itself: a saved output would otherwise reference its own grad_fn, a
        cycle that keeps the graph alive if backward never runs.
        """
        if tensor.untyped_storage().data_ptr() in self._keep:
            self.resident_tensors += 1
            return tensor
        host = self._copies.to_host(tensor) if tensor.is_cuda else tensor.detach()
        page = _Page(len(self._pages), tensor.device, host)
        self._pages.append(page)
        self.paged_tensors += 1
        self.paged_bytes += tensor.numel() * tensor.element_size()
        return page

    def _start_copy_back(self, page: _Page) -> None:
        page.on_device, page.ready = self._copies.start_to_device(page.host, page.device)

    def _prefetch_before(self, index: int) -> None:
        for page in self._pages[max(index - self.prefetch, 0) : index]:
            if not page.taken and page.on_device is None:
                self._start_copy_back(page)

    def _take_on_device(self, page: _Page) -> Tensor:
        if page.on_device is None:
            self._start_copy_back(page)
        self._prefetch_before(page.index)
        assert page.ready is not None and page.on_device is not None
        tensor = HostCopies.wait(page.on_device, page.ready)
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


def paged_backward(
    model: StepModel, window: FrameWindow, k: int, prefetch: int, device: torch.device
) -> tuple[float, StreamingStats]:
    """The paged mode over the whole window (see `rcswarm.train.bptt.streaming`); (loss, stats)."""
    bounds = chunk_bounds(window.length, k)
    embeddings, targets, snapshots = encode_without_grad(model, window, bounds, device)
    loss, grad, pager = _core_backward(model, embeddings, targets.to(device), prefetch)
    if grad is not None:
        recompute_backward(model, window, grad, bounds, snapshots, device)
    stats = StreamingStats(
        n_steps=window.length,
        chunk_steps=k,
        n_chunks=len(bounds),
        max_grad_chunk_steps=max(stop - start for start, stop in bounds),
        paged_tensors=pager.paged_tensors,
        paged_bytes=pager.paged_bytes,
        resident_tensors=pager.resident_tensors,
        unpacked_tensors=pager.unpacked_tensors,
        copied_to_host=pager.copied_to_host,
        scored=scored_count(targets),
    )
    return loss, stats
