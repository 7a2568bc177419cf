"""The optimal unbiased randomizer over continuous outputs (cone program + HiGHS vertex + pricing certificate):
certified, at least as good as any mesh LP, equal to a very fine mesh up to the discretization error, and with
Theorem 6's structure."""

import itertools
import math

import numpy as np
import pytest

from labels_party.core.solvers import staircase
from labels_party.core.solvers.opt_unbiased_continuous import (
    compress,
    refined_columns,
    solve_continuous_optimal_unbiased,
)
from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased
from labels_party.core.solvers.pricing import lower_bound as _lower_bound
from labels_party.core.solvers.pricing import price as _price
from labels_party.core.solvers.signature_cone import cone_phase, solve_signature_socp
from labels_party.core.solvers.staircase import Problem


def price(y, prior, alpha, beta, e):
    return _price(Problem(y, prior, e), alpha, beta, e)


def lower_bound(y, prior, alpha, beta, e):
    return _lower_bound(Problem(y, prior, e), alpha, beta)

CASES = [(seed, eps) for seed in (2, 3, 5, 7, 9) for eps in (0.5, 2.0)]


def _problem(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 7))
    values = np.sort(rng.choice(np.arange(30), k, replace=False)).astype(float)
    return values, rng.dirichlet(np.ones(k))


@pytest.mark.parametrize(("seed", "epsilon"), CASES)
def test_exact_is_certified_and_no_worse_than_the_mesh_lp(seed, epsilon):
    values, prior = _problem(seed)
    solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
    mechanism = solution.mechanism
    loss = mechanism.noisy_label_loss(prior)
    assert mechanism.certified_epsilon <= epsilon and mechanism.max_abs_bias <= 1e-9
    assert solution.lower_bound <= loss and solution.optimality_gap <= 1e-6
    assert loss == pytest.approx(solution.lower_bound, rel=1e-6)
    mesh = solve_optimal_unbiased(values, prior, epsilon, mesh=8 * values.size)
    assert loss <= mesh.noisy_label_loss(prior) * (1 + 1e-9)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_exact_matches_a_very_fine_mesh_over_its_output_span(epsilon):
    values, prior = np.array([0.0, 3.0, 4.0]), np.array([0.5, 0.2, 0.3])
    exact = solve_continuous_optimal_unbiased(values, prior, epsilon).mechanism
    outputs = exact.output_values[exact.counts.max(axis=0) > 0]
    low, high = outputs.min(), outputs.max()
    grid = np.linspace(low - 0.05 * (high - low), high + 0.05 * (high - low), 1500)
    fine = solve_optimal_unbiased(values, prior, epsilon, outputs=grid).noisy_label_loss(prior)
    loss = exact.noisy_label_loss(prior)
    assert loss <= fine * (1 + 1e-9)
    assert fine == pytest.approx(loss, rel=2e-4)  # Lemma 8: the grid costs at most O(Δ)


def test_the_optimum_over_the_reals_beats_the_dbrr_interval_of_algorithm_2():
    # [L, U] is the paper's heuristic range for its grid, not a property of the optimum: here the optimum puts an
    # output outside it and is 2 % better than the finest grid on [L, U].
    values, prior = np.array([0.0, 3.0, 4.0]), np.array([0.5, 0.2, 0.3])
    exact = solve_continuous_optimal_unbiased(values, prior, 2.0).mechanism
    on_interval = solve_optimal_unbiased(values, prior, 2.0, mesh=1500)
    assert exact.noisy_label_loss(prior) < 0.98 * on_interval.noisy_label_loss(prior)
    used = exact.output_values[exact.counts.max(axis=0) > 0]
    grid = on_interval.parameters
    assert used.min() < grid["grid_low"] or used.max() > grid["grid_high"]


