"""The outer step of DiLoCo, shared by both sync backends: averaging, Nesterov SGD, the compressed step.

Pseudo-gradients are Δ_i = θ_v − θ_i (what each worker moved away from the global parameters).
`weighted_average` gives Δ̄ = Σ_i n_i s_i Δ_i / Σ_i n_i (n_i = tokens, s_i the aggregation's scales).
`outer_step` is part of the protocol's definition: every backend turns Δ̄ into the optimizer's
target θ' with the same float operations. With momentum μ and learning rate η:

    b ← μ b + Δ̄
    θ' = θ − η (Δ̄ + μ b)    (Nesterov)      or    θ' = θ − η b    (plain momentum)

which is torch.optim.SGD's update with Δ̄ as the gradient (dampening 0, no weight decay).
`options` is anything with `lr`, `momentum` and `nesterov` (the run spec's `OuterSection`).

The coordinator then sends the step θ_v − θ' compressed with the run's codec, with error feedback
on its side (`compressed_step`), and the next version is what every worker holding θ_v rebuilds bit
for bit: θ_{v+1} = θ_v − decode(encode(θ_v − θ' + r)); with the fp32 codec this is θ' up to one
float32 rounding. A hivemind peer already holds Δ̄ and takes θ_{v+1} = θ' (worker/hivemind_sync.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from rcswarm.sync import codec as codecs

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


# Elements per slice of the average: a power of two, so every slice keeps each element's
# position modulo any SIMD width and the result is bit-identical to one pass over the tensor.
AVERAGE_SLICE = 1 << 20


def weighted_average(
    updates: Sequence[tuple[int, Mapping[str, torch.Tensor]]], scales: Sequence[float] | None = None,
    spare: Mapping[str, torch.Tensor] | None = None,
) -> Tensors:
    """Σ n_i s_i Δ_i / Σ n_i over (tokens, deltas) pairs, accumulated in float64, in the given order.

    `scales` s_i (default: none, i.e. the plain token-weighted mean, computed exactly as without
    them) shrink each update's weight while the denominator keeps all tokens: the clipped mean
    of aggregation.py. Element-wise, so it runs slice by slice through two float64 buffers of
    `AVERAGE_SLICE` elements instead of full-size float64 temporaries; each element sees the
    same operations. The result is written into `spare`'s tensors where they fit (`reusable`: buffers the
    caller gave up), else into fresh ones.
    """
    if not updates:
        raise ValueError("cannot average an empty list of updates")
    total = sum(tokens for tokens, _ in updates)
    if total <= 0:
        raise ValueError(f"total tokens must be positive, got {total}")
    if scales is None:
        weights = [tokens / total for tokens, _ in updates]
    elif len(scales) != len(updates) or not all(0.0 <= s <= 1.0 for s in scales):
        raise ValueError(f"scales = {list(scales)}: expected {len(updates)} numbers in [0, 1]")
    else:
        weights = [tokens * scale / total for (tokens, _), scale in zip(updates, scales)]
    acc = torch.empty(AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    wide = torch.empty(AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    flats = [deltas for _, deltas in updates]
    return {name: _average_one(name, flats, weights, acc, wide, spare) for name in updates[0][1]}


def _average_one(
    name: str,
    updates: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    acc: torch.Tensor,
    wide: torch.Tensor,
    spare: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The float32 weighted average of tensor `name`, slice by slice through `acc` and `wide`, into
    `spare[name]` when it fits."""
    first = updates[0][name]
    into = reusable(spare, name, first) if first.dtype == torch.float32 else None
    average = torch.empty(first.shape, dtype=torch.float32) if into is None else into  # [*shape]
    out = average.view(-1)  # [numel]
    flats = [(weight, deltas[name].contiguous().view(-1)) for weight, deltas in zip(weights, updates)]  # [numel] each
    for start in range(0, out.numel(), AVERAGE_SLICE):
        stop = min(start + AVERAGE_SLICE, out.numel())
        acc_s, wide_s = acc[: stop - start], wide[: stop - start]  # [slice]
        acc_s.zero_()
        for weight, flat in flats:
            wide_s.copy_(flat[start:stop])
            acc_s.add_(wide_s, alpha=weight)
        out[start:stop].copy_(acc_s)
    return average


def compressed_step(
    params: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    codec: int | codecs.WireFormat,
    block_size: int,
    error_feedback: codecs.ErrorFeedback,
    *,
    consume_target: bool = False,
    spare_params: Mapping[str, torch.Tensor] | None = None,
) -> tuple[Tensors, dict[str, bytes]]:
    """The next version θ_v − decode(encode(θ_v − target + residual)) and the encoded step.

    Each step is decoded once (by the error feedback, which needs it for the residual) and
    subtracted from θ_v, so θ_{v+1} is bit-identical to decoding the encoded bytes again. The step's
    buffer becomes the residual and θ_{v+1} is written over the decoded step: no input is touched,
    except that with `consume_target` (a caller done with `target`) the step is written over the
    target, which saves a fresh full-size tensor per parameter; the values are the same. With a lossy
    codec the step is decoded into `spare_params`' tensors where they fit (an earlier θ nobody reads any
    more), so θ_{v+1} lands there instead of in fresh memory.
    """
    if consume_target:
        step = {name: torch.sub(theta, target[name], out=target[name]) for name, theta in params.items()}
    else:
        step = {name: theta - target[name] for name, theta in params.items()}
    encoded, received = error_feedback.compress_decoded(step, codec, block_size, consume=True, into=spare_params)
    new_params = {name: torch.sub(theta, received[name], out=received[name]) for name, theta in params.items()}
    return new_params, encoded
