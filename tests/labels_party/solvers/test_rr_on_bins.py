"""RR-on-Bins: the paper's worked example and brute-force optimality of the dynamic program."""

import itertools
import math

import numpy as np
import pytest

from labels_party.solvers.rr_on_bins import solve_rr_on_bins
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
