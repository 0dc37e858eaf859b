"""Power-law fits against laws with known parameters."""

import math

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
    power_law_band,
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


def test_the_formula_reads_the_sign_of_alpha():
    lengths = [16, 128, 512]
    falling = fit_power_law(lengths, [2.66 * length ** -0.0788 for length in lengths])
    rising = fit_power_law(lengths, [2.66 * length ** 0.0788 for length in lengths])
    assert falling.formula() == "2.66·L^(−0.079)"
    assert rising.formula() == "2.66·L^(+0.079)"  # the loss rises with L: never "L^(−-0.079)"
    assert rising.formula(4) == "2.66·L^(+0.0788)"


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
    assert observed_crossover(*short, *long_).time == pytest.approx(10 + 10 * 0.2 / 0.4)
    above = observed_crossover(*short, [0, 30], [5.0, 1.9])
    assert above.time is None and above.note == "the longer L ends above"
    # Below throughout the counted range: no crossover is observed (it came before counting began, if at all).
    below = observed_crossover(*short, [5, 30], [1.0, 1.0])
    assert below.time is None and "below from 5 s on" in below.note
    # A crossing before `counted_from` is not counted; one after it is.
    assert "below from 16 s on" in observed_crossover(*short, *long_, counted_from=16).note
    assert observed_crossover(*short, *long_, counted_from=14).time == pytest.approx(15)
    # Ending below by less than the noise is no crossover; by more, it is.
    assert "within the noise 0.31" in observed_crossover(*short, *long_, noise=0.31).note
    assert observed_crossover(*short, *long_, noise=0.29).time == pytest.approx(15)
    with pytest.raises(ValueError, match="noise"):
        observed_crossover(*short, *long_, noise=-1.0)


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
    observed = observed_crossover(steps * 0.1, short, steps * 0.2, long_).time
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


def window_means(values: np.ndarray, window: int) -> np.ndarray:
    """The centred moving average summed window by window (math.fsum): what smooth_losses should return."""
    before, after = (window - 1) // 2, window // 2
    windows = [values[max(i - before, 0):i + after + 1] for i in range(len(values))]
    return np.array([math.fsum(held) / len(held) for held in windows])


def test_smooth_losses_equals_the_window_means_on_a_long_noisy_curve():
    from rcswarm.observe.fits import smooth_losses

    steps = np.arange(1, 20001, dtype=float)
    losses = 3.0 * steps ** -0.2 * np.exp(np.random.default_rng(0).normal(0.0, 0.05, len(steps)))  # [20000]
    for window in (1, 2, 25, 26, 101):
        np.testing.assert_allclose(smooth_losses(losses, window), window_means(losses, window), rtol=1e-12)
    assert smooth_losses([], 25).shape == (0,)


def test_one_huge_loss_changes_only_the_windows_that_hold_it():
    from rcswarm.observe.analysis import fit_step_means
    from rcswarm.observe.fits import smooth_losses

    losses = np.r_[np.full(30, 1.0), 1e20, np.full(30, 1.0)]  # [61], the spike at index 30
    smoothed = smooth_losses(losses, 25)  # a window of 25 holds the spike from index 18 to 42
    assert smoothed[:18].tolist() == [1.0] * 18 and smoothed[43:].tolist() == [1.0] * 18
    assert np.all(smoothed[18:43] > 1e18)
    rows = [(length, step, 3.0 * step ** -0.2 * length ** -0.1, step * length / 100)
            for length in (64, 128, 256) for step in range(1, 200)]
    clean = fit_step_means(rows)
    spiked = fit_step_means(rows + [(128, 50, 1e20, 50 * 128 / 100)])
    assert spiked.message is None or "expected finite" not in spiked.message
    assert spiked.analysis is not None and spiked.analysis.schedule is not None
    assert spiked.analysis.points[-1].alpha == pytest.approx(clean.analysis.points[-1].alpha, rel=1e-9)


def test_smoothing_removes_a_noise_crossover_but_keeps_the_real_one():
    steps = np.arange(1, 401, dtype=float)
    short = 2.0 + 1.0 / steps  # [400]
    long_ = 1.9 + 3.0 / steps
    wiggle = np.where(np.arange(400) % 2 == 0, 0.3, -0.3)
    noisy_long = long_ + wiggle
    raw = observed_crossover(steps, short, steps, noisy_long).time
    from rcswarm.observe.fits import smooth_losses

    smoothed = observed_crossover(steps, short, steps, smooth_losses(noisy_long, 2)).time
    assert smoothed == pytest.approx(20.0, abs=1.0)
    assert raw is None or raw > 300


def test_an_exact_law_has_no_caveats_and_a_tight_band():
    lengths = [2, 4, 8, 16]
    losses = [5.5 * length ** -0.3 for length in lengths]
    fit = fit_power_law(lengths, losses)
    assert fit.caveats() == []
    low, high = power_law_band(lengths, losses, [2, 5, 16])
    assert low == pytest.approx([fit.predict(x) for x in (2, 5, 16)], rel=1e-9)
    assert high == pytest.approx(low, rel=1e-9)
    steps = np.linspace(50, 4000, 30)
    schedule = fit_alpha_schedule(steps, 0.308 * (1 - np.exp(-steps / 720)))
    assert schedule.caveats() == [] and schedule.first_step == 50 and schedule.last_step == 4000
    # The resamples are fitted on the grid alone (τ within 3.5%): their intervals hug the exact values.
    assert schedule.alpha_inf_low == pytest.approx(0.308, rel=0.01)
    assert schedule.tau_high == pytest.approx(720, rel=0.05)


