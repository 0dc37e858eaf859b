"""Tests of rcswarm.kernels.rwkv_product: chunked form vs the per-step loop, substep expansion (the Triton kernels under
the interpreter: tests/swarm/test_triton_interpreter.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rcswarm.kernels.rwkv_product import (
    DEFAULT_CHUNK_SIZE,
    collapse_substeps,
    expand_substeps,
    rwkv_product,
    rwkv_product_chunked,
    rwkv_product_naive,
    rwkv_product_substeps,
)
from rcswarm.kernels.triton_probe import triton_available
from tests.helpers.kernels import relative_error
from tests.helpers.uninitialized_memory import assert_independent_of_uninitialized_memory

TOLERANCE = 1e-10
DTYPE = torch.float64


def make_inputs(
    batch: int, length: int, heads: int, d_k: int, d_v: int, seed: int, w_shift: float = 0.0, substeps: int = 0
) -> dict[str, Tensor]:
    """Random RWKV-7-like inputs: a = -κ, b = κ ⊙ β with κ unit-norm, β ∈ (0, 1).

    With substeps > 0, k, v, a, b get a substep axis: [B, T, M, H, d].
    """
    generator = torch.Generator().manual_seed(seed)
    extra = (substeps,) if substeps else ()

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=DTYPE)

    kappa = torch.nn.functional.normalize(randn(batch, length, *extra, heads, d_k), dim=-1)
    beta = torch.rand(batch, length, *extra, heads, d_k, generator=generator, dtype=DTYPE)
    return {
        "r": randn(batch, length, heads, d_k),
        "w_raw": randn(batch, length, heads, d_k) + w_shift,
        "k": randn(batch, length, *extra, heads, d_k) / d_k**0.5,
        "v": randn(batch, length, *extra, heads, d_v),
        "a": -kappa,
        "b": kappa * beta,
    }


def leaves(inputs: dict[str, Tensor], initial_state: Tensor | None) -> dict[str, Tensor]:
    """Fresh leaf copies requiring grad, the initial state under key 'initial_state'."""
    out = {name: tensor.clone().requires_grad_(True) for name, tensor in inputs.items()}
    if initial_state is not None:
        out["initial_state"] = initial_state.clone().requires_grad_(True)
    return out


def outputs_and_grads(
    run, inputs: dict[str, Tensor], initial_state: Tensor | None, seed: int
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Run, then the gradients of a random linear functional of (y, final state) w.r.t. every input."""
    tensors = leaves(inputs, initial_state)
    y, state = run(tensors)
    generator = torch.Generator().manual_seed(seed + 1000)
    y_cotangent = torch.randn(y.shape, generator=generator, dtype=DTYPE)
    state_cotangent = torch.randn(state.shape, generator=generator, dtype=DTYPE)
    loss = (y * y_cotangent).sum() + (state * state_cotangent).sum()
    grads = torch.autograd.grad(loss, list(tensors.values()))
    return y.detach(), state.detach(), dict(zip(tensors, grads, strict=True))


