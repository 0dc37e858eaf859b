"""How one round's pseudo-gradients become one: a direction check, then the plain mean or one of three
robust aggregators.

Every update i of a round has its tokens n_i (bounded by the worker's assignment, see
intake.py), its global L2 norm ‖Δ_i‖ (computed when it was received) and its tensors Δ_i.

The direction check (`sync.min_cosine`, on by default) comes first and drops an update that points
against the round's majority, as if it had not been sent. Update i's score is the cosine it shares
with at least half of the other updates:

    s_i = the k-th largest of cos(Δ_i, Δ_j) over j ≠ i,   k = ⌈(n − 1)/2⌉,

and an update with s_i < `sync.min_cosine` (0) is dropped, the lowest score first and at most
⌊(n − 1)/2⌋ of them, so the majority always stays. The others are then combined by
`sync.aggregation` exactly as if the dropped ones had not been sent (their norms do not enter the
reference norm either): a round whose dropped update came from an attacker gives, bit for bit, the
aggregate of the honest updates alone. While attackers are at most ⌊(n − 1)/2⌋ of the round, an
honest update has at least k honest others (its score is at least the k-th best of its cosines with
them), and a sign-flipped copy of an honest update has at most k − 1 colluders, so its score is one
of its cosines with honest updates: the negatives of the original's, negative wherever honest
updates share a direction. With the default 0 the
criterion is FLTrust's (Cao, Fang, Liu & Gong, "FLTrust: Byzantine-robust Federated Learning via
Trust Bootstrapping", NDSS 2021, arXiv:2012.13995: trust score ReLU(cos(g_i, g_0)), so no weight
for cos <= 0), with their trusted server update g_0, trained on a root data set the coordinator
does not have, replaced by the round's other updates; scoring an update against its nearest others
is Krum's idea (Blanchard, El Mhamdi, Guerraoui & Stainer, "Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent", NeurIPS 2017: the squared distances to its n − f − 2 nearest
updates). Zeno (Xie, Koyejo & Gupta, ICML 2019, arXiv:1805.10032) scores by the descent of a
server-side loss and needs data too. The cosines come from the Gram matrix G = X Xᵀ of the round's
updates, accumulated in float64 over slices like the mean's: one pass of n² products per
coordinate, about the mean's time at 4 updates and a few times it at 16 (docs/PERFORMANCE.md
"Robust aggregation" has it, the measured scores of honest and flipped updates, and why not the
coordinate-wise median as the centre: a sort per coordinate, 17 to 40 times the mean, and flips of
weakly aligned updates scored positive against a median that includes them).

Not checked: rounds of fewer than 3 updates (no majority: in a round of 2 each update's score is
the cosine between the two, the same for both), and updates of norm 0, which have no direction
(they neither vote nor are judged). A history reference for small rounds was measured and not
taken: honest updates' cosine with the previous round's aggregate went down to −0.42 with an SGD
inner optimizer (2 workers), and a worker holding half of a round could steer that reference.

`sync.aggregation` then picks one of:

* ``mean``: Δ̄ = Σ n_i Δ_i / Σ n_i, `outer.weighted_average`, bit-identical to the
  coordinator before robust aggregation existed (with the direction check off, or when it drops nothing). One worker's share of the average is its
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
  extreme of most coordinates contributes to none of them. Tied values (a sparse or 2-bit update
  is mostly exact zeros) are trimmed by value alone, never by which worker sits where: a group of
  equal values that a cut splits keeps its kept share spread over all its members (each keeps the
  same fraction of its tokens, `trimmed_mean`), so the aggregate does not depend on the workers'
  order, and only a value strictly outside the kept values' range counts as trimmed.
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
the direction check: an update dropped ("dropped", counted with the updates refused at push);
clipped_mean: an update scaled down (s_i < 1); centered_clip: an update clipped in the last
iteration (‖Δ_i − v‖ > τ); trimmed_mean: an update trimmed (its value strictly below the smallest
or above the largest value kept) in more than half-way between the share 2k/n of the coordinates
(what a worker without ties expects) and all of them.

Why these defaults: honest updates of one round have similar norms (AdamW moves each
coordinate by at most ~lr per step, `norm_bound.adam_step_bound`), so c = 2 leaves honest rounds alone
(bit-identical to the mean) while bounding any one worker to twice a typical update. Honest
updates of one round also share a direction: their scores s_i were all above 0 (lowest +0.037,
SGD; from +0.15 up at the benchmark's AdamW steps), and a flip's score mirrors its original's, so
`min_cosine = 0` drops every measured flip and no honest update.
docs/PERFORMANCE.md has the cost of each and the loss of an honest run under each.

The hard bound `sync.max_update_norm` (0 = automatic: twice the most an honest worker's inner
optimizer can move θ in a round) is sync/norm_bound.py's, which workers compute too.

Sparse updates (`sync.codec = "sparse"`, issue #28). Every rule here reads an update decoded to a
dense float32 tensor: the entries a worker sent, zero elsewhere (`EncodedDeltas` decodes the sparse
payload like any other), so each applies unchanged; what changes is what the data look like.
* The hard norm bound and clipped_mean see the decoded update's norm: a poisoned update with huge
  values at a few indices has a huge norm and is refused at the push, or (bound lifted) scaled to
  c·R like a dense one; one worker still moves Δ̄ by at most (n_i / Σ n)·c·R. An honest sparse update
  carries its error-feedback residual too (what earlier rounds did not send); the bench's largest
  honest ‖Δ‖ was a small fraction of the automatic bound (docs/PERFORMANCE.md, "Compression (issue #28)"),
  and a worker sends at most 0.9 of the bound, keeping the rest in its residual (sync/norm_bound.py).
* The direction check's cosines are between sparse vectors: honest workers' kept entries overlap
  (large coordinates of one round's pseudo-gradients are shared), so their scores stay positive, but
  lower than dense ones. An update whose entries no honest update sent has cosine 0 with all of
  them: it is not dropped (a drop needs a score below `min_cosine` = 0) and clipping bounds it, as
  tests/coordinator/test_sparse_wire.py shows; a sign flip of an honest sparse update still scores
  the negative of the original's and is dropped.
* trimmed_mean trims per coordinate over all n updates, zeros included: a coordinate that fewer
  than k + 1 workers sent keeps only zeros after the trim, so on sparse updates it keeps the
  coordinates several workers agree on and drops most of the rest (the bench gives its cost). A
  poisoned entry is the largest (or smallest) value of its coordinate and is trimmed with k ≥ 1;
  the attacker's zeros elsewhere stay within the honest values' range after the trim.
* centered_clip measures distances between dense decoded vectors and clips as before: it bounds a
  worker's pull in L2 (w_i τ per iteration), not per coordinate, so a poisoned sparse update moves
  its few coordinates by up to `centered_clip_iterations` · w_i · τ each, the bound, not more.
Both are attacked with the hard bound lifted and the direction check off in
tests/coordinator/test_sparse_wire.py (`..._bounded_by_the_robust_aggregators_alone`): θ_1 stays within
2 honest steps of the honest round's (the plain mean: thousands).

Memory: every aggregator runs slice by slice through float64 buffers of about
`outer.AVERAGE_SLICE` elements (trimmed_mean and the direction check: AVERAGE_SLICE / n
coordinates of n updates); centered_clip keeps its centre v as full-size float32 tensors (the
output). The coordinator holds each pushed update encoded (`EncodedDeltas`, about P bytes for
int8) and every pass reads it tensor by tensor, so a close holds one decoded tensor per update,
not N decoded copies of θ's size; during a close each decodes into a scratch buffer the coordinator
keeps from close to close (`decoding_into`), not into fresh memory. Each pass decodes once: the mean and clipped_mean make one pass,
trimmed_mean one, the direction check one more, centered_clip two per iteration.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rcswarm.config.runspec import SyncSection
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer, tensor_stream

Tensors = dict[str, torch.Tensor]

# sync.min_cosine at or below this turns the direction check off (no cosine is below -1).
DIRECTION_OFF = -1.0
# The fewest updates among which a majority can outvote one: the direction check's minimum.
DIRECTION_MIN_UPDATES = 3


class EncodedDeltas(Mapping[str, torch.Tensor]):
    """A pushed pseudo-gradient held as the payload bytes it arrived in (its codec's size: about P bytes
    for int8 instead of 4·P decoded), read as float32 tensors.

    Reading a tensor decodes it with `codec.decode`, the receiver's own decode, so the values are bit
    for bit those the push was checked and normed with. The most recently read tensor is kept, so a
    pass that reads tensor after tensor (every aggregator here) decodes each once and holds one
    decoded tensor per update. While a scratch buffer is lent (`lend`, `decoding_into`), tensors are
    decoded into it instead of fresh memory: reading one tensor overwrites the one read before, which
    every pass here is done with by then. Threads: the push handler builds it, then only the closing
    thread reads it.
    """

    def __init__(self, header: pb.TensorHeader, payload: bytes | bytearray) -> None:
        """Index the payload's tensors by the (already validated) header; copies nothing."""
        self._format = tensor_stream.header_format(header)
        self._payload = memoryview(payload)
        self._parts: dict[str, tuple[tuple[int, ...], int, int]] = {}
        offset = 0
        for info in header.tensors:
            self._parts[info.name] = (tuple(info.shape), offset, offset + info.num_bytes)
            offset += info.num_bytes
        if offset != self._payload.nbytes:
            raise ValueError(f"payload has {self._payload.nbytes} bytes; its header's tensors take {offset}")
        self._last: tuple[str, torch.Tensor] | None = None
        self._scratch: torch.Tensor | None = None

    @property
    def largest(self) -> int:
        """Elements of the largest tensor: what a scratch buffer must hold."""
        return max((math.prod(shape) for shape, _, _ in self._parts.values()), default=0)

    def lend(self, scratch: torch.Tensor | None) -> None:
        """Decode into `scratch` (a contiguous float32 tensor of at least `largest` elements) from now on, or into
        fresh tensors again with None; forgets the tensor read last."""
        if scratch is not None and (scratch.dtype != torch.float32 or not scratch.is_contiguous()
                                    or scratch.numel() < self.largest):
            raise ValueError(f"scratch of {scratch.numel()} {scratch.dtype} elements: expected a contiguous float32 "
                             f"tensor of at least {self.largest}")
        self._scratch, self._last = scratch, None

    @property
    def nbytes(self) -> int:
        """Bytes held: the encoded payload."""
        return self._payload.nbytes

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor `name`'s shape, without decoding it."""
        return self._parts[name][0]

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        shape, start, stop = self._parts[name]
        if self._scratch is None:
            tensor = codecs.decode(self._payload[start:stop], self._format, shape)  # [*shape]
        else:
            into = self._scratch[: math.prod(shape)]  # [numel]
            tensor = codecs.decode(self._payload[start:stop], self._format, shape, out=into)
        self._last = (name, tensor)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


