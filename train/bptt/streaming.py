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
   steps at a time (the RNG states kept if the encoder drew random numbers),
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
   k steps at a time, last chunk first (RNG states restored), each chunk
   backpropagated with its share of dloss/dembeddings, as in the paged mode.
3. Window chunks come from a `FrameWindow` (`chunk(start, stop)`), so a 10^5
   step window is never materialized. The schedule's next actions are known,
   so what they need is prefetched: on CUDA, chunks and embeddings read from
   disk on a background thread (into pinned buffers) and checkpointed states
   and embeddings copied back from pinned host memory on the side stream; on
   the CPU, the kernel reads the embedding file ahead (posix_fadvise) and the
   rest loads when needed (see `segment_store.Prefetcher` for why).

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

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from rcswarm.data.diagnostics import IGNORE_INDEX
from rcswarm.data.frames.window import FrameWindow, TensorWindow
from rcswarm.models.protocols import CoreState, SegmentStepModel, StepModel
from rcswarm.train.bptt.schedule import (
    ADVANCE,
    FREE,
    KINDS,
    RESTORE,
    STORE,
    TURN,
    Action,
    Schedule,
    binomial,
    plan_schedule,
    store_all,
    uniform,
)
from rcswarm.train.bptt.segment_store import EmbeddingStore, HostCopies, Prefetcher, StateStash

Batch = tuple[Tensor, Tensor]
"""(steps [B, L, *S], targets [B, L, ...])."""

EMBEDDING_PLACES = ("auto", "memory", "disk")
SEGMENT_CHUNKS = 8
"""Default core segment length in encoder chunks of k steps."""


