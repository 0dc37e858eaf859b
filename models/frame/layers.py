"""Building blocks shared by the frame head and the main sequence model.

- `TransformerBlock`: pre-LayerNorm full (non-causal) self-attention block with a
  GELU MLP, as used inside a frame where every cell may see every other cell.
- `MLP`: D -> mlp_ratio * D -> D with GELU.
- `init_lstm_` (and, from rcswarm.models.init, `init_linear`, `init_norm`): the initialization every module of
  the family uses, drawing from torch's global RNG in a fixed order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.init import init_linear, init_norm


def init_lstm_(lstm: nn.LSTM) -> None:
    """Single-layer LSTM: weights uniform(+-1/sqrt(H)), biases zero, forget-gate bias one."""
    hidden = lstm.hidden_size
    bound = hidden**-0.5
    nn.init.uniform_(lstm.weight_ih_l0, -bound, bound)
    nn.init.uniform_(lstm.weight_hh_l0, -bound, bound)
    nn.init.zeros_(lstm.bias_ih_l0)
    nn.init.zeros_(lstm.bias_hh_l0)
    with torch.no_grad():
        lstm.bias_ih_l0[hidden : 2 * hidden].fill_(1.0)


class MLP(nn.Module):
    """Position-wise D -> ratio * D -> D with GELU."""

    def __init__(self, d_model: int, ratio: int) -> None:
        super().__init__()
        self.inner = nn.Linear(d_model, ratio * d_model)
        self.outer = nn.Linear(ratio * d_model, d_model)

    def reset_parameters(self, out_std: float) -> None:
        init_linear(self.inner)
        init_linear(self.outer, out_std)

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(F.gelu(self.inner(x)))  # [..., D]


class TransformerBlock(nn.Module):
    """Pre-LN block: x + Attn(LN(x)), then x + MLP(LN(x)); full attention, no mask."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        assert d_model % n_heads == 0, (d_model, n_heads)
        self.n_heads = n_heads
        self.norm_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attn_out = nn.Linear(d_model, d_model)
        self.norm_mlp = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio)

    def reset_parameters(self, out_std: float) -> None:
        """Residual output projections get `out_std`, everything else the default."""
        init_norm(self.norm_attn)
        init_linear(self.qkv)
        init_linear(self.attn_out, out_std)
        init_norm(self.norm_mlp)
        self.mlp.reset_parameters(out_std)

    def _attention(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        head_dim = d // self.n_heads
        qkv = self.qkv(x).view(n, t, 3, self.n_heads, head_dim)  # [N, T, 3, h, d_h]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [N, h, T, d_h]
        out = F.scaled_dot_product_attention(q, k, v)  # [N, h, T, d_h]
        return self.attn_out(out.transpose(1, 2).reshape(n, t, d))  # [N, T, D]

    def forward(self, x: Tensor) -> Tensor:
        x = x + self._attention(self.norm_attn(x))  # [N, T, D]
        return x + self.mlp(self.norm_mlp(x))  # [N, T, D]
