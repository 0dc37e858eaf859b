"""State-guided sparse attention in O(T·(W + T/G)) on the CPU: query blocks scored against
exactly their window's key blocks and the anchors before the window; hand-written backward.

Same result as `naive.py` (query i sees key j ≤ i with i - j < W or j mod G = G - 1).

Window. Queries are cut into blocks of b positions (`block_size`: a power of two in [16, 64],
about W/8). Block n (queries [nb, nb + b)) reaches back W - 1 positions, so its window keys lie
in the r + 1 key blocks n - r .. n, r = ⌈(W - 1)/b⌉. `unfold` of the keys, front-padded with
r·b zeros, is a strided view giving every block its L = (r + 1)·b keys without a copy, and the
g = H_q / H_kv query heads of a key/value head share them, so one batched matmul scores a
[g·b, L] tile per block. Past the first r blocks each row masks L - W of its L scored keys
(between b - 1 and 2b - 2; 64 of 576 for W = 512, b = 64).

Anchors. Anchor m sits at a_m = mG + G - 1. The anchor part scores query i only against the
anchors with i - a_m ≥ W; an anchor closer than that lies in the window and is counted there,
so the two parts are disjoint. Blocks are processed in chunks (queries [c0, c1)); the chunk's
rows are scored against the anchors a ≤ c1 - 1 - W only, those above c0 - W masked per query.
That is (T - W)²/(2G) pairs plus (c1 - c0)/G per row, not T·T/G.

Merge. Window tile and anchor scores are written side by side into one [g·b, L + A] buffer per
block (the matmuls write into its column slices), so one softmax normalizes both parts.
Only the columns that some row cannot see are masked: both ends of a tile (the first 64 and last
63 of 576 for W = 512), the anchors above c0 - W, and the whole tile in the first r blocks.

Backward. The scores and softmax p are recomputed per chunk; with Δ_i = Σ dO_i·O_i (saved out),
dS = p ⊙ (dO vᵀ - Δ), dq = scale·dS k, dk = scale·dSᵀ q, dv = pᵀ dO (the softmax gradient, as
in FlashAttention, Dao et al. 2022). A block's key tile overlaps the next r tiles, so dk and dv
of the window part are summed into key blocks by r + 1 shifted adds. Memory beyond inputs,
output and gradients: a few buffers of one chunk's scores (`CHUNK_ELEMENTS`). The backward is
`once_differentiable`: first derivatives only, a double backward raises autograd's error.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from rcswarm.kernels.sgsa.checks import check_inputs

CHUNK_ELEMENTS = 1 << 20
"""Target number of scores per chunk and key/value head (window tiles plus anchors)."""


def block_size(window: int) -> int:
    """Query block length b for a window of W keys: W/8 rounded down to a power of two, in [16, 64]."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: expected an int >= 1")
    size = 16
    while size * 2 <= min(64, window // 8):
        size *= 2
    return size


class _Plan:
    """Sizes, masks and layout helpers shared by the forward and backward of one call."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, window: int, anchor_stride: int) -> None:
        self.batch, self.q_heads, self.length, self.dim = q.shape
        self.kv_heads = k.shape[1]
        self.group = self.q_heads // self.kv_heads
        self.dim_v = v.shape[-1]
        self.window = min(window, self.length)
        self.stride = anchor_stride
        self.block = block_size(self.window)
        self.reach = -(-(self.window - 1) // self.block)  # r
        self.keys = (self.reach + 1) * self.block  # L
        self.blocks = -(-self.length // self.block)  # N
        self.padded = self.blocks * self.block
        self.front = self.reach * self.block
        self.anchors = max(0, (self.length - self.window) // anchor_stride)  # a ≤ T - 1 - W
        self.rows = self.group * self.block  # g·b
        per_block = self.rows * (self.keys + self.anchors)
        self.chunk = max(1, min(self.blocks, CHUNK_ELEMENTS // per_block))
        device = q.device
        row = torch.arange(self.block, device=device)[:, None]
        self.column = torch.arange(self.keys, device=device)[None, :]
        distance = row - self.column + self.front  # [b, L]: i - j inside any block
        self.window_mask = (distance >= 0) & (distance < self.window)  # [b, L]
        # The columns every row sees form one range (front - W + b, front]; only the others get masked.
        full = self.window_mask.all(0).nonzero()
        if len(full):
            lo, hi = int(full[0]), int(full[-1]) + 1
            self.masked_ranges = [(start, end) for start, end in ((0, lo), (hi, self.keys)) if end > start]
        else:
            self.masked_ranges = [(0, self.keys)]

    def chunks(self) -> list[tuple[int, int]]:
        return [(n0, min(n0 + self.chunk, self.blocks)) for n0 in range(0, self.blocks, self.chunk)]

    def chunk_anchors(self, n0: int, n1: int) -> tuple[int, int, Tensor | None]:
        """(A0, A1, mask): the chunk's rows score anchors < A1; those ≥ A0 by the mask [Nc, 1, b, A1 - A0]."""
        c0, c1 = n0 * self.block, min(n1 * self.block, self.length)
        total = min(self.anchors, max(0, (c1 - self.window) // self.stride))
        shared = min(total, max(0, (c0 - self.window + 1) // self.stride))
        if total == shared:
            return shared, total, None
        device = self.column.device
        query = torch.arange(c0, n1 * self.block, device=device).reshape(n1 - n0, 1, self.block, 1)
        anchor = torch.arange(shared, total, device=device) * self.stride + self.stride - 1  # [A1 - A0]
        return shared, total, query - anchor >= self.window

    def mask_scores(self, scores: Tensor, n0: int, n1: int, shared: int, anchor_mask: Tensor | None) -> None:
        """Set -inf where a row of scores [Nc, g·b, L + A1] of blocks n0..n1 may not look."""
        tiles = scores.view(n1 - n0, self.group, self.block, scores.shape[-1])
        if n0 < self.reach:
            first_key = (torch.arange(n0, n1, device=scores.device) * self.block)[:, None, None, None]
            mask = self.window_mask & (first_key + self.column >= self.front)  # [Nc, 1, b, L]
            tiles[..., : self.keys].masked_fill_(~mask, float("-inf"))
        else:
            for start, end in self.masked_ranges:
                tiles[..., start:end].masked_fill_(~self.window_mask[:, start:end], float("-inf"))
        if anchor_mask is not None:
            tiles[..., self.keys + shared :].masked_fill_(~anchor_mask, float("-inf"))

    def blocked_queries(self, x: Tensor) -> Tensor:
        """[B, H_q, T, E] -> [B, H_kv, N, g·b, E] (zero rows past T), a contiguous copy."""
        x = x.reshape(self.batch, self.kv_heads, self.group, self.length, x.shape[-1])
        x = F.pad(x, (0, 0, 0, self.padded - self.length))
        x = x.reshape(self.batch, self.kv_heads, self.group, self.blocks, self.block, x.shape[-1])
        x = x.permute(0, 1, 3, 2, 4, 5).contiguous()  # [B, H_kv, N, g, b, E]
        return x.reshape(self.batch, self.kv_heads, self.blocks, self.rows, x.shape[-1])

    def unblocked_queries(self, x: Tensor) -> Tensor:
        """Inverse of `blocked_queries`: [B, H_kv, N, g·b, E] -> [B, H_q, T, E]."""
        width = x.shape[-1]
        x = x.reshape(self.batch, self.kv_heads, self.blocks, self.group, self.block, width)
        x = x.permute(0, 1, 3, 2, 4, 5).reshape(self.batch, self.kv_heads, self.group, self.padded, width)
        return x[..., : self.length, :].reshape(self.batch, self.q_heads, self.length, width)

    def key_tiles(self, x: Tensor) -> Tensor:
        """[B, H_kv, T, E] -> overlapping tiles [B, H_kv, N, E, L] of the zero-padded keys (a view of one pad)."""
        return F.pad(x, (0, 0, self.front, self.padded - self.length)).unfold(2, self.keys, self.block)

    def anchor_rows(self, x: Tensor) -> Tensor:
        """[B, H_kv, T, E] -> the anchors' rows [B, H_kv, A, E] (a view)."""
        return x[:, :, self.stride - 1 :: self.stride][:, :, : self.anchors]

    def add_tiles(self, target: Tensor, tiles: Tensor, n0: int) -> None:
        """target [r + N, b, E] += the overlapping key tiles [Nc, L, E] of blocks n0.."""
        count = tiles.shape[0]
        tiles = tiles.view(count, self.reach + 1, self.block, tiles.shape[-1])
        for offset in range(self.reach + 1):
            target[n0 + offset : n0 + offset + count] += tiles[:, offset]


def _probabilities(
    plan: _Plan, qc: Tensor, key_tiles: Tensor, anchor_keys: Tensor, n0: int, n1: int
) -> tuple[Tensor, int]:
    """softmax over the masked scores [Nc, g·b, L + A1] of blocks n0..n1 (one key/value head), and A1.

    qc [Nc, g·b, D]; key_tiles [N, D, L]; anchor_keys [A, D]."""
    shared, total, anchor_mask = plan.chunk_anchors(n0, n1)
    count = n1 - n0
    scores = torch.empty(count, plan.rows, plan.keys + total, dtype=qc.dtype, device=qc.device)
    torch.bmm(qc, key_tiles[n0:n1], out=scores[:, :, : plan.keys])
    if total:
        flat = scores.view(count * plan.rows, plan.keys + total)
        torch.mm(qc.reshape(-1, plan.dim), anchor_keys[:total].t(), out=flat[:, plan.keys :])
    plan.mask_scores(scores, n0, n1, shared, anchor_mask)
    return torch.softmax(scores, dim=-1), total


class _BlockedAttention(torch.autograd.Function):
    """The blocked forward with the hand-written backward of the module docstring.

    First derivatives only: the backward is `once_differentiable`, so a double backward (a
    gradient penalty's `.backward()` through the first gradients) raises autograd's "trying to
    differentiate twice a function that was marked with @once_differentiable" instead of
    failing inside a `bmm(out=...)` of the backward.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int, anchor_stride: int, scale: float) -> Tensor:
        plan = _Plan(q, k, v, window, anchor_stride)
        qb = plan.blocked_queries(q * scale)  # [B, H_kv, N, g·b, D]
        key_tiles = plan.key_tiles(k)  # [B, H_kv, N, D, L]
        value_tiles = plan.key_tiles(v).transpose(-1, -2)  # [B, H_kv, N, L, D_v]
        anchor_keys, anchor_values = plan.anchor_rows(k), plan.anchor_rows(v)  # [B, H_kv, A, D or D_v]
        out = torch.empty(*qb.shape[:-1], plan.dim_v, dtype=q.dtype, device=q.device)  # [B, H_kv, N, g·b, D_v]
        for b in range(plan.batch):
            for h in range(plan.kv_heads):
                for n0, n1 in plan.chunks():
                    p, total = _probabilities(plan, qb[b, h, n0:n1], key_tiles[b, h], anchor_keys[b, h], n0, n1)
                    chunk_out = out[b, h, n0:n1]  # [Nc, g·b, D_v]
                    torch.bmm(p[:, :, : plan.keys], value_tiles[b, h, n0:n1], out=chunk_out)
                    if total:
                        flat = p.view(-1, plan.keys + total)[:, plan.keys :]
                        chunk_out.view(-1, plan.dim_v).addmm_(flat, anchor_values[b, h, :total])
        ctx.save_for_backward(q, k, v, out)
        ctx.plan_args = (window, anchor_stride, scale)
        return plan.unblocked_queries(out)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        q, k, v, out = ctx.saved_tensors
        window, anchor_stride, scale = ctx.plan_args
        plan = _Plan(q, k, v, window, anchor_stride)
        keys = plan.keys
        qb = plan.blocked_queries(q * scale)  # [B, H_kv, N, g·b, D]
        grad_b = plan.blocked_queries(grad_out)  # [B, H_kv, N, g·b, D_v], zero rows past T
        delta = (grad_b * out).sum(-1, keepdim=True)  # [B, H_kv, N, g·b, 1]
        key_tiles = plan.key_tiles(k)  # [B, H_kv, N, D, L]
        value_tiles = plan.key_tiles(v)  # [B, H_kv, N, D_v, L]
        anchor_keys, anchor_values = plan.anchor_rows(k), plan.anchor_rows(v)  # [B, H_kv, A, D or D_v]
        grad_q = torch.empty_like(qb)  # [B, H_kv, N, g·b, D]
        options = {"dtype": q.dtype, "device": q.device}
        span = plan.reach + plan.blocks
        grad_k = torch.zeros(plan.batch, plan.kv_heads, span, plan.block, plan.dim, **options)  # [B, H_kv, r + N, b, D]
        grad_v = torch.zeros(plan.batch, plan.kv_heads, span, plan.block, plan.dim_v, **options)
        grad_anchor_k = torch.zeros(plan.batch, plan.kv_heads, plan.anchors, plan.dim, **options)  # [B, H_kv, A, D]
        grad_anchor_v = torch.zeros(plan.batch, plan.kv_heads, plan.anchors, plan.dim_v, **options)
        for b in range(plan.batch):
            for h in range(plan.kv_heads):
                for n0, n1 in plan.chunks():
                    qc, gc = qb[b, h, n0:n1], grad_b[b, h, n0:n1]  # [Nc, g·b, D], [Nc, g·b, D_v]
                    p, total = _probabilities(plan, qc, key_tiles[b, h], anchor_keys[b, h], n0, n1)
                    columns = keys + total
                    p_flat, q_flat, g_flat = p.view(-1, columns), qc.reshape(-1, plan.dim), gc.reshape(-1, plan.dim_v)
                    plan.add_tiles(grad_v[b, h], torch.bmm(p[:, :, :keys].transpose(1, 2), gc), n0)
                    dscore = torch.empty_like(p)  # [Nc, g·b, L + A1]
                    torch.bmm(gc, value_tiles[b, h, n0:n1], out=dscore[:, :, :keys])
                    if total:
                        torch.mm(g_flat, anchor_values[b, h, :total].t(), out=dscore.view(-1, columns)[:, keys:])
                        grad_anchor_v[b, h, :total].addmm_(p_flat[:, keys:].t(), g_flat)
                    dscore.sub_(delta[b, h, n0:n1]).mul_(p)
                    chunk_grad_q = grad_q[b, h, n0:n1]  # [Nc, g·b, D]
                    torch.bmm(dscore[:, :, :keys], key_tiles[b, h, n0:n1].transpose(1, 2), out=chunk_grad_q)
                    plan.add_tiles(grad_k[b, h], torch.bmm(dscore[:, :, :keys].transpose(1, 2), qc), n0)
                    if total:
                        d_flat = dscore.view(-1, columns)[:, keys:]
                        chunk_grad_q.view(-1, plan.dim).addmm_(d_flat, anchor_keys[b, h, :total])
                        grad_anchor_k[b, h, :total].addmm_(d_flat.t(), q_flat)
        rows = span * plan.block  # r·b + N·b key positions (named, not -1: B = 0 leaves no elements to infer it)
        grad_k = grad_k.view(plan.batch, plan.kv_heads, rows, plan.dim)[:, :, plan.front : plan.front + plan.length]
        grad_v = grad_v.view(plan.batch, plan.kv_heads, rows, plan.dim_v)[:, :, plan.front : plan.front + plan.length]
        plan.anchor_rows(grad_k).add_(grad_anchor_k)
        plan.anchor_rows(grad_v).add_(grad_anchor_v)
        return plan.unblocked_queries(grad_q) * scale, grad_k, grad_v, None, None, None


def sgsa_sparse(
    q: Tensor, k: Tensor, v: Tensor, window: int, anchor_stride: int, scale: float | None = None
) -> Tensor:
    """Attention output [B, H_q, T, D_v] from exact window tiles and the anchors before each window."""
    _, _, _, _, scale = check_inputs(q, k, v, window, anchor_stride, scale)
    return _BlockedAttention.apply(q, k, v, window, anchor_stride, scale)
