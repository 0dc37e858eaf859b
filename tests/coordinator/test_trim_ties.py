"""trimmed_mean on tied values: the aggregate and the flags depend on the updates' values and tokens, not on
the workers' order.

Found by a review (2026-11-29): a stable sort put ties in
worker order, so the zeros of sparse or 2-bit updates were "trimmed" for whichever workers sat at the ends (3
honest sparse workers: w0 trimmed in 98.8 % of coordinates, w2 in 99.0 %, both flagged; w1 2.2 %), and the kept
token weights went to whichever tied workers sat inside (the same five updates in two orders: 0.0192 and 0.3333).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rcswarm.coordinator import aggregation
from rcswarm.coordinator.aggregation import AggregationOptions, Update
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec, outer, tensor_stream

SHAPES = {"a": (3, 5), "b": (7,), "c": ()}
TRIM = AggregationOptions("trimmed_mean", trim_fraction=0.2, min_cosine=aggregation.DIRECTION_OFF)


@pytest.fixture(params=[4, 1 << 20], ids=["slices-of-4", "one-slice"])
def slices(request, monkeypatch):
    """Slices of 4 elements (tensors span several, with tails) and the default."""
    monkeypatch.setattr(outer, "AVERAGE_SLICE", request.param)


def tied_updates(tokens: list[int], seed: int, kind: str) -> list[Update]:
    """Updates of heavy ties: "sparse" (mostly 0, a few values of a small set) or "lowbit" (ternary × a scale)."""
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for i, n in enumerate(tokens):
        deltas = {}
        for name, shape in SHAPES.items():
            levels = torch.randint(-1, 2, shape, generator=generator).float()  # [*shape] in {-1, 0, 1}
            if kind == "sparse":
                mask = torch.rand(shape, generator=generator) < 0.3  # [*shape]
                deltas[name] = levels * mask * 0.5
            else:
                deltas[name] = levels * (0.25 if i % 2 else 0.5)
        updates.append(Update(f"w{i}", n, tensor_stream.global_norm(deltas), deltas))
    return updates


def continuous_updates(tokens: list[int], seed: int) -> list[Update]:
    """Random normal updates: no ties."""
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for i, n in enumerate(tokens):
        deltas = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
        updates.append(Update(f"w{i}", n, tensor_stream.global_norm(deltas), deltas))
    return updates


def flat64(update: Update) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in update.deltas.values()])  # [P]


def flat_result(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensors[name].reshape(-1).double() for name in SHAPES])  # [P]


def reference_by_value(updates: list[Update], k: int) -> tuple[torch.Tensor, list[int]]:
    """Per coordinate, plainly: each distinct value v with its group G of updates keeps c_G of its |G| sorted
    positions inside k..n−k−1 and weighs (c_G / |G|) · Σ_G tokens; an update is trimmed where its value is
    outside [smallest kept, largest kept]. Returns the aggregate [P] and each update's trimmed count."""
    x = torch.stack([flat64(u) for u in updates])  # [n, P]
    n = len(updates)
    result = torch.empty(x.shape[1], dtype=torch.float64)  # [P]
    trimmed = [0] * n
    for j in range(x.shape[1]):
        column = [float(v) for v in x[:, j]]
        ranked = sorted(column)
        lo, hi = ranked[k], ranked[n - k - 1]
        numerator = denominator = 0.0
        for value in sorted(set(column)):
            positions = [p for p, v in enumerate(ranked) if v == value]
            kept = sum(1 for p in positions if k <= p <= n - k - 1)
            weight = kept / len(positions) * sum(u.tokens for u, v in zip(updates, column) if v == value)
            numerator += weight * value
            denominator += weight
        result[j] = numerator / denominator
        for i, value in enumerate(column):
            trimmed[i] += value < lo or value > hi
    return result, trimmed


def old_trimmed_mean(updates: list[Update], k: int) -> torch.Tensor:
    """The aggregator before ties were handled by value (stable sort, kept positions' own weights), on one
    float64 block [P, n] with the same operations: what the result must equal, bit for bit, without ties."""
    n = len(updates)
    block = torch.stack([flat64(u) for u in updates], dim=1)  # [P, n]
    weights = torch.tensor([float(u.tokens) for u in updates], dtype=torch.float64)  # [n]
    values, order = torch.sort(block, dim=1, stable=True)  # [P, n] each
    kept_values, kept_weights = values[:, k: n - k], weights[order[:, k: n - k]]  # [P, n − 2k] each
    return ((kept_values * kept_weights).sum(dim=1) / kept_weights.sum(dim=1)).float().double()  # [P]


