"""ChainGPT: Chain-Blocks with recurrent depth (ChainGPT, Section 4 and Appendix D.3).

    H = Embed(x),   H_0 = Bottom(H)                                  [B, T, D]
    X_{t+1} = C(Core([X_t; H_0] W_a + b_a))                          X_0 = H_0
    logits = Head(Norm(Top(X_n)))

Bottom, Core and Top are stacks of Chain-Blocks (`layer_division` "C121": 1 / 2 / 1). C is
the core LayerNorm (Appendix F's P_core-norm), applied after every iteration so the no-grad
and gradient iterations are the same map. In training, n_0 iterations run under no_grad,
the state is detached, and n_k iterations run with gradients (truncated backpropagation):
`depth_sampling = "fixed"` uses n_0 = recur_iters - grad_iters, n_k = grad_iters; "uniform"
draws the total n uniformly from {1 .. recur_iters} (torch's global RNG) with
n_k = min(n, grad_iters), n_0 = n - n_k. The config keeps grad_iters >= 1, so n_k >= 1 and
every parameter is on the gradient path. In eval mode all recur_iters iterations run.

`adaptive_forward` implements the entropy-based stopping of Section 4.2: after iteration t
the last position is decoded, H_t(b) = -Σ_i p_i log(p_i + 1e-10), and sample b stops at
the first t with H_{t-k}(b) - H_t(b) ≤ τ(t), τ constant or c/√t, or at the cap.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.chaingpt.block import ChainBlock
from rcswarm.models.chaingpt.config import ChainGPTConfig
from rcswarm.models.inputs import check_inputs

THRESHOLD_SCHEDULES = ("constant", "inv_sqrt")
ENTROPY_EPS = 1e-10


class AdaptiveOutput(NamedTuple):
    """logits [B, T, V] of each sample's stopping iteration; iterations [B] (int64) used."""

    logits: Tensor
    iterations: Tensor


def last_position_entropy(logits: Tensor) -> Tensor:
    """H(b) = -Σ_i p_i log(p_i + ε) of logits[:, -1]: [B, T, V] -> [B] (Eq. 11)."""
    probabilities = torch.softmax(logits[:, -1].double(), dim=-1)  # [B, V]
    return -(probabilities * torch.log(probabilities + ENTROPY_EPS)).sum(-1)


