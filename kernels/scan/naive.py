"""The definition of a prefix scan: the sequential left fold.

`sequential_prefixes` is the reference the parallel scans are checked against. Argument
order everywhere in this package: `op(earlier, later)`. The fold is left-nested,

    inclusive[0] = x0,  inclusive[i] = op(inclusive[i - 1], x_i) = op(...op(op(x0, x1), x2)..., x_i),

and exclusive[0] = identity, exclusive[i] = inclusive[i - 1]. The identity is not used as an
operand, so for a non-associative operator (or an `identity` that is not a true identity)
this differs from the Blelloch parenthesisation of `blelloch.py`; for an associative operator
with a true identity the two agree. It makes n - 1 operator calls of batch size 1.
"""

from __future__ import annotations

from rcswarm.kernels.scan.tree import (
    Element,
    Operator,
    Prefixes,
    cat,
    check_element,
    combine_one,
    row,
    sequence_length,
    stack,
    take,
    unsqueeze0,
)


def sequential_prefixes(op: Operator, elements: Element, identity: Element) -> Prefixes:
    """Left-fold prefixes of `elements` [n, *S_j]; both arrays are [n, *S_j] (see module doc)."""
    n = sequence_length(elements)
    check_element(identity, elements, "identity")
    accumulator = row(elements, 0)
    folds = [accumulator]
    for index in range(1, n):
        accumulator = combine_one(op, accumulator, row(elements, index))
        folds.append(accumulator)
    inclusive = stack(folds)  # [n, *S_j]
    exclusive = cat((unsqueeze0(identity), take(inclusive, slice(0, n - 1))))  # [n, *S_j]
    return Prefixes(exclusive=exclusive, inclusive=inclusive)
