"""Streaming BPTT with core checkpointing: exact gradients for every schedule, bounded stored states, budgets."""

from __future__ import annotations

import math
import threading
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from rcswarm.config.runspec import RunSpec
from rcswarm.data.frames import FrameWindowSpec, TensorWindow, TypingConfig, TypingFrameSource
from rcswarm.models import registry
from rcswarm.models.frame import FrameActionModel
from rcswarm.models.protocols import CoreState, SegmentStepModel
from rcswarm.train.bptt.checkpointed import CheckpointPlan
from rcswarm.train.bptt.schedule import Schedule, binomial, store_all, uniform
from rcswarm.train.bptt.segment_store import EmbeddingStore, HostCopies, Prefetcher, StateStash
from rcswarm.train.bptt.streaming import plain_backward, streaming_backward
from rcswarm.train.inner import inner_step, make_inner_optimizer, make_sampler
from tests.helpers.bptt import (
    BATCH,
    DropoutStepModel,
    SavedBytes,
    _assert_close,
    _batch,
    _grads,
    _plain,
)


@pytest.fixture(scope="module")
def model() -> FrameActionModel:
    return registry.build_model("frame", "tiny", seed=0).double()

# (n_frames, k, plan, the schedule it must run): segments of S steps (default 8 k), the encoder
# recomputed k at a time within them; ragged tails where k or S does not divide n_frames.
CASES = [
    (1, 1, CheckpointPlan("all"), store_all(1)),
    (7, 1, CheckpointPlan("all", segment_steps=3), store_all(3)),
    (11, 2, CheckpointPlan("all", embeddings="disk", segment_steps=4), store_all(3)),
    (23, 1, CheckpointPlan("uniform", segment_steps=2), uniform(12)),
    (23, 1, CheckpointPlan("uniform", interval=4, segment_steps=1), uniform(23, 4)),
    (16, 4, CheckpointPlan("uniform", interval=2, embeddings="disk", segment_steps=4), uniform(4, 2)),
    (40, 3, CheckpointPlan("uniform", segment_steps=6), uniform(7)),
    (23, 1, CheckpointPlan("binomial", slots=1, segment_steps=1), binomial(23, 1)),
    (23, 1, CheckpointPlan("binomial", slots=3, embeddings="disk", segment_steps=1), binomial(23, 3)),
    (23, 2, CheckpointPlan("binomial", segment_steps=2), binomial(12)),
    (17, 5, CheckpointPlan("binomial", slots=2, segment_steps=5), binomial(4, 2)),
    (13, 2, CheckpointPlan("binomial", slots=0, segment_steps=2), binomial(7, 0)),
    (47, 2, CheckpointPlan("binomial", slots=1), binomial(3, 1)),
    (9, 9, CheckpointPlan("binomial"), store_all(1)),
    (5, 8, CheckpointPlan("uniform"), store_all(1)),
]


@pytest.mark.parametrize(("n_frames", "k", "plan", "schedule"), CASES)
def test_checkpointed_gradients_equal_plain_autograd(
    model: FrameActionModel, n_frames: int, k: int, plan: CheckpointPlan, schedule: Schedule
) -> None:
    plain_loss, plain_grads = _plain(model, n_frames)
    model.zero_grad(set_to_none=True)
    loss, stats = streaming_backward(model, _batch(model, n_frames), k, checkpoints=plan)
    assert loss == pytest.approx(plain_loss, rel=1e-12)
    _assert_close(_grads(model), plain_grads)
    assert stats.n_chunks == math.ceil(n_frames / k)
    assert stats.segment_steps == (plan.segment_steps or 8 * k)
    assert math.ceil(n_frames / stats.segment_steps) == schedule.n_segments
    assert stats.schedule == schedule.describe()
    assert stats.stored_states == schedule.stored_states
    assert stats.core_advances == schedule.advances
    assert stats.scored == BATCH * n_frames
    assert stats.embeddings_on_disk == (plan.embeddings == "disk" and schedule.n_segments > 1)


def _state_bytes(model: FrameActionModel) -> int:
    """Bytes of one boundary state: h and c of every main layer, [1, B, H] each."""
    return 2 * model.config.n_main_layers * BATCH * model.config.n_hidden * 8