def call(function, **options):
    """Adapt a kernel to the leaf dictionary of `outputs_and_grads`."""

    def run(tensors: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return function(
            tensors["r"], tensors["w_raw"], tensors["k"], tensors["v"], tensors["a"], tensors["b"],
            tensors.get("initial_state"), **options,
        )

    return run


CASES = [
    # (batch, length, heads, d_k, d_v, chunk, with initial state, seed)
    (2, 37, 3, 5, 4, 8, True, 0),
    (1, 1, 2, 4, 3, 8, True, 1),
    (2, 5, 1, 3, 6, 16, False, 2),
    (1, 32, 2, 4, 4, 8, True, 3),
    (1, 19, 2, 6, 2, 1, False, 4),
    (3, 23, 1, 8, 8, 7, True, 5),
    (1, 40, 2, 4, 5, 64, True, 6),
]


@pytest.mark.parametrize("batch,length,heads,d_k,d_v,chunk,with_state,seed", CASES)
def test_chunked_matches_naive_forward_and_grads(
    batch: int, length: int, heads: int, d_k: int, d_v: int, chunk: int, with_state: bool, seed: int
) -> None:
    inputs = make_inputs(batch, length, heads, d_k, d_v, seed)
    generator = torch.Generator().manual_seed(seed + 7)
    initial = torch.randn(batch, heads, d_v, d_k, generator=generator, dtype=DTYPE) if with_state else None
    y_ref, s_ref, g_ref = outputs_and_grads(call(rwkv_product_naive), inputs, initial, seed)
    y, s, g = outputs_and_grads(call(rwkv_product_chunked, chunk_size=chunk), inputs, initial, seed)
    assert y.shape == (batch, length, heads, d_v) and s.shape == (batch, heads, d_v, d_k)
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
    assert relative_error(y, y_ref) <= TOLERANCE
    assert relative_error(s, s_ref) <= TOLERANCE
    assert set(g) == set(g_ref)
    for name in g_ref:
        assert torch.isfinite(g[name]).all(), name
        assert relative_error(g[name], g_ref[name]) <= TOLERANCE, name


@pytest.mark.parametrize("w_shift,strict_w_raw", [(3.0, True), (4.0, True), (6.0, False)])
def test_strong_decay_underflow_is_safe(w_shift: float, strict_w_raw: bool) -> None:
    # log w = -exp(w_raw): about -55 per step at shift 4 (the cumulative decay over a chunk of
    # 16 underflows float64), about -400 at shift 6. The relative-decay formulation must stay
    # finite and exact. At shift 6 the true w_raw gradient is suppressed by e^{-400} and the
    # round-off of the shift-invariant relative decays (1e-16 of O(1) terms that cancel in
    # the cumulative-sum backward, times e^{w_raw}) dominates it, so that one gradient is
    # checked for finiteness and to 1e-5 only.
    inputs = make_inputs(1, 29, 2, 4, 3, seed=11, w_shift=w_shift)
    initial = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(3), dtype=DTYPE)
    y_ref, s_ref, g_ref = outputs_and_grads(call(rwkv_product_naive), inputs, initial, 11)
    y, s, g = outputs_and_grads(call(rwkv_product_chunked, chunk_size=16), inputs, initial, 11)
    assert relative_error(y, y_ref) <= TOLERANCE
    assert relative_error(s, s_ref) <= TOLERANCE
    for name in g_ref:
        assert torch.isfinite(g[name]).all(), name
        tolerance = TOLERANCE if strict_w_raw or name != "w_raw" else 1e-5
        assert relative_error(g[name], g_ref[name]) <= tolerance, name


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, TOLERANCE), (torch.float32, 1e-4)])
def test_mixed_safe_and_pairwise_chunks(dtype: torch.dtype, tolerance: float) -> None:
    """Heads with per-step log decays of about -1, -9 and -150 (shifts 0, 2.2 and 5), the last
    clamped at -L (`log_decay_floor`: ≈ -19.9 in float32, -40.0 in float64): with chunks of 16
    the chunk's decay span is ~16, ~144 and 16·L. In float32 (factor limit ~80) one call mixes
    the main factorized product, the midpoint factorization (span ≤ 160) and the pair-by-pair
    path (span ~319); in float64 (limit ~638) the main product with factors up to e^144 and the
    midpoint factorization (span ~641; the pair-by-pair path in float64:
    test_strong_decays_do_not_swallow_later_decays). Forward and every gradient."""
    inputs = make_inputs(2, 45, 3, 8, 4, seed=140)
    shift = torch.tensor([0.0, 2.2, 5.0], dtype=DTYPE)[None, None, :, None]  # [1, 1, H, 1]
    inputs["w_raw"] = inputs["w_raw"] * 0.1 + shift
    initial = torch.randn(2, 3, 4, 8, generator=torch.Generator().manual_seed(141), dtype=DTYPE)
    inputs = {name: tensor.to(dtype) for name, tensor in inputs.items()}
    initial = initial.to(dtype)
    y_ref, s_ref, g_ref = outputs_and_grads(call(rwkv_product_naive), inputs, initial, 140)
    y, s, g = outputs_and_grads(call(rwkv_product_chunked, chunk_size=16), inputs, initial, 140)
    assert relative_error(y, y_ref) <= tolerance
    assert relative_error(s, s_ref) <= tolerance
    for name in g_ref:
        assert torch.isfinite(g[name]).all(), name
        assert relative_error(g[name], g_ref[name]) <= tolerance, name


