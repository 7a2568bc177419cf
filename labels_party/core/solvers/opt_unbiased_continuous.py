"""The optimal unbiased randomizer over *continuous* output values, certified to a relative gap.

Problem (squared loss g(t, y) = ½ (t − y)², labels y sorted, prior p). By Claim 12 of the optimal-unbiased paper
every ε-DP column is a conic combination of staircase vectors, so the problem is a semi-infinite LP with one
variable w ≥ 0 per (output value t ∈ ℝ, high set S ⊆ Y), column s_y = e^ε for y ∈ S and 1 otherwise, and only
2|Y| equality rows:

    min Σ w Σ_y p_y s_y g(t, y)   s.t.   Σ w s_y = 1,   Σ w s_y t = y      (every y ∈ Y).

Pipeline:

1. **Cone phase** (:mod:`.signature_cone`): for each interval high set the family of dual constraints is one
   second-order cone whose dual variables are the column's weight and first moment, so output values are
   optimized continuously; working sets of intervals grow coarse to fine around Theorem 6's monotone path, and
   the finest level stops when exact pricing over *all* high sets and all t ∈ ℝ (:mod:`.pricing`) certifies its
   duals within 10⁻⁷. The cones are solved at ε_lp = ε(1 − 2·10⁻⁹), the ε the randomizer is built at.
2. **Exact feasibility.** The interior-point columns satisfy the equality rows to ~10⁻⁹. In (w, u = w t) the rows
   are linear and split — V w = 1 and V u = y — with more columns than labels, so least-norm corrections through
   the sparse differenced rows remove the residual to rounding level (output values move by ~10⁻¹⁰). Without
   this the exact repair of a concentrated row (large ε) turns the residual r into a tilt of about r / Var.
3. **At most 2|Y| outputs.** An interior-point solution spreads its mass over the near-active neighbours of the
   optimal path (60,000 columns at |Y| = 5000). The columns on the heaviest monotone path through them stay —
   Theorem 6's structure, at most 2|Y| − 1 of them (:func:`.staircase.heaviest_path`); every other column is split
   between the two kept output values around its own by unbiased randomized rounding, which keeps each row's total
   and mean exactly and keeps every column ε-DP (a sum of ε-DP columns is ε-DP). What it costs is in the loss, so
   it is in the certified gap: ~10⁻⁷ at most in the stress cases, where keeping the 2|Y| heaviest columns instead
   cost up to 10⁻² on priors with labels of mass ~10⁻²⁰. When the optimum is degenerate (zero-prior labels) the
   interior point mixes optimal solutions on different paths and the path alone can cost more than a quarter of
   the tolerance; then a vertex of the LP over all the columns at their output values (HiGHS) is taken instead —
   always at most 2|Y| outputs, never more loss, but 16 s at |Y| = 5000, so it is the fallback.
4. **Certification** (:func:`.opt_unbiased_mesh.certify_solution`, shared with the mesh LP): columns lifted to
   exact ε_lp-DP, rows renormalized and re-centred exactly, quantized to 2⁻⁵³ and certified from the integers.
5. **Certificate.** The loss of the released randomizer against the best lower bound the cone phase certified
   at the requested ε (:func:`.signature_cone.certified_bound`: the cone's duals, made exact on the active path
   by Newton's method when that is needed — large ε).

Output values are not restricted to the ε-dbRR interval [L, U] of Algorithm 2: that interval is the paper's
heuristic for its grid, not a property of the optimum (at ε = 8 on the PSID prior the optimum over ℝ puts an
output below L and is ~5 % better than the best randomizer over [L, U]).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from types import MappingProxyType

import highspy
import numpy as np
import scipy.sparse as sparse
import scipy.sparse.linalg as sparse_linalg

from labels_party.core.solvers.deadline import NO_DEADLINE, Deadline
from labels_party.core.solvers.highs_lp import quiet_highs
from labels_party.core.solvers.opt_unbiased_mesh import certify_solution
from labels_party.core.solvers.signature_cone import Level, cone_phase
from labels_party.core.solvers.staircase import Problem, heaviest_path
from shared.errors import CertificationError, ErrorCode, LabelDPError
from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.privacy import SATURATION_EPSILON, SOLVER_MARGIN, design_epsilon

# Below this ε Clarabel stops with InsufficientProgress on every prior tried (3e-3 was the smallest that
# solved on four priors; the floor keeps a margin).
MIN_EPSILON = 0.01
EXACT_SOLVER_MARGIN = 2e-9  # the refined columns are exact to ~1e-13: the exact repair needs little slack
DUST = 1e-12  # columns lighter than this fraction of the heaviest are dropped before the refinement


@dataclass(frozen=True)
class ExactSolution:
    mechanism: FiniteRandomizer
    lower_bound: float
    optimality_gap: float
    cone_programs: int  # cone programs solved (levels and working-set rounds)
    seconds: float


@dataclass(frozen=True)
class _Columns:
    """Staircase columns: interval high sets, weights of the vectors scaled to a maximum of 1, output values."""
    first: np.ndarray
    last: np.ndarray
    weights: np.ndarray
    outputs: np.ndarray

    def loss(self, problem: Problem) -> float:
        return float(self.weights @ problem.column_costs(self.first, self.last, self.outputs))


def _loss(problem: Problem, outputs, matrix) -> float:
    return float(problem.p @ (0.5 * (matrix * (outputs[None, :] - problem.y[:, None]) ** 2).sum(axis=1)))


def _corrector(matrix: sparse.csc_matrix, scale: np.ndarray):
    """r ↦ the δ with matrix δ = r of least Σ δ_j² / scale_j: corrections in proportion to each column's weight,
    so a light column moves as little, relatively, as a heavy one and stays positive. A sparse LU of
    matrix · diag(scale) · matrixᵀ, regularized at rounding level."""
    scaled = matrix @ sparse.diags(scale)
    gram = (scaled @ matrix.T).tocsc()
    regularization = 1e-15 * max(float(gram.diagonal().max()), 1e-300)
    factor = sparse_linalg.splu(gram + regularization * sparse.identity(gram.shape[0], format="csc"))
    return lambda residual: scaled.T @ factor.solve(residual)


def refined_columns(problem: Problem, level: Level) -> _Columns:
    """The cone's columns made feasible to rounding level (step 2)."""
    cone = level.cone
    weights = cone.weights * problem.e  # the cone's weights are for vectors with entries 1 and e
    keep = np.flatnonzero((weights > DUST * weights.max()) & np.isfinite(cone.outputs))
    return _made_exact(problem, level.first[keep], level.last[keep], weights[keep], cone.outputs[keep])


