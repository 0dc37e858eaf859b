"""The outer Nesterov step of DiLoCo, shared by both sync backends.

It is part of the protocol's definition: every backend turns the averaged pseudo-gradient Δ̄
into the next version with the same float operations, so that the coordinator's
θ_{v+1} = θ_v − decode(encode(θ_v − θ')) (coordinator/outer.py) and a hivemind peer's
θ_{v+1} = θ' (worker/hivemind_sync.py) start from the same θ'. With momentum μ and learning
rate η:

    b ← μ b + Δ̄
    θ' = θ − η (Δ̄ + μ b)    (Nesterov)      or    θ' = θ − η b    (plain momentum)

which is torch.optim.SGD's update with Δ̄ as the gradient (dampening 0, no weight decay).
`options` is anything with `lr`, `momentum` and `nesterov` (the run spec's `OuterSection`);
protos/ imports nothing else of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

Tensors = dict[str, torch.Tensor]


class OuterOptions(Protocol):
    """The outer optimizer's settings (config/runspec.OuterSection)."""

    lr: float
    momentum: float
    nesterov: bool


def outer_step(
    params: Mapping[str, torch.Tensor],
    momentum: Mapping[str, torch.Tensor],
    average_delta: Mapping[str, torch.Tensor],
    options: OuterOptions,
) -> tuple[Tensors, Tensors]:
    """One SGD(momentum, Nesterov) step; returns new (params, momentum) without touching inputs.

    The same float operations as ``θ − η (Δ̄ + μ (μ b + Δ̄))``, done in place: the new momentum and
    the new parameters are fresh tensors, the direction a view of one work buffer per dtype (the size
    of the largest tensor) reused by every tensor; inputs of one dtype per tensor.
    """
    new_params: Tensors = {}
    new_momentum: Tensors = {}
    largest = max((theta.numel() for theta in params.values()), default=0)
    spare: dict[torch.dtype, torch.Tensor] = {}
    for name, theta in params.items():
        grad = average_delta[name]
        buf = (momentum[name] * options.momentum).add_(grad)
        if buf.dtype not in spare:
            spare[buf.dtype] = torch.empty(largest, dtype=buf.dtype)  # [largest]
        work = spare[buf.dtype][: buf.numel()].view(buf.shape)  # [*shape]
        if options.nesterov:
            direction = torch.mul(buf, options.momentum, out=work).add_(grad).mul_(options.lr)
        else:
            direction = torch.mul(buf, options.lr, out=work)
        new_params[name] = theta - direction
        new_momentum[name] = buf
    return new_params, new_momentum