@dataclass(frozen=True)
class StreamingStats:
    """What one `streaming_backward` call did.

    `max_grad_chunk_steps` is the largest number of steps encoded with
    gradients at once (never more than `chunk_steps`); `paged_tensors` and
    `paged_bytes` count the core's saved tensors that went through the pager,
    `resident_tensors` those it left in place (parameters and the embeddings
    leaf), `unpacked_tensors` the pages the backward pass read back, and
    `copied_to_host` whether pages, states or embeddings were actually copied
    (CUDA) rather than already on the host. `scored` is the number of targets
    the loss averaged over.

    Checkpointed runs (the paged fields are 0): `schedule` describes the
    schedule ("paged" otherwise) over segments of `segment_steps` steps,
    `stored_states` and `stored_state_bytes` are
    the most core states (and their bytes) kept at once, `core_advances` the
    segment forward passes run again without gradients, `embedding_bytes` the
    embeddings kept for them and `embeddings_on_disk` whether in a file.
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
    scored: int = 0
    schedule: str = "paged"
    segment_steps: int = 0
    stored_states: int = 0
    stored_state_bytes: int = 0
    core_advances: int = 0
    embedding_bytes: int = 0
    embeddings_on_disk: bool = False


@dataclass(frozen=True)
class CheckpointPlan:
    """How the checkpointed mode keeps the core's states and the embeddings.

    - `schedule`: "auto" (every state if `budget_bytes` allows, else the binomial
      schedule with as many slots as fit), "all", "uniform" or "binomial".
    - `budget_bytes`: memory for the stored core states plus the embeddings kept
      in memory (None: no limit). The states come first; embeddings that do not
      fit beside them go to a temporary file. A schedule whose states exceed it
      raises ValueError.
    - `slots`: binomial only, the stored states (default ceil(log2 n), fewer if
      the budget allows fewer); `interval`: uniform only (default round(√n)).
    - `embeddings`: "auto" (by the budget), "memory" or "disk"; `spill_dir` the
      directory of the temporary file (default: the system's).
    - `segment_steps`: steps per core segment, a multiple of the encoder chunk k
      (default 8 k): the core runs and is recomputed a segment at a time, the
      encoder k steps at a time within it. Longer segments mean fewer, larger
      core calls and fewer states; a segment's core activations are O(S).
    """

    schedule: str = "auto"
    budget_bytes: int | None = None
    slots: int | None = None
    interval: int | None = None
    embeddings: str = "auto"
    spill_dir: str | None = None
    segment_steps: int | None = None

    def __post_init__(self) -> None:
        if self.schedule not in ("auto", *KINDS):
            raise ValueError(f"CheckpointPlan.schedule={self.schedule!r}: expected 'auto' or one of {KINDS}")
        if self.embeddings not in EMBEDDING_PLACES:
            raise ValueError(f"CheckpointPlan.embeddings={self.embeddings!r}: expected one of {EMBEDDING_PLACES}")
        for name, minimum in (("budget_bytes", 1), ("slots", 0), ("interval", 1), ("segment_steps", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
                raise ValueError(f"CheckpointPlan.{name}={value!r}: expected None or an int >= {minimum}")
        if self.slots is not None and self.schedule != "binomial":
            raise ValueError(f"CheckpointPlan.slots={self.slots!r} applies to schedule 'binomial', not {self.schedule!r}")
        if self.interval is not None and self.schedule != "uniform":
            raise ValueError(f"CheckpointPlan.interval={self.interval!r} applies to schedule 'uniform', not {self.schedule!r}")

    def segment_steps_for(self, k: int) -> int:
        """The segment length for encoder chunks of k steps; ValueError unless a multiple of k."""
        if self.segment_steps is None:
            return SEGMENT_CHUNKS * k
        if self.segment_steps % k:
            raise ValueError(
                f"CheckpointPlan.segment_steps={self.segment_steps}: expected a multiple of k={k} "
                "(the encoder's chunks must tile a segment)"
            )
        return self.segment_steps

    def resolve(self, n: int, state_bytes: int, embedding_bytes: int) -> tuple[Schedule, bool]:
        """(the schedule for n segments, whether the embeddings go to disk) for these sizes."""
        max_states = None if self.budget_bytes is None else self.budget_bytes // max(state_bytes, 1)
        if self.slots is not None:
            chosen = binomial(n, self.slots)
        elif self.interval is not None:
            chosen = uniform(n, self.interval)
        else:
            chosen = plan_schedule(n, max_states, self.schedule)
        states = chosen.stored_states * state_bytes
        if self.budget_bytes is not None and states > self.budget_bytes:
            raise ValueError(
                f"the {chosen.kind} schedule keeps {chosen.stored_states} core states of {state_bytes} bytes: "
                f"expected at most budget_bytes={self.budget_bytes}"
            )
        fits = self.budget_bytes is None or states + embedding_bytes <= self.budget_bytes
        return chosen, self.embeddings == "disk" or (self.embeddings == "auto" and not fits)


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


def chunk_bounds(n_steps: int, k: int) -> list[tuple[int, int]]:
    """[(start, stop)] covering range(n_steps) in chunks of k steps (the last may be shorter)."""
    return [(start, min(start + k, n_steps)) for start in range(0, n_steps, k)]


RngSnapshot = tuple[Tensor, Tensor | None]


def _rng_snapshot(device: torch.device) -> RngSnapshot:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _rng_moved(snapshot: RngSnapshot, device: torch.device) -> bool:
    """Whether the RNG state differs from `snapshot` (something drew random numbers since)."""
    now = _rng_snapshot(device)
    return not torch.equal(now[0], snapshot[0]) or (now[1] is not None and not torch.equal(now[1], snapshot[1]))


@contextmanager
def _rng_restored(snapshot: RngSnapshot, device: torch.device) -> Iterator[None]:
    """Run the body from the RNG state in `snapshot`; the caller's RNG state is kept."""
    cpu, cuda = snapshot
    with torch.random.fork_rng(devices=[device] if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield


def _scored(targets: Tensor) -> int:
    return int((targets != IGNORE_INDEX).sum())


def _encode_without_grad(
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
            snapshots.append(_rng_snapshot(device))
            chunk = model.encode(steps.to(device))  # [B, k, D]
            if embeddings is None:
                embeddings = chunk.new_empty((chunk.shape[0], window.length, *chunk.shape[2:]))
            embeddings[:, start:stop] = chunk  # [B, L, D]
    assert embeddings is not None
    return embeddings, torch.cat(targets, dim=1), snapshots


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
    window: FrameWindow,
    grad: Tensor,
    bounds: list[tuple[int, int]],
    snapshots: list[RngSnapshot] | list[None],
    device: torch.device,
) -> None:
    """Re-encode each chunk with gradients (last chunk first, from its RNG snapshot if any) and backpropagate its share."""
    for (start, stop), snapshot in reversed(list(zip(bounds, snapshots, strict=True))):
        steps, _ = window.chunk(start, stop)
        with _rng_restored(snapshot, device) if snapshot is not None else nullcontext():
            chunk = model.encode(steps.to(device))  # [B, k, D]
        if chunk.requires_grad:
            torch.autograd.backward(chunk, grad_tensors=grad[:, start:stop])
        del chunk


def _paged_backward(
    model: StepModel, window: FrameWindow, k: int, prefetch: int, device: torch.device
) -> tuple[float, StreamingStats]:
    """The paged mode (see the module docstring)."""
    bounds = chunk_bounds(window.length, k)
    embeddings, targets, snapshots = _encode_without_grad(model, window, bounds, device)
    loss, grad, pager = _core_backward(model, embeddings, targets.to(device), prefetch)
    if grad is not None:
        _recompute_backward(model, window, grad, bounds, snapshots, device)
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
        scored=_scored(targets),
    )
    return loss, stats


def _bytes_of(tensors: Iterable[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _lookahead(actions: Iterator[Action], depth: int) -> Iterator[tuple[Action, deque[Action]]]:
    """Each action with the (up to) `depth` actions that follow it."""
    upcoming: deque[Action] = deque()
    for action in actions:
        upcoming.append(action)
        if len(upcoming) > depth:
            yield upcoming.popleft(), upcoming
    while upcoming:
        yield upcoming.popleft(), upcoming


class _CheckpointedRun:
    """One checkpointed backward pass over a window (the checkpointed mode of the module docstring).

    Segment i covers steps [i S, (i + 1) S) (S = `segment_steps`, a multiple of k); its
    encoder runs in chunks of k steps, aligned with the window's chunks of k. Single-threaded
    apart from the `Prefetcher`'s loads (window reads, embedding reads), which touch only the
    window and the embedding file.
    """

    def __init__(
        self, model: SegmentStepModel, window: FrameWindow, k: int, plan: CheckpointPlan, prefetch: int,
        device: torch.device,
    ) -> None:
        self.model, self.window, self.k, self.plan, self.device = model, window, k, plan, device
        self.segment = plan.segment_steps_for(k)
        self.n = math.ceil(window.length / self.segment)
        self.prefetch = prefetch
        self.copies = HostCopies()
        self.prefetcher = Prefetcher(prefetch + 1, background=device.type == "cuda")
        self.states: StateStash | None = None
        self.embeddings: EmbeddingStore | None = None
        self.rng: dict[int, list[RngSnapshot]] = {}
        self.visited = 0
        self.loss_total: Tensor | None = None
        self.scored_total: Tensor | None = None
        self.seed: Tensor | None = None
        self.state: CoreState | None = None
        self.dstate: tuple[Tensor, ...] | None = None
        self.first_state: CoreState | None = None
        self.advances = 0

    def bounds(self, i: int) -> tuple[int, int]:
        return i * self.segment, min((i + 1) * self.segment, self.window.length)

    def _loader(self, i: int) -> Callable[[], tuple[Tensor, Tensor]]:
        def load() -> tuple[Tensor, Tensor]:
            steps, targets = self.window.chunk(*self.bounds(i))
            if self.device.type == "cuda":
                return steps.pin_memory(), targets.pin_memory()
            return steps, targets

        return load

    def prefetch_read(self, i: int) -> None:
        if 0 <= i < self.n:
            self.prefetcher.submit(("read", i), self._loader(i))

    def read(self, i: int) -> TensorWindow:
        """Segment i's steps and targets, as a window of its own on the model's device."""
        steps, targets = self.prefetcher.take(("read", i), self._loader(i))
        return TensorWindow(steps.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True))

    def _encode(self, i: int, segment: TensorWindow) -> Tensor:
        """Segment i's embeddings [B, S, D] without gradients; its RNG states kept if the encoder drew any."""
        embeddings, _, snapshots = _encode_without_grad(
            self.model, segment, chunk_bounds(segment.length, self.k), self.device
        )
        if _rng_moved(snapshots[0], self.device):
            self.rng[i] = snapshots
        return embeddings

    def _count(self, loss_sum: Tensor, scored: Tensor) -> None:
        loss_sum, scored = loss_sum.detach(), scored.detach()
        self.loss_total = loss_sum if self.loss_total is None else self.loss_total + loss_sum
        self.scored_total = scored if self.scored_total is None else self.scored_total + scored
        self.visited += 1

    def _first_forward(self, i: int) -> tuple[Tensor, CoreState]:
        """Segment i's first visit: encode, then the core without gradients from the current state."""
        segment = self.read(i)
        self.prefetch_read(i + 1)
        embeddings = self._encode(i, segment)  # [B, S, D]
        with torch.no_grad():
            loss_sum, scored, state = self.model.core_segment(embeddings, segment.targets, self.state)
        assert loss_sum is not None and scored is not None
        self._count(loss_sum, scored)
        return embeddings, state

    def choose_schedule(self) -> Schedule:
        """Run segment 0 and choose the schedule from its embedding and state sizes."""
        if self.n == 1:
            self.states = StateStash(self.device, self.copies, 0)
            return store_all(1)
        embeddings, state = self._first_forward(0)
        per_step = _bytes_of([embeddings]) / embeddings.shape[1]
        schedule, on_disk = self.plan.resolve(self.n, _bytes_of(state), math.ceil(per_step * self.window.length))
        trailing = tuple(embeddings.shape[2:])
        self.embeddings = EmbeddingStore(
            self.device, embeddings.dtype,
            lambda i: (embeddings.shape[0], self.bounds(i)[1] - self.bounds(i)[0], *trailing),
            self.prefetcher, self.copies, on_disk, self.plan.spill_dir,
        )
        self.embeddings.put(0, embeddings)
        self.states = StateStash(self.device, self.copies, schedule.stored_states)
        self.first_state = state
        return schedule

    def advance(self, i: int) -> None:
        self.advances += 1
        if i == 0 and self.first_state is not None:
            self.state, self.first_state = self.first_state, None
            return
        assert self.embeddings is not None
        if i == self.visited:
            embeddings, self.state = self._first_forward(i)
            self.embeddings.put(i, embeddings)
            return
        if i > self.visited:
            raise RuntimeError(f"the schedule advanced segment {i} before segment {self.visited}")
        with torch.no_grad():
            _, _, self.state = self.model.core_segment(self.embeddings.get(i), None, self.state)

    def turn(self, i: int) -> None:
        """Segment i's backward pass from the current state; dloss/dstate at its input for turn i - 1.

        The core runs with gradients from the state (a leaf) on the embeddings (a leaf: stored,
        or encoded now on the last segment's first visit); one backward of (summed loss, state
        after) gives the core's parameter gradients, dloss/dstate and dloss/dembeddings, and the
        encoder is then recomputed k steps at a time, last chunk first, as in the paged mode.
        """
        segment = self.read(i)
        self.prefetch_read(i - 1)
        first = i == self.visited
        if first:
            embeddings = self._encode(i, segment)  # [B, S, D]
        else:
            assert self.embeddings is not None
            embeddings = self.embeddings.get(i)
        leaf = embeddings.detach().requires_grad_()  # [B, S, D]
        state_in = None if self.state is None else tuple(t.detach().requires_grad_() for t in self.state)
        with torch.enable_grad():
            loss_sum, scored, state_out = self.model.core_segment(leaf, segment.targets, state_in)
        assert loss_sum is not None and scored is not None
        if first:
            self._count(loss_sum, scored)
        if self.visited != self.n:
            raise RuntimeError(f"the schedule turned segment {i} after visiting {self.visited} of {self.n} segments")
        if self.seed is None:
            assert self.scored_total is not None
            self.seed = 1.0 / self.scored_total.to(loss_sum.dtype)
        outputs, grads = [loss_sum], [self.seed]
        if self.dstate is not None:
            outputs += state_out
            grads += self.dstate
        torch.autograd.backward(outputs, grads)
        if state_in is not None:
            self.dstate = tuple(torch.zeros_like(t) if t.grad is None else t.grad for t in state_in)
        self.state = None
        if leaf.grad is not None:
            bounds = chunk_bounds(segment.length, self.k)
            snapshots = self.rng.pop(i, [None] * len(bounds))
            _recompute_backward(self.model, segment, leaf.grad, bounds, snapshots, self.device)

    def _prefetch_ahead(self, upcoming: Iterable[Action]) -> None:
        assert self.states is not None
        for name, index in upcoming:
            if name == RESTORE and index > 0:
                self.states.prefetch(index)
            elif name == ADVANCE and index < self.visited and self.embeddings is not None:
                self.embeddings.prefetch(index)
            elif name == TURN:
                self.prefetch_read(index)
                if self.embeddings is not None and index < self.visited:
                    self.embeddings.prefetch(index)

    def run(self) -> tuple[float, StreamingStats]:
        try:
            schedule = self.choose_schedule()
            states = self.states
            assert states is not None
            for (name, index), upcoming in _lookahead(schedule.actions(), self.prefetch):
                self._prefetch_ahead(upcoming)
                if name == ADVANCE:
                    self.advance(index)
                elif name == TURN:
                    self.turn(index)
                elif name == STORE:
                    assert self.state is not None
                    states.put(index, self.state)
                elif name == RESTORE:
                    self.state = None if index == 0 else states.get(index)
                elif name == FREE:
                    states.drop(index)
        finally:
            self.prefetcher.close()
            if self.embeddings is not None:
                self.embeddings.close()
        return self._result(schedule)

    def _result(self, schedule: Schedule) -> tuple[float, StreamingStats]:
        assert self.loss_total is not None and self.scored_total is not None and self.states is not None
        scored = int(self.scored_total)
        stats = StreamingStats(
            n_steps=self.window.length,
            chunk_steps=self.k,
            n_chunks=math.ceil(self.window.length / self.k),
            max_grad_chunk_steps=min(self.k, self.window.length),
            paged_tensors=0,
            paged_bytes=0,
            resident_tensors=0,
            unpacked_tensors=0,
            copied_to_host=self.copies.copied,
            scored=scored,
            schedule=schedule.describe(),
            segment_steps=self.segment,
            stored_states=self.states.peak_stored,
            stored_state_bytes=self.states.peak_bytes,
            core_advances=self.advances,
            embedding_bytes=0 if self.embeddings is None else self.embeddings.stored_bytes,
            embeddings_on_disk=self.embeddings is not None and self.embeddings.on_disk,
        )
        return (self.loss_total / scored).item() if scored else math.nan, stats


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
        return _paged_backward(model, window, k, prefetch, device)
    if not isinstance(model, SegmentStepModel):
        raise TypeError(
            f"model of type {type(model).__name__}: core checkpointing needs core_segment(embeddings, "
            "targets, state) (the SegmentStepModel protocol)"
        )
    if not isinstance(checkpoints, CheckpointPlan):
        raise TypeError(f"checkpoints of type {type(checkpoints).__name__}: expected a CheckpointPlan or None")
    return _CheckpointedRun(model, window, k, checkpoints, prefetch, device).run()


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
