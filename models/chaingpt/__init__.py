"""rcswarm.models.chaingpt: ChainGPT (Zheng et al.), registered as "chaingpt".

Chain-Blocks (RWKV-Product state layer + SGSA attention layer) arranged as bottom / core /
top with recurrent depth over the core; see `model.py`, `state.py`, `attention.py`.

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
from rcswarm.models.chaingpt.rwkv7 import RWKV7, RWKV7Config
from rcswarm.models.chaingpt.state import RWKVProduct
from rcswarm.models.registry import ModelEntry, register


def _table7(d: int, kv: int, a: int, decay: int, gate: int, lora: int, iters: int, division: str) -> dict[str, object]:
    values: dict[str, object] = {
        "vocab_size": 65536, "d_model": d, "d_mlp": 4 * d, "rwkv_head_dim": 64, "attn_head_dim": 128,
        "n_kv_heads": kv, "a_rank": a, "decay_rank": decay, "gate_rank": gate, "lora_rank": lora,
        "substeps": 2, "recur_iters": iters, "grad_iters": 8, "layer_division": division,
        "window": 512, "anchor_stride": 64,
    }
    if (d // 128) % kv:
        values["n_q_heads"] = 16
    return values


PRESETS: dict[str, dict[str, object]] = {
    "tiny": {
        "vocab_size": 32, "d_model": 32, "d_mlp": 64, "rwkv_head_dim": 16, "attn_head_dim": 16,
        "n_kv_heads": 1, "substeps": 2, "lora_rank": 4, "decay_rank": 4, "gate_rank": 8, "a_rank": 4,
        "recur_iters": 3, "grad_iters": 2, "window": 8, "anchor_stride": 4, "kernel_chunk_size": 8,
    },
    "small": {
        "vocab_size": 256, "d_model": 128, "d_mlp": 512, "rwkv_head_dim": 32, "attn_head_dim": 32,
        "n_kv_heads": 2, "substeps": 2, "lora_rank": 16, "decay_rank": 16, "gate_rank": 32, "a_rank": 16,
        "recur_iters": 4, "grad_iters": 2, "window": 64, "anchor_stride": 16,
    },
    "180m": _table7(1024, 2, 64, 64, 128, 96, 12, "C121"),
    "0.5b": _table7(2048, 2, 96, 96, 256, 128, 16, "C121"),
    "1.5b": _table7(2560, 8, 128, 128, 320, 256, 16, "C141"),
}

register(
    ModelEntry(
        name="chaingpt",
        config_cls=ChainGPTConfig,
        build=ChainGPT,
        presets=PRESETS,
        description="ChainGPT: RWKV-Product + SGSA Chain-Blocks with recurrent depth and adaptive stopping.",
    )
)

register(
    ModelEntry(
        name="rwkv7",
        config_cls=RWKV7Config,
        build=RWKV7,
        presets={"tiny": {"d_model": 32, "n_layers": 2, "head_dim": 16}, "small": {"d_model": 128, "n_layers": 4, "head_dim": 32}},
        description="RWKV-7 baseline: ChainGPT's state layer with M = 1, no attention.",
    )
)

__all__ = [
    "PRESETS", "RWKV7", "RWKV7Config", "SGSA", "AdaptiveOutput", "ChainGPT", "ChainGPTConfig", "RWKVProduct",
    "last_position_entropy", "parameter_count_formula",
]
