"""State-guided sparse attention as Triton kernels (flash-attention style), forward and backward.

Same result as `naive.py` (query i sees key j ≤ i with i - j < W or j mod G = G - 1), for CUDA
tensors; the kernels also run in Triton's interpreter (`TRITON_INTERPRET=1`, set before triton
is imported) on CPU tensors, which is how the tests check them.

The host multiplies q by the scale once, so the kernels score s = q kᵀ. Only key blocks that
hold visible keys are visited. A program owns BLOCK_M queries [m0, m0 + BLOCK_M) of one query
head and reads the key/value head h // (H_q / H_kv):

- anchors: the keys a_m = mG + G - 1 gathered on the host into a [B, H_kv, A, D] tensor
  (A = ⌊(T - W)/G⌋, the anchors some query sees outside its window); the program walks the
  first ⌊(m0 + BLOCK_M - W)/G⌋ of them in blocks of BLOCK_N with the mask i - a ≥ W;
- window: the key blocks covering [m0 - W + 1, m0 + BLOCK_M), mask 0 ≤ i - j < W.

The two masks are disjoint, so an anchor inside the window is counted once. Scores are merged
by the online softmax of FlashAttention (Dao et al., 2022): running max m, running sum l,
rescaled accumulator; the forward stores out and lse = m + log l per query.

Backward (Δ_i = Σ dO_i · O_i on the host, p = exp(s - lse), dS = p ⊙ (dO vᵀ - Δ)):
- `_dq_kernel`: per query block, the forward's walk, Σ dS k (the host multiplies by the scale);
- `_dkdv_kernel` with ANCHORS false: per key block and key/value head, the query blocks
  [n0, n0 + BLOCK_N + W - 1) of every query head of the group, dv = Σ pᵀ dO, dk = Σ dSᵀ (scale·q);
- `_dkdv_kernel` with ANCHORS true: per block of gathered anchors and range of `anchor_split`
  queries, the queries i ≥ a + W, same sums; the host adds the ranges' partial sums into dk
  and dv at the anchor positions (a fixed order: deterministic, no atomics).

Accumulation is in float32 (float64 for float64 inputs); float32 products use IEEE precision
(no TF32), so float32 results match the dense definition to about 1e-6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from rcswarm.kernels.sgsa.checks import check_inputs
from rcswarm.kernels.sgsa.sparse import sgsa_sparse
from rcswarm.kernels.triton_probe import on_tensor_device


@triton.jit
def _fwd_kernel(
    Q, K, V, KA, VA, O, LSE,
    length, anchors, window, stride_g, group, q_heads,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    ska_b, ska_h, ska_t, sva_b, sva_h, sva_t, so_b, so_h, so_t, sl_b, sl_h,
    DIM: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // q_heads).to(tl.int64)  # 64-bit offsets: B·H·T·D may pass 2³¹
    head = (pid_bh % q_heads).to(tl.int64)
    kv_head = head // group
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    row_valid = offs_m < length
    q = tl.load(
        Q + batch * sq_b + head * sq_h + offs_m[:, None] * sq_t + offs_d[None, :],
        mask=row_valid[:, None] & (offs_d[None, :] < DIM), other=0.0,
    )
    high = tl.full([BLOCK_M], float("-inf"), ACC)
    total = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], ACC)
    last = tl.minimum(m0 + BLOCK_M, length) - 1
    anchor_count = tl.minimum(tl.maximum(last - window + 1, 0) // stride_g, anchors)
    for start in range(0, anchor_count, BLOCK_N):
        index = start + offs_n
        valid = index < anchor_count
        keys = tl.load(
            KA + batch * ska_b + kv_head * ska_h + index[None, :] * ska_t + offs_d[:, None],
            mask=valid[None, :] & (offs_d[:, None] < DIM), other=0.0,
        )
        s = tl.dot(q, keys, input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        position = index * stride_g + stride_g - 1
        visible = (offs_m[:, None] - position[None, :] >= window) & valid[None, :]
        s = tl.where(visible, s, float("-inf"))
        new_high = tl.maximum(high, tl.max(s, 1))
        safe = tl.where(new_high == float("-inf"), 0.0, new_high)
        p = tl.exp(s - safe[:, None])
        alpha = tl.exp(high - safe)
        total = total * alpha + tl.sum(p, 1)
        values = tl.load(
            VA + batch * sva_b + kv_head * sva_h + index[:, None] * sva_t + offs_dv[None, :],
            mask=valid[:, None] & (offs_dv[None, :] < DIM_V), other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
        high = new_high
    first = tl.maximum(m0 - window + 1, 0) // BLOCK_N * BLOCK_N
    for start in range(first, last + 1, BLOCK_N):
        key_index = start + offs_n
        valid = key_index < length
        keys = tl.load(
            K + batch * sk_b + kv_head * sk_h + key_index[None, :] * sk_t + offs_d[:, None],
            mask=valid[None, :] & (offs_d[:, None] < DIM), other=0.0,
        )
        s = tl.dot(q, keys, input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        distance = offs_m[:, None] - key_index[None, :]
        visible = (distance >= 0) & (distance < window) & valid[None, :]
        s = tl.where(visible, s, float("-inf"))
        new_high = tl.maximum(high, tl.max(s, 1))
        safe = tl.where(new_high == float("-inf"), 0.0, new_high)
        p = tl.exp(s - safe[:, None])
        alpha = tl.exp(high - safe)
        total = total * alpha + tl.sum(p, 1)
        values = tl.load(
            V + batch * sv_b + kv_head * sv_h + key_index[:, None] * sv_t + offs_dv[None, :],
            mask=valid[:, None] & (offs_dv[None, :] < DIM_V), other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
        high = new_high
    safe_total = tl.where(total > 0, total, 1.0)
    out = acc / safe_total[:, None]
    tl.store(
        O + batch * so_b + head * so_h + offs_m[:, None] * so_t + offs_dv[None, :],
        out.to(O.dtype.element_ty), mask=row_valid[:, None] & (offs_dv[None, :] < DIM_V),
    )
    tl.store(LSE + batch * sl_b + head * sl_h + offs_m, high + tl.log(safe_total), mask=row_valid)


@triton.jit
def _dq_kernel(
    Q, K, V, KA, VA, DO, LSE, DELTA, DQ,
    length, anchors, window, stride_g, group, q_heads,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    ska_b, ska_h, ska_t, sva_b, sva_h, sva_t, sdo_b, sdo_h, sdo_t, sl_b, sl_h,
    DIM: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // q_heads).to(tl.int64)  # 64-bit offsets: B·H·T·D may pass 2³¹
    head = (pid_bh % q_heads).to(tl.int64)
    kv_head = head // group
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    row_valid = offs_m < length
    q = tl.load(
        Q + batch * sq_b + head * sq_h + offs_m[:, None] * sq_t + offs_d[None, :],
        mask=row_valid[:, None] & (offs_d[None, :] < DIM), other=0.0,
    )
    grad = tl.load(
        DO + batch * sdo_b + head * sdo_h + offs_m[:, None] * sdo_t + offs_dv[None, :],
        mask=row_valid[:, None] & (offs_dv[None, :] < DIM_V), other=0.0,
    )
    lse = tl.load(LSE + batch * sl_b + head * sl_h + offs_m, mask=row_valid, other=0.0)
    delta = tl.load(DELTA + batch * sl_b + head * sl_h + offs_m, mask=row_valid, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    last = tl.minimum(m0 + BLOCK_M, length) - 1
    anchor_count = tl.minimum(tl.maximum(last - window + 1, 0) // stride_g, anchors)
    for start in range(0, anchor_count, BLOCK_N):
        index = start + offs_n
        valid = index < anchor_count
        keys = tl.load(
            KA + batch * ska_b + kv_head * ska_h + index[:, None] * ska_t + offs_d[None, :],
            mask=valid[:, None] & (offs_d[None, :] < DIM), other=0.0,
        )
        s = tl.dot(q, tl.trans(keys), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        position = index * stride_g + stride_g - 1
        visible = (offs_m[:, None] - position[None, :] >= window) & valid[None, :] & row_valid[:, None]
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        values = tl.load(
            VA + batch * sva_b + kv_head * sva_h + index[None, :] * sva_t + offs_dv[:, None],
            mask=valid[None, :] & (offs_dv[:, None] < DIM_V), other=0.0,
        )
        dp = tl.dot(grad, values, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(keys.dtype), keys, input_precision=PRECISION)
    first = tl.maximum(m0 - window + 1, 0) // BLOCK_N * BLOCK_N
    for start in range(first, last + 1, BLOCK_N):
        key_index = start + offs_n
        valid = key_index < length
        keys = tl.load(
            K + batch * sk_b + kv_head * sk_h + key_index[:, None] * sk_t + offs_d[None, :],
            mask=valid[:, None] & (offs_d[None, :] < DIM), other=0.0,
        )
        s = tl.dot(q, tl.trans(keys), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        distance = offs_m[:, None] - key_index[None, :]
        visible = (distance >= 0) & (distance < window) & valid[None, :] & row_valid[:, None]
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        values = tl.load(
            V + batch * sv_b + kv_head * sv_h + key_index[None, :] * sv_t + offs_dv[:, None],
            mask=valid[None, :] & (offs_dv[:, None] < DIM_V), other=0.0,
        )
        dp = tl.dot(grad, values, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(keys.dtype), keys, input_precision=PRECISION)
    tl.store(
        DQ + batch * sq_b + head * sq_h + offs_m[:, None] * sq_t + offs_d[None, :],
        dq.to(DQ.dtype.element_ty), mask=row_valid[:, None] & (offs_d[None, :] < DIM),
    )


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    length, key_count, window, stride_g, group, q_heads, kv_heads, span, ANCHORS: tl.constexpr,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sdo_b, sdo_h, sdo_t, sl_b, sl_h,
    sdk_s, sdk_b, sdk_h, sdk_t, sdv_s, sdv_b, sdv_h, sdv_t,
    DIM: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    """dk, dv of a block of keys: window keys (ANCHORS false, K/V the full [B, H_kv, T, ·] tensors)
    or gathered anchors (ANCHORS true, K/V the [B, H_kv, A, ·] anchor rows, key_count = A), summed
    over the queries [s·span, (s + 1)·span) of split s = program_id(2) into DK[s], DV[s]."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    batch = (pid_bh // kv_heads).to(tl.int64)  # 64-bit offsets: B·H·T·D may pass 2³¹
    kv_head = (pid_bh % kv_heads).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_m = tl.arange(0, BLOCK_M)
    key_valid = offs_n < key_count
    keys = tl.load(
        K + batch * sk_b + kv_head * sk_h + offs_n[:, None] * sk_t + offs_d[None, :],
        mask=key_valid[:, None] & (offs_d[None, :] < DIM), other=0.0,
    )
    values = tl.load(
        V + batch * sv_b + kv_head * sv_h + offs_n[:, None] * sv_t + offs_dv[None, :],
        mask=key_valid[:, None] & (offs_dv[None, :] < DIM_V), other=0.0,
    )
    if ANCHORS:
        position = offs_n * stride_g + stride_g - 1
        first = (pid_n * BLOCK_N * stride_g + stride_g - 1 + window) // BLOCK_M * BLOCK_M
        end = length
    else:
        position = offs_n
        first = pid_n * BLOCK_N // BLOCK_M * BLOCK_M
        end = tl.minimum(pid_n * BLOCK_N + BLOCK_N - 1 + window, length)
    first = tl.maximum(first, pid_s * span)
    end = tl.minimum(end, pid_s * span + span)
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], ACC)
    for member in range(group):
        head = kv_head * group + member
        for start in range(first, end, BLOCK_M):
            query_index = start + offs_m
            row_valid = query_index < length
            q = tl.load(
                Q + batch * sq_b + head * sq_h + query_index[:, None] * sq_t + offs_d[None, :],
                mask=row_valid[:, None] & (offs_d[None, :] < DIM), other=0.0,
            )
            grad = tl.load(
                DO + batch * sdo_b + head * sdo_h + query_index[:, None] * sdo_t + offs_dv[None, :],
                mask=row_valid[:, None] & (offs_dv[None, :] < DIM_V), other=0.0,
            )
            lse = tl.load(LSE + batch * sl_b + head * sl_h + query_index, mask=row_valid, other=0.0)
            delta = tl.load(DELTA + batch * sl_b + head * sl_h + query_index, mask=row_valid, other=0.0)
            s = tl.dot(keys, tl.trans(q), input_precision=PRECISION)  # [BLOCK_N, BLOCK_M]
            distance = query_index[None, :] - position[:, None]
            if ANCHORS:
                visible = distance >= window
            else:
                visible = (distance >= 0) & (distance < window)
            visible = visible & key_valid[:, None] & row_valid[None, :]
            p = tl.where(visible, tl.exp(s - lse[None, :]), 0.0)
            dv += tl.dot(p.to(grad.dtype), grad, input_precision=PRECISION)
            dp = tl.dot(values, tl.trans(grad), input_precision=PRECISION)  # [BLOCK_N, BLOCK_M]
            ds = p * (dp - delta[None, :])
            dk += tl.dot(ds.to(q.dtype), q, input_precision=PRECISION)
    tl.store(
        DK + pid_s * sdk_s + batch * sdk_b + kv_head * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :],
        dk.to(DK.dtype.element_ty), mask=key_valid[:, None] & (offs_d[None, :] < DIM),
    )
    tl.store(
        DV + pid_s * sdv_s + batch * sdv_b + kv_head * sdv_h + offs_n[:, None] * sdv_t + offs_dv[None, :],
        dv.to(DV.dtype.element_ty), mask=key_valid[:, None] & (offs_dv[None, :] < DIM_V),
    )


