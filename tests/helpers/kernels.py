"""What the kernel tests share: the comparison with a reference, and the flag of the Triton interpreter's child.

tests/swarm/test_triton_interpreter.py runs tests/kernels/test_sgsa.py's `triton_child` tests in a pytest
subprocess with TRITON_INTERPRET=1 and SGSA_CHILD_ENV=1 (the variable must be set before triton is imported).
"""

from __future__ import annotations

import torch

SGSA_CHILD_ENV = "RCSWARM_SGSA_TRITON_CHILD"


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| / max(max |reference|, tiny): the kernels' comparison with their references."""
    scale = reference.abs().max().clamp_min(1e-300)
    return float((value - reference).abs().max() / scale)
