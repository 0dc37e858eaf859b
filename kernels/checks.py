"""Input validation shared by the kernels: readable tensor descriptions and common checks; the comparison of a
kernel's result with its reference (`relative_error`, used by the tests and by `rcswarm bench gpu`)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor


def describe(value: object) -> str:
    """A short description of a tensor (or tuple of them) for error messages, e.g. 'tensor[2, 3] float64'."""
    if isinstance(value, Tensor):
        return f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(item) for item in value) + ")"
    return type(value).__name__


def check_float_tensors(named: Mapping[str, object], dims: int, layout: str) -> None:
    """Every value is a floating tensor with `dims` dims, on the first one's dtype and device."""
    reference_name, reference = next(iter(named.items()))
    for name, tensor in named.items():
        if not isinstance(tensor, Tensor) or tensor.dim() != dims:
            raise ValueError(f"{name}={describe(tensor)}: expected a tensor {layout}")
        if not tensor.is_floating_point():
            raise ValueError(f"{name}={describe(tensor)}: expected a floating dtype")
        assert isinstance(reference, Tensor)
        if tensor.dtype != reference.dtype or tensor.device != reference.device:
            raise ValueError(
                f"{name}={describe(tensor)} on {tensor.device}: expected {reference_name}'s dtype and device "
                f"({describe(reference)} on {reference.device})"
            )


def relative_error(value: Tensor, reference: Tensor) -> float:
    """max |value - reference| / max(max |reference|, tiny), computed in float64: how kernels are compared with
    their references."""
    value, reference = value.double(), reference.double()
    scale = reference.abs().max().clamp_min(1e-300)
    return float((value - reference).abs().max() / scale)
