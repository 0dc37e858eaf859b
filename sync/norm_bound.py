"""The hard bound on one update's norm (`sync.max_update_norm`; 0 = automatic), shared by both ends of a push.

The coordinator refuses an update whose global L2 norm exceeds the bound for the version it was trained from
(coordinator/intake.py); a worker with error feedback keeps what it sends under a share of the same bound
(`SEND_NORM_SHARE`, `Worker._push_deltas`) and leaves the rest in its residual, so that what earlier rounds did not
send never makes an honest update one the coordinator refuses. Both compute the bound from the run spec and θ of
that version alone (`update_norm_bound`), so they agree without exchanging it.

`automatic_norm_bound` is the default: NORM_BOUND_SAFETY × the most an honest worker's inner optimizer can move θ
in the most steps one round lets it train (`SyncSection.step_cap`: inner.steps, or sync.max_steps for time-boxed
rounds; adaptive step counts never exceed inner.steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from rcswarm.config.runspec import InnerSection, RunSpec

# The hard bound where the inner optimizer gives none (SGD without gradient clipping): the old default.
FALLBACK_NORM_BOUND = 1e4
# The automatic hard bound is this many times the most an honest worker can move θ.
NORM_BOUND_SAFETY = 2.0
# Steps over which Adam's per-coordinate bound is maximised (it converges long before).
ADAM_BOUND_STEPS = 10_000
# A worker with error feedback sends at most this share of the bound: the rest of the margin absorbs the float
# rounding of the coordinator's own norm of the decoded update.
SEND_NORM_SHARE = 0.9


def adam_step_bound(beta1: float, beta2: float) -> float | None:
    """The most one Adam(W) step moves a coordinate, in units of lr; None when unbounded (β1² >= β2).

    By Cauchy–Schwarz on m_t = (1−β1) Σ_k β1^k g_{t−k} against v_t = (1−β2) Σ_k β2^k g²_{t−k},
    |m̂_t| / sqrt(v̂_t) <= (1−β1)/sqrt(1−β2) · sqrt((1 − q^t)/(1 − q)) · sqrt(1 − β2^t)/(1 − β1^t)
    with q = β1²/β2 (eps only lowers it); the bound is its maximum over t (1 at t = 1).

    β2 = 0 is a legal Adam (torch takes β2 in [0, 1)): v_t = g_t², so the step is m̂_t / |g_t|. With β1 = 0 that
    is sign(g_t), at most 1 (q = 0 above); with β1 > 0, m̂_t keeps earlier gradients while g_t may be as small as
    it likes, so no bound exists (q = ∞ >= 1, the limit of β1²/β2 as β2 → 0).
    """
    if beta2 == 0.0:
        q = 0.0 if beta1 == 0.0 else math.inf
    else:
        q = beta1 * beta1 / beta2
    if q >= 1.0:
        return None
    scale = (1 - beta1) / math.sqrt(1 - beta2)
    best = 1.0
    for t in range(1, ADAM_BOUND_STEPS + 1):
        value = scale * math.sqrt((1 - q**t) / (1 - q)) * math.sqrt(1 - beta2**t) / (1 - beta1**t)
        best = max(best, value)
    return max(best, scale / math.sqrt(1 - q))


def automatic_norm_bound(
    inner: InnerSection, parameters: int, theta_norm: float, steps: int | None = None, steps_from: str = "inner.steps"
) -> tuple[float, str]:
    """`sync.max_update_norm = 0`: NORM_BOUND_SAFETY × the most `steps` honest steps move θ; with why. `steps`: the
    most inner steps one round lets a worker train (None: inner.steps), named in the reason by `steps_from`.

    AdamW: each coordinate moves at most a·lr per step (`adam_step_bound`), so the step's L2
    norm is at most a·lr·sqrt(P); the decoupled weight decay adds lr·wd·‖θ_t‖ with
    ‖θ_t‖ <= ‖θ_v‖ + H·a·lr·sqrt(P). SGD: each step is lr·(g + wd·θ) with ‖g‖ <= grad_clip.
    Without such a bound (SGD without clipping, Adam with β1² >= β2) FALLBACK_NORM_BOUND.
    The factor covers what the codec's error feedback adds to an update (at most a few
    thousandths of the previous one for int8).
    """
    if steps is None:
        steps = inner.steps
    if steps < 1:
        raise ValueError(f"automatic_norm_bound: steps = {steps}; expected the most inner steps of a round, >= 1")
    lr, decay = inner.lr, inner.weight_decay
    if inner.optimizer == "adamw":
        a = adam_step_bound(inner.beta1, inner.beta2)
        if a is None:
            return FALLBACK_NORM_BOUND, f"{FALLBACK_NORM_BOUND:g} (AdamW with beta1² >= beta2 has no step bound)"
        per_step = a * lr * math.sqrt(parameters)
        why = f"AdamW: {a:.3g} × lr per coordinate and step"
    else:
        if inner.grad_clip <= 0:
            return FALLBACK_NORM_BOUND, f"{FALLBACK_NORM_BOUND:g} (SGD without inner.grad_clip has no step bound)"
        per_step = lr * inner.grad_clip
        why = "SGD: lr × inner.grad_clip per step"
    drift = steps * per_step
    bound = NORM_BOUND_SAFETY * steps * (per_step + lr * decay * (theta_norm + drift))
    return bound, (f"{bound:.4g} = {NORM_BOUND_SAFETY:g} × the most {steps} honest inner steps ({steps_from}) move θ "
                   f"({why}, weight decay at ‖θ‖ = {theta_norm:.4g}, {parameters} parameters)")


def update_norm_bound(spec: RunSpec, params: Mapping[str, torch.Tensor]) -> tuple[float, str]:
    """The hard bound on an update's norm trained from `params`, and why (no lock: pure): automatic, for the most
    steps one round lets a worker train (`SyncSection.step_cap`: inner.steps, or sync.max_steps, 10 × inner.steps by
    default, in a time-boxed round; adaptive step counts stay within inner.steps), unless configured."""
    configured = spec.sync.max_update_norm
    if configured > 0:
        return configured, f"sync.max_update_norm = {configured:.4g}"
    # A bound needs no float64 sum: float32 norms per tensor, without full-size temporaries.
    norm = math.sqrt(sum(float(torch.linalg.vector_norm(t)) ** 2 for t in params.values()))
    parameters = sum(t.numel() for t in params.values())
    steps = spec.sync.step_cap(spec.inner.steps)
    steps_from = "inner.steps" if spec.sync.round == "steps" else "sync.max_steps of a time-boxed round"
    bound, why = automatic_norm_bound(spec.inner, parameters, norm, steps, steps_from)
    return bound, f"the automatic sync.max_update_norm {why}"
