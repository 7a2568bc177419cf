"""Private label prior (labels_party/core/prior.py, Algorithm 4 of the optimal-unbiased paper) and the ε₁/ε₂ budget
split (shared/privacy.py, App. C: ε₁ = √(k/n), capped at ε/2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from labels_party.core.prior import HISTOGRAM_SENSITIVITY, estimate_prior
from shared.errors import LabelDPError
from shared.privacy import COMPOSITION_MARGIN, split_budget

Z_TOL = 5.0
HIST = np.array([120.0, 7.0, 0.0, 55.0, 1.0, 300.0, 3.0, 0.0, 42.0, 18.0])


def _dlap_moments(alpha: float) -> tuple[float, float]:
    """(E[Z²], E[Z⁴]) of the discrete Laplace with pmf ∝ alpha^|k|, by direct summation."""
    k = np.arange(-20_000, 20_001).astype(np.float64)
    w = alpha ** np.abs(k)
    w /= w.sum()
    return float(np.sum(k**2 * w)), float(np.sum(k**4 * w))


def _noise_samples(eps: float, runs: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([estimate_prior(HIST, eps, rng).noisy_counts - HIST for _ in range(runs)])


# -- estimate_prior --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [0.05, 0.5, 2.0])
def test_weights_are_clipped_normalized_noisy_counts(eps):
    rng = np.random.default_rng(17)
    for _ in range(50):
        prior = estimate_prior(HIST, eps, rng)
        w = prior.weights
        assert w.shape == HIST.shape
        assert np.all(w >= 0)
        assert math.fsum(w) == pytest.approx(1.0, abs=1e-12)
        clipped = np.maximum(prior.noisy_counts, 0)
        assert clipped.sum() > 0  # with these counts the fallback never triggers
        np.testing.assert_allclose(w, clipped / clipped.sum(), rtol=1e-15, atol=0)
        assert np.all((w == 0) == (prior.noisy_counts <= 0))
        assert prior.epsilon == eps
        # the scale is the exact rational t/s >= 2/ε, within 2**-31 of it; the certified ε is 2 s/t <= ε
        assert prior.scale >= HISTOGRAM_SENSITIVITY / eps and prior.scale == pytest.approx(2 / eps, rel=2**-30)
        assert prior.certified_epsilon <= eps and prior.certified_epsilon == pytest.approx(eps, rel=2**-30)
        assert prior.noisy_counts.dtype == np.int64


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_discrete_laplace_noise_mean_and_variance(eps):
    runs = 3000
    z = _noise_samples(eps, runs, seed=1618)
    n = z.size
    assert np.all(z == np.round(z))
    alpha = math.exp(-eps / 2)
    assert estimate_prior(HIST, eps, np.random.default_rng(0)).noise.alpha == pytest.approx(alpha, rel=1e-9)
    var = 2 * alpha / (1 - alpha) ** 2
    var_sum, fourth = _dlap_moments(alpha)
    assert var_sum == pytest.approx(var, rel=1e-10)
    assert abs(z.mean()) < Z_TOL * math.sqrt(var / n)
    assert abs(z.var() - var) < Z_TOL * math.sqrt((fourth - var**2) / n)
    # empirical pmf of the noise: chi-square on -m..m (every bin expecting > 20) plus both tails
    c = (1 - alpha) / (1 + alpha)
    m = int(math.floor(math.log(20 / (n * c)) / math.log(alpha)))
    k = np.arange(-m, m + 1)
    observed = np.concatenate([[np.sum(z < -m)], np.bincount((z[np.abs(z) <= m] + m).astype(np.int64),
                                                               minlength=k.size), [np.sum(z > m)]])
    tail = alpha ** (m + 1) / (1 + alpha)
    expected = n * np.concatenate([[tail], c * alpha ** np.abs(k), [tail]])
    assert expected.sum() == pytest.approx(n, rel=1e-12)
    assert expected.min() > 5
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    # the test has power against the common mistake of scale 1/ε (sensitivity 1 instead of 2)
    wrong = n * np.concatenate([[np.exp(-eps) ** (m + 1) / (1 + np.exp(-eps))],
                                (1 - np.exp(-eps)) / (1 + np.exp(-eps)) * np.exp(-eps * np.abs(k)),
                                [np.exp(-eps) ** (m + 1) / (1 + np.exp(-eps))]])
    assert stats.chisquare(observed, wrong * n / wrong.sum()).pvalue < 1e-6


def test_noisy_counts_are_integers():
    rng = np.random.default_rng(3)
    for eps in (0.01, 0.3, 5.0):
        prior = estimate_prior(HIST, eps, rng)
        assert prior.noisy_counts.dtype == np.int64
        if eps == 0.01:
            assert np.all(prior.noisy_counts != HIST)  # DLap(200): Pr[Z = 0] ≈ 0.005 per count


def test_all_clipped_to_zero_falls_back_to_uniform():
    histogram = np.zeros(4)
    # search fixed seeds for a draw where every noisy count is <= 0 (probability >= 1/16 per seed)
    for seed in range(500):
        prior = estimate_prior(histogram, 0.01, np.random.default_rng(seed))
        if np.all(prior.noisy_counts <= 0):
            break
    else:
        pytest.fail("no seed made every noisy count non-positive")
    np.testing.assert_array_equal(prior.weights, np.full(4, 0.25))
    # a neighbouring outcome with a single positive count gives a one-hot prior, not uniform
    for seed in range(500):
        prior = estimate_prior(histogram, 0.01, np.random.default_rng(seed))
        if np.sum(prior.noisy_counts > 0) == 1:
            break
    else:
        pytest.fail("no seed made exactly one noisy count positive")
    np.testing.assert_array_equal(prior.weights, (prior.noisy_counts > 0).astype(np.float64))


def test_estimate_prior_rejects_bad_epsilon():
    rng = np.random.default_rng(0)
    for bad in (0.0, -1.0, float("nan"), float("inf"), "abc"):
        with pytest.raises(LabelDPError):
            estimate_prior(HIST, bad, rng)


def test_prior_describe_roundtrip():
    prior = estimate_prior(HIST, 1.0, np.random.default_rng(8))
    d = prior.describe()
    assert d["sensitivity"] == 2 and d["scale"] == 2.0 and d["noise"] == "discrete-laplace"
    assert d["scale_rational"] == f"{2**32}/{2**31}" and d["certified_epsilon"] == 1.0
    np.testing.assert_array_equal(d["weights"], prior.weights)
    np.testing.assert_array_equal(d["noisy_counts"], prior.noisy_counts)


# -- split_budget ----------------------------------------------------------------------------------------------

def test_split_budget_census_value():
    split = split_budget(1.0, 52, 13_000_000)
    assert abs(split.prior_epsilon - 0.002) < 1e-4
    assert split.prior_epsilon == pytest.approx(math.sqrt(52 / 13_000_000), rel=1e-15)
    # ε₂ is what is left, less the composition margin that keeps ε₁ + ε₂ strictly inside the charge
    assert split.randomizer_epsilon == 1.0 - split.prior_epsilon - COMPOSITION_MARGIN * 1.0
    assert split.prior_epsilon + split.randomizer_epsilon < 1.0
    assert split.prior_epsilon + split.randomizer_epsilon == pytest.approx(1.0, abs=2e-12)
    assert split.epsilon == 1.0


def test_split_budget_criteo_value():
    split = split_budget(2.0, 400, 1_400_000)
    assert abs(split.prior_epsilon - 0.0169) < 1e-4
    assert split.prior_epsilon == pytest.approx(math.sqrt(400 / 1_400_000), rel=1e-15)
    assert split.randomizer_epsilon == 2.0 - math.sqrt(400 / 1_400_000) - COMPOSITION_MARGIN * 2.0


@pytest.mark.parametrize("eps,k,n", [(0.01, 400, 1_400_000), (0.003, 52, 13_000_000), (1.0, 10, 20),
                                     (0.5, 5, 5)])
def test_split_budget_cap_applies(eps, k, n):
    assert math.sqrt(k / n) > eps / 2
    split = split_budget(eps, k, n)
    assert split.prior_epsilon == eps / 2
    assert split.randomizer_epsilon == eps - eps / 2 - COMPOSITION_MARGIN * eps


def test_split_budget_cap_not_applied_just_below():
    k, n = 400, 1_400_000
    eps = 2 * math.sqrt(k / n) * 1.001
    split = split_budget(eps, k, n)
    assert split.prior_epsilon == pytest.approx(math.sqrt(k / n), rel=1e-15)
    assert split.prior_epsilon < eps / 2


def test_split_budget_override():
    split = split_budget(1.0, 52, 13_000_000, prior_epsilon=0.1)
    assert split.prior_epsilon == 0.1
    assert split.randomizer_epsilon == 1.0 - 0.1 - COMPOSITION_MARGIN
    assert split.rule == "override"
    # the override is used even where the default rule would give something else (and even with n = 0)
    assert split_budget(0.01, 400, 1_400_000, prior_epsilon=0.009).prior_epsilon == 0.009
    for bad in (1.0, 1.5, 0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(LabelDPError) as info:
            split_budget(1.0, 52, 1000, prior_epsilon=bad)
        assert info.value.code == "invalid_epsilon"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), float("-inf"), "x", None])
def test_split_budget_rejects_bad_epsilon(bad):
    with pytest.raises(LabelDPError) as info:
        split_budget(bad, 52, 1000)
    assert info.value.code == "invalid_epsilon"


def test_split_budget_rejects_no_examples():
    with pytest.raises(LabelDPError) as info:
        split_budget(1.0, 52, 0)
    assert info.value.code == "empty_labels"
