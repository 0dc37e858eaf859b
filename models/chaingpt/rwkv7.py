"""RWKV-7: ChainGPT's RWKV-Product state layer with one substep (M = 1) and no attention.

The baseline the PSM issue asks for once ChainGPT exists: a stack of pre-LayerNorm residual
layers, each the RWKV-Product time-mix (Appendix D.1 of the ChainGPT paper, an RWKV-7
time-mix when M = 1) followed by a SwiGLU MLP, then a final norm and a linear head. It reuses
ChainGPT's layer code; only depth, width and head size are its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from rcswarm.models.chaingpt.block import Layer
from rcswarm.models.chaingpt.config import ChainGPTConfig
from rcswarm.models.chaingpt.state import RWKVProduct


@dataclass
class RWKV7Config:
    vocab_size: int = 256
    # Output classes of the head; None = vocab_size.
    num_classes: int | None = None
    d_model: int = 64
    n_layers: int = 2
    head_dim: int = 16
    mlp_ratio: int = 4
    lora_rank: int = 8

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "head_dim", "mlp_ratio", "lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RWKV7Config.{name}={value!r}: expected a positive int")
        if self.d_model % self.head_dim:
            raise ValueError(f"RWKV7Config.d_model={self.d_model}: expected a multiple of head_dim={self.head_dim}")
        self.layer_config()

    @property
    def output_classes(self) -> int:
        return self.num_classes or self.vocab_size

    def layer_config(self) -> ChainGPTConfig:
        """The ChainGPT config its layers are built from: one substep, the same head size."""
        return ChainGPTConfig(
            vocab_size=self.vocab_size, num_classes=self.num_classes, d_model=self.d_model,
            d_mlp=self.mlp_ratio * self.d_model, rwkv_head_dim=self.head_dim, attn_head_dim=self.head_dim,
            n_kv_heads=1, substeps=1, lora_rank=self.lora_rank, decay_rank=self.lora_rank,
            gate_rank=2 * self.lora_rank, a_rank=self.lora_rank,
        )


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
        if inputs.dim() != 2:
            raise ValueError(f"inputs of shape {tuple(inputs.shape)}: expected [batch, time]")
        x = self.embed(inputs)  # [B, T, D]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.final_norm(x))  # [B, T, V]
