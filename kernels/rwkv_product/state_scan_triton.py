"""The chunked form's state scan (`state_scan.py`) as one Triton kernel.

Program (p, i) owns rows [i·BLOCK_V, (i+1)·BLOCK_V) of head p's d_v × d_k state and walks all N chunks: it
loads the next additive term and transition, forms x·m (or x·mᵀ in reverse) with `tl.dot` in IEEE float32
(no TF32, so it agrees with the loop to float32 rounding), adds, and stores. Rows never meet other rows, so the
programs never communicate. d_v and d_k need not be powers of two (masked; blocks at least 16, `tl.dot`'s least).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from rcswarm.kernels.triton_probe import on_tensor_device

# State rows per program (at d_v = 64 and B·H = 64: 128 programs).
BLOCK_ROWS = 32


@triton.jit
def _scan_kernel(
    x_ptr, m_ptr, heads, d_v, d_k, chunks,
    REVERSE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    head = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    cols = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    inner = tl.arange(0, BLOCK_K)  # [BLOCK_K], the contracted index
    tile_ok = (rows < d_v)[:, None] & (cols < d_k)[None, :]
    tile = rows[:, None] * d_k + cols[None, :]  # [BLOCK_V, BLOCK_K] offsets in one state
    m_ok = (inner < d_k)[:, None] & (cols < d_k)[None, :]
    if REVERSE:  # m[n]ᵀ: element (i, j) is m[n][j, i]
        m_tile = cols[None, :] * d_k + inner[:, None]
    else:
        m_tile = inner[:, None] * d_k + cols[None, :]
    state_size = d_v * d_k
    if REVERSE:
        first = chunks
    else:
        first = 0
    x = tl.load(x_ptr + (first * heads + head).to(tl.int64) * state_size + tile, mask=tile_ok, other=0.0)
    for step in range(chunks):
        if REVERSE:  # n: the transition used; target: the state written
            n = chunks - 1 - step
            target = n
        else:
            n = step
            target = step + 1
        m = tl.load(m_ptr + (n * heads + head).to(tl.int64) * d_k * d_k + m_tile, mask=m_ok, other=0.0)
        here = x_ptr + (target * heads + head).to(tl.int64) * state_size + tile
        x = tl.load(here, mask=tile_ok, other=0.0) + tl.dot(x, m, input_precision="ieee")
        tl.store(here, x, mask=tile_ok)


@on_tensor_device
def _launch(_ctx: None, x: Tensor, m: Tensor, reverse: bool) -> Tensor:
    chunks, heads, d_v, d_k = m.shape[0], x.shape[1], x.shape[2], x.shape[3]
    block_v = max(16, min(BLOCK_ROWS, triton.next_power_of_2(d_v)))
    block_k = max(16, triton.next_power_of_2(d_k))
    _scan_kernel[(heads, triton.cdiv(d_v, block_v))](
        x, m, heads, d_v, d_k, chunks, REVERSE=reverse, BLOCK_V=block_v, BLOCK_K=block_k,
    )
    return x


def state_scan_triton_(x: Tensor, m: Tensor, reverse: bool = False) -> Tensor:
    """`state_scan.state_scan_naive_` by the kernel: x [N+1, BH, d_v, d_k] and m [N, BH, d_k, d_k], contiguous
    float32 (CPU tensors only under TRITON_INTERPRET=1), in place on x; x."""
    return _launch(None, x, m, reverse)
