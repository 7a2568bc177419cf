"""RRWithPrior is the LP optimum of "maximize Pr[output = input]"; RR-Top-k and RR behave as defined."""

import math

import numpy as np
import pytest
from scipy.optimize import linprog

from labels_party.core.solvers.rr_with_prior import best_top_k, rr_with_prior
from shared.mechanisms.randomized_response import randomized_response, rr_top_k


def _max_agreement_lp(prior, epsilon):
    """max Σ_y p_y M[y, y] over all ε-DP K x K randomizers (pairwise DP rows), with scipy's HiGHS."""
    k = prior.size
    cost = np.zeros(k * k)
    for y in range(k):
        cost[y * k + y] = -prior[y]
    a_eq = np.zeros((k, k * k))
    for y in range(k):
        a_eq[y, y * k:(y + 1) * k] = 1
    rows = []
    for out in range(k):
        for y in range(k):
            for y2 in range(k):
                if y != y2:
                    row = np.zeros(k * k)
                    row[y2 * k + out] = 1
                    row[y * k + out] = -math.exp(epsilon)
                    rows.append(row)
    result = linprog(cost, A_ub=np.array(rows), b_ub=np.zeros(len(rows)), A_eq=a_eq, b_eq=np.ones(k),
                     bounds=(0, None), method="highs")
    assert result.status == 0
    return -result.fun


@pytest.mark.parametrize("seed", range(8))
def test_rr_with_prior_is_optimal_for_agreement(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 7))
    prior = rng.dirichlet(np.full(k, 0.5))
    epsilon = float(rng.choice([0.2, 0.7, 1.5, 3.0]))
    mechanism = rr_with_prior(prior, epsilon)
    assert mechanism.agreement_probability(prior) == pytest.approx(_max_agreement_lp(prior, epsilon), abs=1e-6)
    assert mechanism.certified_epsilon <= epsilon


def test_k_is_chosen_deterministically_on_ties():
    order, k = best_top_k(np.array([0.25, 0.25, 0.25, 0.25]), 1.0)
    assert list(order) == [0, 1, 2, 3]  # equal priors: smaller class id first
    assert k == 4  # uniform prior: k e^ε / (e^ε + k - 1) / 4 increases in k
    # prior (0.5, 0.25, 0.25) at e^ε = 2: k = 1 gives 0.5, k = 2 gives 0.75 * 2/3 = 0.5 — a tie; smallest k wins
    order, k = best_top_k(np.array([0.5, 0.25, 0.25]), np.log(2.0))
    assert k == 1 and order[0] == 0
    order, k = best_top_k(np.array([0.05, 0.45, 0.45, 0.05]), 2.0)
    assert list(order[:2]) == [1, 2]
    # e = e^2 ≈ 7.389: k=1 -> 0.45, k=2 -> 0.9 e/(e+1) ≈ 0.793, k=3 -> 0.95 e/(e+2) ≈ 0.748, k=4 -> e/(e+3) ≈ 0.711
    assert k == 2
    _, k = best_top_k(np.array([0.1, 0.4, 0.4, 0.1]), 2.0)
    assert k == 4  # 0.8 e/(e+1) ≈ 0.705 < 0.9 e/(e+2) ≈ 0.708 < e/(e+3) ≈ 0.711


def test_rr_top_k_outputs_only_candidates_with_the_right_probabilities():
    epsilon = 1.3
    e = math.exp(epsilon)
    mechanism = rr_top_k(6, [1, 4], epsilon)
    m = mechanism.matrix
    assert m[1, 1] == pytest.approx(e / (e + 1), rel=1e-8)
    assert m[1, 4] == pytest.approx(1 / (e + 1), rel=1e-8)
    assert m[0, 1] == m[0, 4] == pytest.approx(0.5, rel=1e-15)
    assert np.all(m[:, [0, 2, 3, 5]] == 0)
    assert mechanism.certified_epsilon == pytest.approx(epsilon, abs=1e-8)


def test_randomized_response_probabilities():
    epsilon = 0.8
    mechanism = randomized_response(np.arange(10), epsilon)
    e = math.exp(epsilon)
    assert np.diag(mechanism.matrix) == pytest.approx(np.full(10, e / (e + 9)), rel=1e-8)
    assert mechanism.agreement_probability(np.ones(10)) == pytest.approx(e / (e + 9), rel=1e-8)