@pytest.mark.parametrize(
    ("budget_states", "budget_extra", "kind", "slots", "on_disk"),
    [
        (21, 23 * BATCH * 32 * 8, "all", 0, False),  # every state and the embeddings fit
        (21, 0, "all", 0, True),  # every state fits, the embeddings go to disk
        (5, 100, "binomial", 5, True),  # five states fit: binomial with five slots
    ],
)
def test_the_budget_chooses_schedule_and_where_embeddings_live(
    model: FrameActionModel, budget_states: int, budget_extra: int, kind: str, slots: int, on_disk: bool
) -> None:
    _, plain_grads = _plain(model, 23)
    state_bytes = _state_bytes(model)
    plan = CheckpointPlan(budget_bytes=budget_states * state_bytes + budget_extra, segment_steps=1)
    model.zero_grad(set_to_none=True)
    _, stats = streaming_backward(model, _batch(model, 23), 1, checkpoints=plan)
    _assert_close(_grads(model), plain_grads)
    expected = binomial(23, slots) if kind == "binomial" else store_all(23)
    assert stats.schedule == expected.describe()
    assert stats.stored_states == expected.stored_states
    assert stats.stored_state_bytes == expected.stored_states * state_bytes
    assert stats.embeddings_on_disk == on_disk
    assert stats.embedding_bytes == 22 * BATCH * 32 * 8  # every segment but the last (never advanced)


def test_a_budget_below_one_state_is_refused(model: FrameActionModel) -> None:
    plan = CheckpointPlan(budget_bytes=_state_bytes(model) - 1, segment_steps=1)
    with pytest.raises(ValueError, match="no core state fits the memory budget for 23 segments"):
        streaming_backward(model, _batch(model, 23), 1, checkpoints=plan)
    small = CheckpointPlan("uniform", budget_bytes=3 * _state_bytes(model), segment_steps=1)
    with pytest.raises(ValueError, match="uniform schedule of 23 segments keeps 6 core states: expected at most 3"):
        streaming_backward(model, _batch(model, 23), 1, checkpoints=small)


class StateCounter:
    """A SegmentStepModel around the frame model that counts its core states alive at once."""

    def __init__(self, inner: FrameActionModel) -> None:
        self.inner = inner
        self.live = 0
        self.peak = 0

    def _released(self) -> None:
        self.live -= 1

    def encode(self, steps: Tensor) -> Tensor:
        return self.inner.encode(steps)

    def core_loss(self, embeddings: Tensor, targets: Tensor) -> Tensor:
        return self.inner.core_loss(embeddings, targets)

    def parameters(self, recurse: bool = True):  # noqa: ANN201 - the nn.Module signature
        return self.inner.parameters(recurse)

    def core_segment(
        self, embeddings: Tensor, targets: Tensor | None, state: CoreState | None
    ) -> tuple[Tensor | None, Tensor | None, CoreState]:
        loss_sum, scored, new_state = self.inner.core_segment(embeddings, targets, state)
        self.live += 1
        self.peak = max(self.peak, self.live)
        weakref.finalize(new_state[0], self._released)
        return loss_sum, scored, new_state


@pytest.mark.parametrize(("plan", "schedule"), [
    (CheckpointPlan("binomial", slots=3, segment_steps=1), binomial(48, 3)),
    (CheckpointPlan("uniform", segment_steps=1), uniform(48)),
    (CheckpointPlan("all", segment_steps=1), store_all(48)),
])
def test_stored_core_states_follow_the_schedule(
    model: FrameActionModel, plan: CheckpointPlan, schedule: Schedule
) -> None:
    counter = StateCounter(model)
    assert isinstance(counter, SegmentStepModel)
    model.zero_grad(set_to_none=True)
    _, stats = streaming_backward(counter, _batch(model, 48), 1, checkpoints=plan)
    assert stats.stored_states == schedule.stored_states
    assert stats.stored_state_bytes == schedule.stored_states * _state_bytes(model)
    # stored states are copies in the stash's slots: no state the core returned piles up beside them
    assert counter.peak <= 2
    assert counter.live == 0


def test_saved_activations_do_not_grow_with_the_window(model: FrameActionModel) -> None:
    """Autograd's saved tensors peak at one segment's core and one chunk's encoder, at any L; paged keeps O(L)."""
    peaks, paged = {}, {}
    for n_frames in (8, 32):
        model.zero_grad(set_to_none=True)
        tracker = SavedBytes()
        with tracker.hooks():
            streaming_backward(model, _batch(model, n_frames), 4,
                               checkpoints=CheckpointPlan("binomial", slots=2, segment_steps=8))
        assert tracker.live == 0
        peaks[n_frames] = tracker.peak
        paged[n_frames] = streaming_backward(model, _batch(model, n_frames), 4)[1].paged_bytes
    assert peaks[32] == peaks[8]
    assert paged[32] > 3 * paged[8]


