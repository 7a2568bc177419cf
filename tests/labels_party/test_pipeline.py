"""Algorithm 3 end to end on label arrays: budget split, private prior, mechanism, privatized labels."""

import numpy as np
import pytest

from labels_party.core.pipeline import privatize_labels
from labels_party.core.registry import MechanismOptions
from shared.domains import Classes, ContinuousInterval, integer_range
from shared.errors import LabelDPError


@pytest.fixture(scope="module")
def weeks():
    rng = np.random.default_rng(2024)
    return np.clip(np.round(rng.normal(44, 9, size=200_000)), 1, 52)


@pytest.mark.parametrize("mechanism", ["opt-unbiased", "laplace", "staircase", "dbrr"])
def test_unbiased_mechanisms_preserve_the_label_mean(weeks, mechanism):
    result = privatize_labels(integer_range(1, 52), weeks, mechanism, 1.0, np.random.default_rng(1),
                              options=MechanismOptions(mesh=52) if mechanism == "opt-unbiased" else None)
    error = result.noisy_labels - weeks
    assert abs(error.mean()) < 4 * error.std() / np.sqrt(weeks.size)
    assert result.certified_epsilon <= 1.0
    # the empirical noisy-label loss matches the mechanism's own number (under the empirical prior)
    hist = np.bincount(weeks.astype(int) - 1, minlength=52)
    expected = result.mechanism.noisy_label_loss(hist)
    assert np.mean(0.5 * error**2) == pytest.approx(expected, rel=0.03)


def test_prior_budget_split_follows_the_rule_and_the_override(weeks):
    result = privatize_labels(integer_range(1, 52), weeks, "rr-on-bins", 1.0, np.random.default_rng(2))
    assert result.split.prior_epsilon == pytest.approx(np.sqrt(52 / weeks.size), rel=1e-12)
    assert result.prior.epsilon + result.split.randomizer_epsilon == pytest.approx(1.0, rel=1e-12)
    assert result.certified_epsilon <= 1.0
    assert result.certified_epsilon >= 1.0 - 1e-6
    override = privatize_labels(integer_range(1, 52), weeks, "opt-unbiased", 2.0, np.random.default_rng(3),
                                prior_epsilon=0.1, options=MechanismOptions(mesh=52))
    assert override.split.prior_epsilon == 0.1
    assert override.prior.certified_epsilon <= 0.1 and override.prior.certified_epsilon > 0.1 * (1 - 2**-30)
    assert override.prior.noisy_counts.dtype == np.int64
    assert override.mechanism.epsilon == pytest.approx(1.9)


def test_private_prior_is_close_to_the_truth_for_many_labels(weeks):
    result = privatize_labels(integer_range(1, 52), weeks, "rr-on-bins", 1.0, np.random.default_rng(4))
    truth = np.bincount(weeks.astype(int) - 1, minlength=52) / weeks.size
    # DLap(2/ε₁) per count, E|noise| ≈ 2/ε₁, so E[TV] ≈ ½ · 52 · (2/ε₁) / n ≈ 0.016 here
    expected_tv = 0.5 * 52 * result.prior.scale / weeks.size
    assert 0.5 * np.abs(result.prior.weights - truth).sum() < 1.5 * expected_tv
    assert 1.5 * expected_tv < 0.03


def test_continuous_labels_are_rounded_then_privatized_without_bias():
    rng = np.random.default_rng(5)
    revenue = np.minimum(rng.lognormal(3.5, 1.0, size=100_000), 400.0)
    result = privatize_labels(ContinuousInterval(0.0, 400.0, 41), revenue, "opt-unbiased", 2.0,
                              np.random.default_rng(6))
    error = result.noisy_labels - revenue
    assert abs(error.mean()) < 4 * error.std() / np.sqrt(revenue.size)


def test_classes_and_subset_release():
    labels = np.random.default_rng(7).integers(0, 4, size=50_000)
    sets = privatize_labels(Classes(4), labels, "subset", 1.0, np.random.default_rng(8)).noisy_labels
    assert sets.shape == (50_000, 4) and sets.dtype == bool
    result = privatize_labels(Classes(4), labels, "rr-with-prior", 1.0, np.random.default_rng(9))
    assert result.prior is not None and result.certified_epsilon <= 1.0


@pytest.mark.parametrize(("domain", "labels", "mechanism", "code"), [
    (integer_range(1, 52), [1, 2, 53], "laplace", "label_out_of_domain"),
    (integer_range(1, 52), [1, 2, np.nan], "opt-unbiased", "label_out_of_domain"),
    (integer_range(1, 52), [1.5], "rr", "label_out_of_domain"),
    (integer_range(1, 52), [1, 2], "subset", "mechanism_domain_mismatch"),
    (Classes(3), [0, 1], "opt-unbiased", "mechanism_domain_mismatch"),
    (Classes(3), [0, 3], "rr", "label_out_of_domain"),
    (ContinuousInterval(0, 1), [0.5, 1.5], "laplace", "label_out_of_domain"),
    (integer_range(1, 52), [], "rr", "empty_labels"),
    (integer_range(1, 52), [1, 2], "nonsense", "unknown_mechanism"),
])
def test_bad_input_is_refused_with_a_code(domain, labels, mechanism, code):
    with pytest.raises(LabelDPError) as err:
        privatize_labels(domain, labels, mechanism, 1.0, np.random.default_rng(0))
    assert err.value.code == code

