"""Shared kernel check: results must not depend on what uninitialized memory holds."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _poison_allocator(fill: float) -> None:
    """Allocate, fill and free a few large buffers so later allocations may reuse that memory."""
    buffers = [torch.full((1 << 20,), fill) for _ in range(8)] + [torch.full((4096,), fill) for _ in range(64)]
    del buffers


def assert_independent_of_uninitialized_memory(run: Callable[[], list[Tensor]]) -> None:
    """`run` (outputs and gradients) under NaN-, zero- and inf-filled freed memory, and with
    torch.empty NaN-poisoned by torch's deterministic mode: every run finite and bitwise equal."""
    runs = []
    for fill in (float("nan"), 0.0, float("inf")):
        _poison_allocator(fill)
        runs.append(run())
    previous = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        assert torch.isnan(torch.empty(4)).all()  # the poisoning is active
        runs.append(run())
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.utils.deterministic.fill_uninitialized_memory = previous[1]
    for tensor in runs[0]:
        assert torch.isfinite(tensor).all()
    for other in runs[1:]:
        for first, second in zip(runs[0], other, strict=True):
            assert torch.equal(first, second)