def _padded_width(size: int) -> int:
    return max(16, triton.next_power_of_2(size))


def _constants(q: Tensor, v: Tensor, block_m: int, block_n: int) -> dict[str, object]:
    wide = q.dtype == torch.float64
    return {
        "DIM": q.shape[-1],
        "DIM_V": v.shape[-1],
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_D": _padded_width(q.shape[-1]),
        "BLOCK_DV": _padded_width(v.shape[-1]),
        "ACC": tl.float64 if wide else tl.float32,
        "PRECISION": "ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
    }


def _anchor_count(length: int, window: int, anchor_stride: int) -> int:
    """Anchors seen outside some query's window: a = mG + G - 1 ≤ T - 1 - W."""
    return max(0, (length - window) // anchor_stride)


def _anchor_rows(x: Tensor, anchor_stride: int, anchors: int) -> Tensor:
    """[B, H_kv, T, E] -> the rows of the first `anchors` anchors [B, H_kv, A, E] (a view)."""
    return x[:, :, anchor_stride - 1 :: anchor_stride][:, :, :anchors]


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    @on_tensor_device
    def forward(
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        window: int,
        anchor_stride: int,
        scale: float,
        block_m: int,
        block_n: int,
        anchor_split: int,
    ) -> Tensor:
        scaled = (q * scale).contiguous()  # [B, H_q, T, D]; the kernels take the scale in q
        k, v = k.contiguous(), v.contiguous()
        batch, q_heads, length, _ = q.shape
        kv_heads = k.shape[1]
        window = min(window, length)
        anchors = _anchor_count(length, window, anchor_stride)
        # Gathered anchors [B, H_kv, A, D or D_v]; with none, k and v stand in and are never read.
        anchor_keys = _anchor_rows(k, anchor_stride, anchors).contiguous() if anchors else k
        anchor_values = _anchor_rows(v, anchor_stride, anchors).contiguous() if anchors else v
        out = torch.empty(batch, q_heads, length, v.shape[-1], dtype=q.dtype, device=q.device)  # [B, H_q, T, D_v]
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        lse = torch.empty(batch, q_heads, length, dtype=lse_dtype, device=q.device)  # [B, H_q, T]
        _fwd_kernel[(triton.cdiv(length, block_m), batch * q_heads)](
            scaled, k, v, anchor_keys, anchor_values, out, lse,
            length, anchors, window, anchor_stride, q_heads // kv_heads, q_heads,
            *scaled.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *anchor_keys.stride()[:3], *anchor_values.stride()[:3], *out.stride()[:3], *lse.stride()[:2],
            **_constants(q, v, block_m, block_n),
        )
        ctx.save_for_backward(scaled, k, v, anchor_keys, anchor_values, out, lse)
        ctx.settings = (window, anchor_stride, scale, block_m, block_n, anchor_split, anchors)
        return out

    @staticmethod
    @on_tensor_device
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        scaled, k, v, anchor_keys, anchor_values, out, lse = ctx.saved_tensors
        window, anchor_stride, scale, block_m, block_n, anchor_split, anchors = ctx.settings
        grad_out = grad_out.contiguous()  # [B, H_q, T, D_v]
        batch, q_heads, length, _ = scaled.shape
        kv_heads = k.shape[1]
        group = q_heads // kv_heads
        delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1).contiguous()  # [B, H_q, T]
        constants = _constants(scaled, v, block_m, block_n)
        grad_q = torch.empty_like(scaled)  # [B, H_q, T, D]
        grad_k = torch.empty_like(k)  # [B, H_kv, T, D]
        grad_v = torch.empty_like(v)  # [B, H_kv, T, D_v]
        main_strides = (*scaled.stride()[:3], *k.stride()[:3], *v.stride()[:3])
        row_strides = (*grad_out.stride()[:3], *lse.stride()[:2])
        _dq_kernel[(triton.cdiv(length, block_m), batch * q_heads)](
            scaled, k, v, anchor_keys, anchor_values, grad_out, lse, delta, grad_q,
            length, anchors, window, anchor_stride, group, q_heads, *main_strides,
            *anchor_keys.stride()[:3], *anchor_values.stride()[:3], *row_strides,
            **constants,
        )
        whole = triton.cdiv(length, block_m) * block_m  # one split covering every query
        _dkdv_kernel[(triton.cdiv(length, block_n), batch * kv_heads, 1)](
            scaled, k, v, grad_out, lse, delta, grad_k, grad_v,
            length, length, window, anchor_stride, group, q_heads, kv_heads, whole, False, *main_strides, *row_strides,
            0, *grad_k.stride()[:3], 0, *grad_v.stride()[:3], **constants,
        )
        if anchors:
            # An anchor is seen by every later query: its sums are split over query ranges of
            # `anchor_split` positions (more programs), then added up here.
            splits = triton.cdiv(length, anchor_split)
            partial_k = torch.empty(splits, *anchor_keys.shape, dtype=lse.dtype, device=k.device)  # [S, B, H_kv, A, D]
            partial_v = torch.empty(splits, *anchor_values.shape, dtype=lse.dtype, device=k.device)
            _dkdv_kernel[(triton.cdiv(anchors, block_n), batch * kv_heads, splits)](
                scaled, anchor_keys, anchor_values, grad_out, lse, delta, partial_k, partial_v,
                length, anchors, window, anchor_stride, group, q_heads, kv_heads, anchor_split, True,
                *scaled.stride()[:3], *anchor_keys.stride()[:3], *anchor_values.stride()[:3], *row_strides,
                *partial_k.stride()[:4], *partial_v.stride()[:4], **constants,
            )
            _anchor_rows(grad_k, anchor_stride, anchors).add_(partial_k.sum(0).to(k.dtype))
            _anchor_rows(grad_v, anchor_stride, anchors).add_(partial_v.sum(0).to(v.dtype))
        return grad_q * scale, grad_k, grad_v, None, None, None, None, None, None


def sgsa_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    anchor_stride: int,
    scale: float | None = None,
    *,
    block_m: int = 64,
    block_n: int = 64,
    anchor_split: int = 1024,
) -> Tensor:
    """Attention output [B, H_q, T, D_v] from the Triton kernels.

    block_m, block_n: query and key block sizes, powers of two ≥ 16; anchor_split: queries per
    program of the anchors' dk/dv, a multiple of block_m."""
    _, _, _, _, scale = check_inputs(q, k, v, window, anchor_stride, scale)
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
            raise ValueError(f"{name}={value!r}: expected a power of two >= 16")
    if isinstance(anchor_split, bool) or not isinstance(anchor_split, int) or anchor_split < 1 or anchor_split % block_m:
        raise ValueError(f"anchor_split={anchor_split!r}: expected a positive multiple of block_m={block_m}")
    if q.shape[0] == 0:  # an empty batch: no programs to launch; the blocked path gives the empty output and gradients
        return sgsa_sparse(q, k, v, window, anchor_stride, scale)
    return _TritonAttention.apply(q, k, v, window, anchor_stride, scale, block_m, block_n, anchor_split)
