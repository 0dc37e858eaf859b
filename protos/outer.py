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


def reusable(spare: Mapping[str, torch.Tensor] | None, name: str, like: torch.Tensor) -> torch.Tensor | None:
    """`spare[name]` when it can hold a result shaped like `like` (same shape and dtype, contiguous), else None.

    A spare is a buffer its owner gave up (a previous version's tensor nobody reads any more); writing a
    result into it instead of a fresh tensor gives the same values without touching fresh memory.
    """
    candidate = None if spare is None else spare.get(name)
    if candidate is None or candidate.shape != like.shape or candidate.dtype != like.dtype:
        return None
    if not candidate.is_contiguous() or candidate.data_ptr() == like.data_ptr():
        return None
    return candidate


def outer_step(
    params: Mapping[str, torch.Tensor],
    momentum: Mapping[str, torch.Tensor],
    average_delta: Mapping[str, torch.Tensor],
    options: OuterOptions,
    *,
    spare_momentum: Mapping[str, torch.Tensor] | None = None,
    consume_average: bool = False,
) -> tuple[Tensors, Tensors]:
    """One SGD(momentum, Nesterov) step; returns new (params, momentum) without touching θ or b.

    The same float operations as ``θ − η (Δ̄ + μ (μ b + Δ̄))``, done in place: the new momentum and
    the new parameters are fresh tensors (but see below), the direction a view of one work buffer per dtype (the size
    of the largest tensor) reused by every tensor; inputs of one dtype per tensor.

    Buffers a caller gives up save fresh memory, with the same values: the new momentum is written into
    `spare_momentum` (a previous momentum nobody reads; `reusable` says which tensors fit), and with
    `consume_average` the new parameters are written over `average_delta` (each tensor once its step is
    computed), which the caller must not read afterwards.
    """
    new_params: Tensors = {}
    new_momentum: Tensors = {}
    largest = max((theta.numel() for theta in params.values()), default=0)
    spare: dict[torch.dtype, torch.Tensor] = {}
    for name, theta in params.items():
        grad = average_delta[name]
        into = reusable(spare_momentum, name, momentum[name])
        buf = (momentum[name] * options.momentum if into is None
               else torch.mul(momentum[name], options.momentum, out=into)).add_(grad)
        if buf.dtype not in spare:
            spare[buf.dtype] = torch.empty(largest, dtype=buf.dtype)  # [largest]
        work = spare[buf.dtype][: buf.numel()].view(buf.shape)  # [*shape]
        if options.nesterov:
            direction = torch.mul(buf, options.momentum, out=work).add_(grad).mul_(options.lr)
        else:
            direction = torch.mul(buf, options.lr, out=work)
        overwrite = consume_average and grad.is_contiguous() and grad.shape == theta.shape and grad.dtype == theta.dtype
        new_params[name] = torch.sub(theta, direction, out=grad) if overwrite else theta - direction
        new_momentum[name] = buf
    return new_params, new_momentum
