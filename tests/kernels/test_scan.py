"""Tests of rcswarm.kernels.scan: Blelloch and online scans, the affine aggregator, Table 1 families."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from rcswarm.kernels.scan import (
    AffineSequence,
    Element,
    OnlineScan,
    Operator,
    affine_identity,
    affine_operator,
    affine_scan,
    blelloch_scan,
    deltanet_elements,
    deltanet_recurrence,
    diagonal_gate_elements,
    diagonal_gate_recurrence,
    gated_deltanet_elements,
    gated_deltanet_recurrence,
    linear_attention_elements,
    linear_attention_recurrence,
    prefix_scan,
    retnet_elements,
    retnet_recurrence,
    sequential_prefixes,
)

F64 = torch.float64


def _softsign(x: Tensor) -> Tensor:
    return x / (1 + x.abs())


def _linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x @ weight + bias as explicit products summed in a fixed order: [K, I] -> [K, O]."""
    out = bias.expand(*x.shape[:-1], bias.shape[0])
    for index in range(weight.shape[0]):
        out = out + x[..., index : index + 1] * weight[index]
    return out


class PairMLP:
    """A non-associative operator: a 2-layer MLP on [earlier | later] -> [K, dim].

    Only elementwise, correctly rounded ops (no BLAS, no transcendental kernels), so every row
    is bit-identical whatever the batch size K; that is what bit-exact scan comparisons need.
    """

    def __init__(self, dim: int, hidden: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(2 * dim, hidden, generator=gen, dtype=F64) / math.sqrt(dim)
        self.b1 = torch.randn(hidden, generator=gen, dtype=F64)
        self.w2 = torch.randn(hidden, dim, generator=gen, dtype=F64) * 2 / math.sqrt(hidden)
        self.b2 = torch.randn(dim, generator=gen, dtype=F64)

    def __call__(self, earlier: Element, later: Element) -> Element:
        assert isinstance(earlier, Tensor) and isinstance(later, Tensor)
        pair = torch.cat((earlier, later), dim=-1)  # [K, 2 dim]
        return _linear(_softsign(_linear(pair, self.w1, self.b1)), self.w2, self.b2)  # [K, dim]


MLP = PairMLP(dim=3, hidden=8, seed=0)


def tuple_op(earlier: Element, later: Element) -> Element:
    """Non-associative on (h [K, 3], m [K, 2, 2]) pairs."""
    assert isinstance(earlier, tuple) and isinstance(later, tuple)
    (h_a, m_a), (h_b, m_b) = earlier, later
    return (MLP(h_a, h_b), _softsign(m_a - 2 * m_b) + h_a[:, :2, None] * m_b)


class Counting:
    """Wraps an operator; counts its calls and the rows (K) it was given."""

    def __init__(self, op: Operator) -> None:
        self.op, self.calls, self.rows = op, 0, 0

    def __call__(self, earlier: Element, later: Element) -> Element:
        self.calls += 1
        self.rows += (earlier if isinstance(earlier, Tensor) else earlier[0]).shape[0]
        return self.op(earlier, later)


def one(op: Operator, earlier: Tensor, later: Tensor) -> Tensor:
    out = op(earlier[None], later[None])
    assert isinstance(out, Tensor)
    return out[0]


def add(earlier: Element, later: Element) -> Element:
    assert isinstance(earlier, Tensor) and isinstance(later, Tensor)
    return earlier + later


def matmul(earlier: Element, later: Element) -> Element:
    assert isinstance(earlier, Tensor) and isinstance(later, Tensor)
    return earlier @ later


def randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def assert_prefixes_equal(actual: Element, expected: Element) -> None:
    actual_leaves = (actual,) if isinstance(actual, Tensor) else actual
    expected_leaves = (expected,) if isinstance(expected, Tensor) else expected
    assert len(actual_leaves) == len(expected_leaves)
    for got, want in zip(actual_leaves, expected_leaves):
        assert torch.equal(got, want)


def test_the_mlp_operator_is_not_associative_so_the_order_matters() -> None:
    x = randn(3, 3, seed=1)
    left_nested = one(MLP, one(MLP, x[0], x[1]), x[2])
    right_nested = one(MLP, x[0], one(MLP, x[1], x[2]))
    assert (left_nested - right_nested).abs().max() > 1e-3
    identity = randn(3, seed=2)
    blelloch = blelloch_scan(MLP, x, identity).inclusive
    sequential = sequential_prefixes(MLP, x, identity).inclusive
    assert (blelloch - sequential).abs().max() > 1e-3


def test_online_scan_reproduces_static_prefixes_bit_for_bit() -> None:
    n = 64
    x, identity = randn(n, 3, seed=3), randn(3, seed=4)
    static = blelloch_scan(MLP, x, identity)
    scan = OnlineScan(MLP, identity)
    for t in range(1, n + 1):
        assert torch.equal(scan.prefix, static.exclusive[t - 1])
        assert torch.equal(scan.push(x[t - 1]), static.inclusive[t - 1])
        assert scan.count == t
        assert scan.num_roots <= math.ceil(math.log2(t + 1))


def test_online_scan_reproduces_static_prefixes_for_tuple_elements() -> None:
    n = 37
    x = (randn(n, 3, seed=5), randn(n, 2, 2, seed=6))
    identity = (randn(3, seed=7), randn(2, 2, seed=8))
    static = blelloch_scan(tuple_op, x, identity)
    scan = OnlineScan(tuple_op, identity)
    for t in range(n):
        pushed = scan.push((x[0][t], x[1][t]))
        assert isinstance(pushed, tuple) and isinstance(static.inclusive, tuple)
        assert_prefixes_equal(pushed, (static.inclusive[0][t], static.inclusive[1][t]))
    assert_prefixes_equal(prefix_scan(tuple_op, x, identity, "online").exclusive, static.exclusive)


def test_number_of_roots_is_the_popcount_and_within_corollary_3_6() -> None:
    scan = OnlineScan(add, torch.zeros((), dtype=torch.int64))
    for t in range(1, 300):
        scan.push(torch.tensor(t))
        assert scan.num_roots == t.bit_count()
        assert scan.num_roots <= math.ceil(math.log2(t + 1))


def test_online_scan_makes_at_most_two_operator_calls_per_push_amortised() -> None:
    counting = Counting(MLP)
    scan = OnlineScan(counting, randn(3, seed=9))
    for t, row in enumerate(randn(100, 3, seed=10), start=1):
        scan.push(row)
        assert counting.calls <= 2 * t


def test_static_prefixes_of_a_prefix_do_not_depend_on_the_length() -> None:
    x, identity = randn(40, 3, seed=11), randn(3, seed=12)
    full = blelloch_scan(MLP, x, identity)
    for m in range(1, 41):
        part = blelloch_scan(MLP, x[:m], identity)
        assert torch.equal(part.exclusive, full.exclusive[:m])
        assert torch.equal(part.inclusive, full.inclusive[:m])


def _alg1_heap(op: Operator, leaves: list[Tensor], identity: Tensor, size: int) -> list[Tensor]:
    """Alg. 1 as printed: heap layout over `size` leaves padded with the identity; P at the leaves."""
    tree = [identity] * (2 * size)
    tree[size : size + len(leaves)] = leaves
    for node in range(size - 1, 0, -1):
        tree[node] = one(op, tree[2 * node], tree[2 * node + 1])
    prefix = [identity] * (2 * size)
    for node in range(1, size):
        prefix[2 * node] = prefix[node]
        prefix[2 * node + 1] = one(op, prefix[node], tree[2 * node])
    return prefix[size:]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 13, 16])
