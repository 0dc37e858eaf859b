"""The outer step of DiLoCo: token-weighted averaging of pseudo-gradients and Nesterov SGD.

Pseudo-gradients are Δ_i = θ_v − θ_i (what each worker moved away from the global
parameters). With Δ̄ = Σ_i n_i Δ_i / Σ_i n_i (n_i = tokens), momentum μ and learning rate η:

    b ← μ b + Δ̄
    θ ← θ − η (Δ̄ + μ b)    (Nesterov)      or    θ ← θ − η b    (plain momentum)

which is torch.optim.SGD's update with Δ̄ as the gradient (dampening 0, no weight decay).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from rcswarm.protos.runspec import OuterSection

Tensors = dict[str, torch.Tensor]


def weighted_average(updates: Sequence[tuple[int, Mapping[str, torch.Tensor]]]) -> Tensors:
    """Σ n_i Δ_i / Σ n_i over (tokens, deltas) pairs, accumulated in float64, in the given order."""
    if not updates:
        raise ValueError("cannot average an empty list of updates")
    total = sum(tokens for tokens, _ in updates)
    if total <= 0:
        raise ValueError(f"total tokens must be positive, got {total}")
    names = list(updates[0][1])
    average: Tensors = {}
    for name in names:
        acc = torch.zeros_like(updates[0][1][name], dtype=torch.float64)
        for tokens, deltas in updates:
            acc.add_(deltas[name].to(torch.float64), alpha=tokens / total)
        average[name] = acc.to(torch.float32)
    return average


def outer_step(
    params: Mapping[str, torch.Tensor],
    momentum: Mapping[str, torch.Tensor],
    average_delta: Mapping[str, torch.Tensor],
    options: OuterSection,
) -> tuple[Tensors, Tensors]:
    """One SGD(momentum, Nesterov) step; returns new (params, momentum) without touching inputs."""
    new_params: Tensors = {}
    new_momentum: Tensors = {}
    for name, theta in params.items():
        grad = average_delta[name]
        buf = momentum[name] * options.momentum + grad
        direction = grad + options.momentum * buf if options.nesterov else buf
        new_params[name] = theta - options.lr * direction
        new_momentum[name] = buf
    return new_params, new_momentum