@pytest.mark.parametrize(("seed", "epsilon"), CASES)
def test_solution_has_the_structure_of_theorem_6(seed, epsilon):
    values, prior = _problem(seed)
    matrix = solve_continuous_optimal_unbiased(values, prior, epsilon).mechanism.matrix
    matrix = matrix[:, matrix.max(axis=0) > 0]
    assert matrix.shape[1] <= 2 * values.size
    high = matrix >= matrix.max(axis=0) * (1 - 1e-6)
    first = [np.flatnonzero(high[:, j])[0] for j in range(matrix.shape[1])]
    last = [np.flatnonzero(high[:, j])[-1] for j in range(matrix.shape[1])]
    for j in range(matrix.shape[1]):  # the high set of each output is an interval of the sorted labels
        assert high[first[j]:last[j] + 1, j].all()
    assert np.all(np.diff(first) >= 0) and np.all(np.diff(last) >= 0)  # ... moving monotonically


def _interval_rc(y, prior, alpha, beta, e, grid):
    """rc(t, S) on a grid of t for every interval S, by brute force: (intervals, grid) and the intervals."""
    c = prior * 0.5 * (grid[:, None] - y) ** 2 - alpha - beta * grid[:, None]  # (grid, labels)
    pairs = [(a, b) for a in range(y.size) for b in range(a, y.size)]
    values = np.array([c.sum(axis=1) + (e - 1) * c[:, a:b + 1].sum(axis=1) for a, b in pairs])
    return values, pairs


def test_pricing_is_exact_against_a_dense_search():
    rng = np.random.default_rng(0)
    y = np.linspace(-1, 1, 6)
    prior = rng.dirichlet(np.ones(6))
    e = np.exp(1.0)
    for _ in range(5):
        alpha, beta = rng.normal(size=6), rng.normal(size=6)
        result = price(y, prior, alpha, beta, e)
        grid = np.linspace(-400, 400, 400_001)
        values, pairs = _interval_rc(y, prior, alpha, beta, e, grid)
        dense = values.min()
        assert result.best <= dense + 1e-12  # over all of ℝ: never above any sampled point
        assert result.best == pytest.approx(dense, rel=1e-6, abs=1e-9)
        if result.t.size:  # the reported candidates are intervals attaining their reported minimum at t
            first, last = int(result.first[0]), int(result.last[0])
            at_t, _ = _interval_rc(y, prior, alpha, beta, e, result.t[:1])
            assert at_t[pairs.index((first, last)), 0] == pytest.approx(result.reduced_cost[0], rel=1e-9, abs=1e-12)
            assert result.reduced_cost[0] == pytest.approx(result.best, rel=1e-12)


def test_only_intervals_are_priced_and_every_bound_stays_below_the_optimum():
    # Claim 11: any randomizer can be made interval-staircase without more loss, so duals only need to price
    # intervals — a relaxation of pricing every subset, never below it — and the bound still holds.
    values, prior = _problem(9)
    y = (values - values.mean()) / np.ptp(values)
    optimum = solve_continuous_optimal_unbiased(y, prior, 1.0).mechanism.noisy_label_loss(prior)
    rng = np.random.default_rng(4)
    grid = np.linspace(-30, 30, 60_001)
    subsets = np.array(list(itertools.product([0, 1], repeat=y.size)), dtype=float)
    for _ in range(10):
        alpha, beta = rng.normal(scale=0.2, size=y.size), rng.normal(scale=0.2, size=y.size)
        c = prior * 0.5 * (grid[:, None] - y) ** 2 - alpha - beta * grid[:, None]
        every_subset = (c.sum(axis=1)[:, None] + (math.e - 1) * c @ subsets.T).min()
        assert price(y, prior, alpha, beta, math.e).best >= every_subset - 1e-6  # the grid is 1e-3 apart
        assert lower_bound(y, prior, alpha, beta, math.e) <= optimum + 1e-12