def test_static_scan_equals_alg1_on_identity_padded_trees(n: int) -> None:
    x, identity = randn(n, 3, seed=13), randn(3, seed=14)
    scanned = blelloch_scan(MLP, x, identity)
    for size in (1 << n.bit_length(), 2 << n.bit_length()):
        leaf_prefixes = _alg1_heap(MLP, list(x), identity, size)
        assert torch.equal(scanned.exclusive, torch.stack(leaf_prefixes[:n]))
        assert torch.equal(scanned.inclusive, torch.stack(leaf_prefixes[1 : n + 1]))


def _balanced(op: Operator, block: list[Tensor]) -> Tensor:
    if len(block) == 1:
        return block[0]
    half = len(block) // 2
    return one(op, _balanced(op, block[:half]), _balanced(op, block[half:]))


def _documented_prefix(op: Operator, x: list[Tensor], identity: Tensor, m: int) -> Tensor:
    """P_m = op(...op(op(e, R(B_1)), R(B_2))..., R(B_j)) over the binary decomposition of m."""
    value, start = identity, 0
    for bit in reversed(range(m.bit_length())):
        if m >> bit & 1:
            value = one(op, value, _balanced(op, x[start : start + (1 << bit)]))
            start += 1 << bit
    return value


def test_static_scan_follows_the_documented_parenthesisation() -> None:
    n = 23
    x, identity = randn(n, 3, seed=15), randn(3, seed=16)
    scanned = blelloch_scan(MLP, x, identity)
    for m in range(n):
        assert torch.equal(scanned.exclusive[m], _documented_prefix(MLP, list(x), identity, m))
        assert torch.equal(scanned.inclusive[m], _documented_prefix(MLP, list(x), identity, m + 1))


