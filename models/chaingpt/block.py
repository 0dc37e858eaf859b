"""Chain-Block (ChainGPT, Section 3.1): a state layer followed by an attention layer.

Each of the two layers is a pre-norm residual pair, as Appendix F's per-layer terms imply
(P_2LN = 4D: two LayerNorms with weight and bias; P_MLP = 3 D D_m: a SwiGLU MLP):

    x ← x + Mixer(LN_1(x)),   x ← x + MLP(LN_2(x))

with Mixer = RWKV-Product in the first (even-indexed) layer and SGSA in the second.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.chaingpt.attention import SGSA
from rcswarm.models.chaingpt.config import ChainGPTConfig
from rcswarm.models.chaingpt.state import RWKVProduct


class SwiGLU(nn.Module):
    """down(silu(gate(x)) ⊙ up(x)): [B, T, D] -> [B, T, D], no biases (3 D D_m parameters)."""

    def __init__(self, d_model: int, d_mlp: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_mlp, bias=False)
        self.up = nn.Linear(d_model, d_mlp, bias=False)
        self.down = nn.Linear(d_mlp, d_model, bias=False)
        for linear in (self.gate, self.up, self.down):
            nn.init.normal_(linear.weight, std=linear.in_features**-0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    """One decoder layer: mixer and MLP, each pre-LayerNorm and residual."""

    def __init__(self, config: ChainGPTConfig, mixer: nn.Module) -> None:
        super().__init__()
        self.mixer_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.mixer = mixer
        self.mlp_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.d_mlp)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.mixer_norm(x))  # [B, T, D]
        return x + self.mlp(self.mlp_norm(x))


class ChainBlock(nn.Module):
    """State layer then attention layer: [B, T, D] -> [B, T, D]."""

    def __init__(self, config: ChainGPTConfig) -> None:
        super().__init__()
        self.state = Layer(config, RWKVProduct(config))
        self.attention = Layer(config, SGSA(config))

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(self.state(x))
