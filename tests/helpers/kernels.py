"""What the kernel tests share: the comparison with a reference, and the flag of the Triton interpreter's child.

tests/swarm/test_triton_interpreter.py runs tests/kernels/test_sgsa.py's `triton_child` tests in a pytest
subprocess with TRITON_INTERPRET=1 and SGSA_CHILD_ENV=1 (the variable must be set before triton is imported).
"""

from __future__ import annotations

from rcswarm.kernels.checks import relative_error

SGSA_CHILD_ENV = "RCSWARM_SGSA_TRITON_CHILD"

__all__ = ["SGSA_CHILD_ENV", "relative_error"]