def test_static_scan_is_differentiable() -> None:
    small = PairMLP(dim=2, hidden=3, seed=17)
    x = randn(6, 2, seed=18).requires_grad_()
    identity = randn(2, seed=19)

    def inclusive(elements: Tensor) -> Tensor:
        out = blelloch_scan(small, elements, identity).inclusive
        assert isinstance(out, Tensor)
        return out

    assert torch.autograd.gradcheck(inclusive, (x,))


LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100]


@pytest.mark.parametrize("n", LENGTHS)
def test_integer_addition_matches_the_left_fold_exactly(n: int) -> None:
    x = torch.randint(-1000, 1000, (n, 4), generator=torch.Generator().manual_seed(n))
    identity = torch.zeros(4, dtype=torch.int64)
    static = blelloch_scan(add, x, identity)
    assert torch.equal(static.inclusive, x.cumsum(0))
    assert_prefixes_equal(static.exclusive, sequential_prefixes(add, x, identity).exclusive)


@pytest.mark.parametrize("n", LENGTHS)
def test_permutation_products_match_the_left_fold_exactly(n: int) -> None:
    gen = torch.Generator().manual_seed(100 + n)
    eye = torch.eye(5, dtype=torch.int64)
    x = torch.stack([eye[torch.randperm(5, generator=gen)] for _ in range(n)])  # [n, 5, 5], non-commuting
    static = blelloch_scan(matmul, x, eye)
    sequential = sequential_prefixes(matmul, x, eye)
    assert torch.equal(static.inclusive, sequential.inclusive)
    assert torch.equal(static.exclusive, sequential.exclusive)


@pytest.mark.parametrize("n", LENGTHS)
def test_orthogonal_products_match_the_left_fold(n: int) -> None:
    x = torch.linalg.qr(randn(n, 4, 4, seed=200 + n)).Q  # [n, 4, 4]
    static = blelloch_scan(matmul, x, torch.eye(4, dtype=F64))
    sequential = sequential_prefixes(matmul, x, torch.eye(4, dtype=F64))
    torch.testing.assert_close(static.inclusive, sequential.inclusive, rtol=0, atol=1e-13)
    torch.testing.assert_close(static.exclusive, sequential.exclusive, rtol=0, atol=1e-13)


def _random_affine(n: int, kind: str, seed: int) -> AffineSequence:
    gen = torch.Generator().manual_seed(seed)
    offset = torch.randn(n, 2, 3, 4, generator=gen, dtype=F64)  # [T, B, d_v, d_k]
    if kind == "matrix":
        transition = torch.linalg.qr(torch.randn(n, 2, 4, 4, generator=gen, dtype=F64)).Q * 0.9
    else:
        transition = torch.rand(n, 2, 1, 4, generator=gen, dtype=F64) + 0.5
    return AffineSequence(transition, offset, kind)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["diagonal", "matrix"])
