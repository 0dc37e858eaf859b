"""Power-law fits against laws with known parameters."""

import numpy as np
import pytest

from rcswarm.coordinator.fits import fit_power_law


def test_exact_power_law_is_recovered():
    lengths = [2, 4, 8, 16, 32]
    fit = fit_power_law(lengths, [5.5 * length ** -0.3 for length in lengths])
    assert fit.alpha == pytest.approx(0.3, abs=1e-12)
    assert fit.amplitude == pytest.approx(5.5, rel=1e-12)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-12)
    assert fit.per_doubling == pytest.approx(2 ** -0.3)
    assert fit.predict(64) == pytest.approx(5.5 * 64 ** -0.3)


def test_noisy_law_gives_an_interval_around_the_truth():
    rng = np.random.default_rng(1)
    lengths = np.repeat([2, 4, 8, 16], 5)
    losses = 5.2 * lengths ** -0.25 * np.exp(rng.normal(0, 0.02, lengths.shape))
    fit = fit_power_law(lengths, losses)
    assert fit.alpha_low < 0.25 < fit.alpha_high
    assert fit.alpha_high - fit.alpha_low < 0.05
    assert 0.9 < fit.r_squared < 1.0


@pytest.mark.parametrize(
    "lengths, losses, fragment",
    [([2, 4], [1.0, 0.9], "at least 3"), ([2, 4, 8], [1.0, -0.9, 0.8], "positive"), ([2, 4, 8], [1.0, 0.9], "one length")],
)
def test_bad_input(lengths, losses, fragment):
    with pytest.raises(ValueError, match=fragment):
        fit_power_law(lengths, losses)
