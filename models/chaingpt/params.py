"""The parameter count of ChainGPT in closed form (ChainGPT, Appendix F).

With V the vocabulary (output classes for the head), D the width, L = 2 × (Chain-Blocks)
decoder layers, L_e = ⌈L/2⌉ RWKV layers and L_o = ⌊L/2⌋ GQA layers, D_m the MLP width, M
substeps, r the LoRA rank, D_DEC, D_GATE, D_AAA the low-rank bottlenecks, H_q, H_kv, d_h
the attention heads and K = H_kv d_h:

    P_total = 2VD + (2D² + D) + 2D + L(3 D D_m + 4D) + L_e P_RWKV + L_o P_GQA
    P_RWKV  = 4D² + 2D(D_DEC + D_GATE) + 6 M D r + 4 M D D_AAA + (2M + 11) D
    P_GQA   = 2 D H_q d_h + 2 D K + 2 d_h

Adjustments Appendix F calls for ("adjust if ...") and this implementation makes:

- the embedding and head are V_in D + D V_out (V D once with `tie_embeddings`);
- with `share_step_bias` (Section 3.2's shared α_0,j) the RWKV vector term is (M + 11) D;
  Appendix F's (2M + 11) D counts separate α^b_0,j and α^c_0,j (Appendix D.1);
- the final LayerNorm before the head adds 2D (Appendix F lists only the core norm).
"""

from __future__ import annotations

from rcswarm.models.chaingpt.config import ChainGPTConfig


def rwkv_layer_parameters(config: ChainGPTConfig) -> int:
    """P_RWKV: one RWKV-Product state layer (mixer only)."""
    d, m = config.d_model, config.substeps
    vectors = (m if config.share_step_bias else 2 * m) + 11
    return (
        4 * d * d
        + 2 * d * (config.decay_rank + config.gate_rank)
        + 6 * m * d * config.lora_rank
        + 4 * m * d * config.a_rank
        + vectors * d
    )


def gqa_layer_parameters(config: ChainGPTConfig) -> int:
    """P_GQA: one SGSA attention layer (mixer only)."""
    d, dh = config.d_model, config.attn_head_dim
    kv = config.n_kv_heads * dh
    return 2 * d * config.query_heads * dh + 2 * d * kv + 2 * dh


def parameter_count_formula(config: ChainGPTConfig) -> int:
    """P_total of Appendix F with the adjustments listed in the module docstring."""
    d = config.d_model
    layers = 2 * sum(config.division)
    rwkv_layers, gqa_layers = (layers + 1) // 2, layers // 2
    embedding = config.vocab_size * d + (0 if config.tie_embeddings else d * config.output_classes)
    adapter = 2 * d * d + d
    core_norm = 2 * d
    final_norm = 2 * d
    per_layer = 3 * d * config.d_mlp + 4 * d
    return (
        embedding
        + adapter
        + core_norm
        + final_norm
        + layers * per_layer
        + rwkv_layers * rwkv_layer_parameters(config)
        + gqa_layers * gqa_layer_parameters(config)
    )
