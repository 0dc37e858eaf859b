"""State-guided sparse attention layer with scaled RoPE and GQA (ChainGPT, Appendix D.2).

Q = X W_q, K = X W_k, V = X W_v with H_q query and H_kv key/value heads of size d_h. Q and K
get a per-head RMSNorm (QK-norm, the 2 d_h of Appendix F's P_GQA) and rotary position
encoding on the pairs (2i, 2i+1), i = 0 .. d_h/2 - 1, with the frequency-dependent scaling of
D.2:

    θ_t^(i) = t / base^{2i/d_h},   f = i / (d_h/2),   β(f) = β_slow + (β_fast - β_slow) f,
    n_s = 1 + (α - 1) / β(f),      θ̃_t^(i) = θ_t^(i) / n_s

(α = 1 is plain RoPE). `sgsa_attention` then attends causally over the window W and the
anchors j mod G = G - 1, with key/value heads shared by groups of H_q / H_kv query heads,
scale 1/√d_h; the heads are concatenated and projected by W_o.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.kernels.sgsa import sgsa_attention
from rcswarm.models.chaingpt.config import ChainGPTConfig


def rope_inverse_frequencies(head_dim: int, base: float, alpha: float, beta_slow: float, beta_fast: float) -> Tensor:
    """Scaled inverse frequencies 1 / (base^{2i/d} n_s(i)): [d_h / 2] float64."""
    half = head_dim // 2
    index = torch.arange(half, dtype=torch.float64)  # [d_h/2]
    fraction = index / half
    beta = beta_slow + (beta_fast - beta_slow) * fraction
    scale = 1.0 + (alpha - 1.0) / beta  # n_s
    return 1.0 / (base ** (2.0 * index / head_dim) * scale)


def apply_rope(x: Tensor, inverse_frequencies: Tensor) -> Tensor:
    """Rotate pairs (2i, 2i+1) of x [B, H, T, d_h] by angle t θ̃^(i), t = 0 .. T-1."""
    length = x.shape[2]
    positions = torch.arange(length, dtype=torch.float64, device=x.device)  # [T]
    angles = positions[:, None] * inverse_frequencies.to(x.device)[None, :]  # [T, d_h/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # [B, H, T, d_h/2]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.flatten(-2)  # [B, H, T, d_h]


class SGSA(nn.Module):
    """The attention layer: x [B, T, D] -> [B, T, D]."""

    def __init__(self, config: ChainGPTConfig) -> None:
        super().__init__()
        d, dh = config.d_model, config.attn_head_dim
        self.q_heads, self.kv_heads, self.head_dim = config.query_heads, config.n_kv_heads, dh
        self.window, self.anchor_stride = config.window, config.anchor_stride
        self.naive = config.naive_kernels
        self.eps = config.norm_eps
        self.query = nn.Linear(d, self.q_heads * dh, bias=False)
        self.key = nn.Linear(d, self.kv_heads * dh, bias=False)
        self.value = nn.Linear(d, self.kv_heads * dh, bias=False)
        self.output = nn.Linear(self.q_heads * dh, d, bias=False)
        self.q_norm = nn.Parameter(torch.ones(dh))
        self.k_norm = nn.Parameter(torch.ones(dh))
        frequencies = rope_inverse_frequencies(
            dh, config.rope_base, config.rope_alpha, config.rope_beta_slow, config.rope_beta_fast
        )
        self.register_buffer("inverse_frequencies", frequencies, persistent=False)
        for linear in (self.query, self.key, self.value, self.output):
            nn.init.normal_(linear.weight, std=linear.in_features**-0.5)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        """[B, T, heads·d_h] -> [B, heads, T, d_h]."""
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def _norm(self, heads: Tensor, weight: Tensor) -> Tensor:
        """QK-norm of [B, H, T, d_h] with the weight in the input's dtype: under bf16 autocast the projections
        arrive in bf16, and a float32 weight beside them keeps PyTorch off its fused kernel (seen on an H100)."""
        return F.rms_norm(heads, (self.head_dim,), weight.to(heads.dtype), self.eps)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape  # [B, T, D]
        q = self._norm(self._split(self.query(x), self.q_heads), self.q_norm)  # [B, H_q, T, d_h]
        k = self._norm(self._split(self.key(x), self.kv_heads), self.k_norm)  # [B, H_kv, T, d_h]
        v = self._split(self.value(x), self.kv_heads)  # [B, H_kv, T, d_h]
        q = apply_rope(q, self.inverse_frequencies)  # [B, H_q, T, d_h]
        k = apply_rope(k, self.inverse_frequencies)  # [B, H_kv, T, d_h]
        # Where CUDA autocast runs rms_norm in float32 (some versions' policy), q, k come in float32 beside a bf16 v:
        # one dtype, v's, for the kernel.
        q, k = q.to(v.dtype), k.to(v.dtype)
        attended = sgsa_attention(q, k, v, self.window, self.anchor_stride, naive=self.naive)  # [B, H_q, T, d_h]
        return self.output(attended.transpose(1, 2).reshape(batch, length, -1))
