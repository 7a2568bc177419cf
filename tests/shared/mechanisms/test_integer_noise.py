"""Exact integer noise (shared/mechanisms/integer_noise.py) against its exact pmf, exact tail masses, closed forms,
Definition 19 of the optimal-unbiased paper, and OpenDP's discrete Laplace.

Statistical tests use fixed seeds and thresholds far from chance (p > 1e-3 for a correct sampler; the power checks
show the same tests reject a nearby wrong distribution with p < 1e-6)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from shared.domains import MAX_LATTICE_STEPS
from shared.mechanisms.integer_noise import (
    DiscreteLaplace,
    DiscreteStaircase,
    bernoulli_exp_neg,
    discrete_staircase_second_moments,
    geometric_exp,
)
from shared.privacy import EPSILON_MAX, EPSILON_MIN


def chi_square_against(samples: np.ndarray, pmf, min_expected: float = 20.0) -> float:
    """p-value of a chi-square test of integer ``samples`` against ``pmf`` (a function of integer arrays). Values
    whose expected count is at least ``min_expected`` get a bin each; everything below and everything above them
    is pooled into one bin per side, so the test sees the tail masses too. The pmf is evaluated on a window ten
    times wider than the samples' range, beyond which its mass is negligible (e^-100 for these noises)."""
    n = samples.size
    span = int(samples.max()) - int(samples.min()) + 1
    window = np.arange(int(samples.min()) - 10 * span, int(samples.max()) + 10 * span + 1)
    p = pmf(window)
    keep = np.flatnonzero(n * p >= min_expected)
    a, b = window[keep[0]], window[keep[-1]]
    observed = np.concatenate([[np.sum(samples < a)],
                               np.bincount(samples[(samples >= a) & (samples <= b)] - a, minlength=b - a + 1),
                               [np.sum(samples > b)]])
    expected = n * np.concatenate([[p[window < a].sum()], p[(window >= a) & (window <= b)], [p[window > b].sum()]])
    used = expected > 0
    assert observed[~used].sum() == 0, "samples where the pmf is zero"
    return float(stats.chisquare(observed[used], expected[used] * n / expected[used].sum()).pvalue)


# -- the primitives --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("numerator", "denominator"), [(0, 1), (1, 1), (1, 3), (2, 3), (7, 10), (999, 1000)])
def test_bernoulli_exp_neg_has_probability_exp_minus_gamma(numerator, denominator):
    n = 400_000
    draws = bernoulli_exp_neg(np.full(n, numerator), denominator, np.random.default_rng(numerator + 10))
    p = math.exp(-numerator / denominator)
    assert draws.dtype == bool
    if numerator == 0:
        assert draws.all()
        return
    assert stats.binomtest(int(draws.sum()), n, p).pvalue > 1e-3
    # power: a 1 % error in the probability is caught
    assert stats.binomtest(int(draws.sum()), n, min(1.0, p * 1.01)).pvalue < 1e-3 or p * 1.01 > 1


@pytest.mark.parametrize(("s", "t"), [(1, 1), (1, 7), (3, 2), (5, 1)])
def test_geometric_pmf_is_exactly_geometric(s, t):
    y = geometric_exp(s, t, 300_000, np.random.default_rng(s * 100 + t))
    q = math.exp(-s / t)
    assert y.min() >= 0
    assert chi_square_against(y, lambda z: np.where(z >= 0, (1 - q) * q ** np.maximum(z, 0).astype(float), 0.0)) \
        > 1e-3


def test_bernoulli_refuses_parameters_it_cannot_sample_exactly():
    rng = np.random.default_rng(0)
    for n, d in ((2, 1), (-1, 3), (1, 0), (1, 2**60)):
        with pytest.raises(ValueError):
            bernoulli_exp_neg(n, d, rng)


