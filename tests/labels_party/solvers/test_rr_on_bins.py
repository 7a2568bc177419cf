"""RR-on-Bins: the paper's worked example, brute-force optimality, the DP over bin counts it replaced, why no Monge
speed-up applies, and a wide domain."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labels_party.core.solvers.rr_on_bins import solve_rr_on_bins
from shared.mechanisms.randomized_response import randomized_response

TABLE1_PRIOR = [0.35 + 0.25, 0.1 + 0.15, 0.05 + 0.1]  # marginal of Table 1 over Y = {0, 1, 2}


def test_worked_example_of_the_optimal_unbiased_paper():
    """Section 3: for Table 1 at ε = 0.5 the optimal map is Φ(0) ≈ 0.396, Φ(1) = Φ(2) ≈ 0.720."""
    mechanism = solve_rr_on_bins([0, 1, 2], TABLE1_PRIOR, 0.5)
    phi = mechanism.output_values[np.argmax(mechanism.matrix, axis=1)]
    assert phi[0] == pytest.approx(0.396, abs=5e-4)
    assert phi[1] == phi[2] == pytest.approx(0.720, abs=5e-4)
    assert mechanism.parameters["bin_edges"] == [0, 1, 3]


def _partitions(items):
    """All set partitions of a list (Bell-number many)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _partitions(rest):
        for i in range(len(partition)):
            yield partition[:i] + [[first] + partition[i]] + partition[i + 1:]
        yield [[first]] + partition


def _best_loss_for_partition(values, prior, blocks, e):
    """Loss of RR-on-Bins with these bins and the loss-optimal output per bin (weighted mean)."""
    m = len(blocks)
    total = 0.0
    for block in blocks:
        weights = prior * (1 + (e - 1) * np.isin(np.arange(values.size), block))
        out = weights @ values / weights.sum()
        total += 0.5 * weights @ (out - values) ** 2
    return total / (e + m - 1)


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_program_matches_brute_force_over_all_set_partitions(seed):
    rng = np.random.default_rng(seed)
    k = 5
    values = np.sort(rng.choice(np.arange(0, 30), size=k, replace=False)).astype(float)
    prior = rng.dirichlet(np.ones(k))
    epsilon = float(rng.choice([0.3, 1.0, 2.5, 6.0]))
    e = math.exp(epsilon)
    brute = min(_best_loss_for_partition(values, prior, blocks, e)
                for blocks in _partitions(list(range(k))))
    mechanism = solve_rr_on_bins(values, prior, epsilon)
    assert mechanism.noisy_label_loss(prior) == pytest.approx(brute, rel=1e-6)


def test_beats_plain_randomized_response_and_a_constant():
    values = np.arange(1.0, 53.0)
    prior = np.exp(-0.5 * ((values - 40) / 8) ** 2)
    prior /= prior.sum()
    for epsilon in (0.25, 1.0, 4.0):
        loss = solve_rr_on_bins(values, prior, epsilon).noisy_label_loss(prior)
        variance = prior @ (values - prior @ values) ** 2
        assert loss <= 0.5 * variance + 1e-9  # one bin = output the prior mean
        assert loss < randomized_response(values, epsilon).noisy_label_loss(prior)


def test_bins_are_contiguous_and_outputs_increase():
    values = np.arange(0.0, 40.0)
    prior = np.random.default_rng(9).dirichlet(np.ones(40))
    mechanism = solve_rr_on_bins(values, prior, 2.0)
    bins = np.argmax(mechanism.matrix, axis=1)
    assert np.all(np.diff(bins) >= 0)
    assert np.all(np.diff(mechanism.output_values) > 0)
    assert len(list(itertools.groupby(bins))) == mechanism.num_outputs


def test_a_prior_on_one_label_gives_one_output():
    """Found by hypothesis: with all mass on one label, every split ties at loss 0; the fewest bins win."""
    mechanism = solve_rr_on_bins([0.125, 1.125], [0.0, 1.0], 0.1)
    assert mechanism.num_outputs == 1 and mechanism.output_values.tolist() == [1.125]


