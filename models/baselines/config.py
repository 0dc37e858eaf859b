"""The configs of the baseline families, one dataclass each, validated on construction.

`BaselineConfig` holds the fields the lstm, transformer, ssm and sum families share;
`RWKV7Config` builds its layers from a `ChainGPTConfig` (the rwkv7 baseline reuses
ChainGPT's state layer). Presets are in `presets.py`, the modules in one file per family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rcswarm.models.chaingpt.config import ChainGPTConfig
from rcswarm.models.validation import (
    check_choice,
    check_fraction,
    check_int,
    check_ints,
    check_optional_int,
    check_positive_float,
)

SCANS = ("sequential", "parallel")
REDUCTIONS = ("sum", "mean")
POSITIONS = ("learned", "rope")
# The range of the SSM's initial step sizes Δ (SSMConfig.dt_min, dt_max; drawn log-uniformly between them, the
# dt_proj bias set to softplus⁻¹(Δ) in float32). dt_min = 5e-324 rounded Δ to 0 and the bias to −inf, dt_max = 1e300
# overflowed Δ to inf: non-finite parameters after one step (review of the specs, 2026-11). MIN_DT keeps Δ in
# float32's normal range (1.2e-38) with 30 orders to spare, and 4 orders below Mamba's own floor (1e-4): a smaller
# Δ leaves exp(Δ·A) at exactly 1 in float32 (no decay at all below 2^-24 ≈ 6e-8). MAX_DT: the slowest channel
# (A = −1) keeps exp(−Δ) of its state per step, and exp(−100) ≈ 3.7e-44 is below float32's normal range: past it
# every channel forgets its whole state at every step, so a larger Δ is no time scale, only a gain on the input
# Δ·x·B (Δ = 1e38 gave NaN at the first step). Mamba's default range is [1e-3, 1e-1].
MIN_DT = 1e-8
MAX_DT = 100.0


@dataclass
class BaselineConfig:
    """Fields every baseline family shares; validated on construction.

    vocab_size: number of input token ids; inputs lie in [0, vocab_size).
    num_classes: number of output classes (logits per position); None means
        vocab_size, as for language modelling. `out_dim` is the resolved value.
    d_model: width of the embedding and of the residual stream.
    n_layers: number of stacked sequence-mixing layers.
    dropout: dropout probability in training mode (0 <= dropout < 1).
    """

    vocab_size: int = 256
    num_classes: int | None = None
    d_model: int = 128
    n_layers: int = 2
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_int(self, "vocab_size")
        check_optional_int(self, "num_classes")
        check_ints(self, ("d_model", "n_layers"))
        check_fraction(self, "dropout")

    @property
    def out_dim(self) -> int:
        """Logits per position: num_classes, or vocab_size when that is None."""
        return self.vocab_size if self.num_classes is None else self.num_classes


@dataclass
class LSTMConfig(BaselineConfig):
    """Hyperparameters of `LSTMModel` (all fields are those of `BaselineConfig`).

    d_model is both the embedding width and the LSTM hidden size; dropout acts
    between LSTM layers and before the head.
    """


@dataclass
class TransformerConfig(BaselineConfig):
    """Hyperparameters of `TransformerModel`; validated on construction.

    Besides the `BaselineConfig` fields (dropout acts on the embeddings, the
    attention weights and both residual branches):
    n_heads: attention heads; d_model must be divisible by it (and, with
        RoPE, d_model / n_heads must be even).
    mlp_ratio: MLP hidden width as a multiple of d_model.
    max_len: the largest number of positions a sequence (or a stream through
        the KV cache) may have; the size of the learned position table.
    positions: "learned" (absolute position embedding) or "rope".
    rope_base: the RoPE frequency base (only used with positions="rope").
    window: None for full causal attention, or W >= 1 for sliding-window
        attention over the last W positions (the query's own included).
    """

    n_heads: int = 4
    mlp_ratio: int = 4
    max_len: int = 1024
    positions: str = "learned"
    rope_base: float = 10000.0
    window: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, ("n_heads", "mlp_ratio", "max_len"))
        check_choice(self, "positions", POSITIONS)
        check_positive_float(self, "rope_base")
        check_optional_int(self, "window")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"TransformerConfig.n_heads={self.n_heads!r}: expected a divisor of "
                f"d_model={self.d_model}"
            )
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError(
                f"TransformerConfig.n_heads={self.n_heads!r}: with positions='rope' expected "
                f"an even head size d_model / n_heads, got {self.d_model // self.n_heads}"
            )


@dataclass
class SSMConfig(BaselineConfig):
    """Hyperparameters of `SSMModel`; validated on construction.

    Besides the `BaselineConfig` fields:
    d_state: N, the state size per channel.
    expand: E / d_model, the inner width of the mixer.
    d_conv: kernel size of the causal depthwise convolution (1: none in effect).
    dt_rank: rank of the Δ projection; None means ceil(d_model / 16).
    dt_min, dt_max: Δ is initialized log-uniformly in [dt_min, dt_max];
        MIN_DT <= dt_min <= dt_max <= MAX_DT.
    scan: "sequential" (loop over time; the fastest on CPU) or "parallel"
        (prefix scan, log2(T) parallel steps; for accelerators).
    """

    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int | None = None
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    scan: str = "sequential"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, ("d_state", "expand", "d_conv"))
        check_optional_int(self, "dt_rank")
        check_positive_float(self, "dt_min")
        check_positive_float(self, "dt_max")
        if self.dt_min < MIN_DT:
            raise ValueError(
                f"SSMConfig.dt_min={self.dt_min!r}: expected >= {MIN_DT:g} (MIN_DT: a smaller initial step "
                "size leaves the state undecayed in float32, and below 1e-45 rounds to 0)"
            )
        if self.dt_max < self.dt_min:
            raise ValueError(
                f"SSMConfig.dt_max={self.dt_max!r}: expected >= dt_min={self.dt_min!r}"
            )
        if self.dt_max > MAX_DT:
            raise ValueError(
                f"SSMConfig.dt_max={self.dt_max!r}: expected <= {MAX_DT:g} (MAX_DT: at a step size of "
                f"{MAX_DT:g} every channel already forgets its state at each step; larger ones only "
                "scale the input, and overflow float32)"
            )
        check_choice(self, "scan", SCANS)

    @property
    def d_inner(self) -> int:
        """E, the number of SSM channels."""
        return self.expand * self.d_model

    @property
    def resolved_dt_rank(self) -> int:
        """dt_rank, or ceil(d_model / 16) when that is None."""
        return math.ceil(self.d_model / 16) if self.dt_rank is None else self.dt_rank


@dataclass
class SumConfig(BaselineConfig):
    """Hyperparameters of `SumModel`; validated on construction.

    Besides the `BaselineConfig` fields:
    mlp_ratio: MLP hidden width as a multiple of d_model.
    reduction: "sum" (the paper's cumulative sum) or "mean" (cumulative mean).
    """

    mlp_ratio: int = 4
    reduction: str = "sum"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self, "mlp_ratio")
        check_choice(self, "reduction", REDUCTIONS)


@dataclass
class RWKV7Config:
    """Hyperparameters of `RWKV7`; validated on construction (its layer config too)."""

    vocab_size: int = 256
    # Output classes of the head; None = vocab_size.
    num_classes: int | None = None
    d_model: int = 64
    n_layers: int = 2
    head_dim: int = 16
    mlp_ratio: int = 4
    lora_rank: int = 8

    def __post_init__(self) -> None:
        check_ints(self, ("vocab_size", "d_model", "n_layers", "head_dim", "mlp_ratio", "lora_rank"))
        if self.num_classes is not None:
            check_int(self, "num_classes")
        if self.d_model % self.head_dim:
            raise ValueError(f"RWKV7Config.d_model={self.d_model}: expected a multiple of head_dim={self.head_dim}")
        self.layer_config()

    @property
    def output_classes(self) -> int:
        return self.num_classes or self.vocab_size

    def layer_config(self) -> ChainGPTConfig:
        """The ChainGPT config its layers are built from: one substep, the same head size. RWKV7 has no attention:
        the attention fields get fixed valid values (one query head of 2), so ChainGPT's RoPE and GQA checks never
        refuse an RWKV head size (an odd one was refused as `ChainGPTConfig.attn_head_dim`)."""
        return ChainGPTConfig(
            vocab_size=self.vocab_size, num_classes=self.num_classes, d_model=self.d_model,
            d_mlp=self.mlp_ratio * self.d_model, rwkv_head_dim=self.head_dim, attn_head_dim=2, n_q_heads=1,
            n_kv_heads=1, substeps=1, lora_rank=self.lora_rank, decay_rank=self.lora_rank,
            gate_rank=2 * self.lora_rank, a_rank=self.lora_rank,
        )
