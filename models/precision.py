"""Ops that run in float32 whatever the autocast dtype: shared by the model families.

Under `[inner] precision = "bf16"` the inner step runs in `torch.autocast(bfloat16)`, whose per-op policy is
wrong for two kinds of op here:

* cuDNN RNNs (every `nn.LSTM` on CUDA): PyTorch's autocast wrapper of `_cudnn_rnn` casts input, weights and
  state to float16 whatever dtype autocast was given (aten/src/ATen/cudnn/AutocastRNN.cpp), so a "bf16" LSTM would
  train in float16 without loss scaling; gradients of order 1/(B·L) underflow at long windows.
* the recurrence kernel rwkv_product: it takes operands of one dtype, and autocast hands it a mix (linear
  layers' outputs in bfloat16, softplus, norms and parameters in float32). (Elsewhere one dtype is restored
  in place: SGSA takes v's, the PSM scan's aggregate returns its operands'.)

`in_float32(fn, *args)` runs such an op with autocast off on its operands' device, its floating tensors (also inside
tuples, such as an LSTM's (h, c)) in float32. Outside autocast it calls `fn(*args)` unchanged, so float32 training
is bit for bit what it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _to_float32(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_to_float32(item) for item in value)
    if isinstance(value, list):
        return [_to_float32(item) for item in value]
    return value


def in_float32(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` with autocast off and the floating tensors of `args` in float32, when autocast is on for their
    device; else `fn(*args)` as it is."""
    tensor = _first_tensor(args)
    if tensor is None or not torch.is_autocast_enabled(tensor.device.type):
        return fn(*args)
    with torch.autocast(device_type=tensor.device.type, enabled=False):
        return fn(*_to_float32(args))
