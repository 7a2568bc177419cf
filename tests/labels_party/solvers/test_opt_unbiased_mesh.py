"""The optimal unbiased randomizer LP (Algorithms 1-2): optimality, feasibility, certification."""

import math

import numpy as np
import pytest
from scipy.optimize import linprog

from labels_party.core.solvers.opt_unbiased_mesh import certify_solution, feasible_output_set, solve_optimal_unbiased
from shared.errors import LabelDPError
from shared.mechanisms.randomized_response import debiased_outputs, debiased_randomized_response
from shared.privacy import SOLVER_MARGIN, design_epsilon


def _pairwise_lp_optimum(values, prior, outputs, epsilon):
    """Algorithm 1 exactly as printed (pairwise DP rows), solved independently with scipy's HiGHS."""
    k, n = values.size, outputs.size
    cost = (prior[:, None] * 0.5 * (outputs[None, :] - values[:, None]) ** 2).ravel()
    a_eq = np.zeros((2 * k, k * n))
    for y in range(k):
        a_eq[y, y * n:(y + 1) * n] = 1.0
        a_eq[k + y, y * n:(y + 1) * n] = outputs
    b_eq = np.concatenate([np.ones(k), values])
    rows = []
    for i in range(n):
        for y in range(k):
            for y2 in range(k):
                if y != y2:
                    row = np.zeros(k * n)
                    row[y2 * n + i] = 1.0
                    row[y * n + i] = -math.exp(epsilon)
                    rows.append(row)
    result = linprog(cost, A_ub=np.array(rows), b_ub=np.zeros(len(rows)), A_eq=a_eq, b_eq=b_eq,
                     bounds=(0, None), method="highs")
    assert result.status == 0
    return result.fun


@pytest.mark.parametrize("seed", range(4))
def test_compact_lp_matches_the_pairwise_lp_of_the_paper(seed):
    rng = np.random.default_rng(seed)
    values = np.sort(rng.choice(np.arange(0, 20), size=4, replace=False)).astype(float)
    prior = rng.dirichlet(np.ones(4))
    epsilon = float(rng.choice([0.5, 1.0, 3.0]))
    mechanism = solve_optimal_unbiased(values, prior, epsilon, mesh=15)
    outputs = feasible_output_set(values, design_epsilon(epsilon, SOLVER_MARGIN), 15)
    reference = _pairwise_lp_optimum(values, prior, outputs, design_epsilon(epsilon, SOLVER_MARGIN))
    assert mechanism.noisy_label_loss(prior) == pytest.approx(reference, rel=1e-7)
    assert mechanism.parameters["lp_objective"] * (0.5 * np.ptp(outputs)) ** 2 == pytest.approx(reference, rel=1e-7)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_two_labels_optimum_is_debiased_rr_closed_form(epsilon):
    """For |Y| = 2 the optimal unbiased randomizer is ε-dbRR, whose loss is e^ε / (2 (e^ε - 1)²)."""
    e = math.exp(epsilon)
    closed_form = e / (2 * (e - 1) ** 2)
    for prior in ([0.5, 0.5], [0.9, 0.1]):
        mechanism = solve_optimal_unbiased([0.0, 1.0], prior, epsilon, mesh=201)
        assert mechanism.noisy_label_loss(prior) == pytest.approx(closed_form, rel=2e-5)
        assert debiased_randomized_response([0.0, 1.0], epsilon).noisy_label_loss(prior) == \
            pytest.approx(closed_form, rel=1e-8)


