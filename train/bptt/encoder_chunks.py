"""The per-step encoder, k steps at a time: the chunks, their random numbers, and the two encoder passes.

Both modes of streaming BPTT (`rcswarm.train.bptt.streaming`) encode a window's chunks of k steps
once without gradients (`encode_without_grad`, keeping the embeddings) and, once dloss/dembeddings
is known, again with gradients, last chunk first, each chunk backpropagated at once
(`recompute_backward`). Each chunk draws its random numbers (dropout) from a seed of its own that a
`WindowRng` derives from one base seed per window, so the recomputation draws the same ones in
O(1) bytes per window; the checkpointed mode seeds its core segments the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from rcswarm.data.diagnostics import IGNORE_INDEX
from rcswarm.data.frames.window import FrameWindow
from rcswarm.models.protocols import StepModel


def chunk_bounds(n_steps: int, k: int) -> list[tuple[int, int]]:
    """[(start, stop)] covering range(n_steps) in chunks of k steps (the last may be shorter)."""
    return [(start, min(start + k, n_steps)) for start in range(0, n_steps, k)]


ENCODE = 0
"""The kind of a `WindowRng` call that is the encoder on chunk c of a window (seed base + 2 c)."""
CORE = 1
"""The kind of a `WindowRng` call that is the core on segment i of a window (seed base + 2 i + 1)."""

_SEED_HIGH = 2**62
"""Base seeds are drawn from [0, 2**62), so base + 2 index + kind stays a valid (unsigned 64-bit) seed."""


def _seed_generators(seed: int, device: torch.device) -> None:
    """Seed the CPU generator and, on CUDA, `device`'s (the generators a call on `device` draws from)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)


def _generator_states(device: torch.device) -> tuple[Tensor, Tensor | None]:
    """The CPU generator's state and, on CUDA, `device`'s: what a call drawing random numbers changes."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _moved(before: tuple[Tensor, Tensor | None], device: torch.device) -> bool:
    now = _generator_states(device)
    cuda_moved = now[1] is not None and before[1] is not None and not torch.equal(now[1], before[1])
    return cuda_moved or not torch.equal(now[0], before[0])


class WindowRng:
    """The random numbers of one window's encoder chunks and core segments: one base seed, a seed per call.

    Every call (encoder chunk c: kind ENCODE; core segment i: kind CORE) runs under
    `torch.random.fork_rng` with the CPU generator and, on CUDA, `device`'s generator seeded
    with base + 2 index + kind, so its recomputation draws exactly the random numbers of its
    first run (the same dropout masks), and what is kept per window is O(1) bytes whatever the
    number of chunks (a whole CPU RNG state is 5,056 bytes). The caller's generators are left as
    they were, except that `finish` advances the CPU generator by one draw when some call drew
    random numbers, so the next window gets other seeds; a window that draws nothing leaves the
    caller's RNG untouched. The base is the number that draw gives (drawn here without advancing).

    A first run (`first=True`) is always seeded, and records whether it drew (`drew`, per kind,
    from the generators' states before and after); a rerun is seeded only if a first run of its
    kind drew, and otherwise runs without any RNG handling (its own first run came before it and
    drew nothing). The CPU generator (mt19937) keeps only the low 32 bits of a seed: within a
    window the 2**31 seeds of a kind are distinct; windows share one only by chance.

    Used from one thread (the one running the streaming pass).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        with torch.random.fork_rng(devices=[]):
            self.base = int(torch.randint(_SEED_HIGH, (), dtype=torch.int64))
        self.drew = [False, False]
        self._finished = False

    def seed(self, kind: int, index: int) -> int:
        """The seed of call `index` of `kind` (ENCODE or CORE); ValueError for another kind or a negative index."""
        if kind not in (ENCODE, CORE):
            raise ValueError(f"kind={kind!r}: expected ENCODE ({ENCODE}) or CORE ({CORE})")
        if index < 0:
            raise ValueError(f"index={index}: expected an int >= 0 (the chunk or segment of the window)")
        return self.base + 2 * index + kind

    @contextmanager
    def seeded(self, kind: int, index: int, *, first: bool) -> Iterator[None]:
        """Run the body from call `index` of `kind`'s seed (always on a first run; on a rerun if its kind drew)."""
        seed = self.seed(kind, index)
        if not first and not self.drew[kind]:
            yield
            return
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if cuda else []):
            _seed_generators(seed, self.device)
            before = _generator_states(self.device) if first and not self.drew[kind] else None
            yield
            if before is not None and _moved(before, self.device):
                self.drew[kind] = True

    def finish(self) -> None:
        """Once per window, after its first runs: advance the caller's CPU generator by one draw if any drew."""
        if not self._finished and any(self.drew):
            torch.randint(_SEED_HIGH, (), dtype=torch.int64)
        self._finished = True


def scored_count(targets: Tensor) -> int:
    """The number of targets the loss averages over (those not IGNORE_INDEX)."""
    return int((targets != IGNORE_INDEX).sum())


def encode_without_grad(
    model: StepModel, window: FrameWindow, bounds: list[tuple[int, int]], device: torch.device, rng: WindowRng,
    first_chunk: int = 0,
) -> tuple[Tensor, Tensor]:
    """Embeddings [B, L, D] chunk by chunk and the targets [B, L, ...]; chunk j from `rng`'s seed first_chunk + j."""
    embeddings: Tensor | None = None
    targets: list[Tensor] = []
    with torch.no_grad():
        for index, (start, stop) in enumerate(bounds, start=first_chunk):
            steps, chunk_targets = window.chunk(start, stop)
            targets.append(chunk_targets)
            with rng.seeded(ENCODE, index, first=True):
                chunk = model.encode(steps.to(device))  # [B, k, D]
            if embeddings is None:
                embeddings = chunk.new_empty((chunk.shape[0], window.length, *chunk.shape[2:]))
            embeddings[:, start:stop] = chunk  # [B, L, D]
    assert embeddings is not None
    return embeddings, torch.cat(targets, dim=1)


def recompute_backward(
    model: StepModel,
    window: FrameWindow,
    grad: Tensor,
    bounds: list[tuple[int, int]],
    rng: WindowRng,
    device: torch.device,
    first_chunk: int = 0,
) -> None:
    """Re-encode each chunk with gradients (last chunk first, from the seed it first drew from) and backpropagate its share.

    `grad` is dloss/dembeddings [B, L, D] of the window; chunk j is call first_chunk + j of `rng`.
    """
    for index, (start, stop) in reversed(list(enumerate(bounds, start=first_chunk))):
        steps, _ = window.chunk(start, stop)
        with rng.seeded(ENCODE, index, first=False):
            chunk = model.encode(steps.to(device))  # [B, k, D]
        if chunk.requires_grad:
            torch.autograd.backward(chunk, grad_tensors=grad[:, start:stop])
        del chunk
