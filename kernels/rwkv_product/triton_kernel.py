"""The RWKV-7 generalized delta rule as Triton kernels, forward and backward.

Recurrence (see `naive.py`), per batch and head with state S [d_v, d_k]:

    S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_tᵀ + v_t k_tᵀ,   y_t = S_t r_t,   w_t = e^{-e^{w_raw_t}}

Row j of S only ever meets row j: (S a)_j = S_{j,:} · a and y_j = S_{j,:} · r. So one program
owns a block of BLOCK_V rows of one (batch, head) state in registers and walks through time;
the grid is (B·H, ⌈d_v / BLOCK_V⌉), and the programs never communicate.

Forward: every CHUNK steps the program stores the state entering the chunk (a checkpoint,
[B·H, N, d_v, d_k], N = ⌈T / CHUNK⌉), then runs the steps, writing y_t; the final state is
written at the end.

Backward, with G = dL/dS_t carried in registers backwards in time (G = d final state at
t = T): for each chunk in reverse, the program reloads its checkpoint, recomputes the chunk's
states S_{t-1} into a per-program scratch buffer [CHUNK, BLOCK_V, d_k], then for t from the
chunk's end down to its start (z = S_{t-1} a_t, S_t recomputed from S_{t-1}):

    G   += dy_t r_tᵀ                     dr_t = S_tᵀ dy_t
    dv_t = G k_t        dk_t = Gᵀ v_t     dz = G b_t        db_t = Gᵀ z
    da_t = S_{t-1}ᵀ dz                   dw_t = Σ_j G_{j,:} ⊙ S_{t-1, j,:}
    dw_raw_t = -dw_t ⊙ e^{w_raw_t - e^{w_raw_t}}    (= dw_t ⊙ w_t ⊙ (-e^{w_raw_t}), finite at any w_raw)
    G    = G diag(w_t) + dz a_tᵀ          (dL/dS_{t-1})

dv_t belongs to the program's rows; dr, dk, da, db, dw_raw are sums over all d_v rows, so
each program writes its partial sum over its rows ([⌈d_v / BLOCK_V⌉, B, T, H, d_k]) and the
host adds the partials. The initial state's gradient is G after the first step. Arithmetic is
in float32 (float64 for float64 inputs); any T (the last chunk may be short), any d (blocks are
the next power of two, masked). Decays are applied step by step from w_raw, with no cumulative
sum, so the chunked path's clamp of λ = log w (`chunked.log_decay_floor`) is not needed here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from rcswarm.kernels.rwkv_product.checks import check_chunk_size, check_inputs
from rcswarm.kernels.rwkv_product.chunked import rwkv_product_chunked
from rcswarm.kernels.triton_probe import on_tensor_device

DEFAULT_TRITON_CHUNK = 32


@triton.jit
def _forward_kernel(
    r_ptr, w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, init_ptr, y_ptr, final_ptr, ckpt_ptr,
    length, heads, d_k, d_v, chunks,
    HAS_INIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    ACC: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    batch_index = pid_bh // heads
    head = pid_bh % heads
    cols = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    col_ok = cols < d_k
    row_ok = rows < d_v
    tile_ok = row_ok[:, None] & col_ok[None, :]
    tile = rows[:, None] * d_k + cols[None, :]  # [BLOCK_V, BLOCK_K] offsets in one [d_v, d_k] state
    state_base = pid_bh.to(tl.int64) * d_v * d_k
    if HAS_INIT:
        state = tl.load(init_ptr + state_base + tile, mask=tile_ok, other=0.0).to(ACC)
    else:
        state = tl.zeros([BLOCK_V, BLOCK_K], dtype=ACC)
    for n in range(chunks):
        ckpt = ckpt_ptr + (pid_bh.to(tl.int64) * chunks + n) * d_v * d_k
        tl.store(ckpt + tile, state.to(ckpt_ptr.dtype.element_ty), mask=tile_ok)
        end = tl.minimum(length, (n + 1) * CHUNK)
        for t in range(n * CHUNK, end):
            row_k = ((batch_index.to(tl.int64) * length + t) * heads + head) * d_k
            row_v = ((batch_index.to(tl.int64) * length + t) * heads + head) * d_v
            r_t = tl.load(r_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            w_raw_t = tl.load(w_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            k_t = tl.load(k_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            a_t = tl.load(a_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            b_t = tl.load(b_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            v_t = tl.load(v_ptr + row_v + rows, mask=row_ok, other=0.0).to(ACC)
            decay = tl.exp(-tl.exp(w_raw_t))  # [BLOCK_K]
            z = tl.sum(state * a_t[None, :], axis=1)  # [BLOCK_V]
            state = state * decay[None, :] + z[:, None] * b_t[None, :] + v_t[:, None] * k_t[None, :]
            y_t = tl.sum(state * r_t[None, :], axis=1)  # [BLOCK_V]
            tl.store(y_ptr + row_v + rows, y_t.to(y_ptr.dtype.element_ty), mask=row_ok)
    tl.store(final_ptr + state_base + tile, state.to(final_ptr.dtype.element_ty), mask=tile_ok)


@triton.jit
def _backward_kernel(
    r_ptr, w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, ckpt_ptr, dy_ptr, dfinal_ptr, scratch_ptr,
    dr_ptr, dw_ptr, dk_ptr, da_ptr, db_ptr, dv_ptr, dinit_ptr,
    batch, length, heads, d_k, d_v, chunks,
    HAS_DFINAL: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    ACC: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    batch_index = pid_bh // heads
    head = pid_bh % heads
    cols = tl.arange(0, BLOCK_K)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < d_k
    row_ok = rows < d_v
    tile_ok = row_ok[:, None] & col_ok[None, :]
    tile = rows[:, None] * d_k + cols[None, :]
    local = tl.arange(0, BLOCK_V)[:, None] * BLOCK_K + cols[None, :]  # offsets in one scratch slot
    state_base = pid_bh.to(tl.int64) * d_v * d_k
    scratch = scratch_ptr + (pid_bh.to(tl.int64) * tl.num_programs(1) + pid_v) * CHUNK * BLOCK_V * BLOCK_K
    partial = pid_v.to(tl.int64) * batch * length * heads * d_k  # this program's slice of the partial sums
    if HAS_DFINAL:
        grad = tl.load(dfinal_ptr + state_base + tile, mask=tile_ok, other=0.0).to(ACC)
    else:
        grad = tl.zeros([BLOCK_V, BLOCK_K], dtype=ACC)
    for m in range(chunks):
        n = chunks - 1 - m
        start = n * CHUNK
        end = tl.minimum(length, start + CHUNK)
        ckpt = ckpt_ptr + (pid_bh.to(tl.int64) * chunks + n) * d_v * d_k
        state = tl.load(ckpt + tile, mask=tile_ok, other=0.0).to(ACC)
        for t in range(start, end):
            tl.store(scratch + (t - start) * BLOCK_V * BLOCK_K + local, state)
            row_k = ((batch_index.to(tl.int64) * length + t) * heads + head) * d_k
            row_v = ((batch_index.to(tl.int64) * length + t) * heads + head) * d_v
            w_raw_t = tl.load(w_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            k_t = tl.load(k_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            a_t = tl.load(a_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            b_t = tl.load(b_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            v_t = tl.load(v_ptr + row_v + rows, mask=row_ok, other=0.0).to(ACC)
            decay = tl.exp(-tl.exp(w_raw_t))
            z = tl.sum(state * a_t[None, :], axis=1)
            state = state * decay[None, :] + z[:, None] * b_t[None, :] + v_t[:, None] * k_t[None, :]
        tl.debug_barrier()
        for j in range(end - start):
            t = end - 1 - j
            previous = tl.load(scratch + (t - start) * BLOCK_V * BLOCK_K + local)  # S_{t-1}
            row_k = ((batch_index.to(tl.int64) * length + t) * heads + head) * d_k
            row_v = ((batch_index.to(tl.int64) * length + t) * heads + head) * d_v
            r_t = tl.load(r_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            w_raw_t = tl.load(w_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            k_t = tl.load(k_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            a_t = tl.load(a_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            b_t = tl.load(b_ptr + row_k + cols, mask=col_ok, other=0.0).to(ACC)
            v_t = tl.load(v_ptr + row_v + rows, mask=row_ok, other=0.0).to(ACC)
            dy_t = tl.load(dy_ptr + row_v + rows, mask=row_ok, other=0.0).to(ACC)
            scale = tl.exp(w_raw_t)
            decay = tl.exp(-scale)
            z = tl.sum(previous * a_t[None, :], axis=1)  # [BLOCK_V]
            current = previous * decay[None, :] + z[:, None] * b_t[None, :] + v_t[:, None] * k_t[None, :]
            grad += dy_t[:, None] * r_t[None, :]
            dz = tl.sum(grad * b_t[None, :], axis=1)  # [BLOCK_V]
            out_k = partial + row_k + cols
            tl.store(dr_ptr + out_k, tl.sum(current * dy_t[:, None], axis=0), mask=col_ok)
            tl.store(dk_ptr + out_k, tl.sum(grad * v_t[:, None], axis=0), mask=col_ok)
            tl.store(db_ptr + out_k, tl.sum(grad * z[:, None], axis=0), mask=col_ok)
            tl.store(da_ptr + out_k, tl.sum(previous * dz[:, None], axis=0), mask=col_ok)
            d_decay = tl.sum(grad * previous, axis=0)  # [BLOCK_K]
            # dw/dw_raw = -e^{w_raw} e^{-e^{w_raw}} as one exponential: w ⊙ e^{w_raw} is 0 · ∞ = NaN at w_raw ≥ 88.7.
            tl.store(dw_ptr + out_k, -d_decay * tl.exp(w_raw_t - scale), mask=col_ok)
            d_v_t = tl.sum(grad * k_t[None, :], axis=1)
            tl.store(dv_ptr + row_v + rows, d_v_t.to(dv_ptr.dtype.element_ty), mask=row_ok)
            grad = grad * decay[None, :] + dz[:, None] * a_t[None, :]
        tl.debug_barrier()
    tl.store(dinit_ptr + state_base + tile, grad.to(dinit_ptr.dtype.element_ty), mask=tile_ok)


# Rows of the state per program unless asked otherwise (`block_v`): the grid is B·H·⌈d_v / BLOCK_V⌉ programs.
DEFAULT_BLOCK_V = 32


def _blocks(d_k: int, d_v: int, block_v: int | None = None) -> tuple[int, int]:
    """(BLOCK_K, BLOCK_V): the next power of two of d_k; rows per program `block_v` (default DEFAULT_BLOCK_V), at most
    the next power of two of d_v."""
    return triton.next_power_of_2(d_k), min(triton.next_power_of_2(d_v), block_v or DEFAULT_BLOCK_V)


def check_block_v(block_v: int | None) -> None:
    """ValueError unless `block_v` is None or a power of two from 1 to 128."""
    if block_v is None:
        return
    if isinstance(block_v, bool) or not isinstance(block_v, int) or not 1 <= block_v <= 128 or block_v & (block_v - 1):
        raise ValueError(f"block_v={block_v!r}: expected a power of two from 1 to 128 (rows of the state per program)")


def _accumulator(dtype: torch.dtype):
    """The kernels' arithmetic type: float64 for float64 inputs, float32 otherwise."""
    return tl.float64 if dtype == torch.float64 else tl.float32


