"""Random numbers in streaming BPTT: recomputations draw what the first run drew (dropout masks, in the encoder and in
a checkpointed core) from a seed per chunk or segment, and the bookkeeping is O(1) bytes per window, not an RNG state
(5,056 bytes) per chunk."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models import registry
from rcswarm.models.frame import FrameActionModel
from rcswarm.models.protocols import CoreState
from rcswarm.train.bptt import encoder_chunks, paged
from rcswarm.train.bptt.checkpointed import CheckpointedRun, CheckpointPlan
from rcswarm.train.bptt.streaming import plain_backward, streaming_backward
from tests.helpers.bptt import DropoutStepModel, _assert_close, _grads

BYTES_PER_CHUNK = 16
"""The most the RNG bookkeeping may grow per encoder chunk (an int64 seed is 8)."""


def _held_bytes(root: object) -> int:
    """Bytes reachable from `root`: Python objects (sys.getsizeof) and tensor storages, each counted once."""
    seen: set[int] = set()
    storages: set[int] = set()
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, nn.Module, torch.device)) or callable(obj):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


class DropoutSegmentToy(nn.Module):
    """A SegmentStepModel with dropout in its encoder and, optionally, in its core (on the GRU's input)."""

    def __init__(self, encoder_p: float, core_p: float = 0.0) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 8)
        self.dropout = nn.Dropout(encoder_p)
        self.core_dropout = nn.Dropout(core_p)
        self.core = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 5)

    def encode(self, steps: Tensor) -> Tensor:
        return torch.tanh(self.dropout(self.encoder(steps)))  # [B, k, 8]

    def core_loss(self, embeddings: Tensor, targets: Tensor) -> Tensor:
        hidden, _ = self.core(self.core_dropout(embeddings))  # [B, L, 8]
        return F.cross_entropy(self.head(hidden).transpose(1, 2), targets)

    def core_segment(
        self, embeddings: Tensor, targets: Tensor | None, state: CoreState | None
    ) -> tuple[Tensor | None, Tensor | None, CoreState]:
        hidden, h = self.core(self.core_dropout(embeddings), None if state is None else state[0])  # [B, T, 8]
        if targets is None:
            return None, None, (h,)
        loss_sum = F.cross_entropy(self.head(hidden).transpose(1, 2), targets, reduction="sum")
        return loss_sum, (targets != -100).sum(), (h,)


