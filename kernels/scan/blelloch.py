"""Static Blelloch scan (Alg. 1 of "Sequential-Parallel Duality in Prefix-Scannable Models").

The training-time scan of a PSM: all prefixes of n chunk states in O(log n) sequential,
batched operator calls and O(n) total work, for ANY binary operator with an identity,
associative or not. Alg. 1 keeps a perfect binary tree over 2^k leaves; the up-sweep sets
T[v] = op(T[2v], T[2v+1]) and the down-sweep sets P[root] = e, P[2v] = P[v],
P[2v+1] = op(P[v], T[2v]). The leaves' P are the EXCLUSIVE prefixes: P_0 = e, P_i covers
x_0..x_{i-1}; Alg. 1 never emits the aggregate of all 2^k leaves.

Parenthesisation (op(earlier, later), e = identity). For a block of 2^b aligned elements
the tree value is the balanced reduction

    R(x_a) = x_a,    R([a, a + 2^b)) = op(R(left half), R(right half)).

For m >= 1 write m = 2^{b_1} + ... + 2^{b_j} with b_1 > ... > b_j, and cut [0, m) into the
aligned blocks B_1, ..., B_j of sizes 2^{b_1}, ..., 2^{b_j}, largest first. Then

    P_0 = e,    P_m = op(...op(op(e, R(B_1)), R(B_2))..., R(B_j)),

e.g. P_1 = op(e, x0), P_3 = op(op(e, op(x0, x1)), x2),
P_6 = op(op(e, op(op(x0, x1), op(x2, x3))), op(x4, x5)). The identity is a real left
operand, exactly as in Alg. 1, so it matters when e is not a true identity.

Any n: conceptually the sequence is padded with e to 2^k > n leaves (one more than n, so that
P_n, the last inclusive prefix, is a leaf) and Alg. 1 is run as written. P_m only reads tree
nodes whose blocks lie inside [0, m), so padded leaves never reach an emitted prefix and
P_m is the formula above for every padded size; the implementation therefore skips the dead
padded nodes instead of computing them. Because P_m does not depend on n, the prefixes of
x[:m] are the first m prefixes of x, and the online binary-counter scan (`online.py`, Alg. 2)
reproduces them exactly (Theorem 3.5).

Per tree level the up-sweep and the down-sweep each make ONE batched operator call: the
static scan makes 2 * floor(log2 n) + 1 calls in all, with at most 2n + log2(n) + 1 rows.
"""

from __future__ import annotations

from rcswarm.kernels.scan.tree import (
    Element,
    Operator,
    Prefixes,
    check_element,
    combine,
    interleave,
    sequence_length,
    take,
    unsqueeze0,
)


def blelloch_scan(op: Operator, elements: Element, identity: Element) -> Prefixes:
    """Exclusive and inclusive prefixes of `elements` [n, *S_j] under the Blelloch tree.

    `op(earlier [K, *S_j], later [K, *S_j]) -> [K, *S_j]` must be batched over dim 0;
    `identity` is one element [*S_j]. Returns exclusive = (P_0..P_{n-1}) and
    inclusive = (P_1..P_n), each [n, *S_j] (views of one [n + 1, *S_j] array).
    """
    n = sequence_length(elements)
    check_element(identity, elements, "identity")
    sums = _upsweep(op, elements)
    prefixes = _downsweep(op, sums, identity, n)  # [n + 1, *S_j]
    return Prefixes(exclusive=take(prefixes, slice(0, n)), inclusive=take(prefixes, slice(1, n + 1)))


def _upsweep(op: Operator, elements: Element) -> list[Element]:
    """sums[l][j] = R([j 2^l, (j + 1) 2^l)) for the complete blocks, sums[l] is [n >> l, *S_j]."""
    sums = [elements]
    length = sequence_length(elements)
    while length >= 2:
        pairs = length // 2
        lower = sums[-1]
        sums.append(combine(op, take(lower, slice(0, 2 * pairs, 2)), take(lower, slice(1, 2 * pairs, 2))))
        length = pairs
    return sums


def _downsweep(op: Operator, sums: list[Element], identity: Element, n: int) -> Element:
    """P_0..P_n [n + 1, *S_j] from the complete-block sums, top level first.

    At level l the live nodes are j = 0..(n >> l), the ones whose block starts at or before
    leaf n. Even children copy the parent's P; odd children take op(P[parent], sums[l][j - 1]).
    """
    prefixes = unsqueeze0(identity)  # [1, *S_j]: the single live node of level n.bit_length()
    for level in reversed(range(n.bit_length())):
        live = (n >> level) + 1
        odd = live // 2
        left_sums = take(sums[level], slice(0, 2 * odd, 2))  # [odd, *S_j]
        right_children = combine(op, take(prefixes, slice(0, odd)), left_sums)  # [odd, *S_j]
        prefixes = interleave(prefixes, right_children)  # [live, *S_j]
    return prefixes