def test_feasible_output_set_endpoints_are_the_dbrr_extremes():
    values = np.arange(1.0, 53.0)
    for epsilon in (0.25, 1.0, 8.0):
        grid = feasible_output_set(values, epsilon, 52)
        assert grid[0] == pytest.approx(debiased_outputs(values, epsilon).min(), rel=1e-12)
        assert grid[-1] == pytest.approx(debiased_outputs(values, epsilon).max(), rel=1e-12)
        # evenly spaced labels: the |Y|-point grid is exactly the dbRR output set
        np.testing.assert_allclose(grid, debiased_outputs(values, epsilon), rtol=1e-12, atol=1e-9)
    # L = ((e + 51) * 1 - 1378) / (e - 1) at ε = 1
    assert feasible_output_set(values, 1.0, 52)[0] == pytest.approx(-770.7011133, rel=1e-9)
    with pytest.raises(LabelDPError):
        feasible_output_set(values, 1.0, 1)


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 6.0])
def test_two_point_grid_is_feasible_proposition_7(epsilon):
    rng = np.random.default_rng(11)
    values = np.sort(rng.uniform(0, 10, size=6))
    prior = rng.dirichlet(np.ones(6))
    mechanism = solve_optimal_unbiased(values, prior, epsilon, mesh=2)
    assert mechanism.certified_epsilon <= epsilon
    assert mechanism.max_abs_bias <= 1e-9
    low, high = mechanism.parameters["grid_low"], mechanism.parameters["grid_high"]
    # on two outputs the unbiased mechanism is unique: loss = Σ p_y ½ (U - y)(y - L)
    assert mechanism.noisy_label_loss(prior) == pytest.approx(prior @ (0.5 * (high - values) * (values - low)),
                                                              rel=1e-9)


def test_beats_debiased_rr_and_finer_nested_grids_never_hurt():
    values = np.arange(1.0, 13.0)
    prior = np.exp(-0.5 * ((values - 9) / 2.5) ** 2) + 0.02
    prior /= prior.sum()
    for epsilon in (0.5, 2.0):
        coarse = solve_optimal_unbiased(values, prior, epsilon, mesh=12)  # the grid = dbRR's outputs
        fine = solve_optimal_unbiased(values, prior, epsilon, mesh=23)  # contains every coarse point
        dbrr = debiased_randomized_response(values, epsilon).noisy_label_loss(prior)
        assert coarse.noisy_label_loss(prior) <= dbrr * (1 + 1e-5)
        assert coarse.noisy_label_loss(prior) < 0.9 * dbrr
        assert fine.noisy_label_loss(prior) <= coarse.noisy_label_loss(prior) * (1 + 1e-9)


def test_certify_solution_repairs_solver_tolerance():
    """A solution perturbed like a solver's (1e-9 violations, tiny negatives, a dust column) is repaired into
    an exactly unbiased, normalized mechanism within ε."""
    values = np.arange(0.0, 5.0)
    epsilon = 1.0
    lp_epsilon = design_epsilon(epsilon, SOLVER_MARGIN)
    exact = debiased_randomized_response(values, lp_epsilon)
    outputs = np.sort(np.concatenate([exact.output_values, [0.3]]))
    dust_column = np.searchsorted(outputs, 0.3)
    matrix = np.insert(exact.matrix, dust_column, 0.0, axis=1)
    rng = np.random.default_rng(0)
    noisy = matrix * (1 + 1e-9 * rng.standard_normal(matrix.shape))
    noisy[:, dust_column] = 1e-12 * rng.uniform(size=values.size)
    noisy[0, 0] -= 1e-9
    repaired = certify_solution(values, outputs, noisy, epsilon, lp_epsilon, "t", {})
    assert repaired.certified_epsilon <= epsilon
    assert repaired.max_abs_bias <= 1e-9
    assert repaired.num_outputs == values.size  # the dust output was merged away
    assert repaired.noisy_label_loss(np.ones(5)) == pytest.approx(exact.noisy_label_loss(np.ones(5)), rel=1e-6)


def test_single_label_domain_is_the_identity():
    mechanism = solve_optimal_unbiased([7.0], [1.0], 1.0)
    assert mechanism.noisy_label_loss([1.0]) == 0.0
    assert mechanism.certified_epsilon == 0.0