def test_outputs_are_causal_bitwise() -> None:
    """Changing the inputs from step 21 on (inside the second chunk of 16) leaves y before step
    21 bitwise unchanged: the chunk's decay blocks use only steps up to their row (float32,
    RWKV-7-like decays with spans far below the factor limit, so every chunk-head takes the
    main factorized product; a chunk-head pushed over the limit by later steps would be
    recomputed as a whole, equal only to rounding)."""
    inputs = {name: tensor.float() for name, tensor in make_inputs(2, 40, 2, 16, 8, seed=150).items()}
    changed = {name: tensor.clone() for name, tensor in inputs.items()}
    generator = torch.Generator().manual_seed(151)
    for name, tensor in changed.items():
        scale = 0.1 if name == "w_raw" else 1.0
        tensor[:, 21:] += scale * torch.randn(tensor[:, 21:].shape, generator=generator)
    y, _ = rwkv_product_chunked(**inputs, chunk_size=16)
    y_changed, _ = rwkv_product_chunked(**changed, chunk_size=16)
    assert torch.equal(y[:, :21], y_changed[:, :21])
    assert not torch.equal(y[:, 21:], y_changed[:, 21:])


def test_chunk_size_does_not_change_result() -> None:
    inputs = make_inputs(1, 26, 2, 4, 3, seed=21)
    reference, _ = rwkv_product_naive(**inputs)
    for chunk in (1, 2, 3, 13, 26, 100):
        y, _ = rwkv_product_chunked(**inputs, chunk_size=chunk)
        assert relative_error(y, reference) <= TOLERANCE, chunk


def test_initial_state_continues_a_split_sequence() -> None:
    inputs = make_inputs(2, 30, 2, 4, 3, seed=31)
    y_full, s_full = rwkv_product(**inputs, chunk_size=8)
    first = {name: tensor[:, :13] for name, tensor in inputs.items()}
    second = {name: tensor[:, 13:] for name, tensor in inputs.items()}
    y_first, s_first = rwkv_product(**first, chunk_size=8)
    y_second, s_second = rwkv_product(**second, initial_state=s_first, chunk_size=8)
    assert relative_error(torch.cat([y_first, y_second], dim=1), y_full) <= TOLERANCE
    assert relative_error(s_second, s_full) <= TOLERANCE


def test_dispatcher_naive_flag() -> None:
    inputs = make_inputs(1, 12, 2, 3, 3, seed=41)
    y_naive, s_naive = rwkv_product(**inputs, naive=True)
    y_loop, s_loop = rwkv_product_naive(**inputs)
    assert torch.equal(y_naive, y_loop) and torch.equal(s_naive, s_loop)
    y_fast, s_fast = rwkv_product(**inputs)
    y_chunked, s_chunked = rwkv_product_chunked(**inputs, chunk_size=DEFAULT_CHUNK_SIZE)
    assert torch.equal(y_fast, y_chunked) and torch.equal(s_fast, s_chunked)
    assert relative_error(y_fast, y_naive) <= TOLERANCE


def test_expansion_with_one_substep_is_identity() -> None:
    inputs = make_inputs(2, 9, 2, 3, 4, seed=51, substeps=1)
    expanded = expand_substeps(**inputs)
    r, w_raw, k, v, a, b = expanded
    assert torch.equal(r, inputs["r"]) and torch.equal(w_raw, inputs["w_raw"])
    for got, name in ((k, "k"), (v, "v"), (a, "a"), (b, "b")):
        assert torch.equal(got, inputs[name][:, :, 0]), name
    y, _ = rwkv_product(*expanded)
    assert torch.equal(collapse_substeps(y, 1), y)


def substep_loop(inputs: dict[str, Tensor], initial_state: Tensor) -> tuple[Tensor, Tensor]:
    """The M-substep recurrence by hand: decay on substep 0 only, read after substep M-1."""
    r, w_raw, k, v, a, b = (inputs[name] for name in ("r", "w_raw", "k", "v", "a", "b"))
    length, substeps = k.shape[1], k.shape[2]
    decay = torch.exp(-torch.exp(w_raw))  # [B, T, H, d_k]
    state = initial_state  # [B, H, d_v, d_k]
    outputs = []
    for t in range(length):
        for j in range(substeps):
            sa = torch.einsum("bhvk,bhk->bhv", state, a[:, t, j])
            kept = state * decay[:, t, :, None, :] if j == 0 else state
            state = kept + sa[..., None] * b[:, t, j, :, None, :] + v[:, t, j, :, :, None] * k[:, t, j, :, None, :]
        outputs.append(torch.einsum("bhvk,bhk->bhv", state, r[:, t]))
    return torch.stack(outputs, dim=1), state


