"""Where streaming BPTT keeps what it needs again later: host copies, embeddings, core states, prefetched loads.

- `HostCopies`: copies between a CUDA device and pinned host buffers on a side stream (one
  per device), device-to-host after the current stream's work, host-to-device with an event
  the consumer waits on. `HostPager` (bptt/paged.py) and the stores below use it. No GPU was
  available where this was written: the CUDA branches run only on a CUDA model, and their
  test (tests/train/test_streaming_bptt.py) skips without a GPU.
- `Prefetcher`: runs loads (window chunks, embedding reads) ahead of their use on one
  background thread (on CUDA; on the CPU it loads when asked, see its docstring), keyed
  so the consumer takes the result it asked for. Every load goes through that one
  thread, so a data source is never read by two threads at once.
- `EmbeddingStore`: the per-segment frame embeddings [B, k, D] the checkpointed schedule
  runs the core on again. In host memory (on CUDA: pinned host copies), or in an unlinked
  temporary file written and read with pwrite/pread (not mmap, so the process holds only
  the segments in flight; the kernel's page cache keeps the rest while memory is free and
  evicts it otherwise). Its prefetch asks the kernel to read ahead
  (posix_fadvise WILLNEED), then loads through the `Prefetcher`. A window's embeddings go to the file only
  where the disk keeps SPILL_RESERVE_BYTES free beside them (`check_spill_space`).
- `StateStash`: the checkpointed core states at segment boundaries, copied into slots
  allocated once (on CUDA in pinned host memory, written and copied back on the side stream, so a
  restore never reads a slot before its copy landed; prefetched when the schedule's restore is near). It counts stored states and bytes and their peaks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor


class HostCopies:
    """Device <-> pinned host copies on a side stream per CUDA device; see the module docstring."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self.copied = False

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The one side stream of `device`: "cuda" and "cuda:N" of the current device are the same device, so the
        same stream (two streams would let a copy back from a slot overtake the copy into it)."""
        if device.index is None:
            device = torch.device(device.type, torch.cuda.current_device())
        stream = self._streams.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device=device)
            self._streams[device] = stream
        return stream

    def to_host(self, tensor: Tensor) -> Tensor:
        """A pinned host copy of CUDA `tensor`, made on the side stream after the current stream's work."""
        return self.copy_to_host(torch.empty_like(tensor, device="cpu", pin_memory=True), tensor)

    def copy_to_host(self, host: Tensor, tensor: Tensor) -> Tensor:
        """Copy CUDA `tensor` into the pinned `host` on the side stream after the current stream's work; `host`.

        On the side stream, so a later `start_to_device` of `host` (same stream) reads it only once written, and
        a copy from `host` still in flight finishes before `host` is written again."""
        stream = self.side_stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(stream)
        self.copied = True
        return host

    def start_to_device(self, host: Tensor, device: torch.device) -> tuple[Tensor, torch.cuda.Event]:
        """Start copying `host` to `device` on the side stream: (device tensor, event when done)."""
        stream = self.side_stream(device)
        with torch.cuda.stream(stream):
            on_device = torch.empty_like(host, device=device)
            on_device.copy_(host, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        return on_device, ready

    @staticmethod
    def wait(tensor: Tensor, ready: torch.cuda.Event) -> Tensor:
        """`tensor` once its copy is done, usable on the current stream."""
        current = torch.cuda.current_stream(tensor.device)
        current.wait_event(ready)
        tensor.record_stream(current)
        return tensor


class Prefetcher:
    """Loads run ahead of their use, keyed; `take` returns the result of the one asked for.

    With `background` the loads run on one background thread, up to `depth` of them
    ahead, so a data source is never read by two threads at once. Without it (the CPU
    default of streaming BPTT) `submit` does nothing and `take` loads at once: on the CPU
    the loads compete with torch for the same cores, and a second thread's malloc arena
    made the peak RSS of a long window grow (measured: +1.2 MiB from L = 1,024 to 8,192
    for the tiny preset, flat without the thread).
    """

    def __init__(self, depth: int, background: bool = True) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"Prefetcher.depth={depth!r}: expected an int >= 0")
        self.depth = depth
        self.background = background
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rcswarm-prefetch") if background else None
        self._pending: dict[Hashable, Future[Any]] = {}
        self.prefetched = 0

    def submit(self, key: Hashable, load: Callable[[], Any]) -> None:
        """Start `load` in the background unless it is pending, `depth` loads already are, or there is no thread."""
        if self._pool is None or key in self._pending or len(self._pending) >= self.depth:
            return
        self._pending[key] = self._pool.submit(load)
        self.prefetched += 1

    def take(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The result of the load submitted under `key`, or of `load` run now (on the loading thread)."""
        if self._pool is None:
            return load()
        future = self._pending.pop(key, None)
        if future is None:
            future = self._pool.submit(load)
        return future.result()

    def close(self) -> None:
        """Wait for the pending loads, drop their results and stop the thread."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def bytes_of(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# Disk a spill leaves free: the window's embeddings go to a file only when the spill directory keeps this much
# beside them (a coordinator's long window, up to the worker's --max-step-tokens, once filled the worker's $TMPDIR).
SPILL_RESERVE_BYTES = 1 << 30


class SpillSpaceError(OSError):
    """The spill directory cannot take a window's embeddings and keep SPILL_RESERVE_BYTES free."""


def check_spill_space(spill_dir: str | None, nbytes: int) -> None:
    """SpillSpaceError, naming the bytes, the directory and its free space, unless `spill_dir` (None: the system's
    temporary directory, $TMPDIR) holds `nbytes` more and keeps SPILL_RESERVE_BYTES free."""
    directory = spill_dir or tempfile.gettempdir()
    free = shutil.disk_usage(directory).free
    if nbytes + SPILL_RESERVE_BYTES > free:
        raise SpillSpaceError(
            f"streaming BPTT would write {nbytes / 2**20:,.1f} MiB of the window's embeddings to {directory}, which has "
            f"{free / 2**20:,.1f} MiB free (keeping {SPILL_RESERVE_BYTES / 2**20:,.0f} MiB): point TMPDIR at a larger "
            "disk, raise [inner] memory_budget_mb, or train shorter windows")


class EmbeddingStore:
    """Per-segment embeddings [B, k, D]: in host memory or a temporary file; see the module docstring.

    `put(i, e)` once per segment (in order of first use); `get(i)` returns it on the
    model's device; `prefetch(i)` starts a read (disk) or device copy (CUDA) ahead.
    `shape_of(i)` gives segment i's shape (the last segment may be shorter).
    """

    def __init__(
        self, device: torch.device, dtype: torch.dtype, shape_of: Callable[[int], tuple[int, ...]],
        prefetcher: Prefetcher, copies: HostCopies, on_disk: bool, spill_dir: str | None = None,
    ) -> None:
        self.device, self.dtype, self.shape_of = device, dtype, shape_of
        self.on_disk = on_disk
        self._prefetcher, self._copies = prefetcher, copies
        self._cuda = device.type == "cuda"
        self._host: dict[int, Tensor] = {}
        self._in_flight: dict[int, tuple[Tensor, torch.cuda.Event]] = {}
        self._slot_bytes = 0
        self._file = tempfile.TemporaryFile(dir=spill_dir) if on_disk else None
        self.stored_bytes = 0

    def _offset(self, index: int) -> int:
        return index * self._slot_bytes

    def put(self, index: int, embeddings: Tensor) -> None:
        nbytes = bytes_of(embeddings)
        self.stored_bytes += nbytes
        if self._file is None:
            self._host[index] = self._copies.to_host(embeddings) if self._cuda else embeddings
            return
        if not self._slot_bytes:
            self._slot_bytes = nbytes
        if nbytes > self._slot_bytes:
            raise ValueError(f"segment {index} has {nbytes} bytes of embeddings: expected at most the first's {self._slot_bytes}")
        raw = embeddings.detach().to("cpu").contiguous().view(torch.uint8).numpy()  # [nbytes]
        view, offset = memoryview(raw), self._offset(index)
        while view:
            written = os.pwrite(self._file.fileno(), view, offset)
            view, offset = view[written:], offset + written

    def _read(self, index: int) -> Tensor:
        """Segment `index` read from the file into a fresh host tensor (pinned on CUDA)."""
        assert self._file is not None
        host = torch.empty(self.shape_of(index), dtype=self.dtype, pin_memory=self._cuda)
        raw = host.view(torch.uint8).numpy()
        view, offset = memoryview(raw), self._offset(index)
        while view:
            read = os.preadv(self._file.fileno(), [view], offset)
            if read <= 0:
                raise OSError(f"embedding file ended at byte {offset}: segment {index} was never stored")
            view, offset = view[read:], offset + read
        return host

    def _load(self, index: int) -> Callable[[], Tensor]:
        return lambda: self._read(index)

    def prefetch(self, index: int) -> None:
        if self._file is not None:
            if hasattr(os, "posix_fadvise") and self._slot_bytes:
                os.posix_fadvise(self._file.fileno(), self._offset(index), self._slot_bytes, os.POSIX_FADV_WILLNEED)
            self._prefetcher.submit(("embedding", index), self._load(index))
        elif self._cuda and index not in self._in_flight and index in self._host:
            self._in_flight[index] = self._copies.start_to_device(self._host[index], self.device)

    def get(self, index: int) -> Tensor:
        if self._file is not None:
            host = self._prefetcher.take(("embedding", index), self._load(index))
            return host.to(self.device, non_blocking=True) if self._cuda else host
        if not self._cuda:
            return self._host[index]
        if index not in self._in_flight:
            self.prefetch(index)
        return HostCopies.wait(*self._in_flight.pop(index))

    def close(self) -> None:
        self._host.clear()
        self._in_flight.clear()
        if self._file is not None:
            self._file.close()


class StateStash:
    """Checkpointed core states (tuples of tensors) by boundary, in slots allocated once; see the module docstring.

    The first `put` allocates `slots` copies of the state's tensors in one buffer per
    tensor (pinned host memory on CUDA); every state is copied into a free slot and read
    back from it. Allocating once keeps the states from being scattered over the heap
    between short-lived tensors, where they would keep the allocator from returning freed
    memory. A state read on the CPU is a view of its slot: valid until the slot is reused.
    """

    def __init__(self, device: torch.device, copies: HostCopies, slots: int) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
            raise ValueError(f"StateStash.slots={slots!r}: expected an int >= 0")
        self.device = device
        self.slots = slots
        self._copies = copies
        self._cuda = device.type == "cuda"
        self._pool: tuple[Tensor, ...] = ()
        self._free: list[int] = []
        self._slot_of: dict[int, int] = {}
        self._in_flight: dict[int, list[tuple[Tensor, torch.cuda.Event]]] = {}
        self.stored = self.stored_bytes = 0
        self.peak_stored = self.peak_bytes = 0

    def _allocate(self, state: tuple[Tensor, ...]) -> None:
        self._pool = tuple(
            torch.empty((self.slots, *t.shape), dtype=t.dtype, device="cpu" if self._cuda else t.device,
                        pin_memory=self._cuda)
            for t in state
        )
        self._free = list(range(self.slots - 1, -1, -1))

    def put(self, boundary: int, state: tuple[Tensor, ...]) -> None:
        if boundary in self._slot_of:
            raise ValueError(f"boundary {boundary} is already stored")
        if not self._pool:
            self._allocate(state)
        if not self._free:
            raise ValueError(f"storing boundary {boundary}: all {self.slots} slots are taken")
        slot = self._free.pop()
        for buffer, tensor in zip(self._pool, state, strict=True):
            if self._cuda:  # on the side stream, which also copies the slot back: never read before it is written
                self._copies.copy_to_host(buffer[slot], tensor)
            else:
                buffer[slot].copy_(tensor)
        self._slot_of[boundary] = slot
        self.stored += 1
        self.stored_bytes += sum(bytes_of(t) for t in state)
        self.peak_stored = max(self.peak_stored, self.stored)
        self.peak_bytes = max(self.peak_bytes, self.stored_bytes)

    def prefetch(self, boundary: int) -> None:
        if self._cuda and boundary in self._slot_of and boundary not in self._in_flight:
            slot = self._slot_of[boundary]
            self._in_flight[boundary] = [self._copies.start_to_device(buffer[slot], self.device) for buffer in self._pool]

    def get(self, boundary: int) -> tuple[Tensor, ...]:
        if boundary not in self._slot_of:
            raise KeyError(f"boundary {boundary} is not stored")
        if not self._cuda:
            slot = self._slot_of[boundary]
            return tuple(buffer[slot] for buffer in self._pool)
        self.prefetch(boundary)
        return tuple(HostCopies.wait(t, ready) for t, ready in self._in_flight.pop(boundary))

    def drop(self, boundary: int) -> None:
        slot = self._slot_of.pop(boundary)
        self._in_flight.pop(boundary, None)
        self._free.append(slot)
        self.stored -= 1
        self.stored_bytes -= sum(bytes_of(buffer[slot]) for buffer in self._pool)
