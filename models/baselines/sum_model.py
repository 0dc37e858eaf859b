"""Cross-temporal Sum baseline, registered as "sum".

Keiblinger, "Recurrence-Complete Frame-based Action Models", Sec. 8.1.3-8.1.4
and Table 4 ("Sum", n_layer 1, n_embed 256), compare the LSTM against a model
in which "the sequence model is replaced by a cross-temporal sum"; the paper's
sequence model is "a residual stack of LSTM cells interspersed with MLPs"
(Sec. 10). This family is that stack with every LSTM replaced by a causal
cumulative sum over time:

    embedding
    -> n_layers blocks:  x = x + Sum(LN(x));  x = x + MLP(LN(x))
    -> LN -> linear head

    Sum(u)_t = sum_{s <= t} (W u_s + b)           reduction="sum" (the paper's)
    Sum(u)_t = mean_{s <= t} (W u_s + b)          reduction="mean"

W, b (a linear map in place of the LSTM's input weights) act per position, so
the only cross-time interaction is an order-blind, parallelizable aggregate:
the model can count (the bias b also accumulates into a position counter) but
cannot carry out a sequential state update. In the paper it solves the
unwithheld maze task (Sec. 8.1.3) but reaches only 0.3785 / 0.2717 validation
accuracy on the withheld one at depth 32 / 64 (Table 4).

Streaming: `init_state(batch_size)` gives zero running sums; `step(tokens,
state)` and `forward(inputs, state)` continue from it and advance it in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rcswarm.models.baselines.common import (
    MLP,
    BlockStack,
    check_state_batch,
    check_tokens,
)
from rcswarm.models.baselines.config import SumConfig
from rcswarm.models.init import init_linear, init_norm
from rcswarm.models.inputs import check_inputs


@dataclass
class SumState:
    """Streaming state: totals[i] [B, d_model], the running sum of layer i's
    projected inputs, and `length`, the number of positions consumed."""

    totals: list[Tensor]
    length: int = 0

    @property
    def batch_size(self) -> int:
        return self.totals[0].shape[0]


class SumBlock(nn.Module):
    """x + CumSum(Linear(LN(x))), then x + MLP(LN(x))."""

    def __init__(self, config: SumConfig) -> None:
        super().__init__()
        self.reduction = config.reduction
        self.norm_sum = nn.LayerNorm(config.d_model)
        self.sum_in = nn.Linear(config.d_model, config.d_model)
        self.norm_mlp = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.mlp_ratio)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, total: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Block output [B, T, D] for x [B, T, D] at positions start .. start + T - 1.

        total: [B, D], the running sum over the positions before `start`.
        Returns the output and the running sum including x's positions.
        """
        sums = total[:, None] + torch.cumsum(self.sum_in(self.norm_sum(x)), dim=1)  # [B, T, D]
        if self.reduction == "mean":
            counts = torch.arange(start + 1, start + x.shape[1] + 1, device=x.device)  # [T]
            mixed = sums / counts.to(sums.dtype)[None, :, None]  # [B, T, D]
        else:
            mixed = sums  # [B, T, D]
        x = x + self.dropout(mixed)  # [B, T, D]
        x = x + self.dropout(self.mlp(self.norm_mlp(x)))  # [B, T, D]
        return x, sums[:, -1]


class SumModel(BlockStack):
    """Residual stack of cross-temporal sums and MLPs with a linear head to `config.out_dim`."""

    def __init__(self, config: SumConfig) -> None:
        super().__init__(config, SumConfig, SumBlock)

    def reset_parameters(self) -> None:
        """Initialize every parameter from the global torch RNG.

        Embedding and linear weights: normal(0, 0.02), the MLP output
        projection normal(0, 0.02 / sqrt(2 * n_layers)); biases zero;
        LayerNorms weight 1, bias 0.
        """
        std = 0.02
        out_std = std / math.sqrt(2 * self.config.n_layers)
        nn.init.normal_(self.embed.weight, mean=0.0, std=std)
        for block in self.blocks:
            init_norm(block.norm_sum)
            init_linear(block.sum_in, std)
            init_norm(block.norm_mlp)
            block.mlp.reset_parameters(std, out_std)
        init_norm(self.norm_out)
        init_linear(self.head, std)

    def init_state(self, batch_size: int) -> SumState:
        """Zero running sums for `batch_size` sequences."""
        weight = self.head.weight
        shape = (batch_size, self.config.d_model)
        return SumState(
            totals=[
                torch.zeros(shape, dtype=weight.dtype, device=weight.device)
                for _ in range(self.config.n_layers)
            ]
        )

    def forward(self, inputs: Tensor, state: SumState | None = None) -> Tensor:
        """Logits [B, T, out_dim] for token ids `inputs` [B, T].

        With `state`, the sums continue from it and `state` is advanced past
        `inputs`; without, they start from zero.
        """
        check_inputs(inputs)
        if state is None:
            run_state = self.init_state(inputs.shape[0])
        else:
            check_state_batch(state.batch_size, inputs)
            run_state = state
        x = self.embed(inputs)  # [B, T, D]
        for i, block in enumerate(self.blocks):
            x, run_state.totals[i] = block(x, run_state.totals[i], run_state.length)  # [B, T, D]
        run_state.length += inputs.shape[1]
        return self.head(self.norm_out(x))  # [B, T, out_dim]

    def step(self, tokens: Tensor, state: SumState) -> Tensor:
        """Logits [B, out_dim] for one token per sequence, `tokens` [B]; advances `state`."""
        check_tokens(tokens)
        return self.forward(tokens[:, None], state)[:, 0]  # [B, out_dim]
