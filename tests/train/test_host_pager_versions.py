"""`HostPager` checks the versions of the tensors it saves, as autograd does without hooks: a saved tensor modified in
place before backward reads it is an error, never a silently wrong gradient (on the CPU a page aliases the tensor)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from rcswarm.train.bptt.paged import HostPager

MODIFIED = r"modified by an inplace operation: \[torch\.float64 \[4\]\].* is at version 1; expected version 0 instead"


def _square_then_modify(x: Tensor) -> Tensor:
    y = x.exp()  # [4]
    z = (y * y).sum()
    y.add_(1)
    return z


def test_a_paged_tensor_modified_in_place_raises_like_autograd() -> None:
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _square_then_modify(x).backward()
    pager = HostPager()
    with pager.hooks():
        loss = _square_then_modify(x)
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()
    assert x.grad is None


def test_a_kept_parameter_modified_in_place_raises_like_autograd() -> None:
    weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    pager = HostPager(keep=[weight])
    with pager.hooks():
        loss = torch.tanh(x @ weight).sum()
    with torch.no_grad():
        weight.mul_(2)
    with pytest.raises(RuntimeError, match=r"\[torch\.float64 \[3, 3\]\], saved for backward through HostPager \(kept"):
        loss.backward()


def _chain(x: Tensor) -> Tensor:
    """In-place ops whose saved output is the modified tensor itself, at the version it had when saved: legal."""
    y = x * 2  # [4]
    y.sigmoid_()
    z = y * x  # [4]
    z.exp_()
    return (z * z).sum()


def test_legal_in_place_ops_are_not_flagged_and_gradients_are_exact() -> None:
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    _chain(x).backward()
    assert x.grad is not None
    want = x.grad.clone()
    x.grad = None
    pager = HostPager()
    with pager.hooks():
        loss = _chain(x)
    loss.backward(retain_graph=True)
    assert x.grad is not None and torch.equal(x.grad, want)
    loss.backward()
    assert torch.equal(x.grad, 2 * want)
    assert pager.paged_tensors > 0 and pager.unpacked_tensors == 2 * pager.paged_tensors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA pages are copies; needs a GPU")
def test_a_cuda_page_modified_in_place_raises_while_its_source_lives() -> None:
    x = torch.randn(1 << 20, dtype=torch.float64, device="cuda", requires_grad=True)
    pager = HostPager()
    with pager.hooks():
        y = x.exp()
        loss = (y * y).sum()
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    pager.close()
    x.grad = None
    pager = HostPager()
    with pager.hooks():
        loss = _square_then_modify(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    pager.close()
    pager = HostPager()
    with pager.hooks():
        y = x.exp()
        loss = (y * y).sum()
    loss.backward()
    pager.close()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, 2 * torch.exp(2 * x.detach()))
    assert pager.copied_to_host