@pytest.mark.parametrize("n", [1, 3, 8, 13, 32, 33])
def test_affine_aggregator_scan_matches_the_left_fold(kind: str, n: int) -> None:
    sequence = _random_affine(n, kind, seed=n)
    op, identity = affine_operator(sequence.kind), affine_identity(sequence)
    static = blelloch_scan(op, sequence.elements, identity)
    sequential = sequential_prefixes(op, sequence.elements, identity)
    pairs = ((static.inclusive, sequential.inclusive), (static.exclusive, sequential.exclusive))
    for scanned, folded in pairs:
        assert isinstance(scanned, tuple) and isinstance(folded, tuple)
        for got, want in zip(scanned, folded):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["diagonal", "matrix"])
def test_affine_aggregator_is_associative_with_an_exact_identity(kind: str) -> None:
    sequence = _random_affine(3, kind, seed=300)
    op, identity = affine_operator(sequence.kind), affine_identity(sequence)
    a, b, c = ((sequence.transition[i : i + 1], sequence.offset[i : i + 1]) for i in range(3))
    for got, want in zip(op(op(a, b), c), op(a, op(b, c))):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    e = (identity[0][None], identity[1][None])
    assert_prefixes_equal(op(e, a), a)
    assert_prefixes_equal(op(a, e), a)


def test_matrix_aggregator_applies_the_earlier_transition_first() -> None:
    first = (torch.tensor([[[0.0, 1.0], [0.0, 0.0]]], dtype=F64), torch.zeros(1, 1, 2, dtype=F64))
    second = (torch.tensor([[[1.0, 0.0], [0.0, 0.0]]], dtype=F64), torch.tensor([[[0.0, 5.0]]], dtype=F64))
    state = torch.tensor([[[3.0, 4.0]]], dtype=F64)  # [1, 1, 2]: a row state
    transition, offset = affine_operator("matrix")(first, second)
    assert torch.equal(state @ transition + offset, (state @ first[0] + first[1]) @ second[0] + second[1])