def _toy_batch(length: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    steps = torch.randn(2, length, 6, generator=generator, dtype=dtype)  # [B, L, 6]
    return steps, torch.randint(0, 5, (2, length), generator=generator)  # [B, L]


def _checkpointed_rng_bytes(length: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """The bytes the checkpointed run's RNG bookkeeping holds when the backward sweep starts (its peak)."""
    held: list[int] = []
    turn = CheckpointedRun.turn

    def measuring_turn(self: CheckpointedRun, i: int) -> None:
        if not held:
            held.append(_held_bytes(self.rng))
        turn(self, i)

    monkeypatch.setattr(CheckpointedRun, "turn", measuring_turn)
    torch.manual_seed(0)
    toy = DropoutSegmentToy(0.1)
    streaming_backward(toy, _toy_batch(length), 1, checkpoints=CheckpointPlan("binomial", budget_bytes=4096))
    monkeypatch.undo()
    return held[0]


def test_checkpointed_rng_bookkeeping_does_not_grow_with_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    short, long = 256, 2048
    growth = _checkpointed_rng_bytes(long, monkeypatch) - _checkpointed_rng_bytes(short, monkeypatch)
    assert growth <= BYTES_PER_CHUNK * (long - short), growth  # was 10,314,240 - 1,253,888 bytes (5 KB per chunk)


def _paged_rng_bytes(model: nn.Module, batch: tuple[Tensor, Tensor], monkeypatch: pytest.MonkeyPatch) -> int:
    """The bytes of what the paged mode keeps for the recomputation besides the model, window, gradient and bounds."""
    held: list[int] = []
    recompute = paged.recompute_backward

    def measuring_recompute(*args: Any) -> None:
        held.append(_held_bytes(args[4:]))
        recompute(*args)

    monkeypatch.setattr(paged, "recompute_backward", measuring_recompute)
    streaming_backward(model, batch, 1)
    monkeypatch.undo()
    return held[0]


def _frame_batch(model: FrameActionModel, length: int) -> tuple[Tensor, Tensor]:
    config = model.config
    generator = torch.Generator().manual_seed(0)
    cells = (1, length, config.rows, config.cols)
    chars = torch.randint(0, config.char_vocab, cells, generator=generator)
    styles = torch.randint(0, config.n_styles, cells, generator=generator)
    return torch.stack((chars, styles), dim=-1), torch.randint(0, config.action_vocab, (1, length), generator=generator)


def test_paged_rng_bookkeeping_does_not_grow_with_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = registry.build_model("frame", "tiny", seed=0)
    assert isinstance(frame, FrameActionModel)
    short, long = 32, 256
    growth = _paged_rng_bytes(frame, _frame_batch(frame, long), monkeypatch) - _paged_rng_bytes(
        frame, _frame_batch(frame, short), monkeypatch
    )
    assert growth <= BYTES_PER_CHUNK * (long - short), growth  # was 1,294,336 - 161,792 bytes, with no dropout at all
    torch.manual_seed(0)
    toy = DropoutSegmentToy(0.1)
    growth = _paged_rng_bytes(toy, _toy_batch(2048), monkeypatch) - _paged_rng_bytes(toy, _toy_batch(256), monkeypatch)
    assert growth <= BYTES_PER_CHUNK * (2048 - 256), growth


class _MaskRecorder:
    """A forward hook on a dropout module: each call's mask (output != 0) with its input, in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Tensor, Tensor]] = []

    def __call__(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        self.calls.append((inputs[0].detach().clone(), (output != 0).detach().clone()))


def _with_fixed_masks(masks: list[Tensor]) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], Tensor]:
    """A forward hook replacing a Dropout(0.5)'s output by its input times the next mask of `masks`, times 2."""
    queue = list(masks)

    def hook(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        return inputs[0] * queue.pop(0) * 2.0

    return hook


@pytest.mark.parametrize("k", [1, 3, 4])
def test_recomputed_encoder_chunks_draw_the_masks_of_the_first_pass(k: int) -> None:
    """The masks are recorded from streaming BPTT itself; plain autograd with those masks fixed (no RNG at all) gives
    the same gradients, and each chunk's recomputation drew exactly its first mask."""
    torch.manual_seed(0)
    toy = DropoutStepModel().double()
    steps, targets = _toy_batch(9, torch.float64)
    recorder = _MaskRecorder()
    handle = toy.dropout.register_forward_hook(recorder)
    torch.manual_seed(1)
    loss, stats = streaming_backward(toy, (steps, targets), k)
    handle.remove()
    got = _grads(toy)
    n = stats.n_chunks
    first, again = recorder.calls[:n], recorder.calls[n:][::-1]
    assert len(again) == n
    for (x0, mask0), (x1, mask1) in zip(first, again, strict=True):
        assert torch.equal(x0, x1) and torch.equal(mask0, mask1)
    assert 0 < sum(int(mask.sum()) for _, mask in first) < sum(mask.numel() for _, mask in first)
    toy.zero_grad(set_to_none=True)
    handle = toy.dropout.register_forward_hook(_with_fixed_masks([mask for _, mask in first]))
    want_loss = plain_backward(toy, (steps, targets), chunk_steps=k)
    handle.remove()
    assert loss == pytest.approx(want_loss, rel=1e-12)
    _assert_close(got, _grads(toy))


def test_chunks_without_random_numbers_are_rerun_without_rng_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    toy = DropoutStepModel().double().eval()
    forks: list[int] = []
    fork = torch.random.fork_rng

    def counting_fork(*args: Any, **kwargs: Any) -> Any:
        forks.append(1)
        return fork(*args, **kwargs)

    monkeypatch.setattr(torch.random, "fork_rng", counting_fork)
    before = torch.get_rng_state()
    _, stats = streaming_backward(toy, _toy_batch(8, torch.float64), 2)
    assert torch.equal(torch.get_rng_state(), before)  # nothing drew: the caller's RNG is as it was
    assert len(forks) == 1 + stats.n_chunks  # the base seed's peek and the first pass; no fork in the recomputation


def test_window_rng_seeds_and_advances_the_caller_once_per_window() -> None:
    WindowRng, ENCODE, CORE = encoder_chunks.WindowRng, encoder_chunks.ENCODE, encoder_chunks.CORE
    torch.manual_seed(3)
    rng = WindowRng(torch.device("cpu"))
    assert rng.seed(ENCODE, 5) == rng.base + 10 and rng.seed(CORE, 5) == rng.base + 11
    with rng.seeded(ENCODE, 5, first=True):
        first = torch.rand(4)
    with rng.seeded(ENCODE, 5, first=False):
        again = torch.rand(4)
    with rng.seeded(ENCODE, 6, first=True):
        other = torch.rand(4)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert rng.drew == [True, False]
    peek = torch.get_rng_state()
    torch.randint(2**62, (), dtype=torch.int64)
    after_one_draw = torch.get_rng_state()
    torch.set_rng_state(peek)
    rng.finish()
    rng.finish()
    assert torch.equal(torch.get_rng_state(), after_one_draw)
    assert WindowRng(torch.device("cpu")).base != rng.base
    with pytest.raises(ValueError, match=r"kind=2: expected ENCODE"):
        rng.seed(2, 0)
    with pytest.raises(ValueError, match=r"index=-1: expected an int >= 0"):
        rng.seed(ENCODE, -1)


def _segment_reference(model: DropoutSegmentToy, steps: Tensor, targets: Tensor, k: int, segment: int) -> float:
    """Plain autograd over the chain of core segments, every chunk and segment from the seed streaming BPTT gives it."""
    WindowRng, ENCODE, CORE = encoder_chunks.WindowRng, encoder_chunks.ENCODE, encoder_chunks.CORE
    rng = WindowRng(torch.device("cpu"))
    length = steps.shape[1]
    pieces = []
    for index, start in enumerate(range(0, length, k)):
        with rng.seeded(ENCODE, index, first=True):
            pieces.append(model.encode(steps[:, start : start + k]))  # [B, k, 8]
    embeddings = torch.cat(pieces, dim=1)  # [B, L, 8]
    total: Tensor | None = None
    scored: Tensor | None = None
    state: CoreState | None = None
    for index, start in enumerate(range(0, length, segment)):
        with rng.seeded(CORE, index, first=True):
            loss_sum, count, state = model.core_segment(
                embeddings[:, start : start + segment], targets[:, start : start + segment], state
            )
        assert loss_sum is not None and count is not None
        total = loss_sum if total is None else total + loss_sum
        scored = count if scored is None else scored + count
    assert total is not None and scored is not None
    loss = total / scored
    loss.backward()
    rng.finish()
    return loss.item()


@pytest.mark.parametrize(
    "plan", [CheckpointPlan("binomial", slots=1, segment_steps=4), CheckpointPlan("all", segment_steps=2)]
)
def test_a_checkpointed_core_with_dropout_gets_the_same_masks_in_every_run(plan: CheckpointPlan) -> None:
    """The core runs up to three times per segment (first sweep, advance from a checkpoint, turn): every run of a
    segment draws the same masks, and the gradients equal plain autograd's over the segments with those masks."""
    torch.manual_seed(0)
    toy = DropoutSegmentToy(encoder_p=0.5, core_p=0.5).double()
    steps, targets = _toy_batch(14, torch.float64)
    recorder = _MaskRecorder()
    handle = toy.core_dropout.register_forward_hook(recorder)
    torch.manual_seed(1)
    loss, _ = streaming_backward(toy, (steps, targets), 2, checkpoints=plan)
    after_streaming = torch.rand(1)
    handle.remove()
    got = _grads(toy)
    runs: dict[bytes, list[Tensor]] = {}
    for x, mask in recorder.calls:
        runs.setdefault(x.numpy().tobytes(), []).append(mask)
    assert max(len(masks) for masks in runs.values()) >= 2
    for masks in runs.values():
        assert all(torch.equal(mask, masks[0]) for mask in masks)
    toy.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    want_loss = _segment_reference(toy, steps, targets, 2, plan.segment_steps or 2)
    assert torch.equal(torch.rand(1), after_streaming)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    _assert_close(got, _grads(toy))
