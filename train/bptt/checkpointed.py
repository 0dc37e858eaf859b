"""The checkpointed mode of streaming BPTT: the core's state kept only at the segment boundaries a schedule chooses.

`CheckpointPlan` says how (the schedule, the memory budget, where the embeddings go, the segment
length); `CheckpointedRun` is one backward pass over a window under it, segment by segment, with the
schedule's next actions prefetched. The mode itself is described in `rcswarm.train.bptt.streaming`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from rcswarm.data.frames.window import FrameWindow, TensorWindow
from rcswarm.models.protocols import CoreState, SegmentStepModel
from rcswarm.train.bptt.encoder_chunks import (
    CORE,
    WindowRng,
    chunk_bounds,
    encode_without_grad,
    recompute_backward,
)
from rcswarm.train.bptt.schedule import (
    ADVANCE,
    FREE,
    KINDS,
    RESTORE,
    STORE,
    TURN,
    Action,
    MemoryBudgetError,
    Schedule,
    binomial,
    plan_schedule,
    store_all,
    uniform,
)
from rcswarm.train.bptt.segment_store import (
    EmbeddingStore,
    HostCopies,
    Prefetcher,
    StateStash,
    bytes_of,
    check_spill_space,
)
from rcswarm.train.bptt.stats import StreamingStats

EMBEDDING_PLACES = ("auto", "memory", "disk")
SEGMENT_CHUNKS = 8
"""Default core segment length in encoder chunks of k steps."""


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
        """(the schedule for n segments, whether the embeddings go to disk) for these sizes; MemoryBudgetError (a
        ValueError, with the states the schedule needs and `state_bytes`) when its states do not fit the budget."""
        max_states = None if self.budget_bytes is None else self.budget_bytes // max(state_bytes, 1)
        if self.slots is not None:
            chosen = binomial(n, self.slots)
        elif self.interval is not None:
            chosen = uniform(n, self.interval)
        else:
            try:
                chosen = plan_schedule(n, max_states, self.schedule)
            except MemoryBudgetError as exc:
                raise MemoryBudgetError(f"{exc} (core states of {state_bytes} bytes, budget_bytes={self.budget_bytes})",
                                        exc.states, state_bytes) from None
        states = chosen.stored_states * state_bytes
        if self.budget_bytes is not None and states > self.budget_bytes:
            raise MemoryBudgetError(
                f"the {chosen.kind} schedule keeps {chosen.stored_states} core states of {state_bytes} bytes: "
                f"expected at most budget_bytes={self.budget_bytes}",
                chosen.stored_states, state_bytes,
            )
        fits = self.budget_bytes is None or states + embedding_bytes <= self.budget_bytes
        return chosen, self.embeddings == "disk" or (self.embeddings == "auto" and not fits)


def _lookahead(actions: Iterator[Action], depth: int) -> Iterator[tuple[Action, deque[Action]]]:
    """Each action with the (up to) `depth` actions that follow it."""
    upcoming: deque[Action] = deque()
    for action in actions:
        upcoming.append(action)
        if len(upcoming) > depth:
            yield upcoming.popleft(), upcoming
    while upcoming:
        yield upcoming.popleft(), upcoming


class CheckpointedRun:
    """One checkpointed backward pass over a window (the checkpointed mode of `rcswarm.train.bptt.streaming`).

    Segment i covers steps [i S, (i + 1) S) (S = `segment_steps`, a multiple of k); its
    encoder runs in chunks of k steps, aligned with the window's chunks of k. Random numbers
    come from `rng` (a `WindowRng`): the window's encoder chunk c from its seed ENCODE c, as
    in the paged mode, and the core on segment i, in each of its up to three runs (the first
    sweep, an advance from a checkpoint, the turn), from its seed CORE i, so a core with
    dropout gets the same masks for the loss, the boundary states and the gradients. That
    costs O(1) bytes per window, not an RNG state per chunk. Single-threaded
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
        self.rng = WindowRng(device)
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

    def _first_chunk(self, i: int) -> int:
        """The window's index of segment i's first encoder chunk of k steps."""
        return self.bounds(i)[0] // self.k

    def _encode(self, i: int, segment: TensorWindow) -> Tensor:
        """Segment i's embeddings [B, S, D] without gradients, each chunk from its seed."""
        embeddings, _ = encode_without_grad(
            self.model, segment, chunk_bounds(segment.length, self.k), self.device, self.rng, self._first_chunk(i)
        )
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
        with torch.no_grad(), self.rng.seeded(CORE, i, first=True):
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
        per_step = bytes_of(embeddings) / embeddings.shape[1]
        state_bytes = sum(bytes_of(t) for t in state)
        embedding_bytes = math.ceil(per_step * self.window.length)
        schedule, on_disk = self.plan.resolve(self.n, state_bytes, embedding_bytes)
        if on_disk:
            check_spill_space(self.plan.spill_dir, embedding_bytes)
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
        with torch.no_grad(), self.rng.seeded(CORE, i, first=False):
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
        with torch.enable_grad(), self.rng.seeded(CORE, i, first=first):
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
            recompute_backward(self.model, segment, leaf.grad, bounds, self.rng, self.device, self._first_chunk(i))

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
            self.rng.finish()
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
