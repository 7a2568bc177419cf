"""The cone phase of the continuous optimal unbiased solver: second-order cone programs over working sets of
interval signatures (Clarabel), coarse to fine.

For a fixed high set S the reduced cost of a column is a quadratic in its output value t,
rc(t, S) = ½ A_S t² − t (P_S + s·β) + D_S − s·α (A_S = Σ s p, P_S = Σ s p y, D_S = ½ Σ s p y²), so the
semi-infinite family {rc(t, S) ≥ 0 for all t} is exactly one rotated second-order cone

    (s·β + P_S)² ≤ 2 A_S (D_S − s·α),

whose dual variables are the column's weight w_S and first moment u_S = w_S t_S: output values are optimized
continuously (the perspective formulation). Theorem 6 of the optimal-unbiased paper says interval signatures
suffice and that along the optimal randomizer's outputs the intervals move monotonically — a path of at most
2|Y| steps through the |Y|²/2 intervals.

Working set by levels. The labels are merged pairwise into coarser and coarser problems until one has at most
ALL_INTERVALS_UP_TO intervals, which is solved over all of them. Each finer level starts from the band (radius 1)
around the intervals the coarser level used, mapped to its labels, plus the singletons (ε-dbRR's signatures keep
every working set feasible); exact pricing (:mod:`.pricing`) adds what is missing. The finest working set is a
tube around the optimal path, O(|Y|) intervals: at |Y| = 5000, 76,000 of 12.5 million.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import clarabel
import numpy as np
import scipy.sparse as sparse

from labels_party.core.solvers import staircase
from labels_party.core.solvers.deadline import NO_DEADLINE, Deadline
from labels_party.core.solvers.pricing import lower_bound, polish_duals, price
from labels_party.core.solvers.staircase import Problem
from shared.errors import ErrorCode, LabelDPError

ALL_INTERVALS_UP_TO = 3000  # cones: a level with at most this many intervals is solved over all of them
# Interior-point duals are accurate to ~1e-7 relative: the finest level stops when its certified gap is this.
CONE_GAP = 1e-7
# A column is active — its band enters the next level — above this fraction of the largest weight. At large ε
# the interior point spreads weight over many near-active intervals: with 1e-6 the finest working set at |Y| = 4136,
# ε = 4 had 97,000 intervals (10.6 s a cone program, and a less accurate one), with 1e-3 27,000 (2.5 s); pricing
# adds whatever a stricter threshold leaves out.
ACTIVE = 1e-3
NOISE = 1e-5  # a worst violation below this fraction of the objective is the interior point's accuracy
# Per round, the most violated intervals enter with their band of radius 1, and up to PRICED_PER_ROUND of the
# violated ones as they are: at |Y| = 4136, ε = 2 the interior point's duals left thousands of long intervals
# (2,500 labels) violated by ~1e-4 of the loss, a few hundred per round only moved the violation elsewhere.
BANDED_PER_ROUND = 256
# Radius of the band around the coarser level's active intervals, mapped: with 1, |Y| = 4136 at ε = 2 needed 14
# rounds of pricing (84 s) for long intervals just outside the tube; with 2, one round (18 s).
MAPPED_BAND = 2
PRICED_PER_ROUND = 4096


@dataclass(frozen=True)
class ConeSolution:
    """Solution of the cone program over a set of interval signatures (scaled coordinates)."""
    alpha: np.ndarray
    beta: np.ndarray
    weights: np.ndarray  # w_S per signature
    outputs: np.ndarray  # t_S = u_S / w_S (nan where w_S = 0)
    objective: float  # dual objective Σ α + β·y (equals the primal optimum at convergence)


def solve_signature_socp(problem: Problem, first, last, deadline: Deadline = NO_DEADLINE) -> ConeSolution:
    """min over {(w_S, t_S)} of the loss with the given interval high sets, as the dual cone program in (α, β)
    written on their prefix sums (each cone touches at most six variables)."""
    k, count = problem.k, len(first)
    # Each signature's vector s is divided by A_S (a column's scale is free: its weight absorbs it), so every cone
    # has A = 1 and entries of order one even when e^ε is in the thousands.
    a_s, p_s, d_s = problem.moments(first, last)
    rows = problem.signature_rows(first, last, 1.0 / a_s).tocoo()
    # Cone i, rows 3i..3i+2: (z + A/2, v, z − A/2) with z = D − s·α, v = s·β + P: v² ≤ 2 A z (A = 1 here).
    matrix = sparse.csc_matrix((np.concatenate([rows.data, -rows.data, rows.data]),
                                (np.concatenate([3 * rows.row, 3 * rows.row + 1, 3 * rows.row + 2]),
                                 np.concatenate([rows.col, rows.col + k, rows.col]))), shape=(3 * count, 2 * k))
    d_scaled, p_scaled = d_s / a_s, p_s / a_s
    b = np.stack([d_scaled + 0.5, p_scaled, d_scaled - 0.5], axis=1).ravel()
    c = np.zeros(2 * k)
    c[k - 1] = -1.0  # Σ α = X_{k−1}
    c[k:] = -(problem.y - np.append(problem.y[1:], 0.0))  # Σ β_j y_j = Σ_j B_j (y_j − y_{j+1})
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-10
    settings.max_iter = 400
    if deadline.solver_seconds() is not None:
        settings.time_limit = deadline.solver_seconds()
    solution = clarabel.DefaultSolver(sparse.csc_matrix((2 * k, 2 * k)), c, matrix, b,
                                      [clarabel.SecondOrderConeT(3)] * count, settings).solve()
    if solution.status == clarabel.SolverStatus.MaxTime:
        deadline.expired("the continuous optimal unbiased solver (cone program)")
    if solution.status not in (clarabel.SolverStatus.Solved, clarabel.SolverStatus.AlmostSolved):
        raise LabelDPError(f"cone program failed: {solution.status}", code=ErrorCode.SOLVER_FAILED)
    x, z = np.asarray(solution.x), np.asarray(solution.z).reshape(count, 3)
    z = z / a_s[:, None]  # back to the weights of the unscaled vectors s
    weights = np.maximum(z[:, 0] + z[:, 2], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        outputs = np.where(weights > 0, -z[:, 1] / weights, np.nan)
    alpha, beta = np.diff(x[:k], prepend=0.0), np.diff(x[k:], prepend=0.0)
    return ConeSolution(alpha, beta, weights, outputs, float(alpha.sum() + beta @ problem.y))


# -- levels -----------------------------------------------------------------------------------------------------

def coarser(problem: Problem) -> Problem:
    """Consecutive labels merged in pairs: prior summed, value the prior-weighted mean (the midpoint where a pair
    has no mass)."""
    starts = np.arange(0, problem.k, 2)
    mass = np.add.reduceat(problem.p, starts)
    midpoints = np.add.reduceat(problem.y, starts) / np.diff(np.append(starts, problem.k))
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(mass > 0, np.add.reduceat(problem.p * problem.y, starts) / mass, midpoints)
    return Problem(values, mass, problem.e)


def _all_intervals(k: int) -> tuple[np.ndarray, np.ndarray]:
    first, last = np.triu_indices(k)
    return first, last


def _with_singletons(k: int, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = np.arange(k)
    return staircase.decode(k, np.union1d(codes, staircase.codes(k, labels, labels)))


@dataclass(frozen=True)
class Level:
    """A level's last cone program, its working set and (at the finest level) the best certified bound."""

    cone: ConeSolution
    first: np.ndarray
    last: np.ndarray
    bound: float  # the best certified lower bound found (−inf when the level is not certified)
    cone_programs: int


