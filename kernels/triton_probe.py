"""The one Triton probe of the kernels: whether triton is installed, and whether a dispatch runs Triton for a tensor."""

from __future__ import annotations

import importlib.util
from functools import cache

from torch import Tensor


@cache
def triton_available() -> bool:
    """Whether the triton package can be imported (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(tensor: object) -> bool:
    """Whether a kernel dispatch runs the Triton kernels for `tensor`: a CUDA tensor, triton installed."""
    return isinstance(tensor, Tensor) and tensor.is_cuda and triton_available()
