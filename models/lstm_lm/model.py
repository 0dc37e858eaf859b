"""Residual LSTM byte-level language model.

A stack of pre-norm residual blocks over a byte embedding. Each block is

    x = x + LSTM(LayerNorm(x))
    x = x + MLP(LayerNorm(x))        # d -> mlp_ratio * d -> d, GELU

followed by a final LayerNorm and an LM head that is tied to the embedding by
default. The model is causal because every LSTM runs forwards in time and the
MLPs act position-wise.

`forward(inputs)` returns logits; `forward(inputs, state, return_state=True)`
additionally returns the per-layer LSTM states so that a long sequence can be
processed (or generated) chunk by chunk with the same result as in one call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.inputs import check_inputs
from rcswarm.models.lstm_lm.config import ResidualLSTMConfig
from rcswarm.models.lstm_run import run_lstm

LSTMState = tuple[Tensor, Tensor]
"""(h, c) of one single-layer nn.LSTM, each [1, B, D]."""


class ResidualLSTMBlock(nn.Module):
    """One pre-norm block: a residual LSTM sublayer, then a residual MLP sublayer."""

    def __init__(self, config: ResidualLSTMConfig) -> None:
        super().__init__()
        d = config.d_model
        self.norm_lstm = nn.LayerNorm(d)
        self.lstm = nn.LSTM(input_size=d, hidden_size=d, num_layers=1, batch_first=True)
        self.norm_mlp = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, config.mlp_ratio * d)
        self.mlp_out = nn.Linear(config.mlp_ratio * d, d)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, state: LSTMState | None = None) -> tuple[Tensor, LSTMState]:
        h, new_state = run_lstm(self.lstm, self.norm_lstm(x), state)  # [B, T, D]; float32, in pieces
        x = x + self.dropout(h)  # [B, T, D]
        m = self.mlp_out(F.gelu(self.mlp_in(self.norm_mlp(x))))  # [B, T, D]
        x = x + self.dropout(m)  # [B, T, D]
        return x, new_state


class ResidualLSTMLM(nn.Module):
    """Byte-level causal LM: embedding, residual LSTM blocks, final norm, LM head."""

    def __init__(self, config: ResidualLSTMConfig) -> None:
        super().__init__()
        if not isinstance(config, ResidualLSTMConfig):
            raise TypeError(
                f"ResidualLSTMLM(config={config!r}): expected a ResidualLSTMConfig"
            )
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(ResidualLSTMBlock(config) for _ in range(config.n_layers))
        self.norm_out = nn.LayerNorm(config.d_model)
        self.head: nn.Linear | None = None
        if not config.tie_embeddings:
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialize every parameter from the global torch RNG.

        Embedding, linear weights and the untied head: normal(0, 0.02); the MLP
        output projection is scaled down by sqrt(2 * n_layers) so the residual
        stream does not grow with depth. Biases: zero. LayerNorms: weight 1,
        bias 0. LSTM weights: uniform(+-1/sqrt(d_model)); LSTM biases zero
        except the forget gate, whose combined bias is 1.
        """
        d = self.config.d_model
        std = 0.02
        nn.init.normal_(self.embed.weight, mean=0.0, std=std)
        for block in self.blocks:
            for norm in (block.norm_lstm, block.norm_mlp):
                nn.init.ones_(norm.weight)
                nn.init.zeros_(norm.bias)
            bound = d**-0.5
            nn.init.uniform_(block.lstm.weight_ih_l0, -bound, bound)
            nn.init.uniform_(block.lstm.weight_hh_l0, -bound, bound)
            nn.init.zeros_(block.lstm.bias_ih_l0)
            nn.init.zeros_(block.lstm.bias_hh_l0)
            with torch.no_grad():
                block.lstm.bias_ih_l0[d : 2 * d].fill_(1.0)
            nn.init.normal_(block.mlp_in.weight, mean=0.0, std=std)
            nn.init.zeros_(block.mlp_in.bias)
            nn.init.normal_(
                block.mlp_out.weight, mean=0.0, std=std / (2 * self.config.n_layers) ** 0.5
            )
            nn.init.zeros_(block.mlp_out.bias)
        nn.init.ones_(self.norm_out.weight)
        nn.init.zeros_(self.norm_out.bias)
        if self.head is not None:
            nn.init.normal_(self.head.weight, mean=0.0, std=std)

    def forward(
        self,
        inputs: Tensor,
        state: list[LSTMState] | None = None,
        return_state: bool = False,
    ) -> Tensor | tuple[Tensor, list[LSTMState]]:
        """Logits [B, T, V] for byte ids `inputs` [B, T].

        `state` is the list of per-layer LSTM states returned by a previous
        call with `return_state=True` (None starts from zeros). With
        `return_state=True` the result is `(logits, new_state)`.
        """
        check_inputs(inputs)
        if state is not None and len(state) != len(self.blocks):
            raise ValueError(
                f"state has {len(state)} layer states: expected {len(self.blocks)} (one per layer)"
            )
        x = self.embed(inputs)  # [B, T, D]
        new_state: list[LSTMState] = []
        for i, block in enumerate(self.blocks):
            x, layer_state = block(x, None if state is None else state[i])  # [B, T, D]
            new_state.append(layer_state)
        x = self.norm_out(x)  # [B, T, D]
        weight = self.embed.weight if self.head is None else self.head.weight  # [V, D]
        logits = F.linear(x, weight)  # [B, T, V]
        if return_state:
            return logits, new_state
        return logits