def _made_exact(problem: Problem, first, last, weights, outputs) -> _Columns:
    """Columns whose weights and first moments are corrected (weighted least norm, twice) until Σ w v = 1 and
    Σ w t v = y hold to rounding."""
    k, y = problem.k, problem.y
    w, u = weights, weights * outputs
    rows = problem.differenced_columns(first, last, np.ones(w.size))[:k]
    correct = _corrector(rows, w)
    for _ in range(2):
        w = w + correct(np.diff(np.ones(k), prepend=0.0) - rows @ w)
        u = u + correct(np.diff(y, prepend=0.0) - rows @ u)
    if not np.all(w > 0):
        raise LabelDPError("the cone's columns could not be made exactly feasible", code=ErrorCode.SOLVER_FAILED)
    return _Columns(first, last, w, u / w)


def vertex(problem: Problem, columns: _Columns, deadline: Deadline = NO_DEADLINE) -> _Columns | None:
    """A basic optimal solution of the LP over these columns at their output values (HiGHS: interior point and
    crossover; then the simplex method if that ends anywhere but optimal), made exact: at most 2|Y| columns, and a
    loss no larger than the columns' own (they are feasible for it). None if HiGHS finds no optimal vertex (near-
    parallel columns can make it declare the LP infeasible at its tolerance). The equality rows are written
    differenced (row y minus row y − 1), so a column has at most six entries; vectors are scaled to a maximum of
    1. Presolve is off: it merges near-parallel columns and then declares the remainder infeasible."""
    k, y = problem.k, problem.y
    matrix = problem.differenced_columns(columns.first, columns.last, columns.outputs)
    matrix.sort_indices()
    targets = np.concatenate([np.diff(np.ones(k), prepend=0.0), np.diff(y, prepend=0.0)])
    count = columns.weights.size
    highs = quiet_highs()
    highs.setOptionValue("solver", "ipm")
    highs.setOptionValue("primal_feasibility_tolerance", 1e-10)
    highs.setOptionValue("dual_feasibility_tolerance", 1e-10)
    highs.setOptionValue("presolve", "off")
    seconds = deadline.solver_seconds()
    if seconds is not None:
        highs.setOptionValue("time_limit", seconds)
    highs.addRows(2 * k, targets, targets, 0, np.array([], np.int32), np.array([], np.int32), np.array([]))
    highs.addCols(count, problem.column_costs(columns.first, columns.last, columns.outputs), np.zeros(count),
                  np.full(count, highspy.kHighsInf), matrix.nnz, matrix.indptr[:-1].astype(np.int32),
                  matrix.indices.astype(np.int32), matrix.data)
    for solver in ("ipm", "simplex"):
        highs.setOptionValue("solver", solver)
        highs.clearSolver()
        highs.run()
        status = highs.getModelStatus()
        if status == highspy.HighsModelStatus.kTimeLimit:
            deadline.expired("the continuous optimal unbiased solver (vertex LP)")
        if status == highspy.HighsModelStatus.kOptimal:
            break
    else:
        return None
    weights = np.array(highs.getSolution().col_value)
    support = weights > 1e-14 * weights.max()
    return _made_exact(problem, columns.first[support], columns.last[support], weights[support],
                       columns.outputs[support])


