"""The optimal unbiased randomizer over *continuous* output values, by column generation with exact pricing.

Problem (squared loss g(t, y) = ½ (t − y)²). By Claim 12 of the optimal-unbiased paper every ε-DP column is a
conic combination of staircase vectors, so the semi-infinite LP has one variable w ≥ 0 per (output value t, high
set S ⊆ Y), with column s_y = e^ε for y ∈ S and 1 otherwise, and only 2|Y| equality rows:

    min Σ w Σ_y p_y s_y g(t, y)   s.t.   Σ w s_y = 1,   Σ w s_y t = y      (every y ∈ Y).

Dual variables (α_y, β_y) for the two row families give the reduced cost of a column

    rc(t, S) = Σ_y s_y c_y(t),   c_y(t) = p_y g(t, y) − α_y − β_y t,

which for fixed t is minimized by S = {y : c_y(t) < 0}, and then rc*(t) = Σ_y c_y(t) + (e^ε − 1) Σ_y min(c_y(t), 0)
is piecewise quadratic with breakpoints at the ≤ 2|Y| roots of the c_y: pricing is exact and closed form, so
column generation converges to the continuous optimum. HiGHS (highspy) solves the restricted master problem and
is warm-started as columns are added.

Certificate. Every feasible solution has Σ w ≤ 1 (each normalization row has s_y ≥ 1), so for any duals
LB = Σ_y (α_y + β_y y) + min(0, min_{t,S} rc(t, S)) is a lower bound on the optimum — computed at the requested ε
it certifies the returned loss to the reported relative gap.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from types import MappingProxyType

import highspy
import numpy as np

from labels_party.solvers.opt_unbiased import certify_solution, solve_mesh_lp
from shared.errors import LabelDPError
from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.mechanisms.randomized_response import debiased_outputs
from shared.privacy import check_epsilon, design_epsilon

EXACT_SOLVER_MARGIN = 1e-9  # the master LP is tiny and exact to ~1e-12: the repair needs almost no slack


@dataclass(frozen=True)
class Pricing:
    t: np.ndarray  # candidate output values (one per piece with negative reduced cost)
    high: np.ndarray  # (candidates, k) bool: the high set S of each candidate
    reduced_cost: np.ndarray
    best: float  # min over all t of rc*(t) (may be >= 0)


def price(values, prior, alpha, beta, e, t_low: float, t_high: float) -> Pricing:
    """Exact minimization of rc*(t) over t ∈ [t_low, t_high] (in the caller's scaled coordinates)."""
    a = 0.5 * prior
    b = -prior * values - beta
    d = 0.5 * prior * values**2 - alpha
    quadratic = a > 0
    disc = b[quadratic] ** 2 - 4 * a[quadratic] * d[quadratic]
    ok = disc > 0
    sq, aq, bq = np.sqrt(disc[ok]), a[quadratic][ok], b[quadratic][ok]
    linear = (~quadratic) & (b != 0)
    roots = np.concatenate([(-bq - sq) / (2 * aq), (-bq + sq) / (2 * aq), -d[linear] / b[linear]])
    inside = roots[(roots > t_low) & (roots < t_high)]
    edges = np.unique(np.concatenate([[t_low, t_high], inside]))
    mids = 0.5 * (edges[:-1] + edges[1:])
    negative = (a[None, :] * mids[:, None] ** 2 + b[None, :] * mids[:, None] + d[None, :]) < 0
    weight = 1.0 + (e - 1.0) * negative  # (pieces, k): the best high set on each piece
    qa, qb, qd = weight @ a, weight @ b, weight @ d
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(qa > 0, -qb / (2 * qa), np.where(qb > 0, -np.inf, np.inf))
    t = np.clip(vertex, edges[:-1], edges[1:])
    rc = qa * t**2 + qb * t + qd
    order = np.argsort(rc)
    keep = order[rc[order] < 0]
    return Pricing(t[keep], negative[keep], rc[keep], float(rc.min()))


@dataclass(frozen=True)
class ExactSolution:
    mechanism: FiniteRandomizer
    lower_bound: float
    optimality_gap: float
    iterations: int
    seconds: float


def solve_exact_optimal_unbiased(values, prior, epsilon: float, *, tolerance: float = 5e-7,
                                 max_iterations: int = 5000, columns_per_iteration: int = 16,
                                 time_limit: float = 120.0, warm_start_mesh: int | None = None,
                                 initial_smoothing: float = 0.5, max_columns: int | None = None) -> ExactSolution:
    """Column generation to a certified relative gap ``tolerance`` (lower bound computed at the requested ε)."""
    started = time.perf_counter()
    epsilon = check_epsilon(epsilon)
    values = np.asarray(values, dtype=np.float64)
    prior = normalized_prior(prior, values.size)
    k = values.size
    if k == 1:
        mechanism = FiniteRandomizer.from_probabilities("opt-unbiased", epsilon, values, values, np.ones((1, 1)),
                                                        {"method": "exact"})
        return ExactSolution(mechanism, 0.0, 0.0, 0, time.perf_counter() - started)
    lp_epsilon = design_epsilon(epsilon, EXACT_SOLVER_MARGIN)
    max_columns = max_columns or 16 * k
    e_lp, e_req = math.exp(lp_epsilon), math.exp(epsilon)
    center, scale = 0.5 * (values[0] + values[-1]), 0.5 * (values[-1] - values[0])
    y = (values - center) / scale

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("primal_feasibility_tolerance", 1e-10)
    highs.setOptionValue("dual_feasibility_tolerance", 1e-10)
    inf = highspy.kHighsInf
    targets = np.concatenate([np.ones(k), y])
    highs.addRows(2 * k, targets, targets, 0, np.array([], np.int32), np.array([], np.int32), np.array([]))
    columns_t: list[float] = []
    columns: list[np.ndarray] = []  # each column's vector over labels (staircase, or a warm-start LP column)

    def add_columns(ts, vectors):
        vectors = np.asarray(vectors, dtype=np.float64).reshape(len(ts), k)
        ts = np.asarray(ts, dtype=np.float64)
        costs = (vectors * prior * 0.5 * (ts[:, None] - y) ** 2).sum(axis=1)
        coefficients = np.concatenate([vectors, vectors * ts[:, None]], axis=1)
        count = len(ts)
        highs.addCols(count, costs, np.zeros(count), np.full(count, inf), count * 2 * k,
                      np.arange(count, dtype=np.int32) * 2 * k, np.tile(np.arange(2 * k, dtype=np.int32), count),
                      coefficients.ravel())
        columns_t.extend(ts.tolist())
        columns.extend(vectors)

    # Output values live in [L, U], the extreme outputs of ε-dbRR (Algorithm 2's interval; Lemma 8 compares
    # grids against the optimum over this same interval). Warm start: the mesh LP on a coarse grid gives columns
    # within a few percent of the optimum and good duals; debiased RR's columns keep the master feasible.
    start_t = debiased_outputs(y, lp_epsilon)
    t_low, t_high = float(start_t.min()), float(start_t.max())
    add_columns(start_t, np.where(np.eye(k, dtype=bool), e_lp, 1.0) / (e_lp + k - 1))
    grid = np.linspace(t_low, t_high, warm_start_mesh or min(k, 64))
    mesh_matrix, mesh_duals = solve_mesh_lp(y, prior, grid, lp_epsilon)
    mesh_matrix = np.maximum(mesh_matrix, 0.0)
    used = mesh_matrix.max(axis=0) > 1e-12
    mesh_matrix = np.maximum(mesh_matrix, mesh_matrix.max(axis=0, keepdims=True) / e_lp)  # exact ε_lp-DP
    add_columns(grid[used], mesh_matrix[:, used].T)

    def lower_bound_at(duals, e):
        """Lagrangian bound for any duals: Σ(α + β y) + min(0, min rc) (valid because Σ w <= 1)."""
        a, b = duals[:k], duals[k:]
        return float(a.sum() + b @ y) + min(0.0, price(y, prior, a, b, e, t_low, t_high).best)

    # Dual stabilization (Wentges smoothing / in-out): price at a convex combination of the best-bound duals
    # (the stability center) and the current master duals; the master's duals alone are degenerate and wild early
    # on (the debiased-RR start has k columns for 2k rows) and make column generation tail off.
    center_duals, lower_bound = mesh_duals, lower_bound_at(mesh_duals, e_req)
    smoothing, iterations = initial_smoothing, 0
    solution_columns = None  # (output values, vectors, weights) of the last master solved to optimality
    while True:
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            highs.clearSolver()  # a warm start can end "unknown" on a badly scaled basis: solve from scratch
            highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            if solution_columns is None:
                raise LabelDPError("column generation master LP failed: "
                                   + highs.modelStatusToString(highs.getModelStatus()), code="solver_failed")
            break  # numerical trouble late in the run: keep the last optimal master; the gap below is honest
        weights = np.array(highs.getSolution().col_value)
        used = np.flatnonzero(weights > 0)
        solution_columns = (np.array(columns_t)[used], np.array(columns)[used], weights[used])
        current = np.array(highs.getSolution().row_dual)
        upper = float(highs.getInfo().objective_function_value)
        iterations += 1
        while True:
            trial = smoothing * center_duals + (1 - smoothing) * current
            # The certificate uses the requested ε: a valid bound for the problem the user asked about.
            bound = lower_bound_at(trial, e_req)
            if bound > lower_bound:
                center_duals, lower_bound = trial, bound
            pricing = price(y, prior, trial[:k], trial[k:], e_lp, t_low, t_high)
            if pricing.t.size:  # keep columns that also improve the current master
                s = np.where(pricing.high, e_lp, 1.0)
                cost = (s * prior * 0.5 * (pricing.t[:, None] - y) ** 2).sum(axis=1)
                rc_now = cost - s @ current[:k] - (s * pricing.t[:, None]) @ current[k:]
                useful = rc_now < -1e-12 * max(1.0, abs(upper))
            else:
                useful = np.zeros(0, dtype=bool)
            if useful.any() or smoothing == 0.0:
                break
            smoothing = 0.0 if smoothing < 0.1 else smoothing / 2  # mis-price: move towards the master duals
        done = upper - lower_bound <= tolerance * abs(upper)
        if done or not useful.any() or iterations >= max_iterations or time.perf_counter() - started > time_limit:
            break
        if len(columns_t) > max_columns:  # column management: drop the least promising non-basic columns
            solution = highs.getSolution()
            weights_now, dj = np.array(solution.col_value), np.array(solution.col_dual)
            removable = np.flatnonzero((weights_now <= 0) & (dj > 0))
            drop = removable[np.argsort(-dj[removable])][: len(columns_t) - max_columns // 2]
            if drop.size:
                highs.deleteCols(drop.size, np.sort(drop).astype(np.int32))
                keep = np.ones(len(columns_t), dtype=bool)
                keep[drop] = False
                columns_t[:] = [t for t, kept in zip(columns_t, keep, strict=True) if kept]
                columns[:] = [c for c, kept in zip(columns, keep, strict=True) if kept]
        chosen = np.flatnonzero(useful)[:columns_per_iteration]
        add_columns(pricing.t[chosen], np.where(pricing.high[chosen], e_lp, 1.0))
        smoothing = min(0.9, smoothing + 0.1) if smoothing > 0 else initial_smoothing

    ts, vectors, weights = solution_columns
    matrix = vectors.T * weights[None, :]
    order = np.argsort(ts, kind="stable")
    ts, matrix = ts[order], matrix[:, order]
    unique_t, first = np.unique(ts, return_index=True)  # equal output values: one output
    merged = np.add.reduceat(matrix, first, axis=1)
    mechanism = certify_solution(values, center + scale * unique_t, merged, epsilon, lp_epsilon, "opt-unbiased",
                                 {"method": "exact", "iterations": iterations})
    loss = mechanism.noisy_label_loss(prior)
    lower = lower_bound * scale**2
    gap = max(0.0, (loss - lower) / loss) if loss > 0 else 0.0
    # The certificate travels with the mechanism (and so into release descriptions and audit records).
    mechanism = dataclasses.replace(mechanism, parameters=MappingProxyType(
        {**mechanism.parameters, "optimality_gap": gap, "lower_bound": lower}))
    return ExactSolution(mechanism, lower, gap, iterations, time.perf_counter() - started)
