"""Pieces shared by the baseline model families: input checks and small modules (the configs are in `config.py`).

Every baseline reads token ids in [0, vocab_size) and writes logits over
`config.out_dim` classes: `num_classes` when a task's targets differ from its
input vocabulary (e.g. the two halting states of the FRJT), else `vocab_size`.

Every family also has a streaming API over a mutable per-family state:

    state = model.init_state(batch_size)
    logits = model.step(tokens, state)       # tokens [B] -> logits [B, out_dim]
    logits = model(inputs, state)            # inputs [B, T] -> logits [B, T, out_dim]

Both calls advance `state` in place (by reassigning its tensors, never by
writing into them, so autograd graphs through earlier states stay valid), and
feeding a sequence token by token, chunk by chunk or in one call gives the same
logits up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.baselines.config import BaselineConfig
from rcswarm.models.init import init_linear


def check_config(model_cls: type, config: object, config_cls: type) -> None:
    """TypeError unless `config` is an instance of `config_cls`."""
    if not isinstance(config, config_cls):
        raise TypeError(
            f"{model_cls.__name__}(config={config!r}): expected a {config_cls.__name__}"
        )


def check_tokens(tokens: Tensor) -> None:
    """ValueError unless `tokens` is an integer tensor [batch] (one step's ids)."""
    if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(
            f"tokens has shape {tuple(tokens.shape)} and dtype {tokens.dtype}: "
            "expected [batch] integer ids"
        )


def check_state_batch(state_batch: int, inputs: Tensor) -> None:
    """ValueError unless the state was made for the batch size of `inputs`."""
    if state_batch != inputs.shape[0]:
        raise ValueError(
            f"state has batch size {state_batch}: expected {inputs.shape[0]} "
            "(the batch size of inputs)"
        )


class MLP(nn.Module):
    """Position-wise d -> ratio * d -> d feed-forward layer with a GELU."""

    def __init__(self, d_model: int, ratio: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, ratio * d_model)
        self.fc_out = nn.Linear(ratio * d_model, d_model)

    def reset_parameters(self, std: float, out_std: float) -> None:
        """fc_in weights ~ normal(0, std), fc_out ~ normal(0, out_std); biases zero."""
        init_linear(self.fc_in, std)
        init_linear(self.fc_out, out_std)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))  # [B, T, D]


class BlockStack(nn.Module):
    """Embedding, `config.n_layers` blocks, a final LayerNorm and a linear head to `config.out_dim`.

    Subclasses give the config type and block class, and define `reset_parameters`, which
    runs last in the constructor.
    """

    def __init__(self, config: BaselineConfig, config_type: type, block: Callable[[Any], nn.Module]) -> None:
        super().__init__()
        check_config(type(self), config, config_type)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(block(config) for _ in range(config.n_layers))
        self.norm_out = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.out_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        raise NotImplementedError