def _solve_level(problem: Problem, first, last, max_rounds: int, deadline: Deadline,
                 certify: Problem | None) -> Level:
    """Cone programs over a growing working set until exact pricing finds nothing missing — or, with ``certify``
    (the problem at the requested ε), until the cone's gap to the bound certified there is CONE_GAP, or stops
    shrinking (what is left is the interior point's accuracy, which :func:`certified_bound` then polishes away).
    The intervals pricing finds violated enter with a band of radius 1 around them."""
    k = problem.k
    bound, previous, rounds, noisy = -math.inf, math.inf, 0, 0
    while True:
        deadline.check("the continuous optimal unbiased solver")
        cone = solve_signature_socp(problem, first, last, deadline)
        rounds += 1
        scale = CONE_GAP * abs(cone.objective)
        if certify is not None:
            bound = max(bound, lower_bound(certify, cone.alpha, cone.beta))
            if cone.objective - bound <= scale:
                break
        elif previous - cone.objective <= scale:
            break  # more signatures no longer move the optimum
        if rounds >= max_rounds:
            break
        previous = cone.objective
        pricing = price(problem, cone.alpha, cone.beta, candidates=PRICED_PER_ROUND)
        known = staircase.codes(k, first, last)
        fresh = np.setdiff1d(np.union1d(
            staircase.band(k, pricing.first[:BANDED_PER_ROUND], pricing.last[:BANDED_PER_ROUND], 1),
            staircase.codes(k, pricing.first, pricing.last)), known)
        if pricing.best >= -scale or not fresh.size:
            break
        # Violations at the interior point's own accuracy keep finding "new" intervals next to the active ones
        # (large ε): two such rounds, then polishing takes over.
        noisy = noisy + 1 if pricing.best > -NOISE * abs(cone.objective) else 0
        if certify is not None and noisy > 2:
            break
        first, last = staircase.decode(k, np.union1d(known, fresh))
    if certify is not None and cone.objective - bound > CONE_GAP * abs(cone.objective):
        bound = max(bound, certified_bound(certify, cone, first, last, CONE_GAP))
    return Level(cone, first, last, bound, rounds)


