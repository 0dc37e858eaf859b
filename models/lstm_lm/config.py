"""ResidualLSTMConfig: the hyperparameters of the residual LSTM byte-level LM, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from rcswarm.models.validation import check_bool, check_fraction, check_ints


@dataclass
class ResidualLSTMConfig:
    """Hyperparameters of `ResidualLSTMLM`; validated on construction."""

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 2
    mlp_ratio: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        check_ints(self, ("vocab_size", "d_model", "n_layers", "mlp_ratio"))
        check_fraction(self, "dropout")
        check_bool(self, "tie_embeddings")
