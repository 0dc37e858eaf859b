"""Stacked LSTM baseline, registered as "lstm".

    embedding -> n_layers LSTM layers (width d_model) -> dropout -> linear head

This is the plain recurrent baseline of the diagnostics (Keiblinger,
"Recurrence-Complete Frame-based Action Models", Sec. 8, Tables 3-4: an LSTM
with n_layer 1, n_embed 256). Unlike `rcswarm.models.lstm_lm` it has no
residual connections, norms or MLPs, and the head is not tied to the
embedding, so the output classes may differ from the input vocabulary.

Streaming: `init_state(batch_size)` gives zero (h, c); `step(tokens, state)`
and `forward(inputs, state)` continue from it and advance it in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rcswarm.models.baselines.common import (
    check_config,
    check_state_batch,
    check_tokens,
)
from rcswarm.models.baselines.config import LSTMConfig
from rcswarm.models.init import init_linear
from rcswarm.models.inputs import check_inputs
from rcswarm.models.lstm_run import run_lstm


@dataclass
class LSTMState:
    """Recurrent state of all layers: h and c, each [n_layers, B, d_model]."""

    h: Tensor
    c: Tensor

    @property
    def batch_size(self) -> int:
        return self.h.shape[1]


class LSTMModel(nn.Module):
    """Token embedding, a multi-layer nn.LSTM, and a linear head to `config.out_dim`."""

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        check_config(type(self), config, LSTMConfig)
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self.lstm = nn.LSTM(
            input_size=d,
            hidden_size=d,
            num_layers=config.n_layers,
            batch_first=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(d, config.out_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialize every parameter from the global torch RNG.

        Embedding: normal(0, 1). LSTM weights: uniform(+-1/sqrt(d_model)); LSTM
        biases zero except the forget gate, whose combined bias is 1. Head:
        normal(0, 0.02) weight, zero bias.
        """
        d = self.config.d_model
        nn.init.normal_(self.embed.weight, mean=0.0, std=1.0)
        bound = d**-0.5
        for layer in range(self.config.n_layers):
            nn.init.uniform_(getattr(self.lstm, f"weight_ih_l{layer}"), -bound, bound)
            nn.init.uniform_(getattr(self.lstm, f"weight_hh_l{layer}"), -bound, bound)
            nn.init.zeros_(getattr(self.lstm, f"bias_hh_l{layer}"))
            bias_ih = getattr(self.lstm, f"bias_ih_l{layer}")
            nn.init.zeros_(bias_ih)
            with torch.no_grad():
                bias_ih[d : 2 * d].fill_(1.0)
        init_linear(self.head, 0.02)

    def init_state(self, batch_size: int) -> LSTMState:
        """Zero state for `batch_size` sequences, on the device and dtype of the parameters."""
        weight = self.head.weight
        shape = (self.config.n_layers, batch_size, self.config.d_model)
        zeros = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        return LSTMState(h=zeros, c=zeros.clone())

    def forward(self, inputs: Tensor, state: LSTMState | None = None) -> Tensor:
        """Logits [B, T, out_dim] for token ids `inputs` [B, T].

        With `state`, the sequence continues from it and `state` is advanced
        past `inputs`; without, it starts from zeros.
        """
        check_inputs(inputs)
        x = self.embed(inputs)  # [B, T, D]
        if state is None:
            h, _ = run_lstm(self.lstm, x)  # [B, T, D]; float32 under autocast, in pieces
        else:
            check_state_batch(state.batch_size, inputs)
            h, (state.h, state.c) = run_lstm(self.lstm, x, (state.h, state.c))  # [B, T, D]
        return self.head(self.dropout(h))  # [B, T, out_dim]

    def step(self, tokens: Tensor, state: LSTMState) -> Tensor:
        """Logits [B, out_dim] for one token per sequence, `tokens` [B]; advances `state`."""
        check_tokens(tokens)
        return self.forward(tokens[:, None], state)[:, 0]  # [B, out_dim]
