"""Parameter initialization shared by the model families."""

from __future__ import annotations

from torch import nn

INIT_STD = 0.02
"""GPT-2's standard deviation for embeddings and linear weights."""


def init_linear(linear: nn.Linear, std: float = INIT_STD) -> None:
    """Weight ~ normal(0, std), bias (if any) zero."""
    nn.init.normal_(linear.weight, mean=0.0, std=std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def init_norm(norm: nn.LayerNorm) -> None:
    """Weight one, bias zero."""
    nn.init.ones_(norm.weight)
    nn.init.zeros_(norm.bias)