@contextmanager
def decoding_into(updates: Sequence[Update], pool: list[torch.Tensor]) -> Iterator[None]:
    """For the body of a `with`: lend each held update (`EncodedDeltas`) one float32 scratch buffer of `pool`,
    replacing (in `pool`) those too small and adding what is missing, so that a close's passes decode into
    the same memory round after round; the updates decode into fresh tensors again afterwards."""
    held = [u.deltas for u in updates if isinstance(u.deltas, EncodedDeltas)]
    size = max((deltas.largest for deltas in held), default=0)
    for index in range(len(held)):
        if index == len(pool):
            pool.append(torch.empty(size, dtype=torch.float32))  # [size]
        elif pool[index].numel() < size:
            pool[index] = torch.empty(size, dtype=torch.float32)  # [size]
    try:
        for deltas, scratch in zip(held, pool):
            deltas.lend(scratch)
        yield
    finally:
        for deltas in held:
            deltas.lend(None)


@dataclass(frozen=True)
class Update:
    """One worker's pseudo-gradient of a round: tokens, its global L2 norm, the tensors (a dict, or the
    `EncodedDeltas` the coordinator holds until the close)."""

    worker_id: str
    tokens: int
    norm: float
    deltas: Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Outcome:
    """What the aggregation did to one update.

    action: "kept", "dropped" (the direction check), "clipped" or "trimmed" (all but "kept" are
    flags); scale: the factor its weight was multiplied by (clipped_mean, centered_clip: in the
    last iteration; 0 when dropped) or the share of its coordinates kept (trimmed_mean).
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
    # The norms this round adds to the reference history: min(‖Δ_i‖, clip_factor × R) of the updates not dropped.
    accepted_norms: tuple[float, ...]
    summary: str
    # Each update's direction score s_i, in the order given; None where the check did not judge it.
    scores: tuple[float | None, ...] = ()

    @property
    def clipped(self) -> int:
        """Updates the aggregator flagged (clipped or trimmed)."""
        return sum(1 for o in self.outcomes if o.flagged and o.action != "dropped")

    @property
    def dropped(self) -> int:
        """Updates the direction check dropped."""
        return sum(1 for o in self.outcomes if o.action == "dropped")


@dataclass(frozen=True)
class AggregationOptions:
    method: str = "clipped_mean"
    clip_factor: float = 2.0
    trim_fraction: float = 0.2
    tau: float = 1.0
    iterations: int = 3
    min_cosine: float = 0.0

    @classmethod
    def from_sync(cls, sync: SyncSection) -> AggregationOptions:
        return cls(sync.aggregation, sync.clip_factor, sync.trim_fraction, sync.centered_clip_tau,
                   sync.centered_clip_iterations, sync.min_cosine)


@dataclass(frozen=True)
class Direction:
    """The direction check of one round: each update's score (None: not judged), the dropped ones, a summary."""

    scores: tuple[float | None, ...]
    dropped: dict[int, str]
    summary: str


