"""State-guided sparse attention in O(T·(W + T/G)): banded window blocks plus gathered anchors.

Same result as `naive.py` (query i sees key j ≤ i with i - j < W or j mod G = G - 1).

- Window part: queries in blocks of W; block n (positions [nW, nW + W)) scores against the
  2W keys [nW - W, nW + W) (key blocks n-1 and n, the sequence front-padded by W masked
  keys), masked to 0 ≤ i - j < W. Cost T·2W·D.
- Anchor part: the keys at j = G-1, 2G-1, ... gathered into a [T // G]-long tensor; query i
  scores against all of them, masked to i - j ≥ W (and so j ≤ i): an anchor that is also in
  the window is counted only by the window part. Cost T·(T/G)·D.
- Merge: lse = logsumexp over both parts' masked scores, out = Σ e^{s - lse} v over the
  window keys plus the same over the anchors. The window always holds key i itself, so lse
  is finite and rows without visible anchors get exactly zero anchor weight.

Grouped-query heads are handled by viewing q as [B, H_kv, H_q / H_kv, T, D] and broadcasting
k and v, no copies. Backward: autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rcswarm.kernels.sgsa.checks import check_inputs


def sgsa_sparse(
    q: Tensor, k: Tensor, v: Tensor, window: int, anchor_stride: int, scale: float | None = None
) -> Tensor:
    """Attention output [B, H_q, T, D_v] from window blocks and gathered anchors."""
    batch, q_heads, kv_heads, length, scale = check_inputs(q, k, v, window, anchor_stride, scale)
    group = q_heads // kv_heads
    dim, dim_v = q.shape[-1], v.shape[-1]
    width = min(window, length)
    blocks = -(-length // width)
    padded = blocks * width
    position = torch.arange(padded, device=q.device)

    qg = q.reshape(batch, kv_heads, group, length, dim)  # [B, H_kv, g, T, D]
    qb = F.pad(qg, (0, 0, 0, padded - length)).reshape(batch, kv_heads, group, blocks, width, dim)
    # qb: [B, H_kv, g, N, W, D]
    kp = F.pad(k, (0, 0, width, padded - length))  # [B, H_kv, W + N·W, D]
    vp = F.pad(v, (0, 0, width, padded - length))  # [B, H_kv, W + N·W, D_v]
    kb = kp.unfold(2, 2 * width, width).transpose(-1, -2)  # [B, H_kv, N, 2W, D]
    vb = vp.unfold(2, 2 * width, width).transpose(-1, -2)  # [B, H_kv, N, 2W, D_v]

    query_pos = position.reshape(blocks, width)  # [N, W]
    key_pos = query_pos[:, :1] - width + torch.arange(2 * width, device=q.device)  # [N, 2W]
    distance = query_pos[:, :, None] - key_pos[:, None, :]  # [N, W, 2W]
    local = (distance >= 0) & (distance < window) & (key_pos[:, None, :] >= 0)  # [N, W, 2W]
    local_scores = scale * torch.einsum("bhgnqd,bhnkd->bhgnqk", qb, kb)  # [B, H_kv, g, N, W, 2W]
    local_scores = local_scores.masked_fill(~local, float("-inf"))
    local_scores = local_scores.reshape(batch, kv_heads, group, padded, 2 * width)[..., :length, :]
    # local_scores: [B, H_kv, g, T, 2W]

    anchor_pos = torch.arange(length // anchor_stride, device=q.device) * anchor_stride + anchor_stride - 1  # [A]
    ka = k[:, :, anchor_pos]  # [B, H_kv, A, D]
    va = v[:, :, anchor_pos]  # [B, H_kv, A, D_v]
    far = (position[:length, None] - anchor_pos[None, :]) >= window  # [T, A]
    anchor_scores = scale * torch.einsum("bhgtd,bhad->bhgta", qg, ka)  # [B, H_kv, g, T, A]
    anchor_scores = anchor_scores.masked_fill(~far, float("-inf"))

    lse = torch.logsumexp(torch.cat([local_scores, anchor_scores], dim=-1), dim=-1, keepdim=True)
    local_weights = torch.exp(local_scores - lse)  # [B, H_kv, g, T, 2W]
    anchor_weights = torch.exp(anchor_scores - lse)  # [B, H_kv, g, T, A]
    local_weights = F.pad(local_weights, (0, 0, 0, padded - length)).reshape(
        batch, kv_heads, group, blocks, width, 2 * width
    )
    local_out = torch.einsum("bhgnqk,bhnkd->bhgnqd", local_weights, vb)  # [B, H_kv, g, N, W, D_v]
    local_out = local_out.reshape(batch, kv_heads, group, padded, dim_v)[..., :length, :]
    anchor_out = torch.einsum("bhgta,bhad->bhgtd", anchor_weights, va)  # [B, H_kv, g, T, D_v]
    return (local_out + anchor_out).reshape(batch, q_heads, length, dim_v)  # [B, H_q, T, D_v]
