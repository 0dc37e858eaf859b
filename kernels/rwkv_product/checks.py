"""Input validation shared by the RWKV-Product kernels.

Layout (time-major per batch, as RWKV-7 writes it): r, w_raw, k, a, b are [B, T, H, d_k],
v is [B, T, H, d_v], the state is [B, H, d_v, d_k] (value-major: y_t = S_t r_t).
T, H, d_k and d_v must be at least 1; an empty batch (B = 0) is valid and gives empty outputs.
"""

from __future__ import annotations

from torch import Tensor

from rcswarm.kernels.checks import check_float_tensors, describe


def check_inputs(
    r: Tensor, w_raw: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, initial_state: Tensor | None
) -> tuple[int, int, int, int, int]:
    """Validate the recurrence inputs; return (B, T, H, d_k, d_v) or raise ValueError."""
    named = {"r": r, "w_raw": w_raw, "k": k, "v": v, "a": a, "b": b}
    check_float_tensors(named, 4, "[B, T, H, d]")
    batch, length, heads, d_k = r.shape
    if length == 0:
        raise ValueError(f"r={describe(r)}: expected T >= 1")
    if heads == 0 or d_k == 0:
        raise ValueError(f"r={describe(r)}: expected H >= 1 and d_k >= 1")
    for name in ("w_raw", "k", "a", "b"):
        if named[name].shape != r.shape:
            raise ValueError(f"{name}={describe(named[name])}: expected r's shape {list(r.shape)}")
    if v.shape[:3] != r.shape[:3]:
        raise ValueError(f"v={describe(v)}: expected [B, T, H] = {list(r.shape[:3])} then d_v")
    d_v = v.shape[3]
    if d_v == 0:
        raise ValueError(f"v={describe(v)}: expected d_v >= 1")
    if initial_state is not None:
        if not isinstance(initial_state, Tensor):
            raise ValueError(f"initial_state={describe(initial_state)}: expected a tensor or None")
        expected = [batch, heads, d_v, d_k]
        if list(initial_state.shape) != expected or initial_state.dtype != r.dtype:
            raise ValueError(
                f"initial_state={describe(initial_state)}: expected [B, H, d_v, d_k] = {expected} "
                f"with dtype {str(r.dtype).removeprefix('torch.')}"
            )
    return batch, length, heads, d_k, d_v


def check_chunk_size(chunk_size: int) -> None:
    """A chunk size (or checkpoint interval) must be an int >= 1; raise ValueError otherwise."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r}: expected an int >= 1")
