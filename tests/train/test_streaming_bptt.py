"""Tests of streaming BPTT: exact gradients, at most k encoder steps alive, paged core activations."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from rcswarm.models import registry
from rcswarm.models.frame import FrameActionModel
from rcswarm.models.protocols import StepModel
from rcswarm.train.bptt.paged import HostPager
from rcswarm.train.bptt.streaming import plain_backward, streaming_backward
from tests.helpers.bptt import DropoutStepModel, SavedBytes, _assert_close, _batch, _grads, _plain


@pytest.fixture(scope="module")
def model() -> FrameActionModel:
    built = registry.build_model("frame", "tiny", seed=0).double()
    assert isinstance(built, FrameActionModel)
    return built


@pytest.mark.parametrize(
    ("n_frames", "k"),
    [(1, 1), (5, 1), (7, 3), (8, 4), (6, 6), (5, 9), (11, 4)],
)
def test_streaming_gradients_equal_plain_autograd(model: FrameActionModel, n_frames: int, k: int) -> None:
    plain_loss, plain_grads = _plain(model, n_frames)
    model.zero_grad(set_to_none=True)
    loss, stats = streaming_backward(model, _batch(model, n_frames), k)
    assert loss == pytest.approx(plain_loss, rel=1e-12)
    _assert_close(_grads(model), plain_grads)
    assert stats.n_steps == n_frames
    assert stats.n_chunks == math.ceil(n_frames / k)


def test_streaming_accumulates_into_existing_grads(model: FrameActionModel) -> None:
    _, plain_grads = _plain(model, 7)
    model.zero_grad(set_to_none=True)
    for name, param in model.named_parameters():
        param.grad = plain_grads[name].clone()
    streaming_backward(model, _batch(model, 7), 2)
    _assert_close(_grads(model), {name: 2 * g for name, g in plain_grads.items()})


def test_encoder_runs_with_grad_on_at_most_k_frames(
    model: FrameActionModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bool, int]] = []
    encode = model.encode

    def recording_encode(frames: Tensor) -> Tensor:
        calls.append((torch.is_grad_enabled(), frames.shape[1]))
        return encode(frames)

    monkeypatch.setattr(model, "encode", recording_encode)
    model.zero_grad(set_to_none=True)
    streaming_backward(model, _batch(model, 10), 4)
    assert calls == [(False, 4), (False, 4), (False, 2), (True, 2), (True, 4), (True, 4)]


def _saved_bytes_of_encoding(model: FrameActionModel, n_frames: int) -> int:
    tracker = SavedBytes()
    with tracker.hooks():
        embeddings = model.encode(_batch(model, n_frames)[0])
    del embeddings
    assert tracker.live == 0
    return tracker.peak


@pytest.mark.parametrize(("n_frames", "k"), [(7, 3), (9, 1)])
def test_never_more_than_k_frame_heads_of_activations_alive(
    model: FrameActionModel, n_frames: int, k: int
) -> None:
    one_chunk = _saved_bytes_of_encoding(model, k)
    assert one_chunk < _saved_bytes_of_encoding(model, k + 1)
    model.zero_grad(set_to_none=True)
    tracker = SavedBytes()
    with tracker.hooks():
        streaming_backward(model, _batch(model, n_frames), k)
    assert tracker.peak == one_chunk
    assert tracker.live == 0
    whole = SavedBytes()
    with whole.hooks():
        plain_backward(model, _batch(model, n_frames))
    assert whole.peak > one_chunk


def test_core_activations_are_routed_through_the_pager(model: FrameActionModel) -> None:
    frames, actions = _batch(model, 6)
    with torch.no_grad():
        embeddings = model.encode(frames)
    counted: list[Tensor] = []

    def count(tensor: Tensor) -> Tensor:
        counted.append(tensor)
        return tensor

    leaf = embeddings.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        model.core_loss(leaf, actions)
    model.zero_grad(set_to_none=True)
    _, stats = streaming_backward(model, (frames, actions), 3)
    assert stats.paged_tensors > 0
    assert stats.paged_tensors + stats.resident_tensors == len(counted)
    assert stats.unpacked_tensors == stats.paged_tensors
    assert stats.paged_bytes > leaf.numel() * leaf.element_size()
    assert not stats.copied_to_host


def test_host_pager_keeps_parameters_and_pages_the_rest() -> None:
    weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    torch.tanh(x @ weight).sum().backward()
    want = (weight.grad.clone(), x.grad.clone())
    weight.grad, x.grad = None, None
    pager = HostPager(keep=[weight])
    with pager.hooks():
        y = torch.tanh(x @ weight).sum()
    y.backward()
    assert torch.equal(weight.grad, want[0]) and torch.equal(x.grad, want[1])
    assert pager.resident_tensors == 1
    assert pager.paged_tensors == pager.unpacked_tensors == 2
    with pytest.raises(ValueError, match=r"HostPager\.prefetch=-1"):
        HostPager(prefetch=-1)


def test_dropout_masks_are_replayed_in_the_recomputation() -> None:
    torch.manual_seed(0)
    toy = DropoutStepModel().double()
    assert isinstance(toy, StepModel)
    steps = torch.randn(3, 9, 6, dtype=torch.float64)
    targets = torch.randint(0, 5, (3, 9))
    torch.manual_seed(1)
    plain_loss = plain_backward(toy, (steps, targets), chunk_steps=4)
    after_plain = torch.rand(1)
    want = _grads(toy)
    toy.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss, _ = streaming_backward(toy, (steps, targets), 4)
    assert torch.equal(torch.rand(1), after_plain)
    assert loss == pytest.approx(plain_loss, rel=1e-12)
    _assert_close(_grads(toy), want)


def test_bad_arguments_are_rejected(model: FrameActionModel) -> None:
    batch = _batch(model, 3)
    with pytest.raises(ValueError, match=r"k=0: expected a positive int"):
        streaming_backward(model, batch, 0)
    with pytest.raises(ValueError, match=r"targets has shape \(2, 2\)"):
        streaming_backward(model, (batch[0], batch[1][:, :2]), 2)
    with pytest.raises(TypeError, match="StepModel"):
        streaming_backward(nn.Linear(2, 2), batch, 2)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA paging path needs a GPU")
def test_cuda_paging_copies_to_host_and_keeps_gradients_exact() -> None:
    cuda_model = registry.build_model("frame", "tiny", seed=0).double().cuda()
    assert isinstance(cuda_model, FrameActionModel)
    batch = _batch(cuda_model, 9)
    plain_backward(cuda_model, batch)
    want = _grads(cuda_model)
    cuda_model.zero_grad(set_to_none=True)
    _, stats = streaming_backward(cuda_model, batch, 2, prefetch=3)
    assert stats.copied_to_host and stats.unpacked_tensors == stats.paged_tensors > 0
    _assert_close(_grads(cuda_model), want)
