"""Input validation shared by the SGSA kernels.

Layout: q [B, H_q, T, D], k and v [B, H_kv, T, D] (v may have its own D_v), H_q a multiple of
H_kv; query head h reads key/value head h // (H_q / H_kv). Positions are 0-based. T, the heads,
D and D_v must be at least 1; an empty batch (B = 0) is valid and gives an empty output.
"""

from __future__ import annotations

import math

from torch import Tensor

from rcswarm.kernels.checks import check_float_tensors, describe


def check_inputs(
    q: Tensor, k: Tensor, v: Tensor, window: int, anchor_stride: int, scale: float | None
) -> tuple[int, int, int, int, float]:
    """Validate; return (B, H_q, H_kv, T, scale) or raise ValueError."""
    check_float_tensors({"q": q, "k": k, "v": v}, 4, "[B, H, T, D]")
    batch, q_heads, length, dim = q.shape
    if length == 0:
        raise ValueError(f"q={describe(q)}: expected T >= 1")
    if q_heads == 0 or dim == 0:
        raise ValueError(f"q={describe(q)}: expected H_q >= 1 and D >= 1")
    if k.shape[0] != batch or k.shape[2] != length or k.shape[3] != dim:
        raise ValueError(f"k={describe(k)}: expected [B, H_kv, T, D] with B={batch}, T={length}, D={dim}")
    kv_heads = k.shape[1]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"k={describe(k)}: expected H_kv >= 1 dividing H_q={q_heads}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v={describe(v)}: expected [B, H_kv, T] = {list(k.shape[:3])} then D_v")
    if v.shape[3] == 0:
        raise ValueError(f"v={describe(v)}: expected D_v >= 1")
    for name, value in (("window", window), ("anchor_stride", anchor_stride)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an int >= 1")
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    elif not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r}: expected a finite float or None")
    return batch, q_heads, kv_heads, length, float(scale)
