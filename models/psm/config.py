"""TransformerPSMConfig: the hyperparameters of Transformer-PSM, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from rcswarm.models.validation import check_choice, check_fraction, check_ints, check_optional_int

COMPRESSIONS = ("right_half", "linear")


@dataclass
class TransformerPSMConfig:
    """Hyperparameters of `TransformerPSM`; validated on construction."""

    vocab_size: int = 256
    # Output classes of the head; None = vocab_size (next-token prediction).
    num_classes: int | None = None
    d_model: int = 64
    n_heads: int = 1
    agg_layers: int = 1
    inf_layers: int = 1
    chunk_size: int = 8
    mlp_ratio: int = 4
    compression: str = "right_half"
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_ints(self, ("vocab_size", "d_model", "n_heads", "agg_layers", "inf_layers", "chunk_size", "mlp_ratio"))
        check_optional_int(self, "num_classes")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerPSMConfig.d_model={self.d_model}: expected a multiple of n_heads={self.n_heads}"
            )
        check_choice(self, "compression", COMPRESSIONS)
        check_fraction(self, "dropout")

    @property
    def output_classes(self) -> int:
        return self.num_classes or self.vocab_size
