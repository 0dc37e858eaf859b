"""The token-input check of every token model's forward (all registered families but frame).

Every such model reads `inputs` [batch, time] of integer token ids with time >= 1; an empty
batch (batch = 0) is allowed and gives an empty output [0, time, classes].
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_inputs(inputs: Tensor) -> None:
    """ValueError unless `inputs` is an integer tensor [batch, time] with time >= 1."""
    dtype = inputs.dtype
    if inputs.dim() != 2 or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(
            f"inputs has shape {tuple(inputs.shape)} and dtype {dtype}: "
            "expected [batch, time] integer ids"
        )
    if inputs.shape[1] == 0:
        raise ValueError(f"inputs has shape {tuple(inputs.shape)}: expected time >= 1")