# -- discrete Laplace --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("epsilon", "sensitivity"), [(0.1, 2), (0.5, 1), (1.0, 51), (4.0, 3), (8.0, 1)])
def test_discrete_laplace_calibration_is_exact_and_tight(epsilon, sensitivity):
    noise = DiscreteLaplace.calibrated(epsilon, sensitivity)
    exact_eps = noise.epsilon(sensitivity)
    assert isinstance(exact_eps, Fraction) and exact_eps <= Fraction(epsilon)
    assert float(exact_eps) > epsilon * (1 - 2**-30)
    assert noise.certified_epsilon(sensitivity) >= exact_eps  # rounded up, never understated
    assert Fraction(noise.certified_epsilon(sensitivity)) - exact_eps < Fraction(1, 2**52) * epsilon
    # the worst log-ratio of the pmf over every shift up to the sensitivity, by brute force
    z = np.arange(-6 * sensitivity - 20, 6 * sensitivity + 21)
    logp = np.log(noise.pmf(z))
    worst = max(float(np.max(np.abs(logp[d:] - logp[:-d]))) for d in range(1, sensitivity + 1))
    assert worst == pytest.approx(float(exact_eps), rel=1e-9)


@pytest.mark.parametrize("scale", [0.4, 1.0, 3.0, 25.5])
def test_discrete_laplace_samples_follow_the_exact_pmf_and_tails(scale):
    noise = DiscreteLaplace.calibrated(1.0 / scale, 1)
    z = noise.sample(400_000, np.random.default_rng(int(scale * 10)))
    assert z.dtype == np.int64
    assert chi_square_against(z, noise.pmf) > 1e-3
    # exact tail masses: Pr[Z >= t] for t beyond the bulk, against binomial confidence
    for t in (1, int(3 * scale) + 1, int(6 * scale) + 2):
        tail = noise.upper_tail(t)
        assert stats.binomtest(int(np.sum(z >= t)), z.size, tail).pvalue > 1e-4
        assert stats.binomtest(int(np.sum(z <= -t)), z.size, tail).pvalue > 1e-4
    # power: the same test rejects a scale 5 % off
    wrong = DiscreteLaplace.calibrated(1.0 / (scale * 1.05), 1)
    assert chi_square_against(z, wrong.pmf) < 1e-6


def test_discrete_laplace_pmf_tail_and_variance_against_direct_sums():
    noise = DiscreteLaplace.calibrated(0.3, 1)
    k = np.arange(-4000, 4001)
    pmf = noise.pmf(k)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert float(np.sum(k.astype(float) ** 2 * pmf)) == pytest.approx(noise.variance, rel=1e-10)
    suffix = np.cumsum(pmf[::-1])[::-1]
    for t in range(-60, 61):
        assert noise.upper_tail(t) == pytest.approx(suffix[t + 4000], abs=1e-13)


def test_discrete_laplace_matches_opendp():
    """Two-sample chi-square between this sampler and OpenDP's integer Laplace (unseeded: OpenDP draws from its own
    cryptographic source, so the threshold is strict enough to make a false failure a 1e-5 event)."""
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    measurement = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=3.0)
    theirs = np.asarray(measurement([0] * 60_000), dtype=np.int64)
    ours = DiscreteLaplace.calibrated(1 / 3.0, 1).sample(60_000, np.random.default_rng(3))
    edges = np.arange(-15, 17) - 0.5
    table = np.array([np.histogram(np.clip(x, -15, 16), bins=np.append(edges, 16.5))[0] for x in (ours, theirs)])
    assert stats.chi2_contingency(table).pvalue > 1e-5
    # and both agree with the exact pmf
    assert chi_square_against(theirs, DiscreteLaplace.calibrated(1 / 3.0, 1).pmf) > 1e-5


# -- discrete staircase -------------------------------------------------------------------------------------------