def certified_bound(requested: Problem, cone: ConeSolution, first, last, gap: float) -> float:
    """The best lower bound at the ``requested`` ε from the cone's duals: as they are, then — when that is not
    within ``gap`` of the cone's objective — made exact on the active path by Newton's method
    (:func:`.pricing.polish_duals`). Interior-point duals violate the constraints of the active columns by ~10⁻⁸
    of the scaled cones (Clarabel ends "almost solved" at large ε), which the certificate pays in full: 4.6·10⁻⁶
    of the loss at |Y| = 1000, ε = 8, and 4.5·10⁻⁸ once polished. The path is the heaviest monotone one through
    the working set; its intervals of negligible weight are probably not active, and the threshold that separates
    them is tried, lightest first, until the gap is met."""
    bound = lower_bound(requested, cone.alpha, cone.beta)
    if cone.objective - bound <= gap * abs(cone.objective):
        return bound
    path = staircase.heaviest_path(requested.k, first, last, cone.weights)
    for threshold in (1e-5, 1e-4, 1e-3):
        rows = path[cone.weights[path] > threshold * cone.weights.max()]
        polished = polish_duals(requested, first[rows], last[rows], cone.alpha, cone.beta)
        bound = max(bound, lower_bound(requested, *polished))
        if cone.objective - bound <= gap * abs(cone.objective):
            break
    return bound


def cone_phase(problem: Problem, requested: Problem, max_rounds: int, deadline: Deadline) -> Level:
    """Solve the coarsest level over all its intervals, then each finer level from the band around the coarser
    level's active intervals; the finest level is solved until its certificate (at the ``requested`` ε) is within
    CONE_GAP.

    ``problem`` is at the ε the randomizer is built at (a hair below the requested one, for the exact repair):
    the released columns are this cone's, and columns optimal at another ε cost ~10⁻⁶ of the loss at |Y| = 2000
    (the continuous optimum moves with ε). The duals certify at the ``requested`` ε all the same: a Lagrangian
    bound holds for any duals."""
    levels = [problem]
    while levels[-1].k * (levels[-1].k + 1) // 2 > ALL_INTERVALS_UP_TO:
        levels.append(coarser(levels[-1]))
    first, last = _all_intervals(levels[-1].k)
    cone_programs = 0
    for depth in range(len(levels) - 1, -1, -1):
        level = _solve_level(levels[depth], first, last, max_rounds, deadline, requested if depth == 0 else None)
        cone_programs += level.cone_programs
        if depth == 0:
            return dataclasses.replace(level, cone_programs=cone_programs)
        active = level.cone.weights > ACTIVE * level.cone.weights.max()
        fine = levels[depth - 1].k
        mapped_first, mapped_last = 2 * level.first[active], np.minimum(2 * level.last[active] + 1, fine - 1)
        first, last = _with_singletons(fine, staircase.band(fine, mapped_first, mapped_last, MAPPED_BAND))
    raise AssertionError("unreachable")
