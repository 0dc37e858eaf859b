"""One entry point for the RWKV-7 generalized delta rule and its M-substep form.

`rwkv_product` runs the Triton kernels (`triton_kernel.py`) on CUDA tensors when triton is
importable (`rcswarm.kernels.triton_probe`), the chunked path (`chunked.py`) otherwise; `naive=True` forces the per-step loop
(`naive.py`), the definition. `rwkv_product_substeps` expands the M substeps per token
(`substeps.py`), runs the recurrence on the T·M sequence and keeps the last substep's output.
"""

from __future__ import annotations

from torch import Tensor

from rcswarm.kernels.rwkv_product.chunked import (
    DEFAULT_CHUNK_SIZE,
    rwkv_product_chunked,
)
from rcswarm.kernels.rwkv_product.naive import rwkv_product_naive
from rcswarm.kernels.rwkv_product.substeps import collapse_substeps, expand_substeps
from rcswarm.kernels.triton_probe import use_triton


def rwkv_product(
    r: Tensor,
    w_raw: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    naive: bool = False,
) -> tuple[Tensor, Tensor]:
    """y [B, T, H, d_v] and final state [B, H, d_v, d_k]; inputs [B, T, H, d] (see `naive.py`).

    `chunk_size` is the chunk of the chunked path and the checkpoint interval of the Triton path.
    """
    if naive:
        return rwkv_product_naive(r, w_raw, k, v, a, b, initial_state)
    if use_triton(r):
        from rcswarm.kernels.rwkv_product.triton_kernel import rwkv_product_triton

        return rwkv_product_triton(r, w_raw, k, v, a, b, initial_state, chunk_size)
    return rwkv_product_chunked(r, w_raw, k, v, a, b, initial_state, chunk_size)


def rwkv_product_substeps(
    r: Tensor,
    w_raw: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    naive: bool = False,
) -> tuple[Tensor, Tensor]:
    """M substeps per token: r, w_raw [B, T, H, d_k]; k, a, b [B, T, M, H, d_k]; v [B, T, M, H, d_v].

    Returns y [B, T, H, d_v] (each token's last substep) and the final state [B, H, d_v, d_k].
    """
    expanded = expand_substeps(r, w_raw, k, v, a, b)
    y, state = rwkv_product(*expanded, initial_state, chunk_size=chunk_size, naive=naive)
    return collapse_substeps(y, k.shape[2]), state