def _family_case(family: str, T: int, seed: int) -> tuple[AffineSequence, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    B, H = (int(s) for s in torch.randint(1, 3, (2,), generator=gen))
    d_k, d_v = (int(s) for s in torch.randint(2, 6, (2,), generator=gen))

    def rand(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=gen, dtype=F64)

    k = torch.nn.functional.normalize(torch.randn(T, B, H, d_k, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(T, B, H, d_v, generator=gen, dtype=F64)
    beta, alpha = rand(T, B, H), 0.8 + 0.2 * rand(T, B, H)
    if family == "linear_attention":
        return linear_attention_elements(k, v), linear_attention_recurrence(k, v)
    if family == "retnet":
        gamma = 0.9 + 0.1 * rand(H)
        return retnet_elements(k, v, gamma), retnet_recurrence(k, v, gamma)
    if family == "diagonal_gate":
        gate = 0.7 + 0.3 * rand(T, B, H, d_k)
        return diagonal_gate_elements(k, v, gate), diagonal_gate_recurrence(k, v, gate)
    if family == "diagonal_gate_per_entry":
        gate = 0.7 + 0.3 * rand(T, B, H, d_v, d_k)
        return diagonal_gate_elements(k, v, gate), diagonal_gate_recurrence(k, v, gate)
    if family == "deltanet":
        return deltanet_elements(k, v, beta), deltanet_recurrence(k, v, beta)
    assert family == "gated_deltanet"
    return gated_deltanet_elements(k, v, beta, alpha), gated_deltanet_recurrence(k, v, beta, alpha)


FAMILIES = ["linear_attention", "retnet", "diagonal_gate", "diagonal_gate_per_entry", "deltanet", "gated_deltanet"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("T", [1, 6, 16, 45])
def test_affine_scan_matches_the_family_recurrence(family: str, T: int) -> None:
    sequence, reference = _family_case(family, T, seed=T * 31 + FAMILIES.index(family))
    for method in ("blelloch", "online"):
        states = affine_scan(sequence, method)  # type: ignore[arg-type]
        assert states.shape == reference.shape
        error = (states - reference).flatten(1).norm(dim=1) / reference.flatten(1).norm(dim=1)  # [T]
        assert error.max() <= 1e-12, (method, error.max())


@pytest.mark.parametrize("n", list(range(1, 70)) + [127, 128, 129, 1000])
def test_static_scan_makes_logarithmically_many_batched_calls(n: int) -> None:
    counting = Counting(add)
    blelloch_scan(counting, torch.arange(n), torch.tensor(0))
    assert counting.calls <= 2 * math.ceil(math.log2(n)) + 1
    assert counting.rows <= 2 * n + n.bit_length()


X = torch.zeros(4, 3)
ZERO = torch.zeros(3)


@pytest.mark.parametrize(
    ("elements", "identity", "match"),
    [
        (torch.zeros(0, 3), ZERO, r"elements=tensor\[0, 3\].*empty sequence"),
        ((), ZERO, r"elements=\(\).*expected a tensor or a non-empty tuple"),
        ([X], ZERO, r"elements=list.*expected a tensor"),
        (torch.tensor(1.0), torch.tensor(0.0), r"elements=tensor\[\].*sequence on dim 0"),
        ((X, torch.zeros(5, 3)), (ZERO, ZERO), r"leaves disagree on the sequence length"),
        (X, torch.zeros(4), r"identity=tensor\[4\] float32.*tensor\[3\] float32"),
        (X, (ZERO, ZERO), r"identity=\(tensor\[3\] float32, tensor\[3\] float32\).*tensor\[3\]"),
        (X, torch.zeros(3, dtype=F64), r"identity=tensor\[3\] float64.*tensor\[3\] float32"),
    ],
)
@pytest.mark.parametrize("method", ["blelloch", "online", "sequential"])
def test_bad_sequences_and_identities_are_rejected(
    elements: object, identity: object, match: str, method: str
) -> None:
    with pytest.raises(ValueError, match=match):
        prefix_scan(add, elements, identity, method)  # type: ignore[arg-type]


def test_an_operator_that_breaks_the_shape_contract_is_named() -> None:
    with pytest.raises(ValueError, match=r"op returned tensor\[2\] float32 for operands tensor\[2, 3\] float32"):
        blelloch_scan(lambda a, b: add(a, b).sum(-1), X, ZERO)


def test_online_push_of_a_mismatched_element_is_rejected() -> None:
    scan = OnlineScan(add, ZERO)
    with pytest.raises(ValueError, match=r"element=tensor\[4\] float32.*tensor\[3\] float32"):
        scan.push(torch.zeros(4))
    assert scan.count == 0


def test_unknown_method_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"method='parallel'.*'blelloch', 'online', 'sequential'"):
        prefix_scan(add, X, ZERO, "parallel")  # type: ignore[arg-type]


K = torch.zeros(5, 2, 3, 4)
V = torch.zeros(5, 2, 3, 6)
STEP = torch.zeros(5, 2, 3)
OFFSET = torch.zeros(5, 2, 4)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: linear_attention_elements(K, V[:4]), r"v=tensor\[4, 2, 3, 6\].*dtype of k=tensor\[5, 2, 3, 4\]"),
        (lambda: linear_attention_elements(torch.zeros(0, 4), torch.zeros(0, 6)), r"k=tensor\[0, 4\]"),
        (lambda: deltanet_elements(K, V, STEP[..., :2]), r"beta=tensor\[5, 2, 2\].*tensor\[5, 2, 3\]"),
        (lambda: gated_deltanet_recurrence(K, V, STEP, STEP[0]), r"alpha=tensor\[2, 3\]"),
        (lambda: diagonal_gate_elements(K, V, torch.zeros(5, 2, 3, 5)), r"alpha=tensor\[5, 2, 3, 5\].*key gate"),
        (lambda: retnet_elements(K, V, torch.zeros(4)), r"gamma=tensor\[4\].*broadcastable to \[2, 3\]"),
        (lambda: AffineSequence(torch.zeros(5, 3, 3), OFFSET, "matrix"), r"transition=tensor\[5, 3, 3\].*\[5, 4, 4\]"),
        (lambda: AffineSequence(torch.zeros(5, 2, 3), OFFSET, "diagonal"), r"transition=tensor\[5, 2, 3\].*rank"),
        (lambda: AffineSequence(torch.zeros(5, 1, 4), OFFSET, "dense"), r"kind='dense'"),
        (lambda: AffineSequence(torch.zeros(5, 1, 4, dtype=F64), OFFSET, "diagonal"), r"transition=tensor.*dtype"),
    ],
)
def test_bad_affine_inputs_are_rejected(build: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()
