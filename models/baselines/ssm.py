"""Diagonal selective state-space (Mamba-like) baseline, registered as "ssm".

    embedding -> n_layers residual blocks  x = x + Mixer(LN(x))  -> LN -> linear head

Each mixer follows the selective SSM block of Gu & Dao 2023, "Mamba:
Linear-Time Sequence Modeling with Selective State Spaces" (arXiv:2312.00752,
Sec. 3.2 Algorithm 2 and Sec. 3.4 Fig. 3), in plain PyTorch:

    x, z   = split(in_proj(u))                          # E = expand * d_model channels each
    x      = SiLU(causal depthwise conv(x))             # kernel d_conv
    Δ      = softplus(dt_proj(W_Δ x))                   # [E] per step, input-dependent
    B, C   = W_B x, W_C x                               # [N] per step, input-dependent
    A      = -exp(A_log)                                # diagonal, [E, N], constant
    h_t    = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t         # [E, N]
    y_t    = C_t · h_t + D ⊙ x_t                        # [E]
    out    = out_proj(y ⊙ SiLU(z))

(Δ B x is the simplified zero-order-hold input term used by Mamba.) The
recurrence is linear in h, so it can be evaluated either by a sequential loop
over time (`scan="sequential"`) or by a Hillis-Steele parallel prefix scan of
the affine maps h -> a h + b (`scan="parallel"`, log2(T) doubling steps; see
Yau et al., "Sequential-Parallel Duality in Prefix-Scannable Models", Table 1
and Lemma 3.4 for the associative operator). Both give the same result up to
float rounding. The loop runs T small steps (the faster choice on a CPU); the
prefix scan runs log2(T) steps over whole [B, T, E, N] tensors and keeps one
such tensor per step for the backward pass.

Streaming: `init_state(batch_size)` gives zero conv buffers and SSM states;
`step(tokens, state)` and `forward(inputs, state)` continue from it and
advance it in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.baselines.common import (
    BlockStack,
    check_state_batch,
    check_tokens,
)
from rcswarm.models.baselines.config import SSMConfig
from rcswarm.models.init import init_linear, init_norm
from rcswarm.models.inputs import check_inputs


@dataclass
class SSMState:
    """Streaming state of all layers.

    conv[i]: [B, E, d_conv - 1], the last mixer inputs of layer i before the
    convolution; ssm[i]: [B, E, N], the state h of layer i.
    """

    conv: list[Tensor]
    ssm: list[Tensor]

    @property
    def batch_size(self) -> int:
        return self.ssm[0].shape[0]


def sequential_scan(decay: Tensor, drive: Tensor, h0: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Readouts y_t = sum_n c_t h_t of h_t = decay_t * h_{t-1} + drive_t, by a loop.

    decay, drive: [B, T, E, N]; h0: [B, E, N]; c: [B, T, N].
    Returns y [B, T, E] and the last state h_T [B, E, N].
    """
    h = h0  # [B, E, N]
    ys = []
    for decay_t, drive_t, c_t in zip(decay.unbind(1), drive.unbind(1), c.unbind(1)):
        h = torch.addcmul(drive_t, decay_t, h)  # [B, E, N]
        ys.append(torch.bmm(h, c_t[:, :, None])[..., 0])  # [B, E]
    return torch.stack(ys, dim=1), h  # [B, T, E], [B, E, N]


