"""rcswarm.models.baselines: the comparison models of the diagnostics.

Five registered families, each with a "tiny" preset (tests) and a "small"
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
- "rwkv7" (`RWKV7`): ChainGPT's RWKV-Product state layer with one substep, no attention.

The folder follows the model template with several families: `config.py` holds every
family's config, `presets.py` their presets, one model file per family (`lstm.py`,
`transformer.py`, `ssm.py`, `sum_model.py`, `rwkv7.py`; `common.py` the pieces the first
four share), and this module registers them all.

The lstm, transformer, ssm and sum families read `vocab_size` input ids and write
`config.out_dim` logits (`num_classes`, defaulting to `vocab_size`), and stream through
`init_state(batch_size)` / `step(tokens, state)` (see `common`).
"""

from rcswarm.models.baselines.config import (
    BaselineConfig,
    LSTMConfig,
    RWKV7Config,
    SSMConfig,
    SumConfig,
    TransformerConfig,
)
from rcswarm.models.baselines.lstm import LSTMModel, LSTMState
from rcswarm.models.baselines.presets import (
    LSTM_PRESETS,
    RWKV7_PRESETS,
    SSM_PRESETS,
    SUM_PRESETS,
    TRANSFORMER_PRESETS,
)
from rcswarm.models.baselines.rwkv7 import RWKV7
from rcswarm.models.baselines.ssm import SSMModel, SSMState
from rcswarm.models.baselines.sum_model import SumModel, SumState
from rcswarm.models.baselines.transformer import KVCache, TransformerModel
from rcswarm.models.registry import ModelEntry, register

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
register(
    ModelEntry(
        name="rwkv7",
        config_cls=RWKV7Config,
        build=RWKV7,
        presets=RWKV7_PRESETS,
        description="RWKV-7 baseline: ChainGPT's state layer with M = 1, no attention.",
    )
)

__all__ = [
    "LSTM_PRESETS",
    "RWKV7",
    "RWKV7_PRESETS",
    "SSM_PRESETS",
    "SUM_PRESETS",
    "TRANSFORMER_PRESETS",
    "BaselineConfig",
    "KVCache",
    "LSTMConfig",
    "LSTMModel",
    "LSTMState",
    "RWKV7Config",
    "SSMConfig",
    "SSMModel",
    "SSMState",
    "SumConfig",
    "SumModel",
    "SumState",
    "TransformerConfig",
    "TransformerModel",
]
