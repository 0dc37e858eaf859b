"""RWKV-Product state layer (ChainGPT, Section 3.2 and Appendix D.1).

Per token t, with h̃_t = h_{t-1} (0 at t = 1) and Δh_t = h̃_t - h_t, token shift gives
x^• = h + Δh ⊙ μ^• for • ∈ {r, w, k, v, α, g}; then

    R = W_r x^r,   K^0 = W_k x^k,   V^0 = W_v x^v
    W = -softplus(-(w_0 + tanh(x^w w_1) w_2)) - 0.5
    for each substep j = 0 .. M-1:
        K^b_j = K^0 + x^k A^b_j B^b_j,     K^c_j = K^0 + x^k A^c_j B^c_j
        β^b_j = σ(α^b_0,j + (x^α α^b_1,j) α^b_2,j),   β^c_j likewise (α_0,j shared by default)
        k̂^c_j = K^c_j ⊙ (1 + (β^c_j - 1) k^{ac})
        b^-_j = -K^b_j / ‖K^b_j‖,   b^+_j = K^b_j / ‖K^b_j‖ ⊙ β^b_j     (per head)
        V_j = V^0 + x^v A^v_j B^v_j                                      (Eq. 7)

and `rwkv_product_substeps(r=R, w_raw=W, k=k̂^c, v=V, a=b^-, b=b^+)` runs, per head,
S ← S diag(w) + (S a) bᵀ + v kᵀ = S (diag(w) - κ (κ ⊙ β^b)ᵀ) + v k̂ᵀ with κ = K^b/‖K^b‖:
the paper's call RUN_CUDA_RWKV7g(r, w, k̂^c, v, b^-, b^+) in the kernel's argument order, so
each substep's transition is diag(a_{t,j}) - β^b_j κ κᵀ of Eq. (2) up to the side β^b sits on
(RWKV-7 puts it on the right factor, as here). The decay applies at substep 0 only and R is
read at the last substep (the kernel's substep expansion does both).

Decay mapping. The paper's W is the RWKV-7 log-log decay: RUN_CUDA_RWKV7g multiplies the
state by exp(-exp(W)). The kernel uses the same convention, w = exp(-exp(w_raw)), so
w_raw = W exactly. Since W ∈ (-∞, -0.5], the decay w = exp(-exp(W)) lies in
[exp(-e^{-1/2}), 1) ≈ [0.545, 1) (RWKV-7, Peng et al. 2025, Section 4).

Output: GroupNorm over heads of the last substep's y, plus the bonus
Σ_h (r·k̂·r_k)_h v_h of the last substep, times the gate σ(x^g g_1) g_2, then W_o.

With M = 1 this is an RWKV-7 time-mix (Peng et al. 2025) with the replacement key κ taken
from its own LoRA path (K^b) instead of K ⊙ k_k, the in-context rate a = β^b, and the value
LoRA added to V^0 instead of RWKV-7's value-residual interpolation.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.kernels.rwkv_product import rwkv_product_substeps
from rcswarm.models.chaingpt.config import ChainGPTConfig
from rcswarm.models.precision import in_float32

MIX_NAMES = ("r", "w", "k", "v", "a", "g")


def token_shift(h: Tensor) -> Tensor:
    """h̃ - h with h̃_t = h_{t-1}, h̃_1 = 0: [B, T, D] -> [B, T, D]."""
    shifted = F.pad(h, (0, 0, 1, -1))  # [B, T, D]
    return shifted - h


def low_rank(x: Tensor, down: Tensor, up: Tensor) -> Tensor:
    """Per-substep LoRA x A_j B_j: x [B, T, D], down [M, D, r], up [M, r, D] -> [B, T, M, D]."""
    hidden = torch.einsum("btd,mdr->btmr", x, down)  # [B, T, M, r]
    return torch.einsum("btmr,mre->btme", hidden, up)  # [B, T, M, D]


def decay_log_log(x_w: Tensor, w0: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """W = -softplus(-(w_0 + tanh(x w_1) w_2)) - 0.5, the kernel's w_raw: [B, T, D]."""
    return -F.softplus(-(w0 + torch.tanh(x_w @ w1) @ w2)) - 0.5


