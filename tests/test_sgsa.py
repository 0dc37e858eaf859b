"""Tests of rcswarm.kernels.sgsa: the window-plus-anchor path vs the dense-mask definition."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from rcswarm.kernels.sgsa import sgsa_attention, sgsa_mask, sgsa_naive, sgsa_sparse
from tests.conftest import relative_error

TOLERANCE = 1e-10
DTYPE = torch.float64


def make_inputs(
    batch: int, q_heads: int, kv_heads: int, length: int, dim: int, dim_v: int, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, length, dim, generator=generator, dtype=DTYPE)
    k = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=DTYPE)
    v = torch.randn(batch, kv_heads, length, dim_v, generator=generator, dtype=DTYPE)
    return q, k, v


def output_and_grads(function, q: Tensor, k: Tensor, v: Tensor, seed: int, **options) -> tuple[Tensor, list[Tensor]]:
    leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    out = function(*leaves, **options)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 500), dtype=DTYPE)
    grads = torch.autograd.grad((out * cotangent).sum(), leaves)
    return out.detach(), list(grads)


CASES = [
    # (batch, q_heads, kv_heads, length, dim, dim_v, window, anchor_stride, seed)
    (2, 4, 2, 37, 5, 4, 4, 6, 0),
    (1, 2, 2, 1, 3, 3, 3, 2, 1),
    (1, 3, 1, 20, 4, 4, 1, 1, 2),
    (1, 2, 1, 50, 4, 6, 64, 7, 3),
    (1, 2, 2, 13, 4, 4, 5, 20, 4),
    (2, 6, 3, 41, 3, 5, 8, 8, 5),
    (1, 4, 4, 33, 4, 4, 7, 3, 6),
    (1, 2, 1, 16, 4, 2, 16, 16, 7),
]


@pytest.mark.parametrize("batch,q_heads,kv_heads,length,dim,dim_v,window,stride,seed", CASES)
def test_sparse_matches_dense_forward_and_grads(
    batch: int, q_heads: int, kv_heads: int, length: int, dim: int, dim_v: int, window: int, stride: int, seed: int
) -> None:
    q, k, v = make_inputs(batch, q_heads, kv_heads, length, dim, dim_v, seed)
    ref, ref_grads = output_and_grads(sgsa_naive, q, k, v, seed, window=window, anchor_stride=stride)
    out, grads = output_and_grads(sgsa_sparse, q, k, v, seed, window=window, anchor_stride=stride)
    assert out.shape == (batch, q_heads, length, dim_v)
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) <= TOLERANCE
    for name, grad, ref_grad in zip("qkv", grads, ref_grads, strict=True):
        assert grad.shape == ref_grad.shape
        assert torch.isfinite(grad).all(), name
        assert relative_error(grad, ref_grad) <= TOLERANCE, name


def test_mask_matches_definition() -> None:
    length, window, stride = 23, 4, 5
    mask = sgsa_mask(length, window, stride)
    for i in range(length):
        for j in range(length):
            allowed = j <= i and (i - j < window or j % stride == stride - 1)
            assert bool(mask[i, j]) == allowed, (i, j)


def full_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    group = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ values


def test_limits_window_covers_everything_and_anchors_only() -> None:
    q, k, v = make_inputs(1, 4, 2, 19, 4, 3, seed=10)
    assert relative_error(sgsa_sparse(q, k, v, 19, 1000), full_causal(q, k, v)) <= TOLERANCE
    assert relative_error(sgsa_sparse(q, k, v, 1, 1), full_causal(q, k, v)) <= TOLERANCE
    # W = 1 and G > T: each query sees only itself.
    expected = v.repeat_interleave(2, 1)
    assert relative_error(sgsa_sparse(q, k, v, 1, 1000), expected) <= TOLERANCE


def test_anchor_inside_window_counted_once() -> None:
    # Every key is an anchor (G = 1) and most are also inside the window: a double count would
    # change the weights away from plain causal attention.
    q, k, v = make_inputs(2, 2, 2, 12, 3, 3, seed=11)
    out, grads = output_and_grads(sgsa_sparse, q, k, v, 11, window=5, anchor_stride=1)
    ref, ref_grads = output_and_grads(lambda *t: full_causal(*t), q, k, v, 11)
    assert relative_error(out, ref) <= TOLERANCE
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert relative_error(grad, ref_grad) <= TOLERANCE


def test_scale_and_dispatcher_naive_flag() -> None:
    q, k, v = make_inputs(1, 2, 1, 17, 4, 4, seed=12)
    naive = sgsa_attention(q, k, v, 3, 4, naive=True)
    assert torch.equal(naive, sgsa_naive(q, k, v, 3, 4))
    fast = sgsa_attention(q, k, v, 3, 4)
    assert torch.equal(fast, sgsa_sparse(q, k, v, 3, 4))
    assert relative_error(fast, naive) <= TOLERANCE
    scaled = sgsa_attention(q, k, v, 3, 4, scale=0.25)
    assert relative_error(scaled, sgsa_attention(q, k, v, 3, 4, scale=0.25, naive=True)) <= TOLERANCE
    assert relative_error(scaled, sgsa_attention(q * 2, k, v, 3, 4, scale=0.125)) <= TOLERANCE
    assert relative_error(scaled, fast) > 1e-6


def test_bad_inputs_raise() -> None:
    q, k, v = make_inputs(1, 3, 1, 8, 4, 4, seed=13)
    for function in (sgsa_naive, sgsa_sparse):
        with pytest.raises(ValueError, match="window"):
            function(q, k, v, 0, 2)
        with pytest.raises(ValueError, match="anchor_stride"):
            function(q, k, v, 2, 0)
        with pytest.raises(ValueError, match="k="):
            function(q, torch.cat([k, k], 1), torch.cat([v, v], 1), 2, 2)
        with pytest.raises(ValueError, match="k="):
            function(q, k[:, :, :5], v[:, :, :5], 2, 2)
        with pytest.raises(ValueError, match="v="):
            function(q, k, v[:, :, :5], 2, 2)
        with pytest.raises(ValueError, match="q="):
            function(q[0], k, v, 2, 2)
        with pytest.raises(ValueError, match="v="):
            function(q, k, v.float(), 2, 2)
        with pytest.raises(ValueError, match="scale"):
            function(q, k, v, 2, 2, float("nan"))
        with pytest.raises(ValueError, match="T >= 1"):
            function(q[:, :, :0], k[:, :, :0], v[:, :, :0], 2, 2)



FLOAT32_TOLERANCE = 1e-4

FLOAT32_CASES = [
    # (batch, q_heads, kv_heads, length, dim, dim_v, window, anchor_stride, seed): T off the
    # window-block grid, T below one block, grouped and plain multi-head.
    (2, 4, 2, 45, 16, 8, 16, 4, 300),
    (1, 3, 3, 11, 8, 8, 16, 3, 301),
    (2, 6, 2, 70, 32, 16, 16, 8, 302),
    (1, 4, 1, 33, 8, 12, 8, 5, 303),
]


@pytest.mark.parametrize("batch,q_heads,kv_heads,length,dim,dim_v,window,stride,seed", FLOAT32_CASES)
def test_float32_sparse_matches_dense_forward_and_grads(
    batch: int, q_heads: int, kv_heads: int, length: int, dim: int, dim_v: int, window: int, stride: int, seed: int
) -> None:
    q, k, v = (t.float() for t in make_inputs(batch, q_heads, kv_heads, length, dim, dim_v, seed))

    def run(function):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = function(*leaves, window, stride)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 500))
        return out.detach(), torch.autograd.grad((out * cotangent).sum(), leaves)

    ref, ref_grads = run(sgsa_naive)
    out, grads = run(sgsa_sparse)
    assert out.dtype == torch.float32
    assert relative_error(out, ref) <= FLOAT32_TOLERANCE
    for name, grad, ref_grad in zip("qkv", grads, ref_grads, strict=True):
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all(), name
        assert relative_error(grad, ref_grad) <= FLOAT32_TOLERANCE, name


def _poison_allocator(fill: float) -> None:
    """Allocate, fill and free a few large buffers so later allocations may reuse that memory."""
    buffers = [torch.full((1 << 20,), fill) for _ in range(8)] + [torch.full((4096,), fill) for _ in range(64)]
    del buffers


@pytest.mark.parametrize("naive", [False, True])
def test_results_do_not_depend_on_uninitialized_memory(naive: bool) -> None:
    """The kernels take no preallocated outputs, so (1) run under different allocator states (NaN
    vs zero filled freed memory) and (2) with torch.empty NaN-poisoned by torch's deterministic
    mode; all runs must agree bitwise and be finite."""
    q, k, v = (t.float() for t in make_inputs(2, 4, 2, 37, 8, 8, seed=310))

    def run() -> list[Tensor]:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = sgsa_attention(*leaves, 8, 5, naive=naive)
        return [out.detach(), *torch.autograd.grad((out * out).sum(), leaves)]

    runs = []
    for fill in (float("nan"), 0.0, float("inf")):
        _poison_allocator(fill)
        runs.append(run())
    previous = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        assert torch.isnan(torch.empty(4)).all()  # the poisoning is active
        runs.append(run())
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.utils.deterministic.fill_uninitialized_memory = previous[1]
    for tensor in runs[0]:
        assert torch.isfinite(tensor).all()
    for other in runs[1:]:
        for first, second in zip(runs[0], other, strict=True):
            assert torch.equal(first, second)
