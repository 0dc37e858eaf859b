"""The chunked form's only sequential part: the state passed from chunk to chunk, in place.

Over the N chunks of every (batch, head) the chunked form (`chunked.py`) passes the state on as
S_{n+1} = S_n A_n + F_n (forward) and its gradient back as G_n = dS_n + G_{n+1} A_nᵀ (backward).
With x [N+1, BH, d_v, d_k] holding the start (x[0], or x[N] in reverse) and the additive terms
(F_n in x[n+1], or dS_n in x[n]), and the transitions m [N, BH, d_k, d_k]:

    forward:  x[n+1] += x[n] @ m[n]        for n = 0 .. N-1
    reverse:  x[n]   += x[n+1] @ m[n]ᵀ     for n = N-1 .. 0

`state_scan_` runs it: for float32 CUDA tensors with triton importable, one launch of the kernel in
`state_scan_triton.py` (each program walks all N chunks for a block of state rows, which evolve independently);
otherwise the loop `state_scan_naive_` (one batched product per chunk: N launches on a GPU, so the loop's launch
cost, not its arithmetic, bounds it there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rcswarm.kernels.triton_probe import use_triton


def check_scan(x: Tensor, m: Tensor) -> None:
    """ValueError unless x is [N+1, BH, d_v, d_k] and m [N, BH, d_k, d_k] of x's dtype and device."""
    if x.dim() != 4 or m.dim() != 4 or m.shape != (x.shape[0] - 1, x.shape[1], x.shape[3], x.shape[3]):
        raise ValueError(f"state scan: x {tuple(x.shape)} and m {tuple(m.shape)}: expected x [N+1, BH, d_v, d_k] and "
                         "m [N, BH, d_k, d_k]")
    if m.dtype != x.dtype or m.device != x.device:
        raise ValueError(f"state scan: m is {m.dtype} on {m.device}, x {x.dtype} on {x.device}: expected the same")


def state_scan_naive_(x: Tensor, m: Tensor, reverse: bool = False) -> Tensor:
    """The scan above as a loop of batched products, in place on x; x."""
    chunks = m.shape[0]
    if reverse:
        transposed = m.transpose(-1, -2)  # [N, BH, d_k, d_k]
        for n in range(chunks - 1, -1, -1):
            x[n].baddbmm_(x[n + 1], transposed[n])
    else:
        for n in range(chunks):
            x[n + 1].baddbmm_(x[n], m[n])
    return x


def state_scan_(x: Tensor, m: Tensor, reverse: bool = False) -> Tensor:
    """The scan above in place on x (contiguous); the Triton kernel for float32 CUDA tensors, else the loop; x."""
    check_scan(x, m)
    if x.numel() == 0:  # an empty batch (BH = 0): nothing to pass on, and no empty grid to launch
        return x
    if x.dtype == torch.float32 and use_triton(x) and x.is_contiguous():
        from rcswarm.kernels.rwkv_product.state_scan_triton import state_scan_triton_

        return state_scan_triton_(x, m.contiguous(), reverse)
    return state_scan_naive_(x, m, reverse)