def compress(problem: Problem, columns: _Columns, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct output values, labels × outputs matrix) over the ``kept`` columns' output values (step 3):
    each other column is split between the kept output values on either side of its own in the proportions that
    keep its mean (beyond the outermost kept value it joins that one; certification
    re-centres the row). Built through difference arrays: O(|Y| · outputs) memory, nothing |Y|² per column."""
    k, e = problem.k, problem.e
    kept = kept[np.argsort(columns.outputs[kept], kind="stable")]
    values = columns.outputs[kept]
    rest = np.setdiff1d(np.arange(columns.weights.size), kept)
    right = np.clip(np.searchsorted(values, columns.outputs[rest]), 0, values.size - 1)
    left = np.clip(np.searchsorted(values, columns.outputs[rest]) - 1, 0, values.size - 1)
    span = values[right] - values[left]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(span > 0, (values[right] - columns.outputs[rest]) / span, 1.0)
    target = np.concatenate([np.arange(values.size), left, right])
    source = np.concatenate([kept, rest, rest])
    weight = columns.weights[source] * np.concatenate([np.ones(values.size), share, 1.0 - share])
    matrix = np.zeros((k + 1, values.size))
    lift = 1.0 - 1.0 / e
    np.add.at(matrix, (columns.first[source], target), lift * weight)
    np.add.at(matrix, (columns.last[source] + 1, target), -lift * weight)
    np.cumsum(matrix, axis=0, out=matrix)
    matrix = matrix[:k]
    matrix += np.bincount(target, weights=weight / e, minlength=values.size)[None, :]
    outputs, start = np.unique(values, return_index=True)  # equal output values: one output
    return outputs, (np.add.reduceat(matrix, start, axis=1) if outputs.size < values.size else matrix)


@dataclass(frozen=True)
class _ScaledSolution:
    outputs: np.ndarray  # sorted, distinct (scaled coordinates)
    matrix: np.ndarray  # labels x outputs, exact to rounding
    lower_bound: float  # valid at the requested ε (scaled loss)
    cone_programs: int
    signatures: int


def _solve_scaled(y, prior, epsilon: float, lp_epsilon: float, tolerance: float, max_rounds: int,
                  deadline: Deadline) -> _ScaledSolution:
    problem, built = Problem(y, prior, math.exp(epsilon)), Problem(y, prior, math.exp(lp_epsilon))
    level = cone_phase(built, problem, max_rounds, deadline)
    columns = refined_columns(built, level)
    kept = heaviest_path(y.size, columns.first, columns.last, columns.weights)
    if kept.size:
        outputs, matrix = compress(built, columns, kept)
    if not kept.size or _loss(built, outputs, matrix) > (1 + 0.25 * tolerance) * columns.loss(built):
        # The interior point mixed optimal solutions on different paths (a degenerate optimum: zero-prior labels)
        # and the path alone loses too much: a vertex of the LP over all the columns instead (or, if HiGHS finds
        # none, every column: more outputs than Theorem 6 needs, none of the loss).
        columns = vertex(built, columns, deadline) or columns
        outputs, matrix = compress(built, columns, np.arange(columns.weights.size))
    return _ScaledSolution(outputs, matrix, level.bound, level.cone_programs, int(level.first.size))


def solve_continuous_optimal_unbiased(values, prior, epsilon: float, *, tolerance: float = 5e-7,
                                      max_rounds: int = 30, deadline: Deadline = NO_DEADLINE) -> ExactSolution:
    """The optimal unbiased randomizer over output values in ℝ, certified to a relative gap ``tolerance``."""
    started = time.perf_counter()
    epsilon = float(epsilon)  # valid: checked by labels_party.core.registry
    if epsilon < MIN_EPSILON:
        raise LabelDPError(f"the continuous optimal unbiased solver certifies epsilon >= {MIN_EPSILON:g} (below, its "
                           f"cone programs lose accuracy); got {epsilon:g}: use a mesh, dbrr or laplace",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    values = np.asarray(values, dtype=np.float64)
    prior = normalized_prior(prior, values.size)
    k = values.size
    if k == 1:
        mechanism = FiniteRandomizer.from_probabilities("opt-unbiased", epsilon, values, values, np.ones((1, 1)),
                                                        {"method": "continuous"})
        return ExactSolution(mechanism, 0.0, 0.0, 0, time.perf_counter() - started)
    center, scale = 0.5 * (values[0] + values[-1]), 0.5 * (values[-1] - values[0])
    # A label with zero prior between two labels with positive prior costs nothing and constrains nothing: the
    # interpolation of its neighbours' rows is normalized, unbiased for it and inside every column's DP range. So
    # it is left out of the solve (the optimum is unchanged; its free duals would only blur the certificate).
    support = np.flatnonzero(prior > 0)
    interior_zero = (prior == 0) & (np.arange(k) > support[0]) & (np.arange(k) < support[-1])
    solved = ~interior_zero
    kept = np.flatnonzero(solved)
    # The randomizer is built at ε_lp = ε(1 − margin) so that the exact repair fits; if the repair of a badly
    # conditioned solution does not fit, the margin grows (and the certified gap says what that cost).
    # Above SATURATION_EPSILON the randomizer is built (and its gap certified) at that ε: see shared/privacy.py.
    target = min(epsilon, SATURATION_EPSILON)
    for margin in (EXACT_SOLVER_MARGIN, 1e-7, SOLVER_MARGIN):
        lp_epsilon = design_epsilon(target, margin)
        scaled = _solve_scaled((values[solved] - center) / scale, prior[solved], target, lp_epsilon, tolerance,
                               max_rounds, deadline)
        matrix = np.empty((k, scaled.outputs.size))
        matrix[solved] = scaled.matrix
        for z in np.flatnonzero(interior_zero):
            left, right = kept[np.searchsorted(kept, z) - 1], kept[np.searchsorted(kept, z)]
            weight = (values[right] - values[z]) / (values[right] - values[left])
            matrix[z] = weight * matrix[left] + (1 - weight) * matrix[right]
        try:
            mechanism = certify_solution(values, center + scale * scaled.outputs, matrix, epsilon, lp_epsilon,
                                         "opt-unbiased", {"method": "continuous", "cone_programs": scaled.cone_programs,
                                                          "signatures": scaled.signatures})
            break
        except CertificationError:
            if margin == SOLVER_MARGIN:
                raise
    loss = mechanism.noisy_label_loss(prior)
    lower = scaled.lower_bound * scale**2
    gap = max(0.0, (loss - lower) / loss) if loss > 0 else 0.0
    # The certificate travels with the mechanism (and so into release descriptions and audit records).
    mechanism = dataclasses.replace(mechanism, parameters=MappingProxyType(
        {**mechanism.parameters, "optimality_gap": gap, "lower_bound": lower}))
    return ExactSolution(mechanism, lower, gap, scaled.cone_programs, time.perf_counter() - started)