class _RWKVTriton(torch.autograd.Function):
    """`_forward_kernel` and `_backward_kernel` as one autograd node (first derivatives only)."""

    @staticmethod
    @on_tensor_device
    def forward(ctx, r, w_raw, k, v, a, b, initial, chunk, rows_per_program):
        batch, length, heads, d_k = r.shape
        d_v = v.shape[-1]
        r, w_raw, k, v, a, b = (x.contiguous() for x in (r, w_raw, k, v, a, b))
        block_k, block_v = _blocks(d_k, d_v, rows_per_program)
        chunks = triton.cdiv(length, chunk)
        work = torch.float64 if r.dtype == torch.float64 else torch.float32
        y = torch.empty_like(v)  # [B, T, H, d_v]
        final = torch.empty(batch, heads, d_v, d_k, dtype=r.dtype, device=r.device)  # [B, H, d_v, d_k]
        checkpoints = torch.empty(batch * heads, chunks, d_v, d_k, dtype=work, device=r.device)  # [B·H, N, d_v, d_k]
        has_init = initial is not None
        init = initial.contiguous() if has_init else final
        grid = (batch * heads, triton.cdiv(d_v, block_v))
        _forward_kernel[grid](
            r, w_raw, k, v, a, b, init, y, final, checkpoints,
            length, heads, d_k, d_v, chunks,
            HAS_INIT=has_init, CHUNK=chunk, BLOCK_K=block_k, BLOCK_V=block_v, ACC=_accumulator(r.dtype),
        )
        ctx.save_for_backward(r, w_raw, k, v, a, b, checkpoints)
        ctx.chunk, ctx.has_init, ctx.block_v = chunk, has_init, block_v
        return y, final

    @staticmethod
    @on_tensor_device
    def backward(ctx, d_y, d_final):
        r, w_raw, k, v, a, b, checkpoints = ctx.saved_tensors
        batch, length, heads, d_k = r.shape
        d_v = v.shape[-1]
        chunk = ctx.chunk
        block_k, block_v = _blocks(d_k, d_v, ctx.block_v)
        chunks = checkpoints.shape[1]
        blocks_v = triton.cdiv(d_v, block_v)
        work = checkpoints.dtype
        d_y = torch.zeros_like(v) if d_y is None else d_y.contiguous()
        has_dfinal = d_final is not None
        d_final = d_final.contiguous() if has_dfinal else checkpoints
        partials = [  # dr, dw_raw, dk, da, db per row block: [⌈d_v / BLOCK_V⌉, B, T, H, d_k] each
            torch.empty(blocks_v, batch, length, heads, d_k, dtype=work, device=r.device) for _ in range(5)
        ]
        d_v_out = torch.empty_like(v)  # [B, T, H, d_v]
        d_initial = torch.empty(batch, heads, d_v, d_k, dtype=r.dtype, device=r.device)  # [B, H, d_v, d_k]
        scratch = torch.empty(
            batch * heads * blocks_v, chunk, block_v, block_k, dtype=work, device=r.device
        )  # [B·H·⌈d_v / BLOCK_V⌉, CHUNK, BLOCK_V, BLOCK_K], S_{t-1} of one chunk per program
        _backward_kernel[(batch * heads, blocks_v)](
            r, w_raw, k, v, a, b, checkpoints, d_y, d_final, scratch,
            *partials, d_v_out, d_initial,
            batch, length, heads, d_k, d_v, chunks,
            HAS_DFINAL=has_dfinal, CHUNK=chunk, BLOCK_K=block_k, BLOCK_V=block_v, ACC=_accumulator(r.dtype),
        )
        d_r, d_w, d_k_out, d_a, d_b = (p.sum(0).to(r.dtype) for p in partials)
        return d_r, d_w, d_k_out, d_v_out, d_a, d_b, (d_initial if ctx.has_init else None), None, None


def rwkv_product_triton(
    r: Tensor,
    w_raw: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = DEFAULT_TRITON_CHUNK,
    block_v: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Outputs y [B, T, H, d_v] and the final state [B, H, d_v, d_k] by the Triton kernels.

    `chunk_size` is the checkpoint interval (state memory B·H·⌈T / chunk⌉·d_v·d_k); `block_v` the state rows per
    program (default DEFAULT_BLOCK_V; fewer make more programs, and more partial sums in the backward pass).
    """
    check_inputs(r, w_raw, k, v, a, b, initial_state)
    check_chunk_size(chunk_size)
    check_block_v(block_v)
    if r.shape[0] == 0:  # an empty batch: no programs to launch; the chunked path gives the empty outputs and gradients
        return rwkv_product_chunked(r, w_raw, k, v, a, b, initial_state, chunk_size)
    return _RWKVTriton.apply(r, w_raw, k, v, a, b, initial_state, chunk_size, block_v)