def test_noisy_law_band_brackets_the_truth_and_says_when_alpha_is_not_identified():
    rng = np.random.default_rng(3)
    lengths = np.repeat([2, 4, 8, 16], 5)
    losses = 5.2 * lengths ** -0.25 * np.exp(rng.normal(0, 0.02, lengths.shape))
    low, high = power_law_band(lengths, losses, [2, 16])
    assert np.all(low < 5.2 * np.array([2, 16]) ** -0.25) and np.all(5.2 * np.array([2, 16]) ** -0.25 < high)
    # Three lengths whose losses hardly fall: α's interval is wider than α, and R² is low.
    flat = fit_power_law([2, 4, 8], [2.0, 1.97, 2.01])
    assert [c[:16] for c in flat.caveats()] == ["α's 90% interval", "R² = 0.06 is bel"]


def test_a_schedule_that_has_not_levelled_off_does_not_identify_alpha_inf():
    """α(s) still rising linearly at the last step: τ lies beyond the data, α∞ is an extrapolation."""
    steps = np.linspace(10, 300, 30)
    rng = np.random.default_rng(0)
    alphas = 0.3 * (1 - np.exp(-steps / 3000)) + rng.normal(0, 0.002, steps.shape)
    fit = fit_alpha_schedule(steps, alphas)
    caveats = fit.caveats()
    assert caveats and "beyond the data's last common step 300" in caveats[0].text
    assert caveats[0].parameters == ("alpha_inf", "tau") and fit.tau > 300


def test_a_flat_schedule_leaves_tau_bounded_and_noise_widens_the_intervals():
    steps = np.linspace(100, 1000, 30)
    flat = fit_alpha_schedule(steps, np.full(30, 0.2) + np.random.default_rng(1).normal(0, 1e-3, 30))
    assert any("below the first matched step" in c.text and c.parameters == ("tau",) for c in flat.caveats())
    noisy = fit_alpha_schedule(steps, 0.2 * (1 - np.exp(-steps / 300)) + np.random.default_rng(2).normal(0, 0.05, 30))
    texts = [c.text for c in noisy.caveats()]
    assert any(text.startswith("τ's 90% interval") for text in texts), texts
    assert any(text.startswith("R² = ") for text in texts), texts
    # A law given by hand (the curriculum's configured one) has no intervals and no caveats.
    assert AlphaScheduleFit(0.3, 100.0, float("nan")).caveats() == []


def test_ema_smooth_is_tensorboards_debiased_moving_average():
    from rcswarm.observe.fits import ema_smooth

    values = [4.0, 2.0, 3.0]
    assert ema_smooth(values, 0.0).tolist() == values
    # last = 0.6·last + 0.4·x, divided by 1 − 0.6^k: 4, (0.96 + 0.8) / 0.64, ...
    expected, last = [], 0.0
    for k, value in enumerate(values, start=1):
        last = 0.6 * last + 0.4 * value
        expected.append(last / (1 - 0.6 ** k))
    assert ema_smooth(values, 0.6).tolist() == pytest.approx(expected)
    assert expected[0] == pytest.approx(4.0) and expected[1] == pytest.approx(1.76 / 0.64)
    assert ema_smooth([2.5] * 50, 0.99).tolist() == pytest.approx([2.5] * 50)
    for weight in (1.0, -0.1, "0.5", True):
        with pytest.raises(ValueError, match="smoothing weight"):
            ema_smooth(values, weight)


def test_the_plateau_ends_when_the_loss_stays_ten_percent_below_its_start():
    from rcswarm.observe.fits import counting_start, gap_noise, plateau_end, step_noise

    times = [0, 1, 2, 3, 4, 5]
    assert plateau_end(times, [5.0, 4.9, 4.4, 4.6, 4.0, 3.0]) == 4  # 4.6 > 4.5 at t=3: back above
    assert plateau_end(times, [5.0, 4.9, 4.8, 4.7, 4.6, 4.6]) is None
    assert counting_start([4.0, 2.0], 0.0, 100.0) == 10.0 and counting_start([40.0], 0.0, 100.0) == 40.0
    # Gaussian noise of σ = 0.1 about a falling trend: the trend does not count, the noise does.
    noisy = np.linspace(3, 2, 4000) + np.random.default_rng(0).normal(0, 0.1, 4000)
    assert step_noise(noisy) == pytest.approx(0.1, rel=0.05)
    assert gap_noise(noisy, noisy, 25) == pytest.approx(2 * np.sqrt(2) * step_noise(noisy) / 5)


def test_the_gap_noise_of_a_window_wider_than_the_curves_counts_only_their_steps():
    # A mean holds at most the steps a curve has: a window of 10^9 over 40 steps is a 40-step mean (before: its noise
    # was divided by sqrt(10^9), almost zero, and any gap counted as a crossover).
    from rcswarm.observe.fits import gap_noise

    short = np.random.default_rng(1).normal(3, 0.1, 40)
    long = np.random.default_rng(2).normal(2, 0.1, 60)
    assert gap_noise(short, long, 10**9) == gap_noise(short, long, 40) > gap_noise(short, long, 60) / 2
    assert gap_noise(short, long, 10) > gap_noise(short, long, 40)
