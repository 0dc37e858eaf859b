"""The definition of the RWKV-7 generalized delta rule: the plain per-step loop.

Per batch and head, with state S ∈ R^{d_v × d_k} (S_0 = initial state, zeros by default):

    w_t = exp(-exp(w_raw_t))                                  (RWKV-7 decay, in (0, 1])
    S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_tᵀ + v_t k_tᵀ
    y_t = S_t r_t

This loop is the reference for the chunked path; autograd through it is the reference for
gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rcswarm.kernels.rwkv_product.checks import check_inputs


def rwkv_product_naive(
    r: Tensor,
    w_raw: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Outputs y [B, T, H, d_v] and the final state [B, H, d_v, d_k] by the per-step loop."""
    batch, _, heads, d_k, d_v = check_inputs(r, w_raw, k, v, a, b, initial_state)
    if initial_state is None:
        state = r.new_zeros(batch, heads, d_v, d_k)  # [B, H, d_v, d_k]
    else:
        state = initial_state
    decay = torch.exp(-torch.exp(w_raw))  # [B, T, H, d_k]
    outputs = []
    # Per-step slices by unbind (x[:, t] would make each step's backward write a zero gradient
    # of the whole [B, T, H, d] input: O(T²) work); unbind's backward is one stack.
    steps = zip(*(x.unbind(1) for x in (r, decay, k, v, a, b)), strict=True)
    for r_t, decay_t, k_t, v_t, a_t, b_t in steps:
        sa = torch.einsum("bhvk,bhk->bhv", state, a_t)  # [B, H, d_v]
        state = (
            state * decay_t[:, :, None, :]
            + sa[..., :, None] * b_t[:, :, None, :]
            + v_t[:, :, :, None] * k_t[:, :, None, :]
        )  # [B, H, d_v, d_k]
        outputs.append(torch.einsum("bhvk,bhk->bhv", state, r_t))  # [B, H, d_v]
    return torch.stack(outputs, dim=1), state  # [B, T, H, d_v], [B, H, d_v, d_k]
