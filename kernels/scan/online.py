"""Online binary-counter scan (Alg. 2 of "Sequential-Parallel Duality in Prefix-Scannable Models").

The inference-time scan of a PSM (Alg. 4): elements arrive one at a time and each push
returns the prefix that the static Blelloch scan (`blelloch.py`) gives at that position, bit
for bit for a deterministic, batch-invariant operator, associative or not (Theorem 3.5).

After t pushes, t = 2^{b_1} + ... + 2^{b_j} (b_1 > ... > b_j), the counter holds one root per
set bit: root[b_i] = R(B_i), the balanced reduction of the aligned block B_i of 2^{b_i}
elements (blocks in stream order, largest first). A push carries like binary +1: while
root[k] is occupied, carry = op(root[k], carry) (earlier block on the left, as in the
up-sweep) and root[k] is freed. The prefix is the MSB -> LSB fold
op(...op(op(e, R(B_1)), R(B_2))..., R(B_j)), which is the static scan's P_t.

Memory: popcount(t) <= floor(log2 t) + 1 = ceil(log2(t + 1)) roots (Corollary 3.6, with t
counting the elements pushed). Alg. 2 refolds all roots on every push, O(log t) calls; here
each root also keeps the fold of e and the roots above it, so a push costs its carries plus
ONE fold call: at most 2 calls per push amortised, and at most 2 ceil(log2(t + 1)) stored
elements. Every call is the operator on a batch of K = 1.
"""

from __future__ import annotations

from rcswarm.kernels.scan.tree import (
    Element,
    Operator,
    check_element,
    combine_one,
    leaves_of,
    unsqueeze0,
)


class OnlineScan:
    """Streaming Blelloch prefixes in O(log t) memory.

    `push(x)` with x one element [*S_j] (shaped like `identity`) returns the inclusive prefix
    of everything pushed so far, equal to `blelloch_scan(...).inclusive[t - 1]` after t
    pushes. `prefix` is the exclusive prefix for the next element (the identity before the
    first push): the PSM state s_{i-1} to use while chunk i is being decoded.
    """

    def __init__(self, op: Operator, identity: Element) -> None:
        leaves_of(identity, "identity")
        self._op = op
        self._identity = identity
        self._roots: list[Element | None] = []
        self._folds: list[Element | None] = []
        self._count = 0
        self._prefix = identity

    @property
    def count(self) -> int:
        """Elements pushed so far, t."""
        return self._count

    @property
    def num_roots(self) -> int:
        """Occupied roots (block aggregates) held now: popcount(t)."""
        return sum(root is not None for root in self._roots)

    def stored(self) -> list[Element]:
        """Every element held now: the occupied roots and their cached folds."""
        return [element for element in self._roots + self._folds if element is not None]

    @property
    def prefix(self) -> Element:
        """Aggregate of everything pushed so far (P_t); the identity before the first push."""
        return self._prefix

    def push(self, element: Element) -> Element:
        """Add the next element and return the new prefix P_t (see class doc)."""
        check_element(element, unsqueeze0(self._identity), "element")
        level, carry = self._carry(element)
        above = next((fold for fold in self._folds[level + 1 :] if fold is not None), self._identity)
        self._folds[level] = combine_one(self._op, above, carry)
        self._roots[level] = carry
        self._count += 1
        self._prefix = self._folds[level]
        return self._prefix

    def _carry(self, element: Element) -> tuple[int, Element]:
        """Binary +1: merge and free the occupied low roots; the level and value of the new root."""
        carry = element
        level = 0
        while level < len(self._roots) and self._roots[level] is not None:
            root = self._roots[level]
            assert root is not None
            carry = combine_one(self._op, root, carry)
            self._roots[level] = None
            self._folds[level] = None
            level += 1
        if level == len(self._roots):
            self._roots.append(None)
            self._folds.append(None)
        return level, carry
