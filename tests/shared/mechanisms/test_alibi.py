"""ALIBI's randomizer (issue 41): the noisy one-hot vectors are exactly S·e_y plus discrete Laplace noise calibrated
to sensitivity 2S (certified ε = 2S·s/t ≤ ε), its log-likelihoods give the Bayes posterior computed from the exact
pmf, and an empirical lower bound on ε stays below the certificate."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from labels_party.core.privacy_audit import audit
from shared.errors import CertificationError
from shared.mechanisms.alibi import AlibiRandomizer


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 4.0])
def test_the_certificate_is_the_noise_at_sensitivity_two_scales(epsilon):
    mechanism = AlibiRandomizer.build(10, epsilon)
    assert mechanism.certified_epsilon <= epsilon
    assert mechanism.certified_epsilon == pytest.approx(epsilon, rel=1e-8)
    assert mechanism.noise.scale == pytest.approx(2 * mechanism.scale / epsilon, rel=1e-8)  # b = 2/ε per unit


def test_coordinates_are_the_scaled_one_hot_plus_exact_discrete_laplace():
    mechanism = AlibiRandomizer.build(3, 1.0)
    vectors = mechanism.sample(np.full(60_000, 1), np.random.default_rng(0))
    assert vectors.dtype == np.int64 and vectors.shape == (60_000, 3)
    for column, shift in ((0, 0), (1, mechanism.scale)):
        noise = vectors[:, column] - shift
        support = np.arange(-60, 61)
        observed = np.array([(noise == z).sum() for z in support])
        expected = mechanism.noise.pmf(support) * noise.size
        tails = noise.size - observed.sum()
        expected_tails = noise.size - expected.sum()
        chi = stats.chisquare(np.append(observed, tails), np.append(expected, expected_tails) *
                              noise.size / (expected.sum() + expected_tails))
        assert chi.pvalue > 1e-4


def test_the_posterior_is_bayes_with_the_exact_pmf():
    mechanism = AlibiRandomizer.build(3, 0.7)
    rng = np.random.default_rng(2)
    vectors = mechanism.sample(rng.integers(0, 3, 50), rng)
    prior = np.array([0.6, 0.3, 0.1])
    got = mechanism.posterior(vectors, prior)
    for v, row in zip(vectors, got, strict=True):
        joint = np.array([prior[k] * np.prod(mechanism.noise.pmf(v - mechanism.scale * np.eye(3)[k]))
                          for k in range(3)])
        np.testing.assert_allclose(row, joint / joint.sum(), rtol=1e-9)
    assert np.allclose(mechanism.posterior(vectors).sum(axis=1), 1.0)


def test_a_description_rebuilds_the_same_noise_and_a_forged_one_is_refused():
    mechanism = AlibiRandomizer.build(4, 2.0)
    assert AlibiRandomizer.from_description(mechanism.describe()) == mechanism
    forged = {**mechanism.describe(), "noise": {**mechanism.describe()["noise"], "scale_rational": "1/1"}}
    with pytest.raises(CertificationError):
        AlibiRandomizer.from_description(forged)


class _FirstCoordinate:
    """ALIBI followed by keeping the first coordinate: post-processing, so its ε is at most ALIBI's."""

    def __init__(self, mechanism):
        self.mechanism = mechanism
        self.name, self.certified_epsilon = "alibi[0]", mechanism.certified_epsilon

    def sample(self, labels, rng):
        return self.mechanism.sample(labels, rng)[:, 0].astype(np.float64)


def test_an_audit_of_a_coordinate_stays_below_the_certificate():
    mechanism = AlibiRandomizer.build(2, 1.0, scale=1)  # S = 1: the coarsest grid, the largest per-event ratio
    result = audit(_FirstCoordinate(mechanism), np.array([0.0, 1.0]), 200_000, np.random.default_rng(3))
    assert 0.25 <= result.empirical_epsilon_lower_bound <= result.certified_epsilon <= 1.0
    assert list(itertools.islice(result.worst_pair, 2)) in ([0.0, 1.0], [1.0, 0.0])
