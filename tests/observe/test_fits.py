"""Power-law fits against laws with known parameters."""

import numpy as np
import pytest

from rcswarm.observe.fits import (
    AlphaScheduleFit,
    amplitude_from_points,
    fit_alpha_over_steps,
    fit_alpha_schedule,
    fit_power_law,
    observed_crossover,
    per_doubling,
    predicted_crossover,
    seconds_per_step,
)


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


PAPER_ALPHA_INF, PAPER_TAU = 0.308, 720.0


def paper_runs(noise: float = 0.01, seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """loss(L | s) = A(s) L^(−α(s)) with the paper's α∞ and τ, A(s) falling from 5.8 to 5, multiplicative noise."""
    rng = np.random.default_rng(seed)
    steps = np.arange(25, 4001, 25, dtype=float)
    amplitude = 5.0 + 0.8 * np.exp(-steps / 1500.0)
    alpha = PAPER_ALPHA_INF * (1 - np.exp(-steps / PAPER_TAU))
    return {
        length: (steps, amplitude * length ** -alpha * np.exp(rng.normal(0, noise, steps.shape)))
        for length in (2, 4, 8, 16)
    }


def test_schedule_exact_law_is_recovered():
    steps = np.linspace(50, 4000, 30)
    fit = fit_alpha_schedule(steps, 0.308 * (1 - np.exp(-steps / 720)))
    assert fit.alpha_inf == pytest.approx(0.308, rel=1e-6)
    assert fit.tau == pytest.approx(720, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-9)
    assert fit.alpha(720) == pytest.approx(0.308 * (1 - np.exp(-1)), rel=1e-6)
    assert fit.per_doubling == pytest.approx(2 ** -0.308, rel=1e-6)


def test_schedule_through_the_papers_three_points():
    fit = fit_alpha_schedule([400, 650, 4000], [0.129, 0.196, 0.318])
    assert abs(fit.alpha_inf - PAPER_ALPHA_INF) < 0.015
    assert fit.tau == pytest.approx(PAPER_TAU, rel=0.05)
    assert fit.r_squared > 0.99


def test_noisy_paper_law_recovers_alpha_inf_and_tau():
    points = fit_alpha_over_steps(paper_runs())
    assert len(points) == 40 and all(p.r_squared > 0.5 for p in points[-10:])
    fit = fit_alpha_schedule([p.step for p in points], [p.alpha for p in points])
    assert fit.alpha_inf == pytest.approx(PAPER_ALPHA_INF, rel=0.1)
    assert fit.tau == pytest.approx(PAPER_TAU, rel=0.1)
    assert points[-1].amplitude == pytest.approx(5.0 + 0.8 * np.exp(-4000 / 1500), rel=0.05)


def test_alpha_over_steps_interpolates_at_given_steps():
    steps = np.array([0.0, 100.0, 200.0])
    runs = {length: (steps, 4.0 * length ** -(0.001 * steps + 0.1)) for length in (2, 4, 8)}
    points = fit_alpha_over_steps(runs, steps=[50, 150])
    assert [p.step for p in points] == [50, 150]
    assert points[1].alpha == pytest.approx(0.25, rel=1e-9)
    assert points[1].amplitude == pytest.approx(4.0, rel=1e-9)


def test_observed_crossover_on_hand_made_curves():
    short = ([0, 10, 20, 30], [3.0, 2.0, 1.8, 1.7])
    long_ = ([0, 10, 20, 30], [4.0, 2.2, 1.6, 1.4])
    assert observed_crossover(*short, *long_) == pytest.approx(10 + 10 * 0.2 / 0.4)
    assert observed_crossover(*short, [0, 30], [5.0, 1.9]) is None
    assert observed_crossover(*short, [5, 30], [1.0, 1.0]) == 5


def test_predicted_crossover_follows_eq_11():
    schedule = AlphaScheduleFit(alpha_inf=0.3, tau=100.0, r_squared=1.0)

    def amplitude(step: float) -> float:
        return float(np.log(2.0 + 3.0 * np.exp(-step / 200.0)))

    cross = predicted_crossover(schedule, 2, 1.0, 4, 2.0, log_amplitude=amplitude)
    assert cross is not None and cross.step_short == pytest.approx(2 * cross.step_long)

    def log_loss(step, length):
        return amplitude(step) - schedule.alpha(step) * np.log(length)

    for time in (cross.time * 1.01, cross.time * 10):
        assert log_loss(time / 2.0, 4) < log_loss(time / 1.0, 2)
    assert log_loss(cross.time * 0.99 / 2.0, 4) > log_loss(cross.time * 0.99, 2)
    assert predicted_crossover(schedule, 2, 1.0, 4, 2.0, log_amplitude=amplitude, max_time=cross.time / 2) is None


def test_predicted_crossover_on_the_synthetic_law_matches_the_observed_one():
    runs = paper_runs(noise=0.0)
    points = fit_alpha_over_steps(runs)
    schedule = fit_alpha_schedule([p.step for p in points], [p.alpha for p in points])
    steps, short = runs[2]
    _, long_ = runs[4]
    observed = observed_crossover(steps * 0.1, short, steps * 0.2, long_)
    cross = predicted_crossover(schedule, 2, 0.1, 4, 0.2, log_amplitude=amplitude_from_points(points))
    assert observed is not None and cross is not None
    assert cross.time == pytest.approx(observed, rel=0.15)


def test_helpers_and_bad_input():
    assert per_doubling(0.308) == pytest.approx(0.808, abs=1e-3)
    assert seconds_per_step([1, 2, 3], [0.5, 1.0, 1.5]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least 3 distinct"):
        fit_alpha_schedule([1, 1, 2], [0.1, 0.1, 0.2])
    with pytest.raises(ValueError, match="positive finite"):
        fit_alpha_schedule([-1, 2, 3], [0.1, 0.1, 0.2])
    with pytest.raises(ValueError, match="at least 3 distinct lengths"):
        fit_alpha_over_steps({2: ([1, 2], [1, 1]), 4: ([1, 2], [1, 1])})
    with pytest.raises(ValueError, match="common range"):
        fit_alpha_over_steps(paper_runs(), steps=[10_000])
    with pytest.raises(ValueError, match="shorter < longer"):
        predicted_crossover(AlphaScheduleFit(0.3, 100, 1), 4, 1, 2, 1)
    with pytest.raises(ValueError, match="increase with step"):
        seconds_per_step([1, 2], [2.0, 1.0])


def test_smooth_losses_is_a_centred_mean_with_shrinking_ends():
    from rcswarm.observe.fits import smooth_losses

    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert smooth_losses(values, 1).tolist() == values
    assert smooth_losses(values, 3).tolist() == pytest.approx([1.5, 2.0, 3.0, 17 / 3, 7.0])
    assert smooth_losses(values, 4).tolist() == pytest.approx([2.0, 2.5, 4.75, 17 / 3, 7.0])
    assert smooth_losses(values, 99).tolist() == pytest.approx([4.0] * 5)
    for window in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window"):
            smooth_losses(values, window)


def test_smoothing_removes_a_noise_crossover_but_keeps_the_real_one():
    steps = np.arange(1, 401, dtype=float)
    short = 2.0 + 1.0 / steps  # [400]
    long_ = 1.9 + 3.0 / steps
    wiggle = np.where(np.arange(400) % 2 == 0, 0.3, -0.3)
    noisy_long = long_ + wiggle
    raw = observed_crossover(steps, short, steps, noisy_long)
    from rcswarm.observe.fits import smooth_losses

    smoothed = observed_crossover(steps, short, steps, smooth_losses(noisy_long, 2))
    assert smoothed == pytest.approx(20.0, abs=1.0)
    assert raw is None or raw > 300