def test_the_certificate_travels_with_the_mechanism():
    values, prior = _problem(3)
    solution = solve_continuous_optimal_unbiased(values, prior, 1.0)
    parameters = solution.mechanism.parameters
    assert parameters["method"] == "continuous" and parameters["optimality_gap"] == solution.optimality_gap
    assert parameters["lower_bound"] == solution.lower_bound
    assert solution.mechanism.describe()["parameters"]["optimality_gap"] <= 1e-6


def _psid_like(seed, k, zeros):
    rng = np.random.default_rng(seed)
    prior = rng.dirichlet(np.ones(k))
    prior[rng.choice(np.arange(1, k - 1), zeros, replace=False)] = 0.0  # interior labels nobody has
    prior[0] = 0.0  # and an extreme one
    return np.arange(1.0, k + 1), prior / prior.sum()


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 8.0])
def test_zero_prior_labels_and_large_epsilon_are_certified(epsilon):
    values, prior = _psid_like(4, 24, 5)
    solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
    mechanism = solution.mechanism
    assert mechanism.certified_epsilon <= epsilon and mechanism.max_abs_bias <= 1e-9
    assert solution.optimality_gap <= 1e-6
    mesh = solve_optimal_unbiased(values, prior, epsilon, mesh=4 * values.size)
    assert mechanism.noisy_label_loss(prior) <= mesh.noisy_label_loss(prior) * (1 + 1e-9)


def test_lower_bound_is_valid_for_arbitrary_duals_and_the_shift_only_helps():
    values, prior = _problem(5)
    y = (values - values.mean()) / np.ptp(values)
    optimum = solve_continuous_optimal_unbiased(y, prior, 1.0).mechanism.noisy_label_loss(prior)
    rng = np.random.default_rng(1)
    e = math.e
    for _ in range(20):
        alpha, beta = rng.normal(scale=0.1, size=y.size), rng.normal(scale=0.1, size=y.size)
        plain = alpha.sum() + beta @ y + min(0.0, price(y, prior, alpha, beta, e).best)
        bound = lower_bound(y, prior, alpha, beta, e)
        assert plain - 1e-12 <= bound <= optimum + 1e-9


def test_cone_program_over_all_intervals_equals_the_lp_over_its_columns():
    # The cone program's value is the optimum over interval signatures with free output values; a HiGHS mesh LP
    # on the cone's own output values (plus a fine grid) cannot beat it by more than solver tolerance.
    values, prior = _problem(7)
    y = (values - values.mean()) / np.ptp(values)
    first, last = np.triu_indices(y.size)
    cone = solve_signature_socp(Problem(y, prior, math.exp(1.0)), first, last)
    used = cone.outputs[cone.weights > 1e-7 * cone.weights.max()]
    grid = np.union1d(used, np.linspace(used.min(), used.max(), 400))
    mesh = solve_optimal_unbiased(y, prior, 1.0, outputs=grid).noisy_label_loss(prior)
    assert mesh >= cone.objective * (1 - 1e-6)
    assert mesh == pytest.approx(cone.objective, rel=1e-4)


def test_the_working_set_grows_coarse_to_fine_into_a_tube():
    values = np.arange(1.0, 121.0)
    prior = np.exp(-0.5 * ((values - 40) / 15) ** 2)
    prior /= prior.sum()
    y = (values - 60.5) / 59.5
    problem = Problem(y, prior, math.exp(1.0))
    level = cone_phase(problem, problem, 30, staircase_deadline())
    assert level.cone_programs >= 2  # a coarse level first
    assert level.first.size < 120 * 121 // 6  # a tube, not every interval
    assert np.all(level.first <= level.last)
    singletons = set(level.first[level.first == level.last].tolist())
    assert singletons == set(range(120))  # ε-dbRR's signatures keep every working set feasible
    assert level.cone.objective - level.bound <= 1e-7 * level.cone.objective  # certified at this ε


def staircase_deadline():
    from labels_party.core.solvers.deadline import NO_DEADLINE

    return NO_DEADLINE


