"""Named presets of ChainGPT: "tiny" and "small" for tests and CPU diagnostics, and Table 7's rows.

"180m", "0.5b", "1.5b" follow Table 7 of the ChainGPT paper (vocabulary 65536 and D_m = 4D are
choices, the paper does not state them); the package docstring lists every preset.
"""

from __future__ import annotations


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