def direction_check(updates: Sequence[Update], min_cosine: float) -> Direction:
    """Score every update by the cosine it shares with at least half of the others; drop the lowest below `min_cosine`.

    Only updates of nonzero norm take part, and only when there are at least DIRECTION_MIN_UPDATES
    of them; at most ⌊(m − 1)/2⌋ of the m taking part are dropped.
    """
    unjudged = (None,) * len(updates)
    if min_cosine <= DIRECTION_OFF:
        return Direction(unjudged, {}, "")
    voters = [i for i, u in enumerate(updates) if u.norm > 0]
    m = len(voters)
    if m < DIRECTION_MIN_UPDATES:
        return Direction(unjudged, {}, f"direction: not checked ({m} updates with a direction; needs {DIRECTION_MIN_UPDATES})")
    cosines = cosine_matrix([updates[i] for i in voters])  # [m, m]
    k = m // 2  # ⌈(m − 1)/2⌉ of the m − 1 others
    scores: list[float | None] = list(unjudged)
    agreeing: dict[int, int] = {}
    for row, i in enumerate(voters):
        others = [float(c) for j, c in enumerate(cosines[row].tolist()) if j != row]
        scores[i] = sorted(others, reverse=True)[k - 1]
        agreeing[i] = sum(1 for c in others if c >= min_cosine)
    below = sorted((scores[i], i) for i in voters if scores[i] < min_cosine)[: (m - 1) // 2]
    dropped = {
        i: (f"direction: cosine >= sync.min_cosine = {min_cosine:g} with {agreeing[i]} of the other {m - 1} "
            f"updates, fewer than the {k} needed (its score {score:+.3f})")
        for score, i in below
    }
    kept = [scores[i] for i in voters if i not in dropped]
    summary = (f"direction: {len(dropped)} of {m} dropped (score = cosine shared with {k} of the other {m - 1}; "
               f"sync.min_cosine = {min_cosine:g}), least kept score {min(kept):+.3f}")
    return Direction(tuple(scores), dropped, summary)


def cosine_matrix(updates: Sequence[Update]) -> torch.Tensor:
    """cos(Δ_i, Δ_j) of every pair [n, n] (0 where a norm is 0), from the Gram matrix accumulated slice by slice in float64."""
    n = len(updates)
    width = max(1, outer.AVERAGE_SLICE // n)
    stack = torch.empty(n, width, dtype=torch.float64)  # [n, width]
    gram = torch.zeros(n, n, dtype=torch.float64)  # [n, n]
    for name in updates[0].deltas:
        flats = [u.deltas[name].contiguous().view(-1) for u in updates]  # [numel] each
        for start in range(0, flats[0].numel(), width):
            stop = min(start + width, flats[0].numel())
            block = stack[:, : stop - start]  # [n, m]
            for i, flat in enumerate(flats):
                block[i].copy_(flat[start:stop])
            gram.addmm_(block, block.t())
    norms = gram.diagonal().sqrt()  # [n]
    scale = torch.outer(norms, norms)  # [n, n]
    return torch.where(scale > 0, gram / torch.where(scale > 0, scale, 1.0), 0.0)


def reference_norm(current: Sequence[float], history: Sequence[float]) -> float:
    """The median of this round's norms and the recent accepted ones (0.0 for none)."""
    pool = [*current, *history]
    return statistics.median(pool) if pool else 0.0


def aggregate(
    updates: Sequence[Update], options: AggregationOptions, history: Sequence[float] = (),
    previous: Mapping[str, torch.Tensor] | None = None, spare: Mapping[str, torch.Tensor] | None = None,
) -> Aggregate:
    """Drop the updates the direction check rejects, combine the others (in the order given) by `options.method`.

    `history`: the accepted norms of recent rounds (the reference's pool besides this round);
    `previous`: the previous round's aggregate, centered_clip's starting point (None: zeros);
    `spare`: float32 buffers the caller gave up, which the mean, clipped_mean and trimmed_mean write the
    aggregate into where they fit (`outer.reusable`; the same values as in fresh tensors).
    The outcomes are in the order of `updates`, the dropped ones included.
    """
    if not updates:
        raise ValueError("cannot aggregate an empty list of updates")
    direction = direction_check(updates, options.min_cosine)
    combined = combine([u for i, u in enumerate(updates) if i not in direction.dropped], options, history, previous, spare)
    kept = iter(combined.outcomes)
    outcomes = tuple(
        Outcome(u.worker_id, u.tokens, u.norm, "dropped", 0.0, direction.dropped[i]) if i in direction.dropped
        else next(kept) for i, u in enumerate(updates)
    )
    summary = f"{combined.summary}; {direction.summary}" if direction.summary else combined.summary
    return Aggregate(combined.average, outcomes, combined.accepted_norms, summary, direction.scores)


def combine(
    updates: Sequence[Update], options: AggregationOptions, history: Sequence[float] = (),
    previous: Mapping[str, torch.Tensor] | None = None, spare: Mapping[str, torch.Tensor] | None = None,
) -> Aggregate:
    """Combine a round's updates (in the order given) by `options.method`, without the direction check; the
    aggregate into `spare` where it fits (see `aggregate`)."""
    reference = reference_norm([u.norm for u in updates], history)
    described = (f"reference norm {reference:.4g} (median of {len(updates)} norms of this round and "
                 f"{len(history)} of recent rounds)")
    limit = options.clip_factor * reference
    accepted = tuple(min(u.norm, limit) for u in updates)
    if options.method == "mean":
        average = outer.weighted_average([(u.tokens, u.deltas) for u in updates], spare=spare)
        outcomes = tuple(Outcome(u.worker_id, u.tokens, u.norm, "kept", 1.0, "mean") for u in updates)
        return Aggregate(average, outcomes, accepted, "mean: token-weighted")
    if options.method == "clipped_mean":
        average, outcomes = clipped_mean(updates, limit, options.clip_factor, spare)
        summary = f"clipped_mean: {described}, limit {options.clip_factor:g} × R = {limit:.4g}"
    elif options.method == "trimmed_mean":
        average, outcomes = trimmed_mean(updates, options.trim_fraction, spare)
        summary = f"trimmed_mean: {trim_count(len(updates), options.trim_fraction)} of {len(updates)} trimmed at each end per coordinate"
    elif options.method == "centered_clip":
        tau = options.tau * reference
        average, outcomes = centered_clip(updates, tau, options.iterations, previous)
        summary = f"centered_clip: {described}, τ = {options.tau:g} × R = {tau:.4g}, {options.iterations} iterations"
    else:
        raise ValueError(f"sync.aggregation = {options.method!r}: expected mean, clipped_mean, trimmed_mean or centered_clip")
    flagged = sum(1 for o in outcomes if o.flagged)
    return Aggregate(average, outcomes, accepted, f"{summary}; {flagged} of {len(updates)} flagged")


def clipped_mean(
    updates: Sequence[Update], limit: float, factor: float, spare: Mapping[str, torch.Tensor] | None = None,
) -> tuple[Tensors, tuple[Outcome, ...]]:
    """Σ n_i s_i Δ_i / Σ n_i, s_i = min(1, limit / ‖Δ_i‖); the mean's call itself when nothing is clipped
    (into `spare` where it fits)."""
    scales = [limit / u.norm if u.norm > limit else 1.0 for u in updates]
    pairs = [(u.tokens, u.deltas) for u in updates]
    clipped = any(scale < 1.0 for scale in scales)
    average = outer.weighted_average(pairs, scales if clipped else None, spare)
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


def trimmed_mean(
    updates: Sequence[Update], fraction: float, spare: Mapping[str, torch.Tensor] | None = None,
) -> tuple[Tensors, tuple[Outcome, ...]]:
    """Coordinate-wise: drop the k largest and k smallest values, average the rest with token weights (into
    `spare` where it fits); the result and the flags depend on the updates' values and tokens, not their order.

    Per coordinate, with the n values sorted, v_(1) <= ... <= v_(n), the positions k+1..n−k are kept.
    Without ties that is Σ_kept w_i x_i / Σ_kept w_i, the kept positions' own token weights. A group G of
    tied values (all equal to v_G, at positions a..b) that a cut splits has c_G = |[a, b] ∩ [k+1, n−k]| of
    its |G| positions kept: each member keeps the fraction f_G = c_G / |G| of its tokens w_i, so the group
    weighs f_G · W_G (W_G = Σ_{i∈G} w_i) at the value v_G, the same as giving each of its c_G kept
    positions the group's mean weight W_G / |G|:

        x̄ = Σ_{j=k+1}^{n−k} ω_j v_(j) / Σ_{j=k+1}^{n−k} ω_j,   ω_j = w_(j) if position j's group lies inside
        the kept positions, else W_G / |G| of its group G.

    With equal tokens in the group this is c_G · w, what any order of its members gives; with unequal tokens
    the kept share no longer goes to whichever members the sort happened to put inside. An update counts as
    trimmed at a coordinate when its value is strictly below v_(k+1) or strictly above v_(n−k): a value tied
    with a kept one is not an outlier.
    Columns are laid out by ascending tokens before the stable sort, so ties are summed in an order fixed by
    values and tokens alone.
    """
    n = len(updates)
    k = trim_count(n, fraction)
    tokens = torch.tensor([float(u.tokens) for u in updates], dtype=torch.float64)  # [n]
    if not tokens.sum() > 0:
        raise ValueError(f"total tokens must be positive, got {int(tokens.sum())}")
    columns = torch.sort(tokens, stable=True).indices  # [n] column c holds update columns[c]
    weights = tokens[columns]  # [n] ascending
    width = max(1, outer.AVERAGE_SLICE // n)
    stack = torch.empty(width, n, dtype=torch.float64)  # [width, n]
    trimmed = torch.zeros(n, dtype=torch.int64)  # [n] coordinates where column c was trimmed
    coordinates = 0
    average: Tensors = {}
    for name in updates[0].deltas:
        flats = [updates[i].deltas[name].contiguous().view(-1) for i in columns.tolist()]  # [numel] each
        first = updates[0].deltas[name]
        into = outer.reusable(spare, name, first) if first.dtype == torch.float32 else None
        result = torch.empty(first.shape, dtype=torch.float32) if into is None else into  # [*shape]
        out = result.view(-1)  # [numel]
        for start in range(0, out.numel(), width):
            stop = min(start + width, out.numel())
            block = stack[: stop - start]  # [m, n]
            for c, flat in enumerate(flats):
                block[:, c].copy_(flat[start:stop])
            values, order = torch.sort(block, dim=1, stable=True)  # [m, n] each
            kept_weights = _kept_weights(values, order, weights, k)  # [m, n − 2k]
            kept_values = values[:, k: n - k]  # [m, n − 2k]
            out[start:stop].copy_((kept_values * kept_weights).sum(dim=1) / kept_weights.sum(dim=1))
            if k:
                trimmed += _trimmed_columns(values, order, k)
        coordinates += out.numel()
        average[name] = result
    counts = torch.empty_like(trimmed).index_copy_(0, columns, trimmed).tolist()  # [n] in update order
    return average, tuple(_trim_outcome(u, count, coordinates, k, n) for u, count in zip(updates, counts))


def _kept_weights(values: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, k: int) -> torch.Tensor:
    """ω of the kept positions k..n−k−1 (0-based) of sorted rows `values` [m, n] (`order` [m, n]: their columns,
    whose tokens are `weights` [n], ascending; `trimmed_mean`): a position's own weight, or W_G / |G| where its tied
    group G crosses a cut. With equal tokens W_G / |G| is every member's own weight: nothing to split (the common
    case, workers of one configuration: the split doubled the time on updates with many ties, aggregation_bench
    --zeros 0.9).

    A group crossing a cut is the run of values equal to the kept value at that cut, in rows where that value
    equals its trimmed neighbour (v_(k) = v_(k+1) or v_(n−k) = v_(n−k+1), 1-based). Its W_G is summed in sorted
    order (ascending tokens within the tie), so the sum does not depend on the workers' order. (Finding the group's
    ends by binary search and W_G from running sums instead was slower here: docs/PERFORMANCE.md.)"""
    n = values.shape[1]
    kept = weights[order[:, k: n - k]]  # [m, n − 2k]
    if not k or bool((weights == weights[0]).all()):
        return kept
    sorted_weights = None
    for cut, neighbour in ((k, k - 1), (n - k - 1, n - k)):
        crosses = values[:, cut] == values[:, neighbour]  # [m] a tie across this cut
        if not bool(crosses.any()):
            continue
        if sorted_weights is None:
            sorted_weights = weights[order]  # [m, n]
        members = values == values[:, cut: cut + 1]  # [m, n] the group of the kept value at this cut
        total = torch.where(members, sorted_weights, 0.0).sum(dim=1, keepdim=True)  # [m, 1] W_G
        mean = total / members.sum(dim=1, keepdim=True)  # [m, 1] W_G / |G|
        kept = torch.where(members[:, k: n - k] & crosses.unsqueeze(1), mean, kept)  # [m, n − 2k]
    return kept


def _trimmed_columns(values: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """How many rows of sorted `values` [m, n] (`order` [m, n] their columns) trim each column, int64 [n]: the
    values at the k positions of each end strictly below the smallest kept value or strictly above the largest
    (a value tied with a kept one is not trimmed, whichever worker the sort put there)."""
    n = values.shape[1]
    below = values[:, :k] < values[:, k: k + 1]  # [m, k]
    above = values[:, n - k:] > values[:, n - k - 1: n - k]  # [m, k]
    ends = torch.cat([order[:, :k], order[:, n - k:]], dim=1)  # [m, 2k]
    columns = torch.where(torch.cat([below, above], dim=1), ends, n)  # [m, 2k], n where not trimmed
    return torch.bincount(columns.reshape(-1), minlength=n + 1)[:n]


def _trim_outcome(update: Update, count: int, coordinates: int, k: int, n: int) -> Outcome:
    """`trimmed_mean`'s outcome for an update trimmed in `count` of `coordinates`: flagged above half-way between
    the share 2k/n and all of them."""
    share = count / coordinates if coordinates else 0.0
    expected = 2 * k / n
    threshold = (expected + 1.0) / 2
    reason = f"trimmed in {share:.1%} of coordinates (expected {expected:.1%}; flagged above {threshold:.1%})"
    return Outcome(update.worker_id, update.tokens, update.norm, "trimmed" if k and share > threshold else "kept",
                   1.0 - share, reason)


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
                     else torch.zeros(_shape(updates[0].deltas, name), dtype=torch.float32)) for name in names}
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


def _shape(deltas: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """Tensor `name`'s shape, without decoding it when `deltas` are held encoded."""
    return deltas.shape(name) if isinstance(deltas, EncodedDeltas) else tuple(deltas[name].shape)


def _distances(updates: Sequence[Update], center: Mapping[str, torch.Tensor]) -> list[float]:
    """‖Δ_i − v‖ for every update, accumulated in float64 slice by slice."""
    sums = [0.0] * len(updates)
    wide = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    other = torch.empty(outer.AVERAGE_SLICE, dtype=torch.float64)  # [AVERAGE_SLICE]
    for name, v in center.items():
        flat_v = v.view(-1)  # [numel]
        flats = [u.deltas[name].contiguous().view(-1) for u in updates]  # [numel] each
        for start in range(0, flat_v.numel(), outer.AVERAGE_SLICE):
            stop = min(start + outer.AVERAGE_SLICE, flat_v.numel())
            v_s, x_s = other[: stop - start], wide[: stop - start]  # [slice]
            v_s.copy_(flat_v[start:stop])
            for i, flat in enumerate(flats):
                x_s.copy_(flat[start:stop]).sub_(v_s)
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
