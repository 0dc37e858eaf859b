"""How one round's pseudo-gradients become one: the plain mean and three robust aggregators.

Every update i of a round has its tokens n_i (bounded by the worker's assignment, see
service.py), its global L2 norm ‖Δ_i‖ (computed when it was received) and its tensors Δ_i.
`sync.aggregation` picks one of:

* ``mean``: Δ̄ = Σ n_i Δ_i / Σ n_i, `outer.weighted_average`, bit-identical to the
  coordinator before robust aggregation existed. One worker's share of the average is its
  share of the tokens, and nothing bounds its norm but `sync.max_update_norm`.
* ``clipped_mean`` (the default): Δ̄ = Σ n_i s_i Δ_i / Σ n_i with s_i = min(1, c R / ‖Δ_i‖),
  c = `sync.clip_factor` (2) and R the reference norm below. Tokens weigh as in the mean and
  the denominator keeps every update's tokens, so a clipped update loses weight instead of
  lending it to the others. One worker moves Δ̄ by at most (n_i / Σ n) · c R. When no update
  is clipped the result is the mean's, bit for bit (the same call with the same weights).
* ``trimmed_mean``: per coordinate, the k largest and the k smallest values are dropped,
  k = ⌈`sync.trim_fraction` · n⌉ capped at ⌊(n − 1) / 2⌋ (so 0 below 3 updates), and the
  others averaged with their token weights renormalised per coordinate. Trimming is by count,
  not by tokens, so a worker's tokens cannot decide what is trimmed. A worker that lies at an
  extreme of most coordinates contributes to none of them.
* ``centered_clip``: Karimireddy, He & Jaggi, "Learning from History for Byzantine Robust
  Optimization", ICML 2021 (arXiv:2012.10333), centered clipping:
  v ← v + Σ_i w_i (Δ_i − v) min(1, τ / ‖Δ_i − v‖) for `sync.centered_clip_iterations` (3)
  iterations, with w_i = n_i / Σ n the token weights in place of the paper's 1/n, radius
  τ = `sync.centered_clip_tau` (1) × R, and v started from the previous round's aggregate
  (the paper starts from the previous aggregate; after a restart, or in the first round, from
  0, where the first iteration is a mean clipped at τ around the origin). Each iteration moves
  v by at most w_i τ towards any one worker.

The reference norm R (`reference_norm`) is the median of this round's update norms together
with the accepted norms of the last `sync.reference_rounds` (4) rounds. With 1 or 2 updates
the round's own median is the attacker's (or half of it), so the recent history is what keeps
a small round honest; it also makes a single round full of inflated updates no reference for
itself. The history stores each update's norm after clipping (min(‖Δ_i‖, c R)), so an attacker
that is clipped every round adds entries no larger than c R, and the median moves only while
attackers hold at least half of the recent updates.

Flags (each `Outcome` with its action and reason; the service records them as events, counts
them per round and per worker, and evicts a persistent outlier, decisions.py):
clipped_mean: an update scaled down (s_i < 1); centered_clip: an update clipped in the last
iteration (‖Δ_i − v‖ > τ); trimmed_mean: an update trimmed in more than half-way between the
expected share 2k/n of the coordinates and all of them.

Why these defaults: honest updates of one round have similar norms (AdamW moves each
coordinate by at most ~lr per step, `adam_step_bound`), so c = 2 leaves honest rounds alone
(bit-identical to the mean) while bounding any one worker to twice a typical update.
docs/PERFORMANCE.md has the cost of each and the loss of an honest run under each.

`automatic_norm_bound` is the default hard bound `sync.max_update_norm = 0`: twice the most
an honest worker's inner optimizer can move θ in inner.steps steps.

Memory: every aggregator runs slice by slice through float64 buffers of about
`outer.AVERAGE_SLICE` elements (trimmed_mean: AVERAGE_SLICE / n coordinates of n updates);
centered_clip keeps its centre v as full-size float32 tensors (the output).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rcswarm.config.runspec import InnerSection, SyncSection
from rcswarm.coordinator import outer

Tensors = dict[str, torch.Tensor]

# The hard bound where the inner optimizer gives none (SGD without gradient clipping): the old default.
FALLBACK_NORM_BOUND = 1e4
# The automatic hard bound is this many times the most an honest worker can move θ.
NORM_BOUND_SAFETY = 2.0
# Steps over which Adam's per-coordinate bound is maximised (it converges long before).
ADAM_BOUND_STEPS = 10_000


@dataclass(frozen=True)
class Update:
    """One worker's pseudo-gradient of a round: tokens, its global L2 norm, the tensors."""

    worker_id: str
    tokens: int
    norm: float
    deltas: Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Outcome:
    """What the aggregation did to one update.

    action: "kept", "clipped" or "trimmed" (the last two are flags); scale: the factor its
    weight was multiplied by (clipped_mean, centered_clip: in the last iteration) or the share
    of its coordinates kept (trimmed_mean).
    """

    worker_id: str
    tokens: int
    norm: float
    action: str
    scale: float
    reason: str

    @property
    def flagged(self) -> bool:
        return self.action != "kept"