def test_checkpointed_accumulates_into_existing_grads(model: FrameActionModel) -> None:
    _, plain_grads = _plain(model, 7)
    model.zero_grad(set_to_none=True)
    for name, param in model.named_parameters():
        param.grad = plain_grads[name].clone()
    streaming_backward(model, _batch(model, 7), 1, checkpoints=CheckpointPlan("binomial", slots=1, segment_steps=2))
    _assert_close(_grads(model), {name: 2 * g for name, g in plain_grads.items()})


class RecordingWindow:
    """A FrameWindow that records every chunk asked of it."""

    def __init__(self, steps: Tensor, targets: Tensor) -> None:
        self.inner = TensorWindow(steps, targets)
        self.calls: list[tuple[int, int]] = []

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    @property
    def length(self) -> int:
        return self.inner.length

    def chunk(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        self.calls.append((start, stop))
        return self.inner.chunk(start, stop)


def test_a_lazy_window_is_read_a_segment_at_a_time_twice(model: FrameActionModel) -> None:
    _, plain_grads = _plain(model, 11)
    window = RecordingWindow(*_batch(model, 11))
    model.zero_grad(set_to_none=True)
    streaming_backward(model, window, 2, checkpoints=CheckpointPlan("binomial", slots=1, segment_steps=4))
    _assert_close(_grads(model), plain_grads)
    segments = [(0, 4), (4, 8), (8, 11)]
    assert sorted(set(window.calls)) == segments
    assert [window.calls.count(s) for s in segments] == [2, 2, 1]  # the last is first read by its turn


def test_typing_window_trains_as_its_materialized_batch(model: FrameActionModel) -> None:
    config = model.config
    typing = TypingConfig.fitting(config.rows, config.cols, config.char_vocab, config.action_vocab, n_documents=4)
    spec = FrameWindowSpec(batch_size=BATCH, window=19, seed=3)
    batch = TypingFrameSource(typing, spec).next_batch()
    model.zero_grad(set_to_none=True)
    plain_loss = plain_backward(model, batch)
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    window = TypingFrameSource(typing, spec).next_window()
    loss, _ = streaming_backward(model, window, 4, checkpoints=CheckpointPlan("uniform", embeddings="disk"))
    assert loss == pytest.approx(plain_loss, rel=1e-12)
    _assert_close(_grads(model), want)


class DropoutSegmentModel(DropoutStepModel):
    """The dropout toy of test_streaming_bptt with a segment-wise GRU core."""

    def core_segment(
        self, embeddings: Tensor, targets: Tensor | None, state: CoreState | None
    ) -> tuple[Tensor | None, Tensor | None, CoreState]:
        hidden, h = self.core(embeddings, None if state is None else state[0])  # [B, T, 8], [1, B, 8]
        if targets is None:
            return None, None, (h,)
        loss_sum = F.cross_entropy(self.head(hidden).transpose(1, 2), targets, reduction="sum")
        return loss_sum, (targets != -100).sum(), (h,)


def test_dropout_and_ignored_targets_are_exact_when_checkpointed() -> None:
    torch.manual_seed(0)
    toy = DropoutSegmentModel().double()
    steps = torch.randn(3, 14, 6, dtype=torch.float64)
    targets = torch.randint(0, 5, (3, 14))
    targets[0, :5] = -100
    targets[2, 9:] = -100
    torch.manual_seed(1)
    plain_loss = plain_backward(toy, (steps, targets), chunk_steps=3)
    after_plain = torch.rand(1)
    want = _grads(toy)
    toy.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    plan = CheckpointPlan("binomial", slots=1, segment_steps=6)
    loss, stats = streaming_backward(toy, (steps, targets), 3, checkpoints=plan)
    assert torch.equal(torch.rand(1), after_plain)
    assert loss == pytest.approx(plain_loss, rel=1e-12)
    assert stats.scored == 3 * 14 - 5 - 5
    _assert_close(_grads(toy), want)


def test_bad_plans_and_models_are_rejected(model: FrameActionModel) -> None:
    with pytest.raises(ValueError, match=r"CheckpointPlan\.schedule='revolve'"):
        CheckpointPlan("revolve")
    with pytest.raises(ValueError, match=r"CheckpointPlan\.budget_bytes=0: expected None or an int >= 1"):
        CheckpointPlan(budget_bytes=0)
    with pytest.raises(ValueError, match=r"CheckpointPlan\.slots=2 applies to schedule 'binomial', not 'uniform'"):
        CheckpointPlan("uniform", slots=2)
    with pytest.raises(ValueError, match=r"CheckpointPlan\.embeddings='ssd'"):
        CheckpointPlan(embeddings="ssd")
    with pytest.raises(ValueError, match=r"CheckpointPlan\.segment_steps=6: expected a multiple of k=4"):
        streaming_backward(model, _batch(model, 8), 4, checkpoints=CheckpointPlan(segment_steps=6))
    with pytest.raises(TypeError, match="SegmentStepModel"):
        streaming_backward(DropoutStepModel(), (torch.randn(1, 4, 6), torch.zeros(1, 4, dtype=torch.long)), 2,
                           checkpoints=CheckpointPlan())
    with pytest.raises(TypeError, match="expected a CheckpointPlan"):
        streaming_backward(model, _batch(model, 4), 2, checkpoints="binomial")  # type: ignore[arg-type]


def test_the_worker_step_picks_the_schedule_from_memory_budget_mb() -> None:
    torch.manual_seed(0)
    worker_model = registry.build_model("frame", "tiny", seed=0)
    spec = RunSpec.from_dict({
        "model": {"name": "frame", "preset": "tiny"},
        "data": {"source": "typing", "seq_len": 40, "batch_size": 2, "task_config": {"n_documents": 4}},
        "inner": {"bptt_chunk": 1, "memory_budget_mb": 0.003},  # 3,145 bytes: 2 states of 1,536
    })
    sampler = make_sampler(spec.data, seed=1, model_config=worker_model.config)
    windows = []
    next_window = sampler.next_window
    sampler.next_window = lambda: windows.append(1) or next_window()  # type: ignore[method-assign]
    sampler.next_batch = None  # type: ignore[assignment]  # the lazy window must be used
    optimizer = make_inner_optimizer(worker_model, spec.inner)
    result = inner_step(worker_model, optimizer, sampler, 1.0, torch.device("cpu"), 1, spec.inner.memory_budget_mb)
    assert windows == [1]
    assert result.tokens == 80 and math.isfinite(result.loss)
    assert result.schedule == binomial(5, 2).describe()  # segments of 8 steps
    paged = inner_step(worker_model, optimizer, make_sampler(spec.data, seed=1, model_config=worker_model.config),
                       1.0, torch.device("cpu"), 1)
    assert paged.schedule == "" and paged.tokens == 80


def test_memory_budget_mb_is_validated() -> None:
    assert RunSpec.from_dict({"inner": {"bptt_chunk": 4, "memory_budget_mb": 64}}).inner.memory_budget_mb == 64.0
    with pytest.raises(ValueError, match=r"inner\.memory_budget_mb = -1\.0 is invalid: expected a finite number >= 0"):
        RunSpec.from_dict({"inner": {"bptt_chunk": 4, "memory_budget_mb": -1}})
    with pytest.raises(ValueError, match=r"inner\.memory_budget_mb = 8\.0 is invalid: expected 0 unless inner\.bptt_chunk > 0"):
        RunSpec.from_dict({"inner": {"memory_budget_mb": 8}})


def test_prefetcher_loads_ahead_on_one_thread_or_when_asked() -> None:
    threads: list[str] = []

    def load(value: int):  # noqa: ANN202
        return lambda: threads.append(threading.current_thread().name) or value

    background = Prefetcher(depth=1)
    background.submit("a", load(1))
    background.submit("b", load(2))  # beyond the depth: not started
    assert background.prefetched == 1
    assert background.take("a", load(-1)) == 1 and background.take("b", load(2)) == 2
    background.close()
    assert len(threads) == 2 and all(name.startswith("rcswarm-prefetch") for name in threads)
    threads.clear()
    inline = Prefetcher(depth=3, background=False)
    inline.submit("a", load(1))
    assert inline.prefetched == 0 and inline.take("a", load(7)) == 7
    inline.close()
    assert threads == [threading.current_thread().name]
    with pytest.raises(ValueError, match=r"Prefetcher\.depth=-1"):
        Prefetcher(depth=-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_embedding_store_round_trips_segments_through_a_file(tmp_path, dtype: torch.dtype) -> None:
    lengths = [4, 4, 3]  # a ragged last segment
    prefetcher = Prefetcher(depth=2, background=False)
    store = EmbeddingStore(torch.device("cpu"), dtype, lambda i: (2, lengths[i], 5), prefetcher, HostCopies(),
                           on_disk=True, spill_dir=str(tmp_path))
    segments = [torch.randn(2, n, 5).to(dtype) for n in lengths]
    for i in (0, 1):
        store.put(i, segments[i])
    with pytest.raises(OSError, match="segment 2 was never stored"):
        store.get(2)
    store.put(2, segments[2])
    for i in (2, 0, 1):
        store.prefetch(i)
        assert torch.equal(store.get(i), segments[i])
    assert store.stored_bytes == sum(t.numel() * t.element_size() for t in segments)
    with pytest.raises(ValueError, match=r"segment 3 has \d+ bytes of embeddings: expected at most the first's \d+"):
        store.put(3, torch.randn(2, 6, 5).to(dtype))
    store.close()
    prefetcher.close()
    assert list(tmp_path.iterdir()) == []  # the file was unlinked from the start


def test_state_stash_copies_states_into_slots_allocated_once() -> None:
    stash = StateStash(torch.device("cpu"), HostCopies(), slots=2)
    states = {b: (torch.full((1, 2, 3), float(b)), torch.full((1, 2, 3), -float(b))) for b in (1, 2, 3)}
    stash.put(1, states[1])
    stash.put(2, states[2])
    with pytest.raises(ValueError, match="storing boundary 3: all 2 slots are taken"):
        stash.put(3, states[3])
    with pytest.raises(ValueError, match="boundary 2 is already stored"):
        stash.put(2, states[2])
    states[1][0].fill_(99.0)  # the stash holds a copy
    assert torch.equal(stash.get(1)[0], torch.full((1, 2, 3), 1.0))
    stash.drop(1)
    stash.put(3, states[3])  # into the freed slot
    assert torch.equal(stash.get(3)[1], states[3][1]) and torch.equal(stash.get(2)[0], states[2][0])
    assert (stash.stored, stash.peak_stored, stash.peak_bytes) == (2, 2, 2 * 2 * 6 * 4)
    with pytest.raises(KeyError, match="boundary 1 is not stored"):
        stash.get(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA paging path needs a GPU")
def test_cuda_checkpointing_pages_to_host_and_keeps_gradients_exact() -> None:
    cuda_model = registry.build_model("frame", "tiny", seed=0).double().cuda()
    assert isinstance(cuda_model, FrameActionModel)
    batch = _batch(cuda_model, 21)
    plain_backward(cuda_model, batch)
    want = _grads(cuda_model)
    for embeddings in ("memory", "disk"):
        cuda_model.zero_grad(set_to_none=True)
        plan = CheckpointPlan("binomial", slots=2, embeddings=embeddings, segment_steps=4)
        _, stats = streaming_backward(cuda_model, batch, 2, prefetch=3, checkpoints=plan)
        assert stats.copied_to_host and stats.stored_states == 2
        _assert_close(_grads(cuda_model), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA stash needs a GPU")
def test_a_cuda_state_restored_at_once_is_the_one_just_stored() -> None:
    """A state put and prefetched at once (the binomial schedule's `store b, advance, turn, restore b` with
    read-ahead) comes back as stored, never as the slot's previous state: the copy into the pinned slot and the
    copy back run in order (both on the side stream). 64 MiB states, so that a copy takes long enough to race."""
    device = torch.device("cuda")
    stash = StateStash(device, HostCopies(), slots=1)
    for i in range(12):
        state = torch.full((4096, 4096), float(i), device=device)
        stash.put(i, (state,))
        stash.prefetch(i)
        (restored,) = stash.get(i)
        assert torch.equal(restored, torch.full_like(restored, float(i))), f"state {i} came back stale"
        stash.drop(i)


def test_cuda_and_cuda_n_of_the_current_device_share_one_side_stream(monkeypatch) -> None:
    """The copy into a pinned slot (keyed by the tensor's device, "cuda:0") and the copy back (the stash's device,
    "cuda") must run on one stream, or the copy back can overtake the copy in (seen on an H100: a stale state).
    CUDA's streams are stood in for here, so it runs without a GPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: object())
    copies = HostCopies()
    assert copies.side_stream(torch.device("cuda")) is copies.side_stream(torch.device("cuda:0"))
    assert copies.side_stream(torch.device("cuda:1")) is not copies.side_stream(torch.device("cuda:0"))
