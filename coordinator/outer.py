"""The outer step of DiLoCo: token-weighted averaging of pseudo-gradients and Nesterov SGD.

Pseudo-gradients are Δ_i = θ_v − θ_i (what each worker moved away from the global
parameters). With Δ̄ = Σ_i n_i Δ_i / Σ_i n_i (n_i = tokens), momentum μ and learning rate η:

    b ← μ b + Δ̄
    θ ← θ − η (Δ̄ + μ b)    (Nesterov)      or    θ ← θ − η b    (plain momentum)

which is torch.optim.SGD's update with Δ̄ as the gradient (dampening 0, no weight decay).

The step θ_v − θ' to the optimizer's target θ' is then sent to workers compressed with the
run's codec, with error feedback on the coordinator, and the next version is defined as
what every worker holding θ_v can rebuild bit for bit: θ_{v+1} = θ_v − decode(encode(...)).
With the fp32 codec this is θ' up to one float32 rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rcswarm.config.runspec import OuterSection
from rcswarm.protos import codec as codecs

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


def compressed_step(
    params: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    codec: int,
    block_size: int,
    error_feedback: codecs.ErrorFeedback,
) -> tuple[Tensors, dict[str, bytes]]:
    """The next version θ_v − decode(encode(θ_v − target + residual)) and the encoded step."""
    step = {name: theta - target[name] for name, theta in params.items()}
    encoded = error_feedback.compress(step, codec, block_size)
    new_params = {
        name: theta - codecs.decode(encoded[name], codec, tuple(theta.shape), block_size)
        for name, theta in params.items()
    }
    return new_params, encoded
