"""ChainGPTConfig: the hyperparameters of ChainGPT, validated on construction.

Names follow ChainGPT (Zheng et al.), Table 7 and Appendix F:

- `rwkv_head_dim` ("RWKV head dim"), `attn_head_dim` ("GQA head dim", d_h), `n_kv_heads`
  ("KV heads", H_kv), `n_q_heads` (H_q; None = d_model / attn_head_dim, so H_q d_h = D).
- `a_rank` ("A_low_rank_dim", D_AAA), `decay_rank` ("Decay_low_rank_dim", D_DEC), `gate_rank`
  ("Gate_low_rank_dim", D_GATE), `lora_rank` ("M_rank_dim", r), `substeps` (M).
- `recur_iters` ("Recursive iters", n_0 + n_k), `grad_iters` ("Grad-enabled iters", n_k),
  1 <= grad_iters <= recur_iters: with none, every core iteration would run under no_grad and
  the embedding, bottom blocks, adapter, core and core norm would never get a gradient.
- `layer_division` ("C121", "C141": bottom / core / top Chain-Block counts).
- `window` (W) and `anchor_stride` (G) of SGSA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rcswarm.models.validation import (
    check_bool,
    check_choice,
    check_int,
    check_ints,
    check_optional_int,
    check_positive_float,
)

DEPTH_SAMPLINGS = ("fixed", "uniform")
_DIVISION = re.compile(r"^C(\d)(\d)(\d)$")


@dataclass
class ChainGPTConfig:
    vocab_size: int = 256
    # Output classes of the head; None = vocab_size (next-token prediction).
    num_classes: int | None = None
    d_model: int = 64
    d_mlp: int = 256
    rwkv_head_dim: int = 16
    attn_head_dim: int = 16
    n_q_heads: int | None = None
    n_kv_heads: int = 2
    substeps: int = 2
    lora_rank: int = 8
    decay_rank: int = 8
    gate_rank: int = 16
    a_rank: int = 8
    # True: one step-size bias alpha_0,j per substep for both paths (Section 3.2, Eqs. 8-9);
    # False: separate alpha^b_0,j and alpha^c_0,j (Appendix D.1; Appendix F's (2M + 11) D).
    share_step_bias: bool = True
    layer_division: str = "C121"
    recur_iters: int = 4
    grad_iters: int = 2
    depth_sampling: str = "fixed"
    window: int = 512
    anchor_stride: int = 64
    rope_base: float = 10000.0
    # Frequency-dependent RoPE scaling of Appendix D.2; rope_alpha = 1 is plain RoPE.
    rope_alpha: float = 1.0
    rope_beta_slow: float = 1.0
    rope_beta_fast: float = 32.0
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    kernel_chunk_size: int = 16
    naive_kernels: bool = False

    def __post_init__(self) -> None:
        positive = (
            "vocab_size", "d_model", "d_mlp", "rwkv_head_dim", "attn_head_dim", "n_kv_heads",
            "substeps", "lora_rank", "decay_rank", "gate_rank", "a_rank", "recur_iters",
            "window", "anchor_stride", "kernel_chunk_size",
        )
        check_ints(self, positive)
        for name in ("num_classes", "n_q_heads"):
            check_optional_int(self, name)
        for name in ("share_step_bias", "tie_embeddings", "naive_kernels"):
            check_bool(self, name)
        self._check_heads()
        self._check_depth()
        self._check_positive_floats()
        if self.tie_embeddings and self.output_classes != self.vocab_size:
            raise ValueError(
                f"ChainGPTConfig.tie_embeddings={self.tie_embeddings!r}: expected False when "
                f"num_classes={self.num_classes} differs from vocab_size={self.vocab_size}"
            )

    def _check_heads(self) -> None:
        if self.d_model % self.rwkv_head_dim:
            raise ValueError(
                f"ChainGPTConfig.rwkv_head_dim={self.rwkv_head_dim}: expected a divisor of d_model={self.d_model}"
            )
        if self.attn_head_dim % 2:
            raise ValueError(f"ChainGPTConfig.attn_head_dim={self.attn_head_dim}: expected an even int (RoPE pairs)")
        if self.n_q_heads is None and self.d_model % self.attn_head_dim:
            raise ValueError(
                f"ChainGPTConfig.attn_head_dim={self.attn_head_dim}: expected a divisor of "
                f"d_model={self.d_model} when n_q_heads is None"
            )
        if self.query_heads % self.n_kv_heads:
            raise ValueError(
                f"ChainGPTConfig.n_kv_heads={self.n_kv_heads}: expected a divisor of the "
                f"query heads ({self.query_heads})"
            )

    def _check_depth(self) -> None:
        if not isinstance(self.layer_division, str) or not _DIVISION.match(self.layer_division):
            raise ValueError(
                f"ChainGPTConfig.layer_division={self.layer_division!r}: expected 'C' and three "
                "digits (bottom, core, top blocks), e.g. 'C121' or 'C141'"
            )
        if self.division[1] < 1:
            raise ValueError(
                f"ChainGPTConfig.layer_division={self.layer_division!r}: expected at least one core block"
            )
        check_int(self, "grad_iters")
        if self.grad_iters > self.recur_iters:
            raise ValueError(
                f"ChainGPTConfig.grad_iters={self.grad_iters}: expected <= recur_iters={self.recur_iters}"
            )
        check_choice(self, "depth_sampling", DEPTH_SAMPLINGS)

    def _check_positive_floats(self) -> None:
        for name in ("rope_base", "rope_alpha", "rope_beta_slow", "rope_beta_fast", "norm_eps"):
            check_positive_float(self, name)

    @property
    def output_classes(self) -> int:
        return self.num_classes or self.vocab_size

    @property
    def query_heads(self) -> int:
        return self.n_q_heads if self.n_q_heads is not None else self.d_model // self.attn_head_dim

    @property
    def division(self) -> tuple[int, int, int]:
        """(bottom, core, top) Chain-Block counts parsed from `layer_division`."""
        match = _DIVISION.match(self.layer_division)
        assert match is not None
        bottom, core, top = (int(group) for group in match.groups())
        return bottom, core, top