def _dp_over_bin_counts(values, prior, epsilon):
    """The DP over (prefix, bin count) this solver replaced — O(|Y|³) time, O(|Y|²) memory — as the reference:
    the best loss over every number of bins m, at the design ε the solver uses."""
    from shared.privacy import design_epsilon

    prior = np.asarray(prior, dtype=float) / np.sum(prior)
    e, k = math.exp(design_epsilon(epsilon)), values.size
    c0, c1, c2 = (np.concatenate([[0.0], np.cumsum(prior * values**j)]) for j in range(3))
    a, b = np.meshgrid(np.arange(k + 1), np.arange(k + 1), indexing="ij")
    s0, s1, s2 = (c[-1] + (e - 1) * (c[b] - c[a]) for c in (c0, c1, c2))
    with np.errstate(invalid="ignore", divide="ignore"):
        cost = np.where(b > a, 0.5 * np.maximum(s2 - s1 * s1 / s0, 0.0), np.inf)
    best, losses = np.concatenate([[0.0], np.full(k, np.inf)]), []
    for m in range(1, k + 1):
        best = (best[:, None] + cost).min(axis=0)
        best[0] = np.inf
        losses.append(best[k] / (e + m - 1))
    return min(losses)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 24), st.floats(0.05, 10.0), st.integers(0, 2**32 - 1), st.sampled_from([0.1, 1.0, 10.0]),
       st.booleans())
def test_dinkelbach_equals_the_dp_over_bin_counts(k, epsilon, seed, concentration, zeros):
    rng = np.random.default_rng(seed)
    values = np.sort(rng.choice(np.arange(-40, 200), size=k, replace=False)).astype(float)
    prior = rng.dirichlet(np.full(k, concentration))
    if zeros:
        prior[rng.random(k) < 0.3] = 0.0
        prior[rng.integers(k)] += 0.5
    mechanism = solve_rr_on_bins(values, prior, epsilon)
    reference = _dp_over_bin_counts(values, prior, epsilon)
    # abs: the reference loses ~1e-14 · y² to cancellation in s2 − s1²/s0
    assert mechanism.noisy_label_loss(prior) == pytest.approx(reference, rel=1e-9, abs=1e-13 * np.max(values**2))
    assert mechanism.certified_epsilon <= epsilon


def test_monge_speed_ups_do_not_apply():
    """Why each round is a plain O(|Y|²) DP: the bin cost violates the quadrangle inequality
    cost[a, c] + cost[b, d] <= cost[a, d] + cost[b, c] (a <= b < c <= d), so SMAWK / Knuth–Yao / monotone split
    points are not available; here on a prior with all its bins on one side of the mean, at large ε."""
    values = np.arange(24.0)
    prior = np.random.default_rng(231).dirichlet(np.full(24, 0.1))
    e = 918.27
    c0, c1, c2 = (np.concatenate([[0.0], np.cumsum(prior * values**j)]) for j in range(3))

    def cost(a, b):
        s0, s1, s2 = (c[-1] + (e - 1) * (c[b] - c[a]) for c in (c0, c1, c2))
        return 0.5 * (s2 - s1 * s1 / s0)

    violations = [(a, b, c, d) for a, b, c, d in itertools.combinations(range(25), 4)
                  if cost(a, c) + cost(b, d) > cost(a, d) + cost(b, c) + 1e-9]
    assert violations


def test_twenty_thousand_labels_in_linear_memory():
    """|Y| = 20,000 (prices in dollars): the DP over bin counts needed 3.2 GB per table; this keeps O(|Y|) arrays
    and the mechanism is O(|Y| + m) numbers (RR over m bins, no dense matrix)."""
    values = np.arange(20_000.0)
    prior = np.exp(-0.5 * ((np.log1p(values) - 7.5) / 1.0) ** 2) / (1 + values)
    mechanism = solve_rr_on_bins(values, prior, 2.0)
    assert mechanism.parameters["dinkelbach_rounds"] <= 10
    bins = mechanism.bin_of_input
    assert np.all(np.diff(bins) >= 0) and np.all(np.diff(mechanism.output_values) > 0)
    assert mechanism.noisy_label_loss(prior) < 0.5 * prior @ (values - prior @ values / prior.sum()) ** 2 / prior.sum()
    draws = mechanism.sample(np.full(100_000, 5_000.0), np.random.default_rng(0))
    own = mechanism.output_values[bins[5_000]]
    assert abs(np.mean(draws == own) - mechanism.keep_probability) < 0.005
