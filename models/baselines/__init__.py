"""rcswarm.models.baselines: the comparison models of the diagnostics.

Four registered families, each with a "tiny" preset (tests) and a "small"
preset (about 1M parameters, CPU experiments); parameter counts are for the
default vocab_size 256 and num_classes None:

- "lstm" (`LSTMModel`): embedding -> stacked LSTM -> head.
  tiny: d_model 32, 2 layers (33,536); small: d_model 256, 2 layers (1,184,000).
- "transformer" (`TransformerModel`): GPT-style pre-LN causal Transformer,
  learned or rotary positions, optional sliding window, KV-cache decoding.
  tiny: d_model 32, 2 layers, 2 heads, max_len 128 (46,208);
  small: d_model 128, 4 layers, 4 heads, max_len 1024 (990,208).
- "ssm" (`SSMModel`): Mamba-like diagonal selective state-space stack.
  tiny: d_model 32, 2 layers, d_state 8 (33,600); small: d_model 192, 4 layers (1,106,560).
- "sum" (`SumModel`): the cross-temporal Sum baseline of Keiblinger (Table 4).
  tiny: d_model 32, 2 layers (35,776); small: d_model 192, 3 layers (1,100,032).

Every family reads `vocab_size` input ids and writes `config.out_dim` logits
(`num_classes`, defaulting to `vocab_size`), and streams through
`init_state(batch_size)` / `step(tokens, state)` (see `common`).
"""

from rcswarm.models.baselines.common import BaselineConfig
from rcswarm.models.baselines.lstm import LSTMConfig, LSTMModel, LSTMState
from rcswarm.models.baselines.ssm import SSMConfig, SSMModel, SSMState
from rcswarm.models.baselines.sum_model import SumConfig, SumModel, SumState
from rcswarm.models.baselines.transformer import (
    KVCache,
    TransformerConfig,
    TransformerModel,
)
from rcswarm.models.registry import ModelEntry, register

LSTM_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2},
    "small": {"d_model": 256, "n_layers": 2},
}
TRANSFORMER_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_len": 128},
    "small": {"d_model": 128, "n_layers": 4, "n_heads": 4, "max_len": 1024},
}
SSM_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2, "d_state": 8},
    "small": {"d_model": 192, "n_layers": 4},
}
SUM_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2},
    "small": {"d_model": 192, "n_layers": 3},
}

register(
    ModelEntry(
        name="lstm",
        config_cls=LSTMConfig,
        build=LSTMModel,
        presets=LSTM_PRESETS,
        description="Embedding, stacked LSTM layers, linear head (recurrent baseline).",
    )
)
register(
    ModelEntry(
        name="transformer",
        config_cls=TransformerConfig,
        build=TransformerModel,
        presets=TRANSFORMER_PRESETS,
        description="GPT-style pre-LN causal Transformer; optional RoPE, sliding window, KV cache.",
    )
)
register(
    ModelEntry(
        name="ssm",
        config_cls=SSMConfig,
        build=SSMModel,
        presets=SSM_PRESETS,
        description="Mamba-like diagonal selective state-space stack in plain PyTorch.",
    )
)
register(
    ModelEntry(
        name="sum",
        config_cls=SumConfig,
        build=SumModel,
        presets=SUM_PRESETS,
        description="Cross-temporal cumulative-sum baseline (Keiblinger, Table 4).",
    )
)

__all__ = [
    "BaselineConfig",
    "KVCache",
    "LSTMConfig",
    "LSTMModel",
    "LSTMState",
    "LSTM_PRESETS",
    "SSMConfig",
    "SSMModel",
    "SSMState",
    "SSM_PRESETS",
    "SUM_PRESETS",
    "SumConfig",
    "SumModel",
    "SumState",
    "TRANSFORMER_PRESETS",
    "TransformerConfig",
    "TransformerModel",
]
