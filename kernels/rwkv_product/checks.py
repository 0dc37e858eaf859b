"""Input validation shared by the RWKV-Product kernels.

Layout (time-major per batch, as RWKV-7 writes it): r, w_raw, k, a, b are [B, T, H, d_k],
v is [B, T, H, d_v], the state is [B, H, d_v, d_k] (value-major: y_t = S_t r_t).
"""

from __future__ import annotations

from torch import Tensor


def describe(value: object) -> str:
    """A short description of a tensor for error messages, e.g. 'tensor[2, 3] float64'."""
    if isinstance(value, Tensor):
        return f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def check_inputs(
    r: Tensor, w_raw: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, initial_state: Tensor | None
) -> tuple[int, int, int, int, int]:
    """Validate the recurrence inputs; return (B, T, H, d_k, d_v) or raise ValueError."""
    named = {"r": r, "w_raw": w_raw, "k": k, "v": v, "a": a, "b": b}
    for name, tensor in named.items():
        if not isinstance(tensor, Tensor):
            raise ValueError(f"{name}={describe(tensor)}: expected a tensor")
        if tensor.dim() != 4:
            raise ValueError(f"{name}={describe(tensor)}: expected 4 dims [B, T, H, d]")
        if not tensor.is_floating_point():
            raise ValueError(f"{name}={describe(tensor)}: expected a floating dtype")
        if tensor.dtype != r.dtype or tensor.device != r.device:
            raise ValueError(
                f"{name}={describe(tensor)} on {tensor.device}: expected r's dtype and device "
                f"({describe(r)} on {r.device})"
            )
    batch, length, heads, d_k = r.shape
    if length == 0:
        raise ValueError(f"r={describe(r)}: expected T >= 1")
    for name in ("w_raw", "k", "a", "b"):
        if named[name].shape != r.shape:
            raise ValueError(f"{name}={describe(named[name])}: expected r's shape {list(r.shape)}")
    if v.shape[:3] != r.shape[:3]:
        raise ValueError(f"v={describe(v)}: expected [B, T, H] = {list(r.shape[:3])} then d_v")
    d_v = v.shape[3]
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
