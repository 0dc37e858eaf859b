"""RWKV-7: ChainGPT's RWKV-Product state layer with one substep (M = 1) and no attention.

The baseline the PSM issue asks for once ChainGPT exists: a stack of pre-LayerNorm residual
layers, each the RWKV-Product time-mix (Appendix D.1 of the ChainGPT paper, an RWKV-7
time-mix when M = 1) followed by a SwiGLU MLP, then a final norm and a linear head. It reuses
ChainGPT's layer code; only depth, width and head size are its own (`RWKV7Config` in `config.py`).
"""

from __future__ import annotations

from torch import Tensor, nn

from rcswarm.models.baselines.config import RWKV7Config
from rcswarm.models.chaingpt.block import Layer
from rcswarm.models.chaingpt.state import RWKVProduct
from rcswarm.models.inputs import check_inputs


class RWKV7(nn.Module):
    """inputs [B, T] token ids -> logits [B, T, output_classes]."""

    def __init__(self, config: RWKV7Config) -> None:
        super().__init__()
        self.config = config
        layer_config = config.layer_config()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.normal_(self.embed.weight, std=config.d_model**-0.5)
        self.layers = nn.ModuleList(Layer(layer_config, RWKVProduct(layer_config)) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.output_classes, bias=False)
        nn.init.normal_(self.head.weight, std=config.d_model**-0.5)

    def forward(self, inputs: Tensor) -> Tensor:
        """Logits [B, T, V] of token ids `inputs` [B, T] (`check_inputs`)."""
        check_inputs(inputs)
        x = self.embed(inputs)  # [B, T, D]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.final_norm(x))  # [B, T, V]
