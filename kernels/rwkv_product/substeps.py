"""M substeps per token by token expansion (ChainGPT, Appendix D.1).

Each token t runs M substeps j = 0, ..., M-1 of the recurrence of `naive.py`, with its own
k_{t,j}, v_{t,j}, a_{t,j}, b_{t,j}. The expansion interleaves them into one sequence of length
T·M (index t·M + j) so the single-step kernels run unchanged:

    r_{t,j} = r_t if j = M-1 else 0          (only the last substep is read)
    w_{t,j} = w_t if j = 0   else 1          (decay once per token; w_raw = -inf gives w = 1)

and only the last substep's output is kept (`collapse_substeps`). With M = 1 the expansion
is the identity.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rcswarm.kernels.rwkv_product.checks import describe


def expand_substeps(
    r: Tensor, w_raw: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Interleave substeps: r, w_raw [B, T, H, d_k]; k, a, b [B, T, M, H, d_k]; v [B, T, M, H, d_v].

    Returns (r, w_raw, k, v, a, b) of length T·M: [B, T·M, H, d] each.
    """
    for name, tensor in (("r", r), ("w_raw", w_raw)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 4:
            raise ValueError(f"{name}={describe(tensor)}: expected [B, T, H, d_k]")
    for name, tensor in (("k", k), ("v", v), ("a", a), ("b", b)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 5:
            raise ValueError(f"{name}={describe(tensor)}: expected [B, T, M, H, d]")
    batch, length, substeps, heads, d_k = k.shape
    if substeps < 1:
        raise ValueError(f"k={describe(k)}: expected M >= 1 substeps")
    for name, tensor in (("a", a), ("b", b)):
        if tensor.shape != k.shape:
            raise ValueError(f"{name}={describe(tensor)}: expected k's shape {list(k.shape)}")
    if v.shape[:4] != k.shape[:4]:
        raise ValueError(f"v={describe(v)}: expected [B, T, M, H] = {list(k.shape[:4])} then d_v")
    for name, tensor in (("r", r), ("w_raw", w_raw)):
        if tensor.shape != (batch, length, heads, d_k):
            raise ValueError(f"{name}={describe(tensor)}: expected [B, T, H, d_k] = {[batch, length, heads, d_k]}")

    def flat(x: Tensor) -> Tensor:
        return x.reshape(batch, length * substeps, heads, x.shape[-1])  # [B, T·M, H, d]

    if substeps == 1:
        return r, w_raw, flat(k), flat(v), flat(a), flat(b)
    rest = substeps - 1
    r_zeros = r.new_zeros(batch, length, rest, heads, d_k)
    r_expanded = torch.cat([r_zeros, r[:, :, None]], dim=2)  # [B, T, M, H, d_k]
    w_identity = w_raw.new_full((batch, length, rest, heads, d_k), float("-inf"))
    w_expanded = torch.cat([w_raw[:, :, None], w_identity], dim=2)  # [B, T, M, H, d_k]
    return flat(r_expanded), flat(w_expanded), flat(k), flat(v), flat(a), flat(b)


def collapse_substeps(y: Tensor, substeps: int) -> Tensor:
    """Keep each token's last substep output: [B, T·M, H, d_v] -> [B, T, H, d_v]."""
    if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
        raise ValueError(f"substeps={substeps!r}: expected an int >= 1")
    if y.dim() != 4 or y.shape[1] % substeps:
        raise ValueError(f"y={describe(y)}: expected [B, T·M, H, d_v] with T·M a multiple of M={substeps}")
    return y[:, substeps - 1 :: substeps]
