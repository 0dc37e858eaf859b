"""The paged mode of streaming BPTT: the core's saved activations paged to host memory (`HostPager`).

See `rcswarm.train.bptt.streaming` for the schedule: the encoder runs on chunks of k steps
without gradients, the core runs once with gradients on the embeddings with its saved tensors
routed through a `HostPager` (on CUDA copied to pinned host memory on a side stream and copied back
a few pages ahead of the backward pass; on the CPU a no-op that still counts), and the encoder is
recomputed with gradients k steps at a time.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable

import torch
from torch import Tensor

from rcswarm.data.frames.window import FrameWindow
from rcswarm.models.protocols import StepModel
from rcswarm.train.bptt.encoder_chunks import (
    WindowRng,
    chunk_bounds,
    encode_without_grad,
    recompute_backward,
    scored_count,
)
from rcswarm.train.bptt.segment_store import HostCopies
from rcswarm.train.bptt.stats import StreamingStats


def _modified_in_place(tensor: Tensor, now: int, saved: int, how: str) -> RuntimeError:
    """Autograd's error for a saved tensor modified in place, naming `tensor`'s dtype, shape and device."""
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{tensor.dtype} {list(tensor.shape)}], saved for backward through HostPager ({how}), is at version {now}; "
        f"expected version {saved} instead"
    )


class _Kept:
    """A saved tensor left where it is (a parameter, the embeddings leaf), with its version when saved."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
        self.version = tensor._version

    def unpack(self) -> Tensor:
        if self.tensor._version != self.version:
            raise _modified_in_place(self.tensor, self.tensor._version, self.version, "kept in place")
        return self.tensor


class _Page:
    """One saved tensor in host memory, with its version when saved and its prefetched device copy if any.

    On the CPU `host` is a detached alias of the saved tensor (it shares the tensor's version
    counter). On CUDA it is a copy made on a side stream: `in_flight` holds a detached alias of
    the source (no grad_fn, so no reference cycle) until the copy is seen done, `stale` the
    source's version then if it had changed (the copy may have read either value), and `source`
    a weak reference to the source for the check at unpack.
    """

    __slots__ = ("copied", "device", "host", "in_flight", "index", "on_device", "ready", "source", "stale", "taken",
                 "version")

    def __init__(self, index: int, device: torch.device, host: Tensor, version: int) -> None:
        self.index = index
        self.device = device
        self.host = host
        self.version = version
        self.on_device: Tensor | None = None
        self.ready: torch.cuda.Event | None = None
        self.taken = False
        self.copied: torch.cuda.Event | None = None
        self.in_flight: Tensor | None = None
        self.source: weakref.ref[Tensor] | None = None
        self.stale: int | None = None


class HostPager:
    """A saved-tensor pack/unpack pair that pages autograd's saved activations to host memory.

    Tensors sharing storage with one of `keep` (parameters, the embeddings
    leaf) stay where they are. Use as `with pager.hooks(): loss = f(x)`, then
    `loss.backward()`, then `pager.close()`. `prefetch` is how many pages
    ahead of the one the backward pass asks for are copied back to the GPU.

    Autograd checks no versions of tensors saved through hooks, so the pager
    does: a saved tensor modified in place before backward reads it raises
    autograd's RuntimeError at unpack. On the CPU (a page aliases the tensor)
    and for kept tensors that is every such modification. On CUDA a page is a
    copy: a modification made before its copy was seen done raises (the copy
    may hold either value); a later one raises if the source is still alive
    at unpack, and otherwise cannot have reached the copy, which holds the
    value autograd saved.

    No lock: `pack` runs during the forward pass (the caller's thread), `unpack`
    during the backward pass (on CUDA on the autograd engine's device thread),
    never at the same time.
    """

    def __init__(self, keep: Iterable[Tensor] = (), prefetch: int = 2) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"HostPager.prefetch={prefetch!r}: expected an int >= 0")
        self.prefetch = prefetch
        self._keep = {t.untyped_storage().data_ptr() for t in keep}
        self._pages: list[_Page] = []
        self._in_flight: deque[_Page] = deque()
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

    def pack(self, tensor: Tensor) -> _Kept | _Page:
        """Autograd's pack hook: a page for `tensor`, or `tensor` kept where it is, each with its version.

        A page holds a detached alias (CPU) or a copy (CUDA), never `tensor`
        itself: a saved output would otherwise reference its own grad_fn, a
        cycle that keeps the graph alive if backward never runs.
        """
        self._settle(wait=False)
        if tensor.untyped_storage().data_ptr() in self._keep:
            self.resident_tensors += 1
            return _Kept(tensor)
        if tensor.is_cuda:
            page = _Page(len(self._pages), tensor.device, self._copies.to_host(tensor), tensor._version)
            page.copied = torch.cuda.Event()
            page.copied.record(self._copies.side_stream(tensor.device))
            page.in_flight = tensor.detach()
            page.source = weakref.ref(tensor)
            self._in_flight.append(page)
        else:
            page = _Page(len(self._pages), tensor.device, tensor.detach(), tensor._version)
        self._pages.append(page)
        self.paged_tensors += 1
        self.paged_bytes += tensor.numel() * tensor.element_size()
        return page

    def _settle(self, wait: bool) -> None:
        """Note the versions of the CUDA sources whose copies are done (all of them if `wait`) and let go of them."""
        while self._in_flight:
            page = self._in_flight[0]
            assert page.copied is not None and page.in_flight is not None
            if wait:
                page.copied.synchronize()
            elif not page.copied.query():
                return
            if page.in_flight._version != page.version:
                page.stale = page.in_flight._version
            page.copied, page.in_flight = None, None
            self._in_flight.popleft()

    def _check_version(self, page: _Page) -> None:
        """Raise autograd's error if `page`'s tensor was modified in place since it was saved (see the class)."""
        if page.device.type != "cuda":
            if page.host._version != page.version:
                raise _modified_in_place(page.host, page.host._version, page.version, "paged as an alias")
            return
        self._settle(wait=True)
        if page.stale is not None:
            raise _modified_in_place(page.host, page.stale, page.version, "modified while its copy was in flight")
        source = None if page.source is None else page.source()
        if source is not None and source._version != page.version:
            raise _modified_in_place(source, source._version, page.version, "paged as a copy")

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

    def unpack(self, packed: _Kept | _Page) -> Tensor:
        """Autograd's unpack hook: the saved tensor, on the device it was saved from; RuntimeError if modified since."""
        if isinstance(packed, _Kept):
            return packed.unpack()
        self._check_version(packed)
        self.unpacked_tensors += 1
        packed.taken = True
        if packed.device.type != "cuda":
            return packed.host
        return self._take_on_device(packed)

    def close(self) -> None:
        """Drop every page (host buffers, prefetched device copies, the sources of copies still in flight)."""
        self._settle(wait=True)
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
    rng = WindowRng(device)
    embeddings, targets = encode_without_grad(model, window, bounds, device, rng)
    rng.finish()
    loss, grad, pager = _core_backward(model, embeddings, targets.to(device), prefetch)
    if grad is not None:
        recompute_backward(model, window, grad, bounds, rng, device)
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
