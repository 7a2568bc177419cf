"""Property tests on random priors and label domains (hypothesis)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labels_party.core.solvers.opt_unbiased_continuous import solve_continuous_optimal_unbiased
from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased
from labels_party.core.solvers.rr_on_bins import solve_rr_on_bins
from shared.mechanisms import dyadic
from shared.mechanisms.randomized_response import randomized_response


@st.composite
def domains_and_priors(draw, max_labels=6):
    k = draw(st.integers(2, max_labels))
    gaps = draw(st.lists(st.floats(0.1, 10.0), min_size=k - 1, max_size=k - 1))
    start = draw(st.floats(-50.0, 50.0))
    values = start + np.concatenate([[0.0], np.cumsum(gaps)])
    weights = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k)))
    if weights.sum() < 1e-3:
        weights[draw(st.integers(0, k - 1))] = 1.0
    epsilon = draw(st.sampled_from([0.1, 0.3, 1.0, 2.0, 5.0]))
    return values, weights / weights.sum(), epsilon


PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(domains_and_priors())
def test_opt_unbiased_is_certified_normalized_unbiased_and_beats_the_two_point_mechanism(case):
    values, prior, epsilon = case
    mechanism = solve_optimal_unbiased(values, prior, epsilon, mesh=3 * values.size)
    assert mechanism.certified_epsilon <= epsilon
    assert np.all(mechanism.counts.sum(axis=1) == dyadic.RESOLUTION)
    assert mechanism.max_abs_bias <= 1e-6 * max(1.0, np.ptp(values))
    low, high = mechanism.parameters["grid_low"], mechanism.parameters["grid_high"]
    two_point = prior @ (0.5 * (high - values) * (values - low))  # Proposition 7's feasible mechanism
    assert mechanism.noisy_label_loss(prior) <= two_point * (1 + 1e-7) + 1e-12


@PROPERTY_SETTINGS
@given(domains_and_priors(max_labels=9), st.sampled_from([0.25, 1.0, 4.0, 8.0]))
def test_exact_optimal_unbiased_is_certified_to_its_gap_and_beats_the_mesh_lp(case, epsilon):
    # Random domains, priors with zeros (the strategy draws weights in [0, 1]) and ε up to 8.
    values, prior, _ = case
    solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
    mechanism = solution.mechanism
    assert mechanism.certified_epsilon <= epsilon
    assert mechanism.max_abs_bias <= 1e-9 * max(1.0, np.abs(values).max())
    assert solution.optimality_gap <= 1e-6
    assert mechanism.num_outputs <= 2 * values.size
    loss = mechanism.noisy_label_loss(prior)
    assert solution.lower_bound <= loss
    mesh = solve_optimal_unbiased(values, prior, epsilon, mesh=3 * values.size)
    assert loss <= mesh.noisy_label_loss(prior) * (1 + 1e-9) + 1e-12


@PROPERTY_SETTINGS
@given(domains_and_priors(max_labels=10))
def test_rr_on_bins_is_certified_and_no_worse_than_its_special_cases(case):
    values, prior, epsilon = case
    mechanism = solve_rr_on_bins(values, prior, epsilon)
    assert mechanism.certified_epsilon <= epsilon
    loss = mechanism.noisy_label_loss(prior)
    assert loss <= 0.5 * prior @ (values - prior @ values) ** 2 + 1e-9  # a single bin at the prior mean
    assert loss <= randomized_response(values, epsilon).noisy_label_loss(prior) + 1e-9  # one bin per label
    assert np.all(np.diff(mechanism.output_values) > 0)


@PROPERTY_SETTINGS
@given(st.integers(2, 12), st.sampled_from([0.05, 0.5, 2.0, 8.0]), st.integers(0, 2**31 - 1))
def test_sampling_respects_zero_probabilities_and_rows(k, epsilon, seed):
    mechanism = randomized_response(np.arange(k, dtype=float), epsilon)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=5000).astype(float)
    out = mechanism.sample(labels, rng)
    assert set(np.unique(out)) <= set(range(k))
    agreement = np.mean(out == labels)
    expected = np.exp(epsilon) / (np.exp(epsilon) + k - 1)
    assert abs(agreement - expected) < 5 * np.sqrt(expected * (1 - expected) / labels.size) + 1e-9