def definition_19_pmf(epsilon: float, delta: int, r: int, k: np.ndarray) -> np.ndarray:
    """Definition 19 built from its levels and normalized by summation (independent of the library)."""
    i = np.abs(k)
    period, offset = np.divmod(i, delta)
    level = period + (offset >= r)
    w = np.exp(-epsilon * level.astype(np.float64))
    return w / w.sum()


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1), (0.5, 20), (1.0, 5), (2.0, 51), (8.0, 10)])
def test_staircase_is_definition_19_up_to_integer_weights(epsilon, delta):
    noise = DiscreteStaircase.calibrated(epsilon, delta)
    exact_eps = noise.epsilon(delta)
    assert exact_eps <= Fraction(epsilon) and float(exact_eps) > epsilon * (1 - 2**-30)
    # the weights' ratio is e^ε to ~1e-12 at these ε, so the realized pmf is Definition 19's
    assert noise.w_low / noise.w_high == pytest.approx(math.exp(float(exact_eps)), rel=1e-11)
    k = np.arange(-40 * delta - int(40 * delta / epsilon), 40 * delta + int(40 * delta / epsilon) + 1)
    np.testing.assert_allclose(noise.pmf(k), definition_19_pmf(float(exact_eps), delta, noise.r, k), rtol=1e-9,
                               atol=1e-300)
    assert noise.pmf(k).sum() == pytest.approx(1.0, abs=1e-12)
    # privacy loss over every shift up to Δ, by brute force, is exactly ε
    window = np.arange(-3 * delta - 3, 3 * delta + 4)
    logp = np.log(noise.pmf(window))
    worst = max(float(np.max(np.abs(logp[d:] - logp[:-d]))) for d in range(1, delta + 1))
    assert worst <= float(exact_eps) * (1 + 1e-12) and worst == pytest.approx(float(exact_eps), rel=1e-9)
    # variance: realized closed form = direct sum = Definition 19's closed form for the chosen r
    kf = k.astype(np.float64)
    assert noise.variance == pytest.approx(float(np.sum(kf**2 * noise.pmf(k))), rel=1e-9)
    assert noise.variance == pytest.approx(discrete_staircase_second_moments(float(exact_eps), delta)[noise.r - 1],
                                           rel=1e-9)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 20), (1.0, 5), (8.0, 10)])
def test_staircase_samples_follow_the_pmf_and_tails(epsilon, delta):
    noise = DiscreteStaircase.calibrated(epsilon, delta)
    z = noise.sample(400_000, np.random.default_rng(delta))
    assert chi_square_against(z, noise.pmf) > 1e-3
    for t in (1, delta, 3 * delta + 1):
        tail = noise.upper_tail(t)
        if tail * z.size > 30:
            assert stats.binomtest(int(np.sum(z >= t)), z.size, tail).pvalue > 1e-4
    k = np.arange(-4000, 4001)
    suffix = np.cumsum(noise.pmf(k)[::-1])[::-1]
    for t in range(-50, 51):
        assert noise.upper_tail(t) == pytest.approx(suffix[t + 4000], abs=1e-12)
    # power: Definition 19 with r off by one (a nearby staircase) is rejected when r can move
    if noise.r < delta:
        assert chi_square_against(z, lambda kk: definition_19_pmf(epsilon, delta, noise.r + 1, kk)) < 1e-6


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
def test_staircase_r_minimizes_the_variance(epsilon):
    delta = 51
    noise = DiscreteStaircase.calibrated(epsilon, delta)
    moments = discrete_staircase_second_moments(float(noise.epsilon(delta)), delta)
    assert noise.variance <= moments.min() * (1 + 1e-9)
    # and beats the discrete Laplace of the same ε (the staircase is the optimal noise for this cost)
    assert noise.variance <= DiscreteLaplace.calibrated(epsilon, delta).variance * (1 + 1e-12)


# -- the whole ε range ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", [DiscreteLaplace, DiscreteStaircase])
@pytest.mark.parametrize("delta", [1, 7, MAX_LATTICE_STEPS])
@pytest.mark.parametrize("epsilon", [EPSILON_MIN, 1e-3, 1.0, 16.0, 40.0, EPSILON_MAX])
def test_every_epsilon_in_range_calibrates_samples_and_certifies(family, delta, epsilon):
    noise = family.calibrated(epsilon, delta)
    certified = noise.certified_epsilon(delta)
    assert 0 < certified <= epsilon
    z = noise.sample(2_000, np.random.default_rng(0))
    assert z.dtype == np.int64 and np.all(np.abs(z) < 2**62)
    # the mass beyond half a standard deviation (or beyond 0 when there is hardly any noise) is the exact one
    t = max(1, int(0.5 * math.sqrt(noise.variance)))
    beyond = int(np.sum(np.abs(z) >= t))
    assert stats.binomtest(beyond, z.size, min(1.0, 2 * noise.upper_tail(t))).pvalue > 1e-4
