"""rcswarm.kernels.scan: prefix scans for Prefix-Scannable Models (PSMs) and affine RNN layers.

After "Sequential-Parallel Duality in Prefix-Scannable Models", Section 3. Every operator
is called as op(earlier, later) and is batched over dim 0 of its operands (`tree.py`).

- `blelloch_scan`: the static scan (Alg. 1) for training, O(log n) batched calls, any
  operator, associative or not; its parenthesisation is documented in `blelloch.py`.
- `OnlineScan`: the binary-counter scan (Alg. 2) for streaming inference; bit-identical
  prefixes in O(log t) memory.
- `sequential_prefixes`: the left fold, the definition for associative operators.
- `prefix_scan`: one entry point over the three methods.
- `affine.py`: the associative affine aggregator (Lemma 3.4) and `affine_scan`;
  `families.py`: Table 1 layers as affine inputs, with their plain recurrences.
"""

from rcswarm.kernels.scan.affine import (
    AFFINE_KINDS,
    AffineKind,
    AffineSequence,
    affine_identity,
    affine_operator,
    affine_scan,
    diagonal_combine,
    matrix_combine,
)
from rcswarm.kernels.scan.blelloch import blelloch_scan
from rcswarm.kernels.scan.dispatch import (
    SCAN_METHODS,
    ScanMethod,
    online_prefixes,
    prefix_scan,
)
from rcswarm.kernels.scan.families import (
    deltanet_elements,
    deltanet_recurrence,
    diagonal_gate_elements,
    diagonal_gate_recurrence,
    gated_deltanet_elements,
    gated_deltanet_recurrence,
    linear_attention_elements,
    linear_attention_recurrence,
    outer,
    retnet_elements,
    retnet_recurrence,
)
from rcswarm.kernels.scan.naive import sequential_prefixes
from rcswarm.kernels.scan.online import OnlineScan
from rcswarm.kernels.scan.tree import Element, Operator, Prefixes

__all__ = [
    "AFFINE_KINDS",
    "SCAN_METHODS",
    "AffineKind",
    "AffineSequence",
    "Element",
    "OnlineScan",
    "Operator",
    "Prefixes",
    "ScanMethod",
    "affine_identity",
    "affine_operator",
    "affine_scan",
    "blelloch_scan",
    "deltanet_elements",
    "deltanet_recurrence",
    "diagonal_combine",
    "diagonal_gate_elements",
    "diagonal_gate_recurrence",
    "gated_deltanet_elements",
    "gated_deltanet_recurrence",
    "linear_attention_elements",
    "linear_attention_recurrence",
    "matrix_combine",
    "online_prefixes",
    "outer",
    "prefix_scan",
    "retnet_elements",
    "retnet_recurrence",
    "sequential_prefixes",
]