@pytest.mark.parametrize("substeps,length,chunk", [(2, 7, 4), (3, 5, 8), (4, 1, 8)])
def test_substeps_match_hand_recurrence(substeps: int, length: int, chunk: int) -> None:
    inputs = make_inputs(2, length, 2, 4, 3, seed=60 + substeps, substeps=substeps)
    initial = torch.randn(2, 2, 3, 4, generator=torch.Generator().manual_seed(9), dtype=DTYPE)
    y_ref, s_ref, g_ref = outputs_and_grads(lambda t: substep_loop(t, t["initial_state"]), inputs, initial, 61)
    for naive in (True, False):
        y, s, g = outputs_and_grads(
            call(rwkv_product_substeps, chunk_size=chunk, naive=naive), inputs, initial, 61
        )
        assert y.shape == (2, length, 2, 3)
        assert relative_error(y, y_ref) <= TOLERANCE
        assert relative_error(s, s_ref) <= TOLERANCE
        for name in g_ref:
            assert relative_error(g[name], g_ref[name]) <= TOLERANCE, (naive, name)


def test_expansion_layout() -> None:
    inputs = make_inputs(1, 3, 1, 2, 2, seed=70, substeps=3)
    r, w_raw, k, v, _, _ = expand_substeps(**inputs)
    assert r.shape == (1, 9, 1, 2)
    for t in range(3):
        assert torch.equal(r[:, 3 * t + 2], inputs["r"][:, t])
        assert (r[:, 3 * t : 3 * t + 2] == 0).all()
        assert torch.equal(w_raw[:, 3 * t], inputs["w_raw"][:, t])
        assert torch.equal(torch.exp(-torch.exp(w_raw[:, 3 * t + 1 : 3 * t + 3])), torch.ones(1, 2, 1, 2, dtype=DTYPE))
        for j in range(3):
            assert torch.equal(k[:, 3 * t + j], inputs["k"][:, t, j])
            assert torch.equal(v[:, 3 * t + j], inputs["v"][:, t, j])


def test_bad_inputs_raise() -> None:
    inputs = make_inputs(1, 4, 2, 3, 2, seed=80)
    with pytest.raises(ValueError, match="chunk_size"):
        rwkv_product_chunked(**inputs, chunk_size=0)
    with pytest.raises(ValueError, match="w_raw"):
        rwkv_product(**{**inputs, "w_raw": inputs["w_raw"][:, :3]})
    with pytest.raises(ValueError, match="v="):
        rwkv_product(**{**inputs, "v": inputs["v"][:, :, :1]})
    with pytest.raises(ValueError, match="k="):
        rwkv_product(**{**inputs, "k": inputs["k"].float()}, naive=True)
    with pytest.raises(ValueError, match="r="):
        rwkv_product(**{**inputs, "r": inputs["r"][0]})
    with pytest.raises(ValueError, match="initial_state"):
        rwkv_product(**inputs, initial_state=torch.zeros(1, 2, 3, 3, dtype=DTYPE))
    with pytest.raises(ValueError, match="T >= 1"):
        rwkv_product(**{name: tensor[:, :0] for name, tensor in inputs.items()})
    with pytest.raises(ValueError, match="k="):
        expand_substeps(**inputs)
    with pytest.raises(ValueError, match="substeps"):
        collapse_substeps(inputs["v"], 0)
    with pytest.raises(ValueError, match="y="):
        collapse_substeps(inputs["v"], 3)


FLOAT32_TOLERANCE = 1e-4

FLOAT32_CASES = [
    # (batch, length, heads, d_k, d_v, chunk, substeps, seed): T off the chunk grid, T below one
    # chunk, several heads, always an initial state; substeps > 0 runs the M-substep entry point.
    (2, 45, 3, 16, 8, 16, 0, 100),
    (1, 11, 4, 8, 8, 16, 0, 101),
    (2, 70, 2, 32, 16, DEFAULT_CHUNK_SIZE, 0, 102),
    (1, 9, 3, 8, 4, 16, 2, 103),
    (2, 13, 2, 8, 8, 8, 2, 104),
]


def float32_outputs_and_grads(run, inputs: dict[str, Tensor], initial: Tensor, seed: int):
    """Like `outputs_and_grads` in float32: returns y, final state, {name: grad}."""
    tensors = {name: t.float().clone().requires_grad_(True) for name, t in inputs.items()}
    tensors["initial_state"] = initial.float().clone().requires_grad_(True)
    y, state = run(tensors)
    generator = torch.Generator().manual_seed(seed + 1000)
    loss = (y * torch.randn(y.shape, generator=generator)).sum() + (state * torch.randn(state.shape, generator=generator)).sum()
    grads = torch.autograd.grad(loss, list(tensors.values()))
    return y.detach(), state.detach(), dict(zip(tensors, grads, strict=True))