TOKENS = [[5, 9, 1], [5, 5, 9, 1, 30], [3, 100, 7, 7, 2, 40, 11], [4] * 16, list(range(1, 17))]


@pytest.mark.parametrize("tokens", TOKENS, ids=lambda t: f"n{len(t)}")
def test_without_ties_the_result_is_unchanged_bit_for_bit(tokens, slices):
    for seed in range(3):
        updates = continuous_updates(tokens, seed)
        k = aggregation.trim_count(len(tokens), 0.2)
        got = flat_result(aggregation.aggregate(updates, TRIM).average)
        assert torch.equal(got, old_trimmed_mean(updates, k))
        torch.testing.assert_close(got, reference_by_value(updates, k)[0].float().double(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["sparse", "lowbit"])
@pytest.mark.parametrize("tokens", TOKENS[:3], ids=lambda t: f"n{len(t)}")
def test_permuting_workers_does_not_change_the_aggregate_or_the_flags(tokens, kind, slices):
    updates = tied_updates(tokens, seed=len(tokens), kind=kind)
    first = aggregation.aggregate(updates, TRIM)
    by_id = {o.worker_id: (o.action, o.scale) for o in first.outcomes}
    orders = itertools.islice(itertools.permutations(range(len(updates))), 1, None, 97 if len(updates) > 5 else 1)
    for order in orders:
        again = aggregation.aggregate([updates[i] for i in order], TRIM)
        assert all(torch.equal(again.average[name], first.average[name]) for name in SHAPES), order
        assert {o.worker_id: (o.action, o.scale) for o in again.outcomes} == by_id, order


@pytest.mark.parametrize("kind", ["sparse", "lowbit"])
@pytest.mark.parametrize("tokens", TOKENS, ids=lambda t: f"n{len(t)}")
def test_ties_against_the_by_value_reference(tokens, kind, slices):
    updates = tied_updates(tokens, seed=1, kind=kind)
    k = aggregation.trim_count(len(tokens), 0.2)
    result = aggregation.aggregate(updates, TRIM)
    want, trimmed = reference_by_value(updates, k)
    torch.testing.assert_close(flat_result(result.average), want, rtol=1e-6, atol=1e-7)
    coordinates = sum(math.prod(shape) for shape in SHAPES.values())
    assert [o.scale for o in result.outcomes] == [1.0 - count / coordinates for count in trimmed]


def test_the_worker_that_trained_most_keeps_its_weight_in_any_order():
    """The review's case: c trained 5000 tokens and sent 0, tied with a and b; one of the three zeros is cut.
    Each keeps 2/3 of its tokens: x̄ = (100 · 1) / (2/3 · 5200 + 100), whatever the order; only e (2, the
    largest) is trimmed, the zero at the cut is not."""
    values, tokens = [0.0, 0.0, 0.0, 1.0, 2.0], [100, 100, 5000, 100, 100]
    updates = [Update(name, tokens[i], abs(values[i]) + 1e-3, {"p": torch.tensor([values[i]])})
               for i, name in enumerate("abcde")]
    first = aggregation.aggregate(updates, TRIM).average["p"]  # [1]
    assert float(first[0]) == pytest.approx(100.0 / (2 / 3 * 5200 + 100), rel=1e-7)  # 0.0280 (before: 0.0192)
    for order in itertools.permutations(range(5)):
        result = aggregation.aggregate([updates[i] for i in order], TRIM)
        assert torch.equal(result.average["p"], first), order
        assert {o.worker_id: o.scale for o in result.outcomes} == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 0.0}


@pytest.mark.parametrize("fmt", [codec.WireFormat(pb.CODEC_SPARSE, 4096, codec.sparse_keep(0.02, 4096), 2),
                                 codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 256, 0, 2)], ids=["sparse", "lowbit2"])
def test_honest_encoded_workers_are_not_flagged(fmt):
    """The review's case: three honest workers, the same signal plus noise, really encoded (mostly exact zeros).
    Before: w0 and w2 trimmed in 98.8 % and 99.0 % of the sparse coordinates (93 % with 2-bit lowbit), flagged."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(65536, generator=generator)  # [P]
    updates = []
    for i in range(3):
        decoded = codec.decode(codec.encode(base + 0.3 * torch.randn(65536, generator=generator), fmt), fmt, (65536,))
        updates.append(Update(f"w{i}", 1000, float(decoded.norm()), {"p": decoded}))
    outcomes = aggregation.aggregate(updates, TRIM).outcomes
    assert not any(o.flagged for o in outcomes), [o.reason for o in outcomes]
    shares = [1.0 - o.scale for o in outcomes]
    assert max(shares) < 2 / 3 and max(shares) - min(shares) < 0.01, shares
