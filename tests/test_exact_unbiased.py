"""Column generation for the optimal unbiased randomizer over continuous outputs: certified, at least as good as
any mesh LP, equal to a very fine mesh up to the discretization error, and with Theorem 6's structure."""

import numpy as np
import pytest

from labels_party.solvers.exact_unbiased import price, solve_exact_optimal_unbiased
from labels_party.solvers.opt_unbiased import solve_optimal_unbiased

CASES = [(seed, eps) for seed in (2, 3, 5, 7, 9) for eps in (0.5, 2.0)]


def _problem(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 7))
    values = np.sort(rng.choice(np.arange(30), k, replace=False)).astype(float)
    return values, rng.dirichlet(np.ones(k))


@pytest.mark.parametrize(("seed", "epsilon"), CASES)
def test_exact_is_certified_and_no_worse_than_the_mesh_lp(seed, epsilon):
    values, prior = _problem(seed)
    solution = solve_exact_optimal_unbiased(values, prior, epsilon)
    mechanism = solution.mechanism
    loss = mechanism.noisy_label_loss(prior)
    assert mechanism.certified_epsilon <= epsilon and mechanism.max_abs_bias <= 1e-9
    assert solution.lower_bound <= loss and solution.optimality_gap <= 1e-6
    assert loss == pytest.approx(solution.lower_bound, rel=1e-6)
    mesh = solve_optimal_unbiased(values, prior, epsilon, mesh=8 * values.size)
    assert loss <= mesh.noisy_label_loss(prior) * (1 + 1e-9)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_exact_matches_a_very_fine_mesh(epsilon):
    values, prior = np.array([0.0, 3.0, 4.0]), np.array([0.5, 0.2, 0.3])
    exact = solve_exact_optimal_unbiased(values, prior, epsilon).mechanism.noisy_label_loss(prior)
    fine = solve_optimal_unbiased(values, prior, epsilon, mesh=1500).noisy_label_loss(prior)
    assert exact <= fine * (1 + 1e-9)
    assert fine == pytest.approx(exact, rel=2e-4)  # Lemma 8: the grid costs at most O(Δ)


@pytest.mark.parametrize(("seed", "epsilon"), CASES)
def test_solution_has_the_structure_of_theorem_6(seed, epsilon):
    values, prior = _problem(seed)
    matrix = solve_exact_optimal_unbiased(values, prior, epsilon).mechanism.matrix
    matrix = matrix[:, matrix.max(axis=0) > 0]
    assert matrix.shape[1] <= 2 * values.size
    high = matrix >= matrix.max(axis=0) * (1 - 1e-6)
    first = [np.flatnonzero(high[:, j])[0] for j in range(matrix.shape[1])]
    last = [np.flatnonzero(high[:, j])[-1] for j in range(matrix.shape[1])]
    for j in range(matrix.shape[1]):  # the high set of each output is an interval of the sorted labels
        assert high[first[j]:last[j] + 1, j].all()
    assert np.all(np.diff(first) >= 0) and np.all(np.diff(last) >= 0)  # ... moving monotonically


def test_pricing_is_exact_against_a_dense_search():
    rng = np.random.default_rng(0)
    y = np.linspace(-1, 1, 6)
    prior = rng.dirichlet(np.ones(6))
    alpha, beta = rng.normal(size=6), rng.normal(size=6)
    e = np.exp(1.0)
    result = price(y, prior, alpha, beta, e, -3.0, 3.0)
    grid = np.linspace(-3, 3, 200_001)
    c = prior * 0.5 * (grid[:, None] - y) ** 2 - alpha - beta * grid[:, None]
    dense = (c.sum(axis=1) + (e - 1) * np.minimum(c, 0).sum(axis=1)).min()
    assert result.best == pytest.approx(dense, abs=1e-8)
    assert result.best <= dense + 1e-12


def test_the_certificate_travels_with_the_mechanism():
    values, prior = _problem(3)
    solution = solve_exact_optimal_unbiased(values, prior, 1.0)
    parameters = solution.mechanism.parameters
    assert parameters["method"] == "exact" and parameters["optimality_gap"] == solution.optimality_gap
    assert parameters["lower_bound"] == solution.lower_bound
    assert solution.mechanism.describe()["parameters"]["optimality_gap"] <= 1e-6
