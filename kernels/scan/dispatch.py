"""One entry point for the prefix scans: `prefix_scan(op, elements, identity, method)`.

"blelloch" is the static parallel scan (training), "online" streams the elements through the
binary-counter scan and returns the same values bit for bit (a reference for inference code),
and "sequential" is the left fold, which differs from the other two for a non-associative
operator (see `naive.py` and `blelloch.py`).
"""

from __future__ import annotations

from typing import Literal

from rcswarm.kernels.scan.blelloch import blelloch_scan
from rcswarm.kernels.scan.naive import sequential_prefixes
from rcswarm.kernels.scan.online import OnlineScan
from rcswarm.kernels.scan.tree import (
    Element,
    Operator,
    Prefixes,
    cat,
    check_element,
    row,
    sequence_length,
    stack,
    take,
    unsqueeze0,
)

ScanMethod = Literal["blelloch", "online", "sequential"]
SCAN_METHODS: tuple[ScanMethod, ...] = ("blelloch", "online", "sequential")


def prefix_scan(op: Operator, elements: Element, identity: Element, method: ScanMethod = "blelloch") -> Prefixes:
    """Exclusive and inclusive prefixes of `elements` [n, *S_j], each [n, *S_j], by `method`."""
    if method == "blelloch":
        return blelloch_scan(op, elements, identity)
    if method == "online":
        return online_prefixes(op, elements, identity)
    if method == "sequential":
        return sequential_prefixes(op, elements, identity)
    raise ValueError(f"method={method!r}: expected one of {', '.join(map(repr, SCAN_METHODS))}")


def online_prefixes(op: Operator, elements: Element, identity: Element) -> Prefixes:
    """The prefixes of `blelloch_scan`, computed by pushing the elements one by one."""
    n = sequence_length(elements)
    check_element(identity, elements, "identity")
    scan = OnlineScan(op, identity)
    inclusive = stack([scan.push(row(elements, index)) for index in range(n)])  # [n, *S_j]
    exclusive = cat((unsqueeze0(identity), take(inclusive, slice(0, n - 1))))  # [n, *S_j]
    return Prefixes(exclusive=exclusive, inclusive=inclusive)