@pytest.mark.parametrize("batch,length,heads,d_k,d_v,chunk,substeps,seed", FLOAT32_CASES)
def test_float32_chunked_matches_naive_forward_and_grads(
    batch: int, length: int, heads: int, d_k: int, d_v: int, chunk: int, substeps: int, seed: int
) -> None:
    inputs = make_inputs(batch, length, heads, d_k, d_v, seed, substeps=substeps)
    initial = torch.randn(batch, heads, d_v, d_k, generator=torch.Generator().manual_seed(seed + 7), dtype=DTYPE)
    kernel = rwkv_product_substeps if substeps else rwkv_product
    y_ref, s_ref, g_ref = float32_outputs_and_grads(call(kernel, naive=True), inputs, initial, seed)
    y, s, g = float32_outputs_and_grads(call(kernel, chunk_size=chunk), inputs, initial, seed)
    assert y.dtype == torch.float32 and s.dtype == torch.float32
    assert relative_error(y, y_ref) <= FLOAT32_TOLERANCE
    assert relative_error(s, s_ref) <= FLOAT32_TOLERANCE
    assert set(g) == set(g_ref) == {"r", "w_raw", "k", "v", "a", "b", "initial_state"}
    for name in g_ref:
        assert g[name].dtype == torch.float32
        assert torch.isfinite(g[name]).all(), name
        assert relative_error(g[name], g_ref[name]) <= FLOAT32_TOLERANCE, name


def _run_with_grads(kernel, inputs: dict[str, Tensor], initial: Tensor, **options) -> list[Tensor]:
    tensors = {name: t.float().clone().requires_grad_(True) for name, t in inputs.items()}
    tensors["initial_state"] = initial.float().clone().requires_grad_(True)
    y, state = call(kernel, **options)(tensors)
    loss = y.sum() + (state * state).sum()
    grads = torch.autograd.grad(loss, list(tensors.values()))
    return [y.detach(), state.detach(), *grads]


@pytest.mark.parametrize("naive", [False, True])
def test_results_do_not_depend_on_uninitialized_memory(naive: bool) -> None:
    """The kernels take no preallocated outputs, so (1) run under different allocator states (NaN
    vs zero filled freed memory) and (2) with torch.empty NaN-poisoned by torch's deterministic
    mode; all runs must agree bitwise and be finite."""
    inputs = make_inputs(2, 21, 2, 8, 4, seed=110, substeps=2)
    initial = torch.randn(2, 2, 4, 8, generator=torch.Generator().manual_seed(111), dtype=DTYPE)
    options = {"naive": naive, "chunk_size": 8}
    assert_independent_of_uninitialized_memory(
        lambda: _run_with_grads(rwkv_product_substeps, inputs, initial, **options))