@dataclass(frozen=True)
class Aggregate:
    """A round's aggregate Δ̄, what happened to each update, and what to remember of the round."""

    average: Tensors
    outcomes: tuple[Outcome, ...]
    # The norms this round adds to the reference history: min(‖Δ_i‖, clip_factor × R).
    accepted_norms: tuple[float, ...]
    summary: str

    @property
    def clipped(self) -> int:
        return sum(1 for o in self.outcomes if o.flagged)


@dataclass(frozen=True)
class AggregationOptions:
    method: str = "clipped_mean"
    clip_factor: float = 2.0
    trim_fraction: float = 0.2
    tau: float = 1.0
    iterations: int = 3

    @classmethod
    def from_sync(cls, sync: SyncSection) -> AggregationOptions:
        return cls(sync.aggregation, sync.clip_factor, sync.trim_fraction, sync.centered_clip_tau,
                   sync.centered_clip_iterations)


def reference_norm(current: Sequence[float], history: Sequence[float]) -> float:
    """The median of this round's norms and the recent accepted ones (0.0 for none)."""
    pool = [*current, *history]
    return statistics.median(pool) if pool else 0.0


def aggregate(
    updates: Sequence[Update], options: AggregationOptions, history: Sequence[float] = (),
    previous: Mapping[str, torch.Tensor] | None = None,
) -> Aggregate:
    """Combine a round's updates (in the order given) by `options.method`.

    `history`: the accepted norms of recent rounds (the reference's pool besides this round);
    `previous`: the previous round's aggregate, centered_clip's starting point (None: zeros).
    """
    if not updates:
        raise ValueError("cannot aggregate an empty list of updates")
    reference = reference_norm([u.norm for u in updates], history)
    described = (f"reference norm {reference:.4g} (median of {len(updates)} norms of this round and "
                 f"{len(history)} of recent rounds)")
    limit = options.clip_factor * reference
    accepted = tuple(min(u.norm, limit) for u in updates)
    if options.method == "mean":
        average = outer.weighted_average([(u.tokens, u.deltas) for u in updates])
        outcomes = tuple(Outcome(u.worker_id, u.tokens, u.norm, "kept", 1.0, "mean") for u in updates)
        return Aggregate(average, outcomes, accepted, "mean: token-weighted")
    if options.method == "clipped_mean":
        average, outcomes = clipped_mean(updates, limit, options.clip_factor)
        summary = f"clipped_mean: {described}, limit {options.clip_factor:g} × R = {limit:.4g}"
    elif options.method == "trimmed_mean":
        average, outcomes = trimmed_mean(updates, options.trim_fraction)
        summary = f"trimmed_mean: {trim_count(len(updates), options.trim_fraction)} of {len(updates)} trimmed at each end per coordinate"
    elif options.method == "centered_clip":
        tau = options.tau * reference
        average, outcomes = centered_clip(updates, tau, options.iterations, previous)
        summary = f"centered_clip: {described}, τ = {options.tau:g} × R = {tau:.4g}, {options.iterations} iterations"
    else:
        raise ValueError(f"sync.aggregation = {options.method!r}: expected mean, clipped_mean, trimmed_mean or centered_clip")
    flagged = sum(1 for o in outcomes if o.flagged)
    return Aggregate(average, outcomes, accepted, f"{summary}; {flagged} of {len(updates)} flagged")


def clipped_mean(updates: Sequence[Update], limit: float, factor: float) -> tuple[Tensors, tuple[Outcome, ...]]:
    """Σ n_i s_i Δ_i / Σ n_i, s_i = min(1, limit / ‖Δ_i‖); the mean's call itself when nothing is clipped."""
    scales = [limit / u.norm if u.norm > limit else 1.0 for u in updates]
    pairs = [(u.tokens, u.deltas) for u in updates]
    clipped = any(scale < 1.0 for scale in scales)
    average = outer.weighted_average(pairs, scales if clipped else None)
    outcomes = tuple(
        Outcome(u.worker_id, u.tokens, u.norm, "clipped", scale,
                f"norm {u.norm:.4g} > {factor:g} × reference = {limit:.4g}: scaled by {scale:.3g}")
        if scale < 1.0 else Outcome(u.worker_id, u.tokens, u.norm, "kept", 1.0, f"norm {u.norm:.4g} <= {limit:.4g}")
        for u, scale in zip(updates, scales)
    )
    return average, outcomes