def parallel_scan(decay: Tensor, drive: Tensor, h0: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The same as `sequential_scan`, by a Hillis-Steele inclusive prefix scan.

    Element t is the affine map h -> decay_t h + drive_t; composing map s
    before map t gives (decay_t decay_s, decay_t drive_s + drive_t), an
    associative operator, so log2(T) doubling steps give all prefixes.
    """
    a = decay  # [B, T, E, N]
    b = torch.cat((drive[:, :1] + decay[:, :1] * h0[:, None], drive[:, 1:]), dim=1)  # [B, T, E, N]
    offset = 1
    while offset < a.shape[1]:
        b = torch.cat((b[:, :offset], a[:, offset:] * b[:, :-offset] + b[:, offset:]), dim=1)
        a = torch.cat((a[:, :offset], a[:, offset:] * a[:, :-offset]), dim=1)
        offset *= 2
    y = torch.einsum("bten,btn->bte", b, c)  # [B, T, E]
    return y, b[:, -1]  # [B, T, E], [B, E, N]


class SelectiveSSM(nn.Module):
    """The Mamba-like mixer: gated, convolved, input-selective diagonal SSM."""

    def __init__(self, config: SSMConfig) -> None:
        super().__init__()
        self.config = config
        d, e, n, r = config.d_model, config.d_inner, config.d_state, config.resolved_dt_rank
        self.in_proj = nn.Linear(d, 2 * e, bias=False)
        self.conv = nn.Conv1d(e, e, kernel_size=config.d_conv, groups=e)
        self.x_proj = nn.Linear(e, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, e)
        self.A_log = nn.Parameter(torch.empty(e, n))
        self.D = nn.Parameter(torch.empty(e))
        self.out_proj = nn.Linear(e, d, bias=False)

    def reset_parameters(self, out_std: float) -> None:
        """Mamba-style initialization (Gu & Dao 2023), from the global RNG.

        A = -(1, ..., N) per channel (S4D-real); D = 1; dt_proj bias such that
        softplus(bias) is log-uniform in [dt_min, dt_max], its weight
        uniform(+-dt_rank^-0.5); conv: PyTorch's default uniform; in_proj and
        x_proj normal(0, 0.02); out_proj normal(0, out_std).
        """
        config = self.config
        e, n, r = config.d_inner, config.d_state, config.resolved_dt_rank
        init_linear(self.in_proj, 0.02)
        self.conv.reset_parameters()
        init_linear(self.x_proj, 0.02)
        nn.init.uniform_(self.dt_proj.weight, -(r**-0.5), r**-0.5)
        log_dt = torch.rand(e) * (math.log(config.dt_max) - math.log(config.dt_min))
        dt = torch.exp(log_dt + math.log(config.dt_min))  # [E]
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
            self.A_log.copy_(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(e, 1))
            self.D.fill_(1.0)
        init_linear(self.out_proj, out_std)

    def forward(
        self, u: Tensor, conv_state: Tensor, h0: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Mixer output [B, T, D] for u [B, T, D] continuing from conv_state and h0.

        conv_state: [B, E, d_conv - 1]; h0: [B, E, N]. Returns the output and
        the new conv_state and h.
        """
        config = self.config
        n, r = config.d_state, config.resolved_dt_rank
        x, z = self.in_proj(u).chunk(2, dim=-1)  # 2 x [B, T, E]
        padded = torch.cat((conv_state, x.transpose(1, 2)), dim=2)  # [B, E, K - 1 + T]
        new_conv_state = padded[:, :, padded.shape[2] - (config.d_conv - 1) :]  # [B, E, K - 1]
        x = F.silu(self.conv(padded)).transpose(1, 2)  # [B, T, E]
        dt_low, b, c = self.x_proj(x).split((r, n, n), dim=-1)  # [B, T, R], 2 x [B, T, N]
        delta = F.softplus(self.dt_proj(dt_low))  # [B, T, E]
        a = -torch.exp(self.A_log)  # [E, N]
        decay = torch.exp(delta[..., None] * a)  # [B, T, E, N]
        drive = (delta * x)[..., None] * b[:, :, None, :]  # [B, T, E, N]
        scan = parallel_scan if config.scan == "parallel" else sequential_scan
        y, h = scan(decay, drive, h0, c)  # [B, T, E], [B, E, N]
        y = (y + self.D * x) * F.silu(z)  # [B, T, E]
        return self.out_proj(y), new_conv_state, h


class SSMBlock(nn.Module):
    """Pre-LN residual block x + Mixer(LN(x))."""

    def __init__(self, config: SSMConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.mixer = SelectiveSSM(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, conv_state: Tensor, h0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        m, conv_state, h = self.mixer(self.norm(x), conv_state, h0)  # [B, T, D]
        return x + self.dropout(m), conv_state, h


class SSMModel(BlockStack):
    """Stack of selective-SSM blocks with a linear head to `config.out_dim`."""

    def __init__(self, config: SSMConfig) -> None:
        super().__init__(config, SSMConfig, SSMBlock)

    def reset_parameters(self) -> None:
        """Initialize every parameter from the global torch RNG.

        Embedding and head weight: normal(0, 0.02), head bias zero; LayerNorms
        weight 1, bias 0; mixers as `SelectiveSSM.reset_parameters` with the
        output projection's std 0.02 / sqrt(n_layers).
        """
        nn.init.normal_(self.embed.weight, mean=0.0, std=0.02)
        out_std = 0.02 / math.sqrt(self.config.n_layers)
        for block in self.blocks:
            init_norm(block.norm)
            block.mixer.reset_parameters(out_std)
        init_norm(self.norm_out)
        init_linear(self.head, 0.02)

    def init_state(self, batch_size: int) -> SSMState:
        """Zero state for `batch_size` sequences, on the device and dtype of the parameters."""
        config = self.config
        weight = self.head.weight
        conv_shape = (batch_size, config.d_inner, config.d_conv - 1)
        ssm_shape = (batch_size, config.d_inner, config.d_state)
        return SSMState(
            conv=[
                torch.zeros(conv_shape, dtype=weight.dtype, device=weight.device)
                for _ in range(config.n_layers)
            ],
            ssm=[
                torch.zeros(ssm_shape, dtype=weight.dtype, device=weight.device)
                for _ in range(config.n_layers)
            ],
        )

    def forward(self, inputs: Tensor, state: SSMState | None = None) -> Tensor:
        """Logits [B, T, out_dim] for token ids `inputs` [B, T].

        With `state`, the sequence continues from it and `state` is advanced
        past `inputs`; without, it starts from zeros.
        """
        check_inputs(inputs)
        if state is None:
            run_state = self.init_state(inputs.shape[0])
        else:
            check_state_batch(state.batch_size, inputs)
            run_state = state
        x = self.embed(inputs)  # [B, T, D]
        for i, block in enumerate(self.blocks):
            x, run_state.conv[i], run_state.ssm[i] = block(
                x, run_state.conv[i], run_state.ssm[i]
            )  # [B, T, D]
        return self.head(self.norm_out(x))  # [B, T, out_dim]

    def step(self, tokens: Tensor, state: SSMState) -> Tensor:
        """Logits [B, out_dim] for one token per sequence, `tokens` [B]; advances `state`."""
        check_tokens(tokens)
        return self.forward(tokens[:, None], state)[:, 0]  # [B, out_dim]
