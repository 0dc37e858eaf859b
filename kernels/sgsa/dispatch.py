"""One entry point for state-guided sparse attention.

`sgsa_attention` runs the Triton kernels (`triton_flash.py`) on CUDA tensors when triton is
installed (`rcswarm.kernels.triton_probe.use_triton`), the blocked O(T·(W + T/G)) path
(`sparse.py`) otherwise, and the dense-mask definition (`naive.py`) when `naive=True`.
"""

from __future__ import annotations

from torch import Tensor

from rcswarm.kernels.sgsa.naive import sgsa_naive
from rcswarm.kernels.sgsa.sparse import sgsa_sparse
from rcswarm.kernels.triton_probe import use_triton


def sgsa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    anchor_stride: int,
    *,
    scale: float | None = None,
    naive: bool = False,
) -> Tensor:
    """q [B, H_q, T, D], k [B, H_kv, T, D], v [B, H_kv, T, D_v] -> [B, H_q, T, D_v]; scale 1/√D by default."""
    if naive:
        return sgsa_naive(q, k, v, window, anchor_stride, scale)
    if use_triton(q):
        from rcswarm.kernels.sgsa.triton_flash import sgsa_triton  # imports triton only when used

        return sgsa_triton(q, k, v, window, anchor_stride, scale)
    return sgsa_sparse(q, k, v, window, anchor_stride, scale)
