"""Tests of rcswarm.kernels.sgsa: the blocked CPU path and the Triton kernels (in Triton's
interpreter, in a subprocess) vs the dense-mask definition."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
from torch import Tensor

from rcswarm.kernels.sgsa import dispatch as dispatch_module
from rcswarm.kernels.sgsa import sgsa_attention, sgsa_mask, sgsa_naive, sgsa_sparse
from rcswarm.kernels.sgsa import sparse as sparse_module
from rcswarm.kernels.triton_probe import triton_available
from tests.helpers.kernels import SGSA_CHILD_ENV, relative_error
from tests.helpers.uninitialized_memory import assert_independent_of_uninitialized_memory

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


def test_sparse_backward_is_once_differentiable() -> None:
    q, k, v = make_inputs(1, 2, 1, 19, 3, 2, seed=17)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = sgsa_sparse(q, k, v, 5, 3)  # [B, H_q, T, D_v]
    grads = torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
    penalty = sum(g.square().sum() for g in grads)  # a double backward, as a gradient penalty runs
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        penalty.backward()


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

    assert_independent_of_uninitialized_memory(run)


BLOCKING_CASES = [
    # (batch, q_heads, kv_heads, length, dim, dim_v, window, anchor_stride, seed): the blocked
    # path's edge cases. T < W; T < G; T off the block grid (b = 16 for W < 256, 32 for
    # W = 256); W = 1; G = 1; W a multiple of b and W = b + 1; anchors inside and before the window.
    (1, 2, 1, 10, 4, 4, 40, 3, 400),
    (2, 4, 2, 21, 4, 3, 4, 30, 401),
    (1, 3, 1, 53, 4, 4, 16, 5, 402),
    (1, 2, 2, 47, 3, 5, 1, 4, 403),
    (1, 4, 2, 45, 4, 4, 6, 1, 404),
    (1, 2, 1, 100, 4, 4, 17, 3, 405),
    (2, 2, 1, 300, 4, 4, 256, 9, 406),
    (1, 6, 3, 70, 5, 4, 32, 16, 407),
]


@pytest.mark.parametrize("chunk_elements", [1, 3000, sparse_module.CHUNK_ELEMENTS])
@pytest.mark.parametrize("batch,q_heads,kv_heads,length,dim,dim_v,window,stride,seed", BLOCKING_CASES)
def test_blocked_path_edge_cases(
    monkeypatch: pytest.MonkeyPatch, chunk_elements: int,
    batch: int, q_heads: int, kv_heads: int, length: int, dim: int, dim_v: int, window: int, stride: int, seed: int,
) -> None:
    """Forward and every gradient against the dense definition, with one block per chunk, a few
    blocks per chunk (so the per-chunk anchor masks and the tile sums cross chunk edges), and the
    default chunking."""
    monkeypatch.setattr(sparse_module, "CHUNK_ELEMENTS", chunk_elements)
    q, k, v = make_inputs(batch, q_heads, kv_heads, length, dim, dim_v, seed)
    ref, ref_grads = output_and_grads(sgsa_naive, q, k, v, seed, window=window, anchor_stride=stride)
    out, grads = output_and_grads(sgsa_sparse, q, k, v, seed, window=window, anchor_stride=stride)
    assert relative_error(out, ref) <= TOLERANCE
    for name, grad, ref_grad in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(grad).all(), name
        assert relative_error(grad, ref_grad) <= TOLERANCE, name


def test_block_size_and_bad_window() -> None:
    assert [sparse_module.block_size(w) for w in (1, 64, 128, 255, 256, 512, 4096)] == [16, 16, 16, 16, 32, 64, 64]
    with pytest.raises(ValueError, match="window=0"):
        sparse_module.block_size(0)


def test_anchor_work_is_the_anchors_before_each_window() -> None:
    """The blocked path scores each chunk's rows against the anchors below its last query minus W
    only (about (T - W)²/(2G) pairs plus one chunk's span / G per row), not every query against
    every anchor (T·T/G)."""
    q, k, v = make_inputs(1, 8, 2, 4096, 1, 1, seed=14)
    plan = sparse_module._Plan(q, k, v, 512, 64)
    scored = sum(
        (min(n1 * plan.block, plan.length) - n0 * plan.block) * plan.chunk_anchors(n0, n1)[1]
        for n0, n1 in plan.chunks()
    )
    visible = sum(max(0, (i - 512 + 1) // 64) for i in range(4096))
    span = (plan.chunk * plan.block) // 64 + 1
    assert visible <= scored <= visible + 4096 * span
    assert scored < 0.45 * 4096 * (4096 // 64)
    assert plan.keys == 576 and plan.block == 64


IN_TRITON_CHILD = os.environ.get(SGSA_CHILD_ENV) == "1"
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


child_only = pytest.mark.skipif(not IN_TRITON_CHILD, reason="runs in test_triton_kernels_in_interpreter's subprocess")

TRITON_CASES = [
    # (batch, q_heads, kv_heads, length, dim, dim_v, window, anchor_stride, seed) with 16-query and
    # 16-key blocks: T off the block grid, GQA, anchors before and inside the window, T < W,
    # W = 1, G = 1, head sizes below and off the 16-wide dot tile.
    (2, 4, 2, 45, 8, 8, 16, 4, 500),
    (1, 6, 2, 70, 16, 12, 21, 8, 501),
    (1, 3, 1, 37, 20, 16, 64, 5, 502),
    (1, 2, 1, 50, 4, 4, 1, 3, 503),
    (1, 2, 2, 33, 8, 8, 7, 1, 504),
]


def _triton_vs_naive(dtype: torch.dtype, case: tuple[int, ...]) -> list[float]:
    from rcswarm.kernels.sgsa.triton_flash import sgsa_triton

    batch, q_heads, kv_heads, length, dim, dim_v, window, stride, seed = case
    q, k, v = (t.to(dtype) for t in make_inputs(batch, q_heads, kv_heads, length, dim, dim_v, seed))
    results = []
    for function in (sgsa_naive, lambda *a: sgsa_triton(*a, block_m=16, block_n=16, anchor_split=32)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = function(*leaves, window, stride)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 500)).to(dtype)
        results.append([out.detach(), *torch.autograd.grad((out * cotangent).sum(), leaves)])
    for value in results[1]:
        assert value.dtype == dtype and torch.isfinite(value).all()
    return [relative_error(value, ref) for value, ref in zip(results[1], results[0], strict=True)]


@child_only
@pytest.mark.parametrize("case", TRITON_CASES)
def test_triton_child_float32_matches_dense(case: tuple[int, ...]) -> None:
    errors = _triton_vs_naive(torch.float32, case)
    assert max(errors) <= FLOAT32_TOLERANCE, dict(zip(["out", "q", "k", "v"], errors))


@child_only
@pytest.mark.parametrize("case", TRITON_CASES[:3])
def test_triton_child_float64_matches_dense(case: tuple[int, ...]) -> None:
    errors = _triton_vs_naive(torch.float64, case)
    assert max(errors) <= TOLERANCE, dict(zip(["out", "q", "k", "v"], errors))


@child_only
def test_triton_child_dispatcher_runs_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `use_triton` true (as for a CUDA tensor with triton installed), `sgsa_attention` runs
    the Triton kernels: same values as the definition, not bitwise those of the CPU path."""
    q, k, v = (t.float() for t in make_inputs(1, 4, 2, 90, 8, 8, seed=520))
    cpu_path = sgsa_attention(q, k, v, 24, 5)
    monkeypatch.setattr(dispatch_module, "use_triton", lambda tensor: True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = sgsa_attention(*leaves, 24, 5)
    assert out.grad_fn is not None and "Triton" in type(out.grad_fn).__name__
    assert relative_error(out.detach(), sgsa_naive(q, k, v, 24, 5)) <= FLOAT32_TOLERANCE
    assert not torch.equal(out.detach(), cpu_path)


def test_dispatcher_choice() -> None:
    q = torch.zeros(1, 1, 1, 1)
    assert not dispatch_module.use_triton(q)
    assert triton_available() == TRITON_INSTALLED


@child_only
def test_triton_child_default_blocks_and_bad_blocks() -> None:
    from rcswarm.kernels.sgsa.triton_flash import sgsa_triton

    q, k, v = (t.float() for t in make_inputs(1, 2, 1, 70, 8, 8, seed=510))
    assert relative_error(sgsa_triton(q, k, v, 20, 6), sgsa_naive(q, k, v, 20, 6)) <= FLOAT32_TOLERANCE
    for name, value in (("block_m", 8), ("block_n", 48), ("anchor_split", 100)):
        with pytest.raises(ValueError, match=f"{name}={value}"):
            sgsa_triton(q, k, v, 20, 6, **{name: value})
    with pytest.raises(ValueError, match="window"):
        sgsa_triton(q, k, v, 0, 6)


def test_empty_dimensions() -> None:
    """H_q = 0, D = 0 or D_v = 0 is refused with a ValueError naming the shape (they failed with ZeroDivisionError or
    a reshape error); an empty batch gives an empty output and empty gradients (the blocked backward failed to
    reshape)."""
    q, k, v = make_inputs(1, 2, 1, 9, 4, 3, seed=520)
    bad = (
        ((q[:, :0], k, v), r"q=tensor\[1, 0, 9, 4\].*H_q >= 1"),
        ((q[..., :0], k[..., :0], v), r"q=tensor\[1, 2, 9, 0\].*D >= 1"),
        ((q, k, v[..., :0]), r"v=tensor\[1, 1, 9, 0\].*D_v >= 1"),
    )
    for function in (sgsa_naive, sgsa_sparse, sgsa_attention):
        for tensors, message in bad:
            with pytest.raises(ValueError, match=message):
                function(*tensors, 3, 2)
        empty = [tensor[:0].clone().requires_grad_(True) for tensor in (q, k, v)]
        out = function(*empty, 3, 2)
        assert out.shape == (0, 2, 9, 3)
        grads = torch.autograd.grad(out.sum(), empty)
        assert [grad.shape for grad in grads] == [tensor.shape for tensor in empty]


@child_only
def test_triton_child_empty_batch() -> None:
    from rcswarm.kernels.sgsa.triton_flash import sgsa_triton

    empty = [t.float()[:0].clone().requires_grad_(True) for t in make_inputs(1, 2, 1, 70, 8, 8, seed=530)]
    out = sgsa_triton(*empty, 20, 6)
    assert out.shape == (0, 2, 70, 8)
    grads = torch.autograd.grad(out.sum(), empty)
    assert [grad.shape for grad in grads] == [tensor.shape for tensor in empty]