def token_transition(w_raw: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """The kernel's own M-substep state transition of one token, [d, d]: with k = v = 0 and
    S_0 = I (d_v = d_k), the final state is I · A = A, where S ↦ S A."""
    substeps, d = a.shape
    zeros = torch.zeros(1, 1, substeps, 1, d, dtype=DTYPE)
    _, state = rwkv_product_substeps(
        torch.zeros(1, 1, 1, d, dtype=DTYPE), w_raw.reshape(1, 1, 1, d), zeros, zeros,
        a.reshape(1, 1, substeps, 1, d), b.reshape(1, 1, substeps, 1, d),
        torch.eye(d, dtype=DTYPE).reshape(1, 1, d, d), naive=True,
    )
    return state[0, 0]


def numerical_rank(matrix: Tensor, rtol: float = 1e-10) -> int:
    singular = torch.linalg.svdvals(matrix)
    return int((singular > rtol * max(float(singular[0]), 1.0)).sum())


@pytest.mark.parametrize("substeps", [1, 2, 3, 4])
def test_lemma2_product_is_diagonal_plus_rank_at_most_m(substeps: int) -> None:
    """Appendix A, Lemma 2: the product of the M substep transitions (diag(w) + a_0 b_0ᵀ)
    (I + a_1 b_1ᵀ) ... (I + a_{M-1} b_{M-1}ᵀ) is diag(w) plus a term of rank ≤ M."""
    d = 12
    for trial in range(5):
        inputs = make_inputs(1, 1, 1, d, d, seed=200 + 10 * substeps + trial, substeps=substeps)
        w_raw = inputs["w_raw"][0, 0, 0]  # [d]
        a, b = inputs["a"][0, 0, :, 0], inputs["b"][0, 0, :, 0]  # [M, d]
        transition = token_transition(w_raw, a, b)
        decay = torch.exp(-torch.exp(w_raw))
        by_hand = torch.diag(decay) + torch.outer(a[0], b[0])
        for j in range(1, substeps):
            by_hand = by_hand @ (torch.eye(d, dtype=DTYPE) + torch.outer(a[j], b[j]))
        assert torch.allclose(transition, by_hand, rtol=1e-12, atol=1e-12)
        low_rank = transition - torch.diag(decay)
        # ≤ M by the lemma, and exactly M for generic (random) inputs: the bound is attained.
        assert numerical_rank(low_rank) == substeps
    # A random matrix minus its diagonal is full rank: the rank test is not vacuous.
    assert numerical_rank(torch.randn(d, d, dtype=DTYPE, generator=torch.Generator().manual_seed(1))) == d


class _ElementCounter(TorchDispatchMode):
    """Counts the elements of every tensor an aten op returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.elements += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, Tensor))
        return out


def _forward_backward_elements(naive: bool, length: int) -> int:
    inputs = make_inputs(1, length, 2, 16, 16, seed=120)
    tensors = leaves(inputs, None)
    with _ElementCounter() as counter:
        y, state = rwkv_product(*tensors.values(), chunk_size=4, naive=naive)
        torch.autograd.grad(y.sum() + state.sum(), list(tensors.values()))
    return counter.elements


@pytest.mark.parametrize("naive", [False, True])
def test_forward_backward_work_is_linear_in_length(naive: bool) -> None:
    """Elements produced by all ops of forward + backward grow ~8x for 8x the length. Indexing
    a per-step / per-chunk slice as x[:, t] in the loop made each slice's backward write a zero
    gradient of the whole tensor: 23x (chunked) and 41x (naive) here, 45x slower at T = 8192."""
    ratio = _forward_backward_elements(naive, 512) / _forward_backward_elements(naive, 64)
    assert ratio <= 9.0, ratio


def test_dispatcher_keeps_cpu_tensors_off_triton() -> None:
    """CPU tensors take the chunked path even when triton is installed (Triton is for CUDA)."""
    inputs = make_inputs(1, 10, 2, 3, 3, seed=130)
    y, state = rwkv_product(**inputs, chunk_size=4)
    y_chunked, state_chunked = rwkv_product_chunked(**inputs, chunk_size=4)
    assert torch.equal(y, y_chunked) and torch.equal(state, state_chunked)
    assert triton_available() == (importlib.util.find_spec("triton") is not None)


CUDA_TRITON = torch.cuda.is_available() and triton_available()


@pytest.mark.skipif(not CUDA_TRITON, reason="the compiled state scan needs a GPU and triton")
@pytest.mark.parametrize("reverse", [False, True])
def test_cuda_state_scan_kernel_matches_the_loop(reverse: bool) -> None:
    """The chunked path's state scan compiled for the GPU (`state_scan_triton.py`) against the loop, float32, ragged
    d_v and d_k, 300 chunks."""
    from rcswarm.kernels.rwkv_product.state_scan import state_scan_, state_scan_naive_

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(301, 6, 40, 24, device="cuda", generator=g)  # [N+1, BH, d_v, d_k]
    m = torch.randn(300, 6, 24, 24, device="cuda", generator=g) * 0.2  # [N, BH, d_k, d_k]
    want = state_scan_naive_(x.clone().double(), m.double(), reverse)
    got = state_scan_(x.clone(), m, reverse)
    assert (got.double() - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.skipif(not CUDA_TRITON, reason="the chunked path's compiled scan needs a GPU and triton")
def test_cuda_chunked_path_matches_naive_forward_and_grads() -> None:
    """The chunked path on CUDA (its scan the Triton kernel), float32, against the naive loop in float64."""
    torch.manual_seed(0)
    batch, length, heads, d = 2, 300, 3, 32
    kappa = F.normalize(torch.randn(batch, length, heads, d, dtype=torch.float64), dim=-1)
    inputs = {"r": torch.randn(batch, length, heads, d, dtype=torch.float64),
              "w_raw": torch.randn(batch, length, heads, d, dtype=torch.float64),
              "k": torch.randn(batch, length, heads, d, dtype=torch.float64) / d**0.5,
              "v": torch.randn(batch, length, heads, d, dtype=torch.float64),
              "a": -kappa, "b": kappa * torch.rand(batch, length, heads, d, dtype=torch.float64),
              "initial_state": torch.randn(batch, heads, d, d, dtype=torch.float64)}
    results = []
    for run, device, dtype in ((rwkv_product_naive, "cpu", torch.float64), (rwkv_product_chunked, "cuda", torch.float32)):
        leaves = {name: x.to(device, dtype, copy=True).requires_grad_(True) for name, x in inputs.items()}
        y, state = run(*leaves.values())
        grads = torch.autograd.grad(y.square().sum() + state.sin().sum(), list(leaves.values()))
        results.append([t.detach().double().cpu() for t in (y, state, *grads)])
    for want, got in zip(*results, strict=True):
        assert (got - want).norm() <= 1e-4 * want.norm()


STRONG_CHUNK = 48


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, TOLERANCE), (torch.float32, FLOAT32_TOLERANCE)])
@pytest.mark.parametrize("run", [1, 36])
@pytest.mark.parametrize("strong", [4.0, 20.0, 90.0, 800.0])
def test_strong_decays_do_not_swallow_later_decays(
    dtype: torch.dtype, tolerance: float, run: int, strong: float
) -> None:
    """The first `run` steps of every chunk of 48 decay with w_raw = `strong` (log w = -e^{strong}), the others weakly
    (w_raw ≈ -5). Unclamped, λ = -e^{20} in the chunk's cumulative sum swallowed the later steps' small λ (7e-2 relative
    error in float32, 1e-8 in float64) and e^{w_raw} overflowed into NaN (w_raw = 90 in float32, 800 in float64). With λ
    clamped at -L (`log_decay_floor`) forward and every gradient match the loop in float64 (with run = 36 the chunk's
    span is 36·L: the pair-by-pair blocks in both dtypes). The loop's own float64 gradient at w_raw ≥ 709.8 is
    0·∞ = NaN; its value there, e^{w_raw - e^{w_raw}}, is 0, as the loop gives at w_raw = 50, where its forward is the
    same (w = 0), so the reference runs on w_raw clamped at 50."""
    length = 2 * STRONG_CHUNK + 5
    inputs = make_inputs(2, length, 2, 8, 4, seed=160)
    inputs["w_raw"] = inputs["w_raw"] * 0.1 - 5.0
    for start in range(0, length, STRONG_CHUNK):
        inputs["w_raw"][:, start : start + run] = strong
    initial = torch.randn(2, 2, 4, 8, generator=torch.Generator().manual_seed(161), dtype=DTYPE)
    reference_inputs = {**inputs, "w_raw": inputs["w_raw"].clamp(max=50.0)}
    y_ref, s_ref, g_ref = outputs_and_grads(call(rwkv_product_naive), reference_inputs, initial, 160)
    low = {name: tensor.to(dtype) for name, tensor in inputs.items()}
    y, s, g = outputs_and_grads(call(rwkv_product_chunked, chunk_size=STRONG_CHUNK), low, initial.to(dtype), 160)
    assert relative_error(y, y_ref) <= tolerance
    assert relative_error(s, s_ref) <= tolerance
    for name in g_ref:
        assert torch.isfinite(g[name]).all(), name
        assert relative_error(g[name], g_ref[name]) <= tolerance, name


def test_backward_twice_through_a_retained_graph_and_gradcheck() -> None:
    """The saved tensors survive a backward with retain_graph=True (they were dropped from ctx after the first), so a
    second backward through the same graph gives the loop's gradients, and gradcheck passes."""
    inputs = make_inputs(1, 7, 2, 3, 2, seed=170)
    initial = torch.randn(1, 2, 2, 3, generator=torch.Generator().manual_seed(171), dtype=DTYPE)
    for run in (rwkv_product_naive, lambda *xs: rwkv_product_chunked(*xs, chunk_size=3)):
        tensors = list(leaves(inputs, initial).values())
        y, state = run(*tensors)
        first = torch.autograd.grad(y.sum(), tensors, retain_graph=True)
        second = torch.autograd.grad(y.square().sum() + state.square().sum(), tensors)
        if run is rwkv_product_naive:
            reference = (first, second)
    for got, want in zip((*first, *second), (*reference[0], *reference[1]), strict=True):
        assert relative_error(got, want) <= TOLERANCE
    tensors = tuple(leaves(inputs, initial).values())
    assert torch.autograd.gradcheck(lambda *xs: rwkv_product_chunked(*xs, chunk_size=3), tensors)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("naive_dispatch", [False, True])
def test_low_precision_inputs_compute_in_float32(dtype: torch.dtype, naive_dispatch: bool) -> None:
    """float16 / bfloat16 inputs on the CPU (no triangular solve there) run the chunked path in float32: outputs and
    gradients come back in the input dtype, within half its eps (plus float32's share) of the loop in float64 on the
    same rounded inputs and cotangents. Through `rwkv_product` (the dispatcher) and `rwkv_product_chunked`."""
    kernel = rwkv_product if naive_dispatch else rwkv_product_chunked
    inputs = make_inputs(2, 45, 3, 16, 8, seed=180)
    initial = torch.randn(2, 3, 8, 16, generator=torch.Generator().manual_seed(181), dtype=DTYPE)
    low = {name: tensor.to(dtype).requires_grad_(True) for name, tensor in {**inputs, "initial_state": initial}.items()}
    exact = {name: tensor.detach().double().requires_grad_(True) for name, tensor in low.items()}
    generator = torch.Generator().manual_seed(182)
    y_cotangent = torch.randn(2, 45, 3, 8, generator=generator, dtype=DTYPE).to(dtype)
    state_cotangent = torch.randn(2, 3, 8, 16, generator=generator, dtype=DTYPE).to(dtype)
    y, state = kernel(**low, chunk_size=16)
    grads = torch.autograd.grad((y * y_cotangent).sum() + (state * state_cotangent).sum(), list(low.values()))
    y_ref, state_ref = rwkv_product_naive(**exact)
    loss_ref = (y_ref * y_cotangent.double()).sum() + (state_ref * state_cotangent.double()).sum()
    grads_ref = torch.autograd.grad(loss_ref, list(exact.values()))
    tolerance = torch.finfo(dtype).eps / 2 + FLOAT32_TOLERANCE
    assert y.dtype == dtype and state.dtype == dtype
    assert relative_error(y.detach(), y_ref.detach()) <= tolerance
    assert relative_error(state.detach(), state_ref.detach()) <= tolerance
    for name, got, want in zip(low, grads, grads_ref, strict=True):
        assert got.dtype == dtype, name
        assert relative_error(got, want) <= tolerance, name


def test_empty_dimensions() -> None:
    """H = 0, d_k = 0 or d_v = 0 is refused with a ValueError naming the shape (they failed with ZeroDivisionError and
    IndexError); an empty batch gives empty outputs and empty gradients on every path."""
    inputs = make_inputs(1, 5, 2, 3, 4, seed=190)
    no_heads = {name: tensor[:, :, :0] for name, tensor in inputs.items()}
    no_keys = {**inputs, **{name: inputs[name][..., :0] for name in ("r", "w_raw", "k", "a", "b")}}
    no_values = {**inputs, "v": inputs["v"][..., :0]}
    kernels = (rwkv_product, rwkv_product_naive, rwkv_product_chunked)
    for kernel in kernels:
        for bad, message in (
            (no_heads, r"r=tensor\[1, 5, 0, 3\].*H >= 1"),
            (no_keys, r"r=tensor\[1, 5, 2, 0\].*d_k >= 1"),
            (no_values, r"v=tensor\[1, 5, 2, 0\].*d_v >= 1"),
        ):
            with pytest.raises(ValueError, match=message):
                kernel(**bad)
    for kernel in (*kernels, lambda **xs: rwkv_product_chunked(**xs, chunk_size=2)):
        tensors = leaves({name: tensor[:0] for name, tensor in inputs.items()}, torch.zeros(0, 2, 4, 3, dtype=DTYPE))
        y, state = kernel(**tensors)
        assert y.shape == (0, 5, 2, 4) and state.shape == (0, 2, 4, 3)
        grads = torch.autograd.grad(y.sum() + state.sum(), list(tensors.values()))
        assert all(grad.shape == tensor.shape for grad, tensor in zip(grads, tensors.values(), strict=True))
    substeps = make_inputs(0, 3, 2, 3, 4, seed=191, substeps=2)
    y, state = rwkv_product_substeps(**substeps, chunk_size=4)
    assert y.shape == (0, 3, 2, 4) and state.shape == (0, 2, 4, 3)
