"""The chunked (WY / UT-transform) form of the RWKV-7 generalized delta rule.

Recurrence (see `naive.py`): S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_tᵀ + v_t k_tᵀ,
y_t = S_t r_t, with w_t = exp(-exp(w_raw_t)). Rows below are time steps of one chunk of C
steps, t, s ∈ {0, ..., C-1}; S_0 is the state entering the chunk.

Log-space decays. λ_t = log w_t = -exp(w_raw_t) ≤ 0 and g_t = Σ_{u ≤ t} λ_u (cumulative sum
within the chunk, g_{-1} = 0). Every decay the chunk needs is a RELATIVE decay
exp(g_t - g_s) with t ≥ s, an exponent ≤ 0, formed per pair (t, s) from the difference of
log sums and masked to -inf above the causal diagonal before exponentiating. Nothing of the
form exp(-g_s) (which overflows once the cumulative decay underflows) is ever built, so any
w_raw and any chunk size is safe; the price is C²·d_k elementwise work per chunk, the same
order as the chunk's matrix products. Chunks of 16 to 64 keep that memory moderate.

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

All chunks are transformed at once (batched matrix products); only S_{n+1} = S_n A_n + F_n
runs as a loop over the T / C chunks (over `unbind` slices, so its backward stays linear in
T). A ragged tail is padded with identity steps (λ = 0, a = b = k = v = r = 0), which leave
the state unchanged.

Backward: autograd through this formulation (triangular solve included). A hand-written
backward is not provided; gradients agree with autograd through the naive loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rcswarm.kernels.rwkv_product.checks import check_inputs

DEFAULT_CHUNK_SIZE = 16


def _pad_time(x: Tensor, pad: int) -> Tensor:
    """Zero-pad dim -2 (time) of [B, H, T, d] at the end by `pad` steps."""
    return F.pad(x, (0, 0, 0, pad)) if pad else x


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
    """Outputs y [B, T, H, d_v] and the final state [B, H, d_v, d_k] by the chunked form."""
    batch, length, heads, d_k, d_v = check_inputs(r, w_raw, k, v, a, b, initial_state)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r}: expected an int >= 1")
    size = min(chunk_size, length)
    chunks = -(-length // size)
    pad = chunks * size - length

    def chunked(x: Tensor) -> Tensor:
        x = _pad_time(x.transpose(1, 2), pad)  # [B, H, N*C, d]
        return x.reshape(batch, heads, chunks, size, x.shape[-1])  # [B, H, N, C, d]

    rc, kc, vc, ac, bc = (chunked(x) for x in (r, k, v, a, b))
    log_decay = chunked(-torch.exp(w_raw))  # [B, H, N, C, d_k], λ ≤ 0, padding λ = 0
    g = torch.cumsum(log_decay, dim=-2)  # [B, H, N, C, d_k]
    g_before = F.pad(g, (0, 0, 1, 0))  # [B, H, N, C+1, d_k], row t' = g_{t'-1}, g_{-1} = 0

    causal = torch.ones(size + 1, size, dtype=torch.bool, device=r.device).tril(-1)  # [C+1, C], s < t'
    exponent = g_before[..., :, None, :] - g[..., None, :, :]  # [B, H, N, C+1, C, d_k]
    relative = exponent.masked_fill(~causal[:, :, None], float("-inf")).exp()  # e^{g_{t'-1} - g_s}, s < t'
    decayed_b = relative * bc[..., None, :, :]  # [B, H, N, C+1, C, d_k]
    decayed_k = relative * kc[..., None, :, :]  # [B, H, N, C+1, C, d_k]
    l_ab = torch.einsum("...tsi,...ti->...ts", decayed_b[..., :-1, :, :], ac)  # [B, H, N, C, C]
    l_ak = torch.einsum("...tsi,...ti->...ts", decayed_k[..., :-1, :, :], ac)  # [B, H, N, C, C]
    q_rb = torch.einsum("...tsi,...ti->...ts", decayed_b[..., 1:, :, :], rc)  # [B, H, N, C, C]
    q_rk = torch.einsum("...tsi,...ti->...ts", decayed_k[..., 1:, :, :], rc)  # [B, H, N, C, C]

    a_tilde = ac * torch.exp(g_before[..., :-1, :])  # [B, H, N, C, d_k]
    r_tilde = rc * torch.exp(g)  # [B, H, N, C, d_k]
    g_last = g[..., -1:, :]  # [B, H, N, 1, d_k]
    to_end = torch.exp(g_last - g)  # [B, H, N, C, d_k]
    b_hat = bc * to_end  # [B, H, N, C, d_k]
    k_hat = kc * to_end  # [B, H, N, C, d_k]

    eye = torch.eye(size, dtype=r.dtype, device=r.device)
    rhs = torch.cat([l_ak @ vc, a_tilde], dim=-1)  # [B, H, N, C, d_v + d_k]
    solved = torch.linalg.solve_triangular(eye - l_ab, rhs, upper=False, unitriangular=True)
    u, w = solved[..., :d_v], solved[..., d_v:]  # [B, H, N, C, d_v], [B, H, N, C, d_k]

    y_intra = q_rb @ u + q_rk @ vc  # [B, H, N, C, d_v]
    read = r_tilde + q_rb @ w  # [B, H, N, C, d_k]
    transition = torch.diag_embed(torch.exp(g_last[..., 0, :])) + w.transpose(-1, -2) @ b_hat  # [B, H, N, d_k, d_k]
    offset = u.transpose(-1, -2) @ b_hat + vc.transpose(-1, -2) @ k_hat  # [B, H, N, d_v, d_k]

    state = r.new_zeros(batch, heads, d_v, d_k) if initial_state is None else initial_state
    entering = []
    # unbind, not transition[:, :, n]: each select's backward would write a zero gradient of the
    # whole [B, H, N, d_k, d_k] tensor, O(N²) work in backward; unbind's backward is one stack.
    for transition_n, offset_n in zip(transition.unbind(2), offset.unbind(2), strict=True):
        entering.append(state)
        state = state @ transition_n + offset_n  # [B, H, d_v, d_k]
    starts = torch.stack(entering, dim=2)  # [B, H, N, d_v, d_k]

    y = y_intra + read @ starts.transpose(-1, -2)  # [B, H, N, C, d_v]
    y = y.reshape(batch, heads, chunks * size, d_v)[:, :, :length]  # [B, H, T, d_v]
    return y.transpose(1, 2), state  # [B, T, H, d_v], [B, H, d_v, d_k]
