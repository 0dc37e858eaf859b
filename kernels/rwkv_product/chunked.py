"""The chunked (WY / UT-transform) form of the RWKV-7 generalized delta rule.

Recurrence (see `naive.py`): S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_tᵀ + v_t k_tᵀ,
y_t = S_t r_t, with w_t = exp(-exp(w_raw_t)). Rows below are time steps of one chunk of C
steps, t, s ∈ {0, ..., C-1}; S_0 is the state entering the chunk.

Log-space decays. λ_t = log w_t = -exp(w_raw_t) ≤ 0 (clamped at -L: "Clamped decays" below) and
g_t = Σ_{u ≤ t} λ_u (cumulative sum within the chunk, g_{-1} = 0). The chunk needs the relative
decays e^{g_{t-1} - g_s} (s < t) and e^{g_t - g_s} (s ≤ t), exponents ≤ 0. The growth factor
e^{-g_s} relative to the chunk start, which overflows once the cumulative decay underflows, is
used only where the chunk's decay span keeps it finite (see below); elsewhere the relative
decays are formed otherwise.

Pseudo-values. With z_t = S_{t-1} a_t [d_v], unrolling the diagonal part gives

    S_t = S_0 diag(e^{g_t}) + Σ_{s ≤ t} (z_s b_sᵀ + v_s k_sᵀ) diag(e^{g_t - g_s})
    z_t = S_0 (a_t ⊙ e^{g_{t-1}}) + Σ_{s < t} z_s L^{ab}_{ts} + Σ_{s < t} v_s L^{ak}_{ts}

    L^{ab}_{ts} = Σ_i a_{t,i} b_{s,i} e^{g_{t-1,i} - g_{s,i}},   L^{ak}_{ts} likewise with k (s < t)
    Q^{rb}_{ts} = Σ_i r_{t,i} b_{s,i} e^{g_{t,i} - g_{s,i}},      Q^{rk}_{ts} likewise with k (s ≤ t)

so in matrix form (rows t; Z, V [C, d_v]; Ã = a ⊙ e^{g_{t-1}}, R̃ = r ⊙ e^{g_t} [C, d_k])
the UT transform is one unit-lower-triangular solve per chunk, independent of S_0:

    (I - L^{ab}) [U | W] = [L^{ak} V | Ã]          so  Z = U + W S_0ᵀ
    y     = (Q^{rb} U + Q^{rk} V) + (R̃ + Q^{rb} W) S_0ᵀ
    S_C   = S_0 A + F,   A = diag(e^{g_{C-1}}) + Wᵀ B̂,   F = Uᵀ B̂ + Vᵀ K̂
    B̂ = b ⊙ e^{g_{C-1} - g_s},  K̂ = k ⊙ e^{g_{C-1} - g_s}

Decay matrices as one matrix product. Since e^{g_{t-1} - g_s} = e^{g_{t-1}} e^{-g_s},

    [L^{ab} L^{ak}; Q^{rb} Q^{rk}] = mask ⊙ ([Ã; R̃] [b ⊙ e^{-g}; k ⊙ e^{-g}]ᵀ)

one [2C, d_k] × [d_k, 2C] product per chunk (masked in place by `tril_`) instead of C²·d_k
elementwise work; the left factors are Ã and R̃ themselves. Every kept (causal) entry is a
product of its exact relative decays, at most 1, and depends only on steps up to its row, so
(in safe chunk-heads) outputs do not depend on later inputs even in rounding; the entries
above the diagonal are zeroed, never multiplied into anything, and get zero gradient. The factors e^{-g_s} are at
most e^{span}, span = max_i(-g_{C-1,i}) the chunk-head's largest decay span, so a chunk-head is
SAFE when span ≤ 0.9·ln(dtype max) (≈ 80 in float32, 638 in float64) and nothing overflows.
The other chunk-heads (strong decays) are recomputed and replace the product's entries
(`_fallback_blocks`, only for those chunk-heads, with autograd through it in backward): up
to twice the limit factorized around the midpoint ρ = g_{C-1}/2 (factors ≤ e^{span/2}), above
that pair by pair from the masked exponents g_{t-1} - g_s, g_t - g_s ≤ 0 ([C, C, d_k]
elementwise). Their e^{-g_s} factors in the main product are clamped at e^{limit} first so the
replaced entries' zero gradients never meet an infinite factor (0 · ∞). Any chunk size is
therefore safe.

Clamped decays. λ is clamped at -L, L = ln(1/eps) + 4 of the arithmetic dtype (≈ 19.9 in
float32, 40.0 in float64; `log_decay_floor`), by clamping w_raw at ln L before the exponential.
Unclamped, one strong decay breaks the cumulative sum: with λ_0 = -e^{20} ≈ -4.9e8 the later
steps' small λ vanish in the rounding of g (float32's spacing there is 32), so the chunk's later
relative decays are wrong (7e-2 relative error in y in float32), and e^{w_raw} overflows at
w_raw ≈ 88.7 (float32) into -∞ + ∞ = NaN. A clamped decay, e^λ ≤ e^{-L} < eps/50, changes the
state by less than eps/50 of the state it decays, below the loop's own rounding. The clamp gives
those entries zero w_raw gradient; the loop's is (dL/dw) w λ with |w λ| = |λ| e^{λ} ≤ L e^{-L}
(4e-8 in float32, 2e-16 in float64, against up to 1/e for weak decays), below the rounding of
the other entries. Since |g| ≤ C·L, a relative decay's exponent is exact to about |g|·eps: up
to C·L·eps (4e-5 at C = 32 in float32) where a run of clamped steps precedes weak ones, ~1e-6
after one strong step. Inputs in dtypes other than float32 and float64 (float16, bfloat16) are
computed in float32 (`compute_dtype`) and the results rounded back.

Layout and work. The sequence is cut into N = ⌈T / C⌉ chunks (a ragged tail padded with
identity steps, λ = 0 and a = b = k = v = r = 0, which leave the state unchanged) and laid out
chunk-major, P = N·B·H pieces [P, C, d], so every chunk-local quantity above is one batched
product or elementwise op over all chunks at once. Only S_{n+1} = S_n A_n + F_n runs in
sequence over the N chunks (`state_scan.py`: one [B·H] batch of d_v × d_k by d_k × d_k products
per chunk, on contiguous slices; on CUDA one Triton launch for all of them). Per step the
forward costs about 4C·d_k (decay blocks) + 2C·d (solve, intra-chunk outputs) + 4·d_v·d_k
(A, F, the read of S_0) + d_v·d_k²/C (the scan) multiply-adds, about 2.4× the recurrence's own
4.5·d_v·d_k at C = 32, d = 64.

Backward (`_chunk_backward`, hand-written, a torch.autograd.Function): the reverse loop
G_n = dS_n + G_{n+1} A_nᵀ (G_N = d final state, dS_n = dY_nᵀ (R̃ + Q^{rb} W) from the reads of
S_0) is the only sequential part; then, batched over all chunks, dA_n = S_nᵀ G_{n+1},
dF_n = G_{n+1}, and the transposed products of the forward in reverse order. The inverse
X = (I - L^{ab})^{-1} (one batched triangular solve against the identity) is kept, so
[U | W] = X [L^{ak} V | Ã] gives d[L^{ak} V | Ã] = Xᵀ d[U | W] and
dL^{ab} = tril(d(L^{ak} V) Uᵀ + dÃ Wᵀ, -1). The decay blocks' gradients flow into the factors
(d of a ⊙ e^{x} is e^{x} for a and (dÃ ⊙ Ã) for x), the exponents into g and g_{t-1}, and dλ
is the reverse cumulative sum of dg. Unsafe chunk-heads get their block gradients by autograd
through `_fallback_blocks` (small, recomputed in backward).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from rcswarm.kernels.rwkv_product.checks import check_chunk_size, check_inputs
from rcswarm.kernels.rwkv_product.state_scan import state_scan_

DEFAULT_CHUNK_SIZE = 32


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The chunked path's arithmetic type: float64 for float64 inputs, float32 for every other floating dtype
    (there is no float16 / bfloat16 triangular solve on the CPU; the Triton path accumulates in float32 too)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def log_decay_floor(dtype: torch.dtype) -> float:
    """L = ln(1 / eps) + 4 of the arithmetic dtype (≈ 19.9 for float32, 40.0 for float64): λ = log w is clamped
    at -L, where e^λ ≤ e^{-L} < eps / 50 already (see the module docstring)."""
    return math.log(1.0 / torch.finfo(dtype).eps) + 4.0


def factor_limit(dtype: torch.dtype) -> float:
    """Largest exponent a decay factor may take: 0.9·ln(max) of the dtype (≈ 80 for float32)."""
    return 0.9 * math.log(torch.finfo(dtype).max)


def _pairwise_blocks(
    a: Tensor, r: Tensor, b: Tensor, k: Tensor, g: Tensor, g_before: Tensor
) -> Tensor:
    """[L^{ab} L^{ak}; Q^{rb} Q^{rk}] [n, 2C, 2C] pair by pair from masked exponents (inputs [n, C, d_k])."""
    size = g.shape[-2]
    strict = torch.ones(size, size, dtype=torch.bool, device=g.device).tril(-1)[:, :, None]  # [C, C, 1]
    lower = torch.ones(size, size, dtype=torch.bool, device=g.device).tril()[:, :, None]  # [C, C, 1]
    minus_inf = torch.tensor(float("-inf"), dtype=g.dtype, device=g.device)
    before = torch.where(strict, g_before[:, :, None, :] - g[:, None, :, :], minus_inf).exp()  # [n, C, C, d_k]
    after = torch.where(lower, g[:, :, None, :] - g[:, None, :, :], minus_inf).exp()  # [n, C, C, d_k]
    rows = []
    for decay, left in ((before, a), (after, r)):
        weighted = decay * left[:, :, None, :]  # [n, C, C, d_k]
        rows.append(torch.cat([(weighted * b[:, None]).sum(-1), (weighted * k[:, None]).sum(-1)], dim=-1))
    return torch.cat(rows, dim=-2)  # [n, 2C, 2C]


def _midpoint_blocks(a: Tensor, r: Tensor, b: Tensor, k: Tensor, g: Tensor, g_before: Tensor) -> Tensor:
    """The decay blocks [n, 2C, 2C] factorized around ρ = g_{C-1} / 2 (factors ≤ e^{span / 2})."""
    size = g.shape[-2]
    reference = 0.5 * g[:, -1:]  # [n, 1, d_k]
    left = torch.cat([a * (g_before - reference).exp(), r * (g - reference).exp()], dim=1)  # [n, 2C, d_k]
    to_reference = (reference - g).exp()  # [n, C, d_k]
    right = torch.cat([b * to_reference, k * to_reference], dim=1)  # [n, 2C, d_k]
    rows = torch.arange(2 * size, device=g.device) % size
    causal = rows[:, None] > rows[None, :]  # [2C, 2C], s < t
    causal[size:] |= torch.eye(size, dtype=torch.bool, device=g.device).repeat(1, 2)  # Q rows: s ≤ t
    return torch.where(causal, left @ right.transpose(-1, -2), torch.zeros((), dtype=g.dtype, device=g.device))


def _fallback_blocks(
    a: Tensor, r: Tensor, b: Tensor, k: Tensor, g: Tensor, g_before: Tensor, limit: float
) -> Tensor:
    """Decay blocks [n, 2C, 2C] of chunk-heads whose span exceeds `limit` (inputs [n, C, d_k]):
    factorized around the midpoint ρ = g_{C-1} / 2 up to a span of 2·limit, pair by pair above."""
    span = -g[:, -1].amin(dim=-1)  # [n]
    blocks = g.new_zeros(g.shape[0], 2 * g.shape[1], 2 * g.shape[1])  # [n, 2C, 2C]
    for chosen, blocks_of in ((span <= 2 * limit, _midpoint_blocks), (span > 2 * limit, _pairwise_blocks)):
        index = chosen.nonzero()[:, 0]
        if index.numel():
            blocks = blocks.index_put((index,), blocks_of(*(x[index] for x in (a, r, b, k, g, g_before))))
    return blocks


def _chunk_forward(
    rc: Tensor, lam: Tensor, kc: Tensor, vc: Tensor, ac: Tensor, bc: Tensor, initial: Tensor, chunks: int
) -> tuple[Tensor, Tensor, dict[str, Tensor | float]]:
    """The chunked form on chunk-major pieces [P, C, d] (P = N·B·H, chunk n of head p at n·BH + p).

    lam: λ = log w ≤ 0 [P, C, d_k]; initial [BH, d_v, d_k]; chunks: N (given, as B·H may be 0).
    Returns y [P, C, d_v], the final state [BH, d_v, d_k] and the saved quantities of
    `_chunk_backward` (tensors, and the float "limit").
    """
    pieces, size, d_k = rc.shape
    heads = initial.shape[0]  # B·H
    limit = factor_limit(rc.dtype)
    g = lam.cumsum(dim=1)  # [P, C, d_k]
    g_before = F.pad(g[:, :-1], (0, 0, 1, 0))  # [P, C, d_k], row t = g_{t-1}, g_{-1} = 0
    g_last = g[:, -1:]  # [P, 1, d_k]
    span = -g_last.amin(dim=(-1, -2))  # [P], the chunk's largest decay span max_i(-g_{C-1,i})
    unsafe = (span > limit).nonzero()[:, 0]  # [u]
    exp_before, exp_g = g_before.exp(), g.exp()  # [P, C, d_k], e^{g_{t-1}}, e^{g_t}
    left, right = (rc.new_empty(pieces, 2 * size, d_k) for _ in range(2))  # [P, 2C, d_k]: [Ã; R̃], [b ⊙ e^{-g}; k ⊙ e^{-g}]
    torch.mul(ac, exp_before, out=left[:, :size])
    torch.mul(rc, exp_g, out=left[:, size:])
    a_tilde, r_tilde = left[:, :size], left[:, size:]  # [P, C, d_k], Ã, R̃
    to_start = g.neg()  # [P, C, d_k], -g_s ≤ span
    if unsafe.numel():
        to_start.clamp_(max=limit)
    e_b = to_start.exp_()  # [P, C, d_k], e^{-g_s}
    torch.mul(bc, e_b, out=right[:, :size])
    torch.mul(kc, e_b, out=right[:, size:])
    blocks = left @ right.transpose(-1, -2)  # [P, 2C, 2C], [L^{ab} L^{ak}; Q^{rb} Q^{rk}]
    _mask_blocks(blocks, size)
    if unsafe.numel():
        blocks[unsafe] = _fallback_blocks(*(x[unsafe] for x in (ac, rc, bc, kc, g, g_before)), limit)
    l_ab, l_ak, q = blocks[:, :size, :size], blocks[:, :size, size:], blocks[:, size:]  # q [P, C, 2C]

    to_end = (g_last - g).exp_()  # [P, C, d_k]
    bk_hat = rc.new_empty(pieces, 2 * size, d_k)  # [P, 2C, d_k], [B̂; K̂]
    torch.mul(bc, to_end, out=bk_hat[:, :size])
    torch.mul(kc, to_end, out=bk_hat[:, size:])

    eye = torch.eye(size, dtype=rc.dtype, device=rc.device)
    inverse = torch.linalg.solve_triangular(
        eye - l_ab, eye.expand(pieces, size, size), upper=False, unitriangular=True
    )  # [P, C, C], (I - L^{ab})^{-1}
    l_ak_v = l_ak @ vc  # [P, C, d_v]
    uw = inverse @ torch.cat([l_ak_v, a_tilde], dim=-1)  # [P, C, d_v + d_k], [U | W]
    d_v = vc.shape[-1]
    u, w = uw[..., :d_v], uw[..., d_v:]  # [P, C, d_v], [P, C, d_k]
    uv = torch.cat([u, vc], dim=1)  # [P, 2C, d_v]
    y = q @ uv  # [P, C, d_v], intra-chunk part
    read = torch.baddbmm(r_tilde, q[:, :, :size], w)  # [P, C, d_k]
    transition = w.transpose(-1, -2) @ bk_hat[:, :size]  # [P, d_k, d_k]
    transition.diagonal(dim1=-2, dim2=-1).add_(g_last[:, 0].exp())

    states = rc.new_empty(chunks + 1, heads, d_v, d_k)  # [N+1, BH, d_v, d_k]
    states[0] = initial
    torch.bmm(uv.transpose(-1, -2), bk_hat, out=states[1:].view(pieces, d_v, d_k))  # F_n, the offsets
    state_scan_(states, transition.view(chunks, heads, d_k, d_k))  # S_{n+1} = S_n A_n + F_n
    starts = states[:-1].view(pieces, d_v, d_k)  # [P, d_v, d_k]
    y.baddbmm_(read, starts.transpose(-1, -2))
    saved = {
        "ac": ac, "rc": rc, "bc": bc, "kc": kc, "vc": vc, "g": g, "g_before": g_before, "g_last": g_last,
        "e_b": e_b, "left": left, "right": right, "blocks": blocks, "unsafe": unsafe, "limit": limit,
        "exp_before": exp_before, "exp_g": exp_g, "to_end": to_end,
        "bk_hat": bk_hat, "inverse": inverse, "uw": uw, "w": w, "uv": uv, "read": read,
        "transition": transition, "states": states,
    }
    return y, states[-1].clone(), saved


def _mask_blocks(blocks: Tensor, size: int) -> None:
    """In place: strictly lower L blocks (rows :C), lower Q blocks (rows C:) of [P, 2C, 2C]."""
    for rows, diagonal in ((slice(None, size), -1), (slice(size, None), 0)):
        blocks[:, rows, :size].tril_(diagonal)
        blocks[:, rows, size:].tril_(diagonal)


def _chunk_backward(
    saved: dict[str, Tensor | float], d_y: Tensor, d_final: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (d_r, d_λ, d_k, d_v, d_a, d_b [P, C, d], d_initial [BH, d_v, d_k]) of `_chunk_forward`."""
    sv = saved
    states, transition, inverse = sv["states"], sv["transition"], sv["inverse"]
    pieces, size, d_k = sv["rc"].shape
    heads = states.shape[1]
    chunks = states.shape[0] - 1
    d_v = sv["vc"].shape[-1]
    starts = states[:-1].view(pieces, d_v, d_k)  # [P, d_v, d_k]
    d_read = d_y @ starts  # [P, C, d_k]
    grads = torch.empty_like(states)  # [N+1, BH, d_v, d_k], dL/dS_n in total
    grads[chunks] = d_final
    torch.bmm(d_y.transpose(-1, -2), sv["read"], out=grads[:chunks].view(pieces, d_v, d_k))
    state_scan_(grads, transition.view(chunks, heads, d_k, d_k), reverse=True)  # G_n = dS_n + G_{n+1} A_nᵀ
    d_offset = grads[1:].view(pieces, d_v, d_k)  # [P, d_v, d_k], G_{n+1}
    d_transition = starts.transpose(-1, -2) @ d_offset  # [P, d_k, d_k]

    w, uv, bk_hat, q = sv["w"], sv["uv"], sv["bk_hat"], sv["blocks"][:, size:]
    d_w = bk_hat[:, :size] @ d_transition.transpose(-1, -2)  # [P, C, d_k]
    d_bk_hat = uv @ d_offset  # [P, 2C, d_k]
    d_bk_hat[:, :size] += w @ d_transition
    d_uv = torch.baddbmm(q.transpose(-1, -2) @ d_y, bk_hat, d_offset.transpose(-1, -2))  # [P, 2C, d_v]
    d_w += q[:, :, :size].transpose(-1, -2) @ d_read
    d_q = d_y @ uv.transpose(-1, -2)  # [P, C, 2C]
    d_q[:, :, :size] += d_read @ w.transpose(-1, -2)
    d_xa = inverse.transpose(-1, -2) @ torch.cat([d_uv[:, :size], d_w], dim=-1)  # [P, C, d_v + d_k]
    d_x, d_a_tilde = d_xa[..., :d_v], d_xa[..., d_v:]  # [P, C, d_v], [P, C, d_k]
    d_l_ab = d_xa @ sv["uw"].transpose(-1, -2)  # [P, C, C]
    d_l_ak = d_x @ sv["vc"].transpose(-1, -2)  # [P, C, C]
    d_blocks = torch.cat([torch.cat([d_l_ab, d_l_ak], dim=-1), d_q], dim=1)  # [P, 2C, 2C]
    d_value = torch.baddbmm(d_uv[:, size:], sv["blocks"][:, :size, size:].transpose(-1, -2), d_x)  # [P, C, d_v]
    _mask_blocks(d_blocks, size)

    unsafe = sv["unsafe"]
    exact_grads = None
    if unsafe.numel():
        with torch.enable_grad():
            names = ("ac", "rc", "bc", "kc", "g", "g_before")
            leaves = [sv[name][unsafe].detach().requires_grad_(True) for name in names]
            exact_grads = torch.autograd.grad(_fallback_blocks(*leaves, sv["limit"]), leaves, d_blocks[unsafe])
        d_blocks[unsafe] = 0.0
    left, right = sv["left"], sv["right"]
    d_left = d_blocks @ right  # [P, 2C, d_k], d[Ã; R̃] from the decay blocks
    d_right = d_blocks.transpose(-1, -2) @ left  # [P, 2C, d_k], d[b ⊙ e^{-g}; k ⊙ e^{-g}]
    d_left[:, :size] += d_a_tilde
    d_left[:, size:] += d_read

    to_end, e_b = sv["to_end"], sv["e_b"]
    d_a = d_left[:, :size] * sv["exp_before"]  # [P, C, d_k]
    d_r = d_left[:, size:] * sv["exp_g"]  # [P, C, d_k]
    d_b = torch.addcmul(d_bk_hat[:, :size] * to_end, d_right[:, :size], e_b)  # [P, C, d_k]
    d_key = torch.addcmul(d_bk_hat[:, size:] * to_end, d_right[:, size:], e_b)  # [P, C, d_k]

    from_left = d_left * left  # [P, 2C, d_k], dÃ ⊙ Ã and dR̃ ⊙ R̃
    from_right = (d_right[:, :size] * right[:, :size]).addcmul_(d_right[:, size:], right[:, size:])  # [P, C, d_k]
    from_hat = (d_bk_hat[:, :size] * bk_hat[:, :size]).addcmul_(d_bk_hat[:, size:], bk_hat[:, size:])  # [P, C, d_k]
    d_before = from_left[:, :size]  # [P, C, d_k], dL/d g_before
    d_g = from_left[:, size:] - from_right - from_hat  # [P, C, d_k]
    d_last = from_hat.sum(1) + d_transition.diagonal(dim1=-2, dim2=-1) * sv["g_last"][:, 0].exp()  # [P, d_k]
    if exact_grads is not None:
        for total, grad in zip((d_a, d_r, d_b, d_key, d_g, d_before), exact_grads, strict=True):
            total.index_add_(0, unsafe, grad)
    d_g[:, -1] += d_last
    d_g[:, :-1] += d_before[:, 1:]
    d_lam = d_g.flip(1).cumsum(1).flip(1)  # [P, C, d_k], g = cumsum(λ)
    return d_r, d_lam, d_key, d_value, d_a, d_b, grads[0]


