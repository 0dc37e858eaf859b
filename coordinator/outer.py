"""The outer step of DiLoCo: token-weighted averaging of pseudo-gradients and Nesterov SGD.

Pseudo-gradients are Δ_i = θ_v − θ_i (what each worker moved away from the global
parameters). With Δ̄ = Σ_i n_i Δ_i / Σ_i n_i (n_i = tokens), momentum μ and learning rate η:

    b ← μ b + Δ̄
    θ ← θ − η (Δ̄ + μ b)    (Nesterov)      or    θ ← θ − η b    (plain momentum)

which is torch.optim.SGD's update with Δ̄ as the gradient (dampening 0, no weight decay).
`outer_step` is defined in protos/outer.py, shared with the hivemind backend, and re-exported here.

The step θ_v − θ' to the optimizer's target θ' is then sent to workers compressed with the
run's codec, with error feedback on the coordinator, and the next version is defined as
what every worker holding θ_v can rebuild bit for bit: θ_{v+1} = θ_v − decode(encode(...)).
With the fp32 codec this is θ' up to one float32 rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rcswarm.protos import codec as codecs
from rcswarm.protos.outer import outer_step, reusable

Tensors = dict[str, torch.Tensor]
__all__ = ["AVERAGE_SLICE", "compressed_step", "outer_step", "reusable", "weighted_average"]


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
    codec: int,
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
