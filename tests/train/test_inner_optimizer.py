"""The inner optimizer runs torch's AdamW and SGD arithmetic bit for bit without torch.optim's classes (issue #31:
their first call imports torch._dynamo, seconds of a worker's start-up)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rcswarm.config.runspec import InnerSection
from rcswarm.train.inner import InnerOptimizer


def reference(kind: str, params: list[nn.Parameter], inner: InnerSection) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=inner.lr, betas=(inner.beta1, inner.beta2), weight_decay=inner.weight_decay)
    return torch.optim.SGD(params, lr=inner.lr, weight_decay=inner.weight_decay)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_inner_optimizer_equals_torchs_bit_for_bit(kind: str) -> None:
    inner = InnerSection(optimizer=kind, lr=3e-2, weight_decay=0.1, beta1=0.8, beta2=0.95)
    torch.manual_seed(0)
    start = [torch.randn(7, 5), torch.randn(5), torch.randn(3, 3)]
    ours = [nn.Parameter(t.clone()) for t in start]
    theirs = [nn.Parameter(t.clone()) for t in start]
    mine, ref = InnerOptimizer(ours, inner), reference(kind, theirs, inner)
    for step in range(6):
        grads = [torch.randn_like(t) * 10 ** (step % 3 - 1) for t in start]
        for optimizer, params in ((mine, ours), (ref, theirs)):
            optimizer.zero_grad(set_to_none=True)
            for index, (p, g) in enumerate(zip(params, grads)):
                if not (index == 2 and step < 2):  # the last parameter gets no gradient in the first two steps
                    p.grad = g.clone()
            optimizer.step()
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b), (kind, step)
    assert all(p.grad is not None for p in ours)
    mine.zero_grad()
    assert all(p.grad is None for p in ours)


def test_an_unknown_optimizer_is_refused() -> None:
    section = InnerSection()
    object.__setattr__(section, "optimizer", "lion")  # past the section's own validation, as a bad caller could
    with pytest.raises(ValueError, match="inner.optimizer = 'lion'"):
        InnerOptimizer([], section)
