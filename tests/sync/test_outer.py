"""DiLoCo's outer step: token weighting and Nesterov SGD against hand computation and torch."""

import pytest
import torch

from rcswarm.config.runspec import OuterSection
from rcswarm.sync.outer import outer_step, weighted_average


def test_token_weighting():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(4.0)}
    b = {"w": torch.tensor([5.0, -2.0]), "b": torch.tensor(0.0)}
    avg = weighted_average([(100, a), (300, b)])
    assert torch.equal(avg["w"], torch.tensor([4.0, -1.0]))
    assert torch.equal(avg["b"], torch.tensor(1.0))
    with pytest.raises(ValueError, match="empty"):
        weighted_average([])
    with pytest.raises(ValueError, match="positive"):
        weighted_average([(0, a)])


def test_nesterov_step_matches_hand_computation():
    options = OuterSection(lr=0.7, momentum=0.9, nesterov=True)
    theta = {"p": torch.tensor([1.0], dtype=torch.float64)}
    buf = {"p": torch.tensor([0.0], dtype=torch.float64)}
    # step 1: b = 0.5; θ = 1 - 0.7 (0.5 + 0.9·0.5) = 0.335
    theta, buf = outer_step(theta, buf, {"p": torch.tensor([0.5], dtype=torch.float64)}, options)
    assert buf["p"].item() == pytest.approx(0.5, abs=1e-15)
    assert theta["p"].item() == pytest.approx(0.335, abs=1e-15)
    # step 2: b = 0.9·0.5 + 0.2 = 0.65; θ = 0.335 - 0.7 (0.2 + 0.9·0.65) = -0.2145
    theta, buf = outer_step(theta, buf, {"p": torch.tensor([0.2], dtype=torch.float64)}, options)
    assert buf["p"].item() == pytest.approx(0.65, abs=1e-15)
    assert theta["p"].item() == pytest.approx(-0.2145, abs=1e-15)


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_step_equals_torch_sgd(nesterov):
    gen = torch.Generator().manual_seed(0)
    options = OuterSection(lr=0.7, momentum=0.9, nesterov=nesterov)
    theta = {"w": torch.randn(5, 3, generator=gen, dtype=torch.float64)}
    buf = {"w": torch.zeros(5, 3, dtype=torch.float64)}
    reference = torch.nn.Parameter(theta["w"].clone())
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=nesterov)
    for _ in range(4):
        delta = torch.randn(5, 3, generator=gen, dtype=torch.float64)
        theta, buf = outer_step(theta, buf, {"w": delta}, options)
        reference.grad = delta.clone()
        sgd.step()
        torch.testing.assert_close(theta["w"], reference.detach(), rtol=0, atol=1e-14)


def test_lr_one_without_momentum_lands_on_the_worker_parameters():
    options = OuterSection(lr=1.0, momentum=0.0, nesterov=True)
    theta = {"w": torch.tensor([0.25, -1.5, 3.0])}
    local = torch.tensor([0.5, -1.0, 2.0])
    new, _ = outer_step(theta, {"w": torch.zeros(3)}, {"w": theta["w"] - local}, options)
    assert torch.equal(new["w"], local)