def test_the_heaviest_monotone_path():
    # intervals of 3 labels: through (1, 1) the path weighs 5, through (0, 2) 4.5
    first = np.array([0, 0, 1, 1, 2, 0])
    last = np.array([0, 1, 1, 2, 2, 2])
    weights = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.5])
    path = staircase.heaviest_path(3, first, last, weights)
    assert [(first[i], last[i]) for i in path] == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 2)]
    weights[5] = 1.5  # now through (0, 2): 5.5
    assert [(first[i], last[i]) for i in staircase.heaviest_path(3, first, last, weights)] == \
        [(0, 0), (0, 1), (0, 2), (1, 2), (2, 2)]
    # (0, 0) does not reach (0, 2) in one step: the path is (0, 2) alone (it starts at 0 and ends at |Y| − 1)
    assert staircase.heaviest_path(3, first[[0, 5]], last[[0, 5]], weights[[0, 5]]).tolist() == [1]


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_refined_and_compressed_columns_are_exact_and_dp(epsilon):
    values = np.arange(1.0, 201.0)
    prior = np.exp(-0.5 * ((np.log(values) - 3.5) / 1.0) ** 2) / values
    prior /= prior.sum()
    y = (values - 100.5) / 99.5
    problem = Problem(y, prior, math.exp(epsilon))
    level = cone_phase(problem, problem, 30, staircase_deadline())
    columns = refined_columns(problem, level)
    assert np.abs(problem.vector_sums(columns.first, columns.last, columns.weights) - 1).max() < 1e-12
    assert np.abs(problem.vector_sums(columns.first, columns.last, columns.weights * columns.outputs) - y).max() \
        < 1e-12
    path = staircase.heaviest_path(y.size, columns.first, columns.last, columns.weights)
    outputs, matrix = compress(problem, columns, path)
    assert outputs.size <= 2 * y.size - 1 < columns.weights.size  # it did merge
    assert np.abs(matrix.sum(axis=1) - 1).max() < 1e-12  # rows stay distributions ...
    interior = (outputs.min() < y) & (y < outputs.max())
    assert np.abs(matrix @ outputs - y)[interior].max() < 1e-10  # ... with their means (rounding is unbiased)
    # ε-DP columns up to the rounding of the difference arrays (certification lifts the rest)
    assert np.all(matrix.max(axis=0) <= math.exp(epsilon) * matrix.min(axis=0) * (1 + 1e-9))


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_four_hundred_labels_are_solved_to_the_certified_gap(epsilon):
    values = np.arange(1.0, 401.0)
    prior = np.exp(-0.5 * ((np.log(values) - 3.5) / 1.0) ** 2) / values
    prior[-1] += 0.05 * prior.sum()
    solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
    assert solution.optimality_gap <= 1e-6
    assert solution.mechanism.num_outputs <= 2 * values.size
    assert solution.mechanism.certified_epsilon <= epsilon
    assert solution.mechanism.max_abs_bias <= 1e-9 * 400


def test_pricing_with_a_vanishing_prior_stays_exact():
    # A prior of 1e-305: that label's quadratic is flat; every interval's minimum must still be exact.
    y = np.linspace(-1, 1, 4)
    prior = np.array([0.5, 1e-305, 0.3, 0.2])
    rng = np.random.default_rng(3)
    e = np.exp(2.0)
    for _ in range(5):
        alpha, beta = rng.normal(scale=0.1, size=4), rng.normal(scale=0.1, size=4)
        result = price(y, prior, alpha, beta, e)
        grid = np.linspace(-50, 50, 1_000_001)
        values, _ = _interval_rc(y, prior, alpha, beta, e, grid)
        dense = values.min()
        assert np.isfinite(result.best) and result.best <= dense + 1e-12
        assert result.best == pytest.approx(dense, rel=1e-6, abs=1e-8)