class RWKVProduct(nn.Module):
    """The state layer: h [B, T, D] -> s [B, T, D]."""

    def __init__(self, config: ChainGPTConfig) -> None:
        super().__init__()
        d, m = config.d_model, config.substeps
        self.heads = d // config.rwkv_head_dim
        self.head_dim = config.rwkv_head_dim
        self.substeps = m
        self.chunk_size = config.kernel_chunk_size
        self.naive = config.naive_kernels
        self.mix = nn.ParameterDict({name: nn.Parameter(torch.empty(d)) for name in MIX_NAMES})
        self.receptance = nn.Linear(d, d, bias=False)
        self.key = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(d, d, bias=False)
        self.output = nn.Linear(d, d, bias=False)
        self.w0 = nn.Parameter(torch.empty(d))
        self.w1 = nn.Parameter(torch.empty(d, config.decay_rank))
        self.w2 = nn.Parameter(torch.empty(config.decay_rank, d))
        self.g1 = nn.Parameter(torch.empty(d, config.gate_rank))
        self.g2 = nn.Parameter(torch.empty(config.gate_rank, d))
        self.key_b_down, self.key_b_up = self._lora_pair(m, d, config.lora_rank)
        self.key_c_down, self.key_c_up = self._lora_pair(m, d, config.lora_rank)
        self.value_down, self.value_up = self._lora_pair(m, d, config.lora_rank)
        self.step_bias_b = nn.Parameter(torch.empty(m, d))
        self.step_bias_c = None if config.share_step_bias else nn.Parameter(torch.empty(m, d))
        self.beta_b_down, self.beta_b_up = self._lora_pair(m, d, config.a_rank)
        self.beta_c_down, self.beta_c_up = self._lora_pair(m, d, config.a_rank)
        self.k_ac = nn.Parameter(torch.empty(d))
        self.r_k = nn.Parameter(torch.empty(self.heads, self.head_dim))
        self.norm = nn.GroupNorm(self.heads, d, eps=1e-5 * self.head_dim)
        self.reset_parameters()

    @staticmethod
    def _lora_pair(m: int, d: int, rank: int) -> tuple[nn.Parameter, nn.Parameter]:
        return nn.Parameter(torch.empty(m, d, rank)), nn.Parameter(torch.empty(m, rank, d))

    def reset_parameters(self) -> None:
        d = self.heads * self.head_dim
        ramp = torch.arange(d, dtype=torch.float32) / max(d - 1, 1)  # [D] in [0, 1]
        with torch.no_grad():
            for index, name in enumerate(MIX_NAMES):
                self.mix[name].copy_(1.0 - ramp ** (0.2 + 0.1 * index))
            for linear in (self.receptance, self.key, self.value, self.output):
                nn.init.normal_(linear.weight, std=d**-0.5)
            self.w0.copy_(-6.0 + 7.0 * ramp)
            for down, up in (
                (self.w1, self.w2), (self.g1, self.g2), (self.key_b_down, self.key_b_up),
                (self.key_c_down, self.key_c_up), (self.value_down, self.value_up),
                (self.beta_b_down, self.beta_b_up), (self.beta_c_down, self.beta_c_up),
            ):
                nn.init.normal_(down, std=d**-0.5)
                nn.init.normal_(up, std=0.1 * down.shape[-1] ** -0.5)
            nn.init.normal_(self.g2, std=self.g2.shape[0] ** -0.5)
            self.step_bias_b.zero_()
            if self.step_bias_c is not None:
                self.step_bias_c.zero_()
            self.k_ac.fill_(1.0)
            self.r_k.fill_(-0.04)

    def _heads(self, x: Tensor) -> Tensor:
        """[..., D] -> [..., H, d_h]."""
        return x.unflatten(-1, (self.heads, self.head_dim))

    def substep_inputs(self, h: Tensor) -> dict[str, Tensor]:
        """All kernel inputs and the gate from h [B, T, D] (Appendix D.1, before the kernel)."""
        delta = token_shift(h)  # [B, T, D]
        x = {name: h + delta * self.mix[name] for name in MIX_NAMES}  # each [B, T, D]
        receptance = self.receptance(x["r"])  # [B, T, D]
        decay = decay_log_log(x["w"], self.w0, self.w1, self.w2)  # [B, T, D]
        key0 = self.key(x["k"])[:, :, None]  # [B, T, 1, D]
        value0 = self.value(x["v"])[:, :, None]  # [B, T, 1, D]
        key_b = key0 + low_rank(x["k"], self.key_b_down, self.key_b_up)  # [B, T, M, D]
        key_c = key0 + low_rank(x["k"], self.key_c_down, self.key_c_up)  # [B, T, M, D]
        bias_c = self.step_bias_b if self.step_bias_c is None else self.step_bias_c  # [M, D]
        beta_b = torch.sigmoid(self.step_bias_b + low_rank(x["a"], self.beta_b_down, self.beta_b_up))
        beta_c = torch.sigmoid(bias_c + low_rank(x["a"], self.beta_c_down, self.beta_c_up))
        key_hat = key_c * (1.0 + (beta_c - 1.0) * self.k_ac)  # [B, T, M, D]
        kappa = F.normalize(self._heads(key_b), dim=-1, eps=1e-12)  # [B, T, M, H, d_h]
        value = value0 + low_rank(x["v"], self.value_down, self.value_up)  # [B, T, M, D]
        gate = torch.sigmoid(x["g"] @ self.g1) @ self.g2  # [B, T, D]
        return {
            "r": self._heads(receptance),  # [B, T, H, d_h]
            "w_raw": self._heads(decay),  # [B, T, H, d_h]
            "k": self._heads(key_hat),  # [B, T, M, H, d_h]
            "v": self._heads(value),  # [B, T, M, H, d_h]
            "a": -kappa,  # [B, T, M, H, d_h]
            "b": kappa * self._heads(beta_b),  # [B, T, M, H, d_h]
            "gate": gate,
        }

    def forward(self, h: Tensor) -> Tensor:
        batch, length, d = h.shape  # [B, T, D]
        inputs = self.substep_inputs(h)
        y, _ = in_float32(  # the kernel takes one dtype; under autocast its inputs come in bf16 and float32
            partial(rwkv_product_substeps, chunk_size=self.chunk_size, naive=self.naive),
            inputs["r"], inputs["w_raw"], inputs["k"], inputs["v"], inputs["a"], inputs["b"],
        )  # [B, T, H, d_h]
        normed = self.norm(y.reshape(batch * length, d)).view(batch, length, d)  # [B, T, D]
        k_last, v_last = inputs["k"][:, :, -1], inputs["v"][:, :, -1]  # [B, T, H, d_h]
        weight = (inputs["r"] * k_last * self.r_k).sum(-1, keepdim=True)  # [B, T, H, 1]
        bonus = (weight * v_last).reshape(batch, length, d)  # [B, T, D]
        return self.output((normed + bonus) * inputs["gate"])