class ChainGPT(nn.Module):
    """inputs [B, T] token ids -> logits [B, T, output_classes]."""

    def __init__(self, config: ChainGPTConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        bottom, core, top = config.division
        self.embed = nn.Embedding(config.vocab_size, d)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        self.bottom = nn.ModuleList(ChainBlock(config) for _ in range(bottom))
        self.adapter = nn.Linear(2 * d, d)
        nn.init.normal_(self.adapter.weight, std=(2 * d) ** -0.5)
        nn.init.zeros_(self.adapter.bias)
        self.core = nn.ModuleList(ChainBlock(config) for _ in range(core))
        self.core_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.top = nn.ModuleList(ChainBlock(config) for _ in range(top))
        self.final_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.head = None
        if not config.tie_embeddings:
            self.head = nn.Linear(d, config.output_classes, bias=False)
            nn.init.normal_(self.head.weight, std=d**-0.5)

    def prelude(self, inputs: Tensor) -> Tensor:
        """H_0 = Bottom(Embed(x)): [B, T] -> [B, T, D] (`check_inputs`; B = 0 gives [0, T, D])."""
        check_inputs(inputs)
        h = self.embed(inputs)  # [B, T, D]
        if inputs.shape[0] == 0:
            return h  # no sample to run the blocks on (their attention's reshapes need B >= 1)
        for block in self.bottom:
            h = block(h)
        return h

    def iterate(self, x: Tensor, h0: Tensor) -> Tensor:
        """One core iteration X_{t+1} = C(Core([X_t; H_0] W_a + b_a)): [B, T, D] -> [B, T, D]."""
        x = self.adapter(torch.cat([x, h0], dim=-1))  # [B, T, D]
        for block in self.core:
            x = block(x)
        return self.core_norm(x)

    def decode(self, x: Tensor) -> Tensor:
        """Logits Head(Norm(Top(X))): [B, T, D] -> [B, T, V]."""
        for block in self.top:
            x = block(x)
        x = self.final_norm(x)
        if self.head is None:
            return F.linear(x, self.embed.weight)
        return self.head(x)

    def depth_schedule(self) -> tuple[int, int]:
        """(n_0, n_k) for one training forward pass."""
        total, grad = self.config.recur_iters, self.config.grad_iters
        if self.config.depth_sampling == "uniform":
            total = int(torch.randint(1, total + 1, ()).item())
        with_grad = min(total, grad)
        return total - with_grad, with_grad

    def forward(self, inputs: Tensor, *, iterations: int | None = None) -> Tensor:
        """Logits [B, T, V]; `iterations` overrides the eval-mode depth (ignored in training)."""
        check_inputs(inputs)
        if self.training:
            no_grad_iters, grad_iters = self.depth_schedule()
        else:
            no_grad_iters, grad_iters = 0, self._eval_iterations(iterations)
        if inputs.shape[0] == 0:
            return self._no_sample_logits(inputs)
        h0 = self.prelude(inputs)  # [B, T, D]
        x = h0
        if no_grad_iters:
            with torch.no_grad():
                for _ in range(no_grad_iters):
                    x = self.iterate(x, h0)
            x = x.detach()
        for _ in range(grad_iters):
            x = self.iterate(x, h0)
        return self.decode(x)

    def _no_sample_logits(self, inputs: Tensor) -> Tensor:
        """Empty logits [0, T, V] for an empty batch (the attention's reshapes need B >= 1)."""
        weight = self.embed.weight if self.head is None else self.head.weight  # [V, D]
        return weight.new_empty(0, inputs.shape[1], self.config.output_classes)  # [0, T, V]

    def _eval_iterations(self, iterations: int | None) -> int:
        if iterations is None:
            return self.config.recur_iters
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
            raise ValueError(f"iterations={iterations!r}: expected a non-negative int or None")
        return iterations

    @torch.no_grad()
    def adaptive_forward(
        self,
        inputs: Tensor,
        *,
        max_iterations: int | None = None,
        threshold: float = 1e-3,
        schedule: str = "constant",
        interval: int = 1,
    ) -> AdaptiveOutput:
        """Entropy-based adaptive depth per sample (Section 4.2), under no_grad.

        Sample b stops after iteration t (1-based, t > interval) once
        H_{t-interval}(b) - H_t(b) ≤ τ(t), with τ(t) = threshold ("constant") or
        threshold / √t ("inv_sqrt"); otherwise at `max_iterations` (default recur_iters).
        Returns each sample's logits at its stopping iteration and the iterations used.
        """
        cap = self.config.recur_iters if max_iterations is None else max_iterations
        _check_adaptive_arguments(cap, threshold, schedule, interval)
        check_inputs(inputs)
        if inputs.shape[0] == 0:
            no_iterations = torch.empty(0, dtype=torch.int64, device=inputs.device)  # [0]
            return AdaptiveOutput(self._no_sample_logits(inputs), no_iterations)
        h0 = self.prelude(inputs)  # [B, T, D]
        batch = h0.shape[0]
        x = h0
        active = torch.arange(batch, device=h0.device)  # [B_active] sample indices
        logits = torch.empty(batch, h0.shape[1], self.config.output_classes, dtype=h0.dtype, device=h0.device)
        used = torch.full((batch,), cap, dtype=torch.int64, device=h0.device)
        history: list[Tensor] = []  # H_t of the active samples, [B_active] each
        for step in range(1, cap + 1):
            x = self.iterate(x, h0[active])  # [B_active, T, D]
            step_logits = self.decode(x)  # [B_active, T, V]
            logits[active] = step_logits
            entropy = last_position_entropy(step_logits)  # [B_active]
            history.append(entropy)
            if step <= interval or step == cap:
                continue
            tau = threshold if schedule == "constant" else threshold / math.sqrt(step)
            stop = history[-1 - interval] - entropy <= tau  # [B_active]
            used[active[stop]] = step
            keep = ~stop
            active, x = active[keep], x[keep]
            history = [values[keep] for values in history]
            if active.numel() == 0:
                break
        return AdaptiveOutput(logits, used)

    generate_depth = adaptive_forward


def _check_adaptive_arguments(cap: object, threshold: object, schedule: object, interval: object) -> None:
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_iterations={cap!r}: expected a positive int or None")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold):
        raise ValueError(f"threshold={threshold!r}: expected a float (τ, or c for 'inv_sqrt')")
    if schedule not in THRESHOLD_SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {THRESHOLD_SCHEDULES}")
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"interval={interval!r}: expected a positive int (k)")
