"""The definition of state-guided sparse attention (ChainGPT, Appendix D.2): the dense mask.

Query i attends to key j (0-based positions) when j ≤ i and

    i - j < W                (local window of W keys, the query's own position included)
    or  j mod G = G - 1      (periodic anchors, stride G)

out = softmax(scale · q kᵀ + M) v with M_ij = 0 where allowed and -inf elsewhere; query head h
uses key/value head h // (H_q / H_kv). Materializes the [T, T] mask: O(T²).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rcswarm.kernels.sgsa.checks import check_inputs


def sgsa_mask(length: int, window: int, anchor_stride: int, device: torch.device | None = None) -> Tensor:
    """The boolean [T, T] mask, True where query i (row) may attend to key j (column)."""
    position = torch.arange(length, device=device)
    distance = position[:, None] - position[None, :]  # [T, T], i - j
    causal = distance >= 0
    local = distance < window
    anchor = (position % anchor_stride == anchor_stride - 1)[None, :]  # [1, T]
    return causal & (local | anchor)


def sgsa_naive(
    q: Tensor, k: Tensor, v: Tensor, window: int, anchor_stride: int, scale: float | None = None
) -> Tensor:
    """Attention output [B, H_q, T, D_v] through the dense [T, T] mask."""
    _, q_heads, kv_heads, length, scale = check_inputs(q, k, v, window, anchor_stride, scale)
    group = q_heads // kv_heads
    keys = k.repeat_interleave(group, dim=1)  # [B, H_q, T, D]
    values = v.repeat_interleave(group, dim=1)  # [B, H_q, T, D_v]
    scores = scale * q @ keys.transpose(-1, -2)  # [B, H_q, T, T]
    mask = sgsa_mask(length, window, anchor_stride, q.device)  # [T, T]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values  # [B, H_q, T, D_v]