class _ChunkedRWKV(torch.autograd.Function):
    """`_chunk_forward` with the hand-written `_chunk_backward` (first derivatives only).

    The saved tensors go through `save_for_backward`, so autograd frees them after a backward
    unless the graph is retained (a second backward, `gradcheck`) and checks that no saved
    input was modified in place since; only their names and the float `limit` live on ctx.
    """

    @staticmethod
    def forward(ctx, rc, lam, kc, vc, ac, bc, initial, chunks):
        y, final, saved = _chunk_forward(rc, lam, kc, vc, ac, bc, initial, chunks)
        ctx.limit = saved.pop("limit")
        ctx.names = tuple(saved)
        ctx.save_for_backward(*saved.values())
        return y, final

    @staticmethod
    @once_differentiable
    def backward(ctx, d_y, d_final):
        saved = dict(zip(ctx.names, ctx.saved_tensors, strict=True))
        saved["limit"] = ctx.limit
        if d_y is None:
            d_y = saved["vc"].new_zeros(saved["vc"].shape)
        if d_final is None:
            d_final = saved["states"].new_zeros(saved["states"].shape[1:])
        return *_chunk_backward(saved, d_y.contiguous(), d_final), None


def rwkv_product_chunked(
    r: Tensor,
    w_raw: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:
    """Outputs y [B, T, H, d_v] and the final state [B, H, d_v, d_k] by the chunked form.

    Arithmetic in `compute_dtype` (float32 for float16 / bfloat16 inputs: outputs and gradients
    are the float32 results rounded to the input dtype, so they agree with the float64 loop to
    about that dtype's resolution, ~4e-3 of the largest entry for bfloat16, ~5e-4 for float16).
    λ = log w is clamped at -`log_decay_floor` (see the module docstring). B = 0 gives empty
    outputs (and empty gradients).
    """
    batch, length, heads, d_k, d_v = check_inputs(r, w_raw, k, v, a, b, initial_state)
    check_chunk_size(chunk_size)
    dtype = r.dtype
    work = compute_dtype(dtype)
    r, w_raw, k, v, a, b = (x.to(work) for x in (r, w_raw, k, v, a, b))
    size = min(chunk_size, length)
    chunks = -(-length // size)
    pad = chunks * size - length

    def chunked(x: Tensor) -> Tensor:
        x = F.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x  # [B, N·C, H, d]
        x = x.reshape(batch, chunks, size, heads, x.shape[-1]).permute(1, 0, 3, 2, 4)  # [N, B, H, C, d]
        return x.reshape(chunks * batch * heads, size, x.shape[-1])  # [P, C, d], P = N·B·H

    state = r.new_zeros(batch, heads, d_v, d_k) if initial_state is None else initial_state.to(work)
    lam = -torch.exp(w_raw.clamp(max=math.log(log_decay_floor(work))))  # [B, T, H, d_k], -L ≤ λ ≤ 0
    y, final = _ChunkedRWKV.apply(
        chunked(r), chunked(lam), chunked(k), chunked(v), chunked(a), chunked(b),
        state.reshape(batch * heads, d_v, d_k), chunks,
    )  # [P, C, d_v], [B·H, d_v, d_k]
    y = y.view(chunks, batch, heads, size, d_v).permute(1, 0, 3, 2, 4).reshape(batch, chunks * size, heads, d_v)
    y, final = y[:, :length], final.view(batch, heads, d_v, d_k)  # [B, T, H, d_v], [B, H, d_v, d_k]
    return y.to(dtype), final.to(dtype)