def trim_count(n: int, fraction: float) -> int:
    """k, the values dropped at each end of a coordinate: ⌈fraction · n⌉, at most ⌊(n − 1) / 2⌋."""
    wanted = math.ceil(fraction * n - 1e-9) if fraction > 0 else 0
    return max(0, min(wanted, (n - 1) // 2))


def trimmed_mean(updates: Sequence[Update], fraction: float) -> tuple[Tensors, tuple[Outcome, ...]]:
    """Coordinate-wise: drop the k largest and k smallest values, average the rest with token weights."""
    n = len(updates)
    k = trim_count(n, fraction)
    weights = torch.tensor([float(u.tokens) for u in updates], dtype=torch.float64)  # [n]
    if not weights.sum() > 0:
        raise ValueError(f"total tokens must be positive, got {int(weights.sum())}")
    width = max(1, outer.AVERAGE_SLICE // n)
    stack = torch.empty(width, n, dtype=torch.float64)  # [width, n]
    trimmed = torch.zeros(n, dtype=torch.int64)  # [n] coordinates where update i was dropped
    coordinates = 0
    average: Tensors = {}
    for name, first in updates[0].deltas.items():
        flats = [u.deltas[name].contiguous().view(-1) for u in updates]  # [numel] each
        result = torch.empty(first.shape, dtype=torch.float32)  # [*shape]
        out = result.view(-1)  # [numel]
        for start in range(0, out.numel(), width):
            stop = min(start + width, out.numel())
            block = stack[: stop - start]  # [m, n]
            for i, flat in enumerate(flats):
                block[:, i].copy_(flat[start:stop])
            values, order = torch.sort(block, dim=1, stable=True)  # [m, n] each
            kept_values, kept_order = values[:, k: n - k], order[:, k: n - k]  # [m, n − 2k]
            kept_weights = weights[kept_order]  # [m, n − 2k]
            out[start:stop].copy_((kept_values * kept_weights).sum(dim=1) / kept_weights.sum(dim=1))
            if k:
                dropped = torch.cat([order[:, :k], order[:, n - k:]], dim=1)  # [m, 2k]
                trimmed += torch.bincount(dropped.reshape(-1), minlength=n)
        coordinates += out.numel()
        average[name] = result
    expected = 2 * k / n
    threshold = (expected + 1.0) / 2
    outcomes = []
    for u, count in zip(updates, trimmed.tolist()):
        share = count / coordinates if coordinates else 0.0
        reason = f"trimmed in {share:.1%} of coordinates (expected {expected:.1%}; flagged above {threshold:.1%})"
        outcomes.append(Outcome(u.worker_id, u.tokens, u.norm, "trimmed" if k and share > threshold else "kept",
                                1.0 - share, reason))
    return average, tuple(outcomes)


def centered_clip(
    updates: Sequence[Update], tau: float, iterations: int, start: Mapping[str, torch.Tensor] | None,
) -> tuple[Tensors, tuple[Outcome, ...]]:
    """Centered clipping: `iterations` times v ← v + Σ w_i (Δ_i − v) min(1, τ / ‖Δ_i − v‖), from `start`."""
    total = sum(u.tokens for u in updates)
    if total <= 0:
        raise ValueError(f"total tokens must be positive, got {total}")
    weights = [u.tokens / total for u in updates]
    names = list(updates[0].deltas)
    center = {name: (start[name].to(torch.float32, copy=True) if start is not None
                     else torch.zeros(updates[0].deltas[name].shape, dtype=torch.float32)) for name in names}
    distances = _distances(updates, center)
    scales, used = [1.0] * len(updates), distances
    for iteration in range(iterations):
        used = distances
        scales = [min(1.0, tau / d) if d > 0 else 1.0 for d in used]
        last = iteration == iterations - 1
        distances = _step_towards(updates, center, [w * s for w, s in zip(weights, scales)], measure=not last)
    outcomes = tuple(
        Outcome(u.worker_id, u.tokens, u.norm, "clipped", scale,
                f"distance to the centre {d:.4g} > τ = {tau:.4g}: scaled by {scale:.3g}")
        if scale < 1.0 else Outcome(u.worker_id, u.tokens, u.norm, "kept", 1.0, f"distance to the centre {d:.4g} <= τ = {tau:.4g}")
        for u, scale, d in zip(updates, scales, used)
    )
    return center, outcomes


def _distances(updates: Sequence[Update], center: Mapping[str, torch.Tensor]) -> list[float]:
    """‖Δ_i − v‖ for every update, accumulated in float64 slice by slice."""
    sums = [0.0] * len(updates)
    wide = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    other = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    for name, v in center.items():
        flat_v = v.view(-1)  # [numel]
        for start in range(0, flat_v.numel(), outer.AVERAGE_SLICE):
            stop = min(start + outer.AVERAGE_SLICE, flat_v.numel())
            v_s, x_s = other[: stop - start], wide[: stop - start]  # [slice]
            v_s.copy_(flat_v[start:stop])
            for i, u in enumerate(updates):
                x_s.copy_(u.deltas[name].contiguous().view(-1)[start:stop]).sub_(v_s)
                sums[i] += float(torch.dot(x_s, x_s))
    return [math.sqrt(s) for s in sums]


def _step_towards(
    updates: Sequence[Update], center: Tensors, coefficients: Sequence[float], measure: bool = True,
) -> list[float]:
    """v ← v + Σ c_i (Δ_i − v) in place (float64 per slice), and with `measure` the new distances ‖Δ_i − v‖."""
    sums = [0.0] * len(updates)
    acc = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    v_wide = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    x_wide = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    for name, v in center.items():
        flat_v = v.view(-1)  # [numel]
        flats = [u.deltas[name].contiguous().view(-1) for u in updates]  # [numel] each
        for start in range(0, flat_v.numel(), outer.AVERAGE_SLICE):
            stop = min(start + outer.AVERAGE_SLICE, flat_v.numel())
            acc_s, v_s, x_s = acc[: stop - start], v_wide[: stop - start], x_wide[: stop - start]  # [slice]
            v_s.copy_(flat_v[start:stop])
            acc_s.copy_(v_s)
            for coefficient, flat in zip(coefficients, flats):
                x_s.copy_(flat[start:stop]).sub_(v_s)
                acc_s.add_(x_s, alpha=coefficient)
            flat_v[start:stop].copy_(acc_s)
            if not measure:
                continue
            v_s.copy_(flat_v[start:stop])
            for i, flat in enumerate(flats):
                x_s.copy_(flat[start:stop]).sub_(v_s)
                sums[i] += float(torch.dot(x_s, x_s))
    return [math.sqrt(s) for s in sums]


def adam_step_bound(beta1: float, beta2: float) -> float | None:
    """The most one Adam(W) step moves a coordinate, in units of lr; None when unbounded (β1² >= β2).

    By Cauchy–Schwarz on m_t = (1−β1) Σ_k β1^k g_{t−k} against v_t = (1−β2) Σ_k β2^k g²_{t−k},
    |m̂_t| / sqrt(v̂_t) <= (1−β1)/sqrt(1−β2) · sqrt((1 − q^t)/(1 − q)) · sqrt(1 − β2^t)/(1 − β1^t)
    with q = β1²/β2 (eps only lowers it); the bound is its maximum over t (1 at t = 1).
    """
    q = beta1 * beta1 / beta2
    if q >= 1.0:
        return None
    scale = (1 - beta1) / math.sqrt(1 - beta2)
    best = 1.0
    for t in range(1, ADAM_BOUND_STEPS + 1):
        value = scale * math.sqrt((1 - q**t) / (1 - q)) * math.sqrt(1 - beta2**t) / (1 - beta1**t)
        best = max(best, value)
    return max(best, scale / math.sqrt(1 - q))


def automatic_norm_bound(inner: InnerSection, parameters: int, theta_norm: float) -> tuple[float, str]:
    """`sync.max_update_norm = 0`: NORM_BOUND_SAFETY × the most inner.steps honest steps move θ; with why.

    AdamW: each coordinate moves at most a·lr per step (`adam_step_bound`), so the step's L2
    norm is at most a·lr·sqrt(P); the decoupled weight decay adds lr·wd·‖θ_t‖ with
    ‖θ_t‖ <= ‖θ_v‖ + H·a·lr·sqrt(P). SGD: each step is lr·(g + wd·θ) with ‖g‖ <= grad_clip.
    Without such a bound (SGD without clipping, Adam with β1² >= β2) FALLBACK_NORM_BOUND.
    The factor covers what the codec's error feedback adds to an update (at most a few
    thousandths of the previous one for int8).
    """
    steps, lr, decay = inner.steps, inner.lr, inner.weight_decay
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
    return bound, (f"{bound:.4g} = {NORM_BOUND_SAFETY:g} × the most {steps} honest inner steps move θ "
                   f"({why}, weight decay at ‖θ‖ = {theta_norm:.4g}, {parameters} parameters)")
