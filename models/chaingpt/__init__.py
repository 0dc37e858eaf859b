"""rcswarm.models.chaingpt: ChainGPT (Zheng et al.), registered as "chaingpt".

Chain-Blocks (RWKV-Product state layer + SGSA attention layer) arranged as bottom / core /
top with recurrent depth over the core; see `model.py`, `state.py`, `attention.py`, the
config in `config.py` and the presets in `presets.py`. The rwkv7 baseline, built from the
same state layer, is registered with the baselines (`rcswarm.models.baselines.rwkv7`).

Presets ("180m", "0.5b", "1.5b" are Table 7's rows; vocabulary 65536 and D_m = 4D are
choices, the paper does not state them):

- "tiny": D 32, C121, M 2, 3 iterations (2 with gradients), W 8, G 4; for tests.
- "small": D 128, C121, M 2, 4 iterations (2 with gradients); CPU diagnostics.
- "180m": D 1024, C121, KV heads 2, ranks 64/64/128/96, 12 iterations (8 with gradients).
- "0.5b": D 2048, C121, KV heads 2, ranks 96/96/256/128, 16 iterations (8).
- "1.5b": D 2560, C141, KV heads 8, ranks 128/128/320/256, 16 iterations (8). D / d_h = 20
  query heads is not a multiple of 8 KV heads, so H_q = 16 (H_q d_h = 2048 ≠ D, which
  Appendix F's P_GQA allows); a choice, the paper does not say.
"""

from rcswarm.models.chaingpt.attention import SGSA
from rcswarm.models.chaingpt.config import ChainGPTConfig
from rcswarm.models.chaingpt.model import (
    AdaptiveOutput,
    ChainGPT,
    last_position_entropy,
)
from rcswarm.models.chaingpt.params import parameter_count_formula
from rcswarm.models.chaingpt.presets import PRESETS
from rcswarm.models.chaingpt.state import RWKVProduct
from rcswarm.models.registry import ModelEntry, register

register(
    ModelEntry(
        name="chaingpt",
        config_cls=ChainGPTConfig,
        build=ChainGPT,
        presets=PRESETS,
        description="ChainGPT: RWKV-Product + SGSA Chain-Blocks with recurrent depth and adaptive stopping.",
    )
)

__all__ = [
    "PRESETS", "SGSA", "AdaptiveOutput", "ChainGPT", "ChainGPTConfig", "RWKVProduct",
    "last_position_entropy", "parameter_count_formula",
]
