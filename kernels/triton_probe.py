"""The one Triton probe of the kernels: whether triton is installed, whether a dispatch runs Triton for a tensor, and
the device a launch runs on (`on_tensor_device`)."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import torch
from torch import Tensor

F = TypeVar("F", bound=Callable[..., Any])


@cache
def triton_available() -> bool:
    """Whether the triton package can be imported (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(tensor: object) -> bool:
    """Whether a kernel dispatch runs the Triton kernels for `tensor`: a CUDA tensor, triton installed."""
    return isinstance(tensor, Tensor) and tensor.is_cuda and triton_available()


def on_tensor_device(step: F) -> F:
    """An autograd Function's forward or backward run with the current CUDA device set to its first CUDA tensor's:
    Triton launches on the current device, so a tensor on cuda:1 while cuda:0 is current would be read from the
    wrong device."""

    @functools.wraps(step)
    def run(ctx: Any, *args: Any) -> Any:
        tensor = next((arg for arg in args if isinstance(arg, Tensor) and arg.is_cuda), None)
        if tensor is None:
            return step(ctx, *args)
        with torch.cuda.device(tensor.device):
            return step(ctx, *args)

    return run  # type: ignore[return-value]
