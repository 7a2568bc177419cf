"""The optimal unbiased randomizer over *continuous* output values: a second-order cone program over interval
signatures (Clarabel), a HiGHS LP for the vertex solution, and an exact pricing certificate.

Problem (squared loss g(t, y) = ½ (t − y)², labels y sorted, prior p). By Claim 12 of the optimal-unbiased paper
every ε-DP column is a conic combination of staircase vectors, so the problem is a semi-infinite LP with one
variable w ≥ 0 per (output value t ∈ ℝ, high set S ⊆ Y), column s_y = e^ε for y ∈ S and 1 otherwise, and only
2|Y| equality rows:

    min Σ w Σ_y p_y s_y g(t, y)   s.t.   Σ w s_y = 1,   Σ w s_y t = y      (every y ∈ Y).

Dual variables (α_y, β_y) give the reduced cost rc(t, S) = Σ_y s_y c_y(t) with c_y(t) = p_y g(t, y) − α_y − β_y t.

Reformulation. For a fixed signature S the reduced cost is a quadratic in t,
rc(t, S) = ½ A_S t² − t (P_S + s·β) + D_S − s·α with A_S = Σ s p, P_S = Σ s p y, D_S = ½ Σ s p y², so the
semi-infinite family of dual constraints {rc(t, S) ≥ 0 for all t} is exactly one rotated second-order cone

    (s·β + P_S)² ≤ 2 A_S (D_S − s·α),

and its dual variables are the column's weight w_S and first moment u_S = w_S t_S: the output value is optimized
continuously (the perspective formulation of the issue). Theorem 6 says an optimal randomizer only needs
*interval* signatures — |Y|(|Y|+1)/2 cones — and that the intervals move monotonically with t; for large |Y| a
working set of intervals grows around the active path (a coarse problem on label blocks first, then pricing and a
band). s·α is written with prefix sums of α (the decision variables), so each cone touches at most six of them.
Clarabel (interior point) solves the cone program.

Vertex and certificate. The interior-point solution is spread over near-active signatures; HiGHS (highspy) then
solves the LP restricted to the cone's columns at their optimal output values, which returns a vertex with
≤ 2|Y| outputs; a float64 refinement makes it feasible to rounding level for the exact repair of
:func:`certify_solution`. For any duals, Σ_y (α_y + β_y y) + (a bound on Σ_S w_S rc_S over feasible w) is a lower
bound on the optimum over *all* signatures and all t ∈ ℝ (:func:`lower_bound`); min over S of rc is attained at
{y : c_y(t) < 0} and min over t is a 1-D piecewise-quadratic problem solved in closed form (:func:`price`). The
bound is computed at the requested ε, so the reported gap certifies the released mechanism.

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

import clarabel
import highspy
import numpy as np
import scipy.linalg
import scipy.sparse as sparse

from labels_party.solvers.deadline import NO_DEADLINE, Deadline, SolverTimeout
from labels_party.solvers.opt_unbiased_mesh import certify_solution
from shared.errors import CertificationError, LabelDPError
from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.mechanisms.randomized_response import debiased_outputs
from shared.privacy import SATURATION_EPSILON, SOLVER_MARGIN, design_epsilon

# Below this ε Clarabel stops with InsufficientProgress on every prior tried (3e-3 was the smallest that
# solved on four priors; the floor keeps a margin).
MIN_EPSILON = 0.01
EXACT_SOLVER_MARGIN = 2e-9  # the vertex LP is feasible to ~1e-10: the exact repair needs little slack
ALL_INTERVALS_UP_TO = 3000  # cones; above this the intervals are grown as a working set
COARSE_LABELS = 48  # block count of the coarse problem that seeds the working set for large |Y|
# Interior-point duals are accurate to ~1e-7 relative; the last digits come from the vertex LP and exact pricing.
CONE_GAP = 1e-7
COLUMNS_PER_ROUND = 64  # exact-pricing columns added to the vertex LP per round


@dataclass(frozen=True)
class Pricing:
    t: np.ndarray  # candidate output values (one per piece with negative reduced cost), best first
    high: np.ndarray  # (candidates, k) bool: the high set S of each candidate
    reduced_cost: np.ndarray
    best: float  # min over all t ∈ ℝ of rc*(t) (may be >= 0)


def price(values, prior, alpha, beta, e) -> Pricing:
    """Exact minimization over t ∈ ℝ of rc*(t) = Σ_y c_y(t) + (e − 1) Σ_y min(c_y(t), 0).

    rc* is piecewise quadratic with breakpoints at the roots of the c_y; on each piece the high set is fixed and the
    minimum is closed form. It tends to +∞ at both ends because the prior has positive mass.
    """
    a = 0.5 * prior
    b = -prior * values - beta
    d = 0.5 * prior * values**2 - alpha
    quadratic = a > 0
    disc = b[quadratic] ** 2 - 4 * a[quadratic] * d[quadratic]
    ok = disc > 0
    sq, aq, bq = np.sqrt(disc[ok]), a[quadratic][ok], b[quadratic][ok]
    linear = (~quadratic) & (b != 0)
    # Cancellation-free roots q / a and d / q with q = −(b + sign(b) √disc) / 2: the textbook formula loses the small
    # root of a label with a tiny prior (b² − 4ad ≈ b²), and a missed breakpoint would make the bound invalid.
    q = -0.5 * (bq + np.where(bq >= 0, sq, -sq))
    dq = d[quadratic][ok]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        roots = np.concatenate([q / aq, dq / q, -d[linear] / b[linear]])
    # A root that overflows (a label with a prior ~1e-300) means that label's sign never changes on finite t.
    roots = np.unique(roots[np.isfinite(roots)])
    lows = np.concatenate([[-np.inf], roots])
    highs = np.concatenate([roots, [np.inf]])
    if roots.size:  # one interior sample point per piece decides its high set; it stays near the piece's inner
        # end, because a label with a tiny prior makes pieces ~1e305 wide and their midpoints overflow t².
        step = np.maximum(1.0, np.abs(roots))
        with np.errstate(over="ignore"):  # an outer piece past ±1e308 is +∞ in rc* anyway
            inner = roots[:-1] + np.minimum(0.5 * np.diff(roots), step[:-1])
            mids = np.concatenate([[roots[0] - step[0]], inner, [roots[-1] + step[-1]]])
    else:
        mids = np.zeros(1)
    # A label with a tiny prior has roots far out (|t| ~ 1e150 and beyond): there t² overflows. rc* is dominated by
    # its positive quadratic term that far out, so such pieces count as +∞.
    with np.errstate(over="ignore", invalid="ignore"):
        negative = (a[None, :] * mids[:, None] ** 2 + b[None, :] * mids[:, None] + d[None, :]) < 0
        weight = 1.0 + (e - 1.0) * negative  # (pieces, k): the best high set on each piece
        qa, qb, qd = weight @ a, weight @ b, weight @ d
        t = np.clip(-qb / (2 * qa), lows, highs)
        rc = qa * t**2 + qb * t + qd
    rc = np.where(np.isfinite(rc), rc, np.inf)
    order = np.argsort(rc)
    keep = order[rc[order] < 0]
    return Pricing(t[keep], negative[keep], rc[keep], float(rc.min()))


def lower_bound(values, prior, alpha, beta, e) -> float:
    """A certified lower bound on the optimal loss from *any* duals (α, β).

    Lagrangian bound: Σ(α + β·y) + Σ_S w_S rc_S ≥ Σ(α + β·y) + min over feasible w of Σ w_S min(rc_S, 0), and
    every feasible solution has both Σ_S w_S ≤ 1 (each normalization row has s_y ≥ 1) and Σ_S w_S A_S = 1
    (A_S = Σ_y s_y p_y; the normalization rows weighted by the prior). Equivalently, shifting the duals to
    (α − δ d, β) raises rc(t, S) by δ Σ_y s_y d_y and costs δ Σ d: along d = p the raise is δ A_S, along d = 1 it
    is δ (|Y| + (e − 1)|S|). For each direction the smallest δ making the shifted duals feasible is found by
    bisection with exact pricing; the best resulting bound (and the plain one) is returned. The shifts matter at
    large ε, where interior-point duals violate the constraints of columns with A_S ~ e^ε.
    """
    objective = float(alpha.sum() + beta @ values)
    worst = price(values, prior, alpha, beta, e).best
    if worst >= 0:
        return objective
    best = objective + worst
    for direction in (prior, np.full(values.size, 1.0 / values.size)):
        # Every s_y >= 1, so at δ = −min rc / min_S Σ s d the shifted reduced costs are all nonnegative.
        low, high = 0.0, -worst / max(float(direction.sum()), 1e-300)
        for _ in range(40):
            middle = 0.5 * (low + high)
            if price(values, prior, alpha - middle * direction, beta, e).best >= 0:
                high = middle
            else:
                low = middle
        best = max(best, objective - high * float(direction.sum()))
    return best


def polish_duals(values, prior, e, masks, alpha, beta, steps: int = 2):
    """Gauss-Newton on the dual optimality conditions of a set of active signatures: for each, min over t of
    rc(t, S) = D_S − s·α − (P_S + s·β)² / (2 A_S) must be zero. Interior-point duals are ill-determined in the
    directions of columns with tiny weight (large ε); making the active constraints tight fixes the certificate."""
    s = np.where(masks, e, 1.0)
    a_s, p_s, d_s = s @ prior, s @ (prior * values), 0.5 * (s @ (prior * values**2))
    for _ in range(steps):
        t = (p_s + s @ beta) / a_s
        residual = d_s - s @ alpha - 0.5 * a_s * t**2
        jacobian = np.concatenate([-s, -t[:, None] * s], axis=1)
        step = scipy.linalg.lstsq(jacobian, -residual, lapack_driver="gelsy")[0]
        alpha, beta = alpha + step[: values.size], beta + step[values.size:]
    return alpha, beta


@dataclass(frozen=True)
class ConeSolution:
    """Solution of the cone program over a set of signatures (scaled coordinates)."""
    alpha: np.ndarray
    beta: np.ndarray
    weights: np.ndarray  # w_S per signature
    outputs: np.ndarray  # t_S = u_S / w_S (nan where w_S = 0)
    objective: float  # dual objective Σ α + β·y (equals the primal optimum at convergence)


def solve_signature_socp(y, prior, e, masks, deadline: Deadline = NO_DEADLINE) -> ConeSolution:
    """min over {(w_S, t_S)} of the loss with the given high sets, as the dual cone program in (α, β)."""
    count, k = masks.shape
    high = masks.astype(np.float64)
    # Each signature's vector s is divided by A_S = Σ s p (a column's scale is free: its weight absorbs it), so
    # every cone has A = 1 and entries of order one even when e^ε is in the thousands.
    scale = 1.0 + (e - 1.0) * (high @ prior)
    p_s = (prior @ y + (e - 1.0) * (high @ (prior * y))) / scale
    d_s = 0.5 * (prior @ y**2 + (e - 1.0) * (high @ (prior * y**2))) / scale
    # s·x = X_k + (e − 1) Σ_j (m_j − m_{j+1}) X_j with X the prefix sums of x: nonzeros only at run boundaries.
    boundary = (e - 1.0) * (high - np.pad(high[:, 1:], ((0, 0), (0, 1))))
    boundary[:, -1] += 1.0
    linear = sparse.csr_matrix(boundary / scale[:, None])
    zero = sparse.csr_matrix((count, k))
    # Cone i, rows 3i..3i+2: (z + A/2, v, z − A/2) with z = D − s·α, v = s·β + P: v² ≤ 2 A z (A = 1 here).
    rows = sparse.vstack([sparse.hstack([linear, zero]), sparse.hstack([zero, -linear]),
                          sparse.hstack([linear, zero])]).tocsr()
    rows = rows[np.arange(3 * count).reshape(3, count).T.ravel()].tocsc()
    b = np.stack([d_s + 0.5, p_s, d_s - 0.5], axis=1).ravel()
    c = np.zeros(2 * k)
    c[k - 1] = -1.0  # Σ α = X_k
    c[k:] = -(y - np.append(y[1:], 0.0))  # Σ β_j y_j = Σ_j B_j (y_j − y_{j+1})
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-10
    settings.max_iter = 400
    if deadline.solver_seconds() is not None:
        settings.time_limit = deadline.solver_seconds()
    solution = clarabel.DefaultSolver(sparse.csc_matrix((2 * k, 2 * k)), c, rows, b,
                                      [clarabel.SecondOrderConeT(3)] * count, settings).solve()
    if solution.status == clarabel.SolverStatus.MaxTime:
        deadline.expired("the continuous optimal unbiased solver (cone program)")
    if solution.status not in (clarabel.SolverStatus.Solved, clarabel.SolverStatus.AlmostSolved):
        raise LabelDPError(f"cone program failed: {solution.status}", code="solver_failed")
    x, z = np.asarray(solution.x), np.asarray(solution.z).reshape(count, 3)
    z = z / scale[:, None]  # back to the weights of the unscaled vectors s
    weights = np.maximum(z[:, 0] + z[:, 2], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        outputs = np.where(weights > 0, -z[:, 1] / weights, np.nan)
    alpha, beta = np.diff(x[:k], prepend=0.0), np.diff(x[k:], prepend=0.0)
    return ConeSolution(alpha, beta, weights, outputs, float(alpha.sum() + beta @ y))


def interval_masks(k: int, firsts, lasts) -> np.ndarray:
    """Boolean masks of the intervals [first, last] (0-based, inclusive) of k sorted labels."""
    labels = np.arange(k)
    return (labels >= np.asarray(firsts)[:, None]) & (labels <= np.asarray(lasts)[:, None])


def initial_signatures(y, prior, e) -> tuple[np.ndarray, int]:
    """The first working set of interval signatures and the band radius for the next round.

    All intervals when there are few. Otherwise the labels are merged into ≤ COARSE_LABELS blocks of s consecutive
    labels (prior summed, value its prior-weighted mean), that coarse problem is solved over all its intervals,
    and its active intervals, mapped to label intervals, are widened by a band of radius s/2 + 1: Theorem 6's
    monotone path of the fine problem runs close to the coarse one.
    """
    k = y.size
    if k * (k + 1) // 2 <= ALL_INTERVALS_UP_TO:
        firsts, lasts = np.triu_indices(k)
        return interval_masks(k, firsts, lasts), 1
    size = math.ceil(k / COARSE_LABELS)
    starts = np.arange(0, k, size)
    mass = np.add.reduceat(prior, starts)
    midpoints = np.add.reduceat(y, starts) / np.diff(np.append(starts, k))
    with np.errstate(invalid="ignore", divide="ignore"):
        coarse_y = np.where(mass > 0, np.add.reduceat(prior * y, starts) / mass, midpoints)
    coarse_masks, _ = initial_signatures(coarse_y, mass / mass.sum(), e)
    cone = solve_signature_socp(coarse_y, mass / mass.sum(), e, coarse_masks)
    active = coarse_masks[cone.weights > 1e-9 * cone.weights.max()]
    ends = np.append(starts[1:] - 1, k - 1)
    firsts = starts[active.argmax(axis=1)]
    lasts = ends[active.shape[1] - 1 - active[:, ::-1].argmax(axis=1)]
    radius = size // 2 + 1
    singletons = np.arange(k)  # they keep any working set feasible (ε-dbRR's signatures)
    masks = np.concatenate([band_around(interval_masks(k, firsts, lasts), radius),
                            interval_masks(k, singletons, singletons)])
    return _new_rows(np.zeros((0, k), dtype=bool), masks), 2


def band_around(masks: np.ndarray, radius: int) -> np.ndarray:
    """Intervals whose ends are within ``radius`` of an interval signature in ``masks`` (non-intervals skipped)."""
    k = masks.shape[1]
    firsts, lasts = masks.argmax(axis=1), k - 1 - masks[:, ::-1].argmax(axis=1)
    is_interval = masks.sum(axis=1) == lasts - firsts + 1
    shifts = np.arange(-radius, radius + 1)
    f, g = (part.ravel() for part in np.broadcast_arrays(firsts[is_interval, None, None] + shifts[None, :, None],
                                                          lasts[is_interval, None, None] + shifts[None, None, :]))
    ok = (f >= 0) & (g < k) & (f <= g)
    pairs = np.unique(np.stack([f[ok], g[ok]], axis=1), axis=0)
    return interval_masks(k, pairs[:, 0], pairs[:, 1])


def _new_rows(existing: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    known = {row.tobytes() for row in np.packbits(existing, axis=1)}
    packed = np.packbits(candidates, axis=1)
    fresh, seen = [], set()
    for i, row in enumerate(packed):
        key = row.tobytes()
        if key not in known and key not in seen:
            seen.add(key)
            fresh.append(i)
    return candidates[fresh]


@dataclass(frozen=True)
class ExactSolution:
    mechanism: FiniteRandomizer
    lower_bound: float
    optimality_gap: float
    cone_programs: int  # cone programs solved (working-set rounds)
    seconds: float


def _column_costs(vectors, outputs, values, prior) -> np.ndarray:
    """Loss per unit weight of each column: Σ_y p_y v_y ½ (t − y)²."""
    return (vectors * prior * 0.5 * (outputs[:, None] - values) ** 2).sum(axis=1)


class _VertexLP:
    """HiGHS master over staircase columns at fixed output values; columns can be added (warm start).

    The rows are differenced (row y minus row y − 1, an invertible change of the equality system): a staircase
    vector then has nonzeros only at the ends of its high runs, so a column has ~6 entries instead of 2|Y| and the
    LP stays sparse at |Y| = 400. Duals are mapped back by α = Dᵀ λ.
    """

    def __init__(self, y, prior, e, deadline: Deadline = NO_DEADLINE):
        self.y, self.prior, self.e, self.k, self.deadline = y, prior, e, y.size, deadline
        self.highs = highspy.Highs()
        self.highs.setOptionValue("output_flag", False)
        self.highs.setOptionValue("primal_feasibility_tolerance", 1e-10)
        self.highs.setOptionValue("dual_feasibility_tolerance", 1e-10)
        # Presolve merges the near-parallel columns (a cone column next to the ε-dbRR column it equals up to
        # 1e-9) and then declares the over-determined remainder infeasible at its tolerance.
        self.highs.setOptionValue("presolve", "off")
        targets = np.concatenate([np.diff(np.ones(self.k), prepend=0.0), np.diff(y, prepend=0.0)])
        self.highs.addRows(2 * self.k, targets, targets, 0, np.array([], np.int32), np.array([], np.int32),
                           np.array([]))
        self.outputs: list[float] = []
        self.vectors: list[np.ndarray] = []  # each column's vector over labels (undifferenced)

    def add(self, outputs, masks):
        outputs = np.asarray(outputs, dtype=np.float64)
        # Staircase vectors scaled to a maximum of 1 (entries 1 and e^-ε): at large ε, entries e^ε made HiGHS's
        # 1e-10 feasibility too coarse for the exact repair.
        vectors = np.where(masks, 1.0, 1.0 / self.e)
        costs = _column_costs(vectors, outputs, self.y, self.prior)
        differenced = np.diff(vectors, axis=1, prepend=0.0)
        columns = sparse.csc_matrix(np.concatenate([differenced, differenced * outputs[:, None]], axis=1).T)
        count = outputs.size
        self.highs.addCols(count, costs, np.zeros(count), np.full(count, highspy.kHighsInf), columns.nnz,
                           columns.indptr[:-1].astype(np.int32), columns.indices.astype(np.int32), columns.data)
        self.outputs.extend(outputs.tolist())
        self.vectors.extend(vectors)

    def solve(self):
        """(weights, row duals α‖β of the undifferenced rows, objective)."""
        self.deadline.check("the continuous optimal unbiased solver (vertex LP)")
        if self.deadline.solver_seconds() is not None:
            self.highs.setOptionValue("time_limit", self.deadline.solver_seconds())
        self.highs.run()
        # A warm start can end "unknown" on a badly scaled basis: solve from scratch, then with 1e-9 tolerances (the
        # refinement below restores exact feasibility), then with the interior-point solver and crossover.
        fallbacks = [{}, {"primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9},
                     {"solver": "ipm"}]
        for options in fallbacks:
            if self.highs.getModelStatus() == highspy.HighsModelStatus.kOptimal:
                break
            for name, value in options.items():
                self.highs.setOptionValue(name, value)
            self.highs.clearSolver()
            self.highs.run()
        status = self.highs.getModelStatus()
        if status == highspy.HighsModelStatus.kTimeLimit:
            self.deadline.expired("the continuous optimal unbiased solver (vertex LP)")
        if status != highspy.HighsModelStatus.kOptimal:
            raise LabelDPError("vertex LP failed: " + self.highs.modelStatusToString(status), code="solver_failed")
        solution = self.highs.getSolution()
        duals = np.array(solution.row_dual).reshape(2, self.k)
        duals = duals - np.pad(duals[:, 1:], ((0, 0), (0, 1)))  # α = Dᵀ λ: α_y = λ_y − λ_{y+1}
        return np.array(solution.col_value), duals.ravel(), float(self.highs.getInfo().objective_function_value)


@dataclass(frozen=True)
class _ScaledSolution:
    outputs: np.ndarray  # sorted, distinct (scaled coordinates)
    matrix: np.ndarray  # labels x outputs, solver tolerance
    lower_bound: float  # valid at the requested ε (scaled loss)
    cone_programs: int
    signatures: int


def _solve_scaled(y, prior, epsilon: float, lp_epsilon: float, tolerance: float, max_rounds: int,
                  deadline: Deadline) -> _ScaledSolution:
    """The three phases: cone programs over a working set (the certificate's duals), the HiGHS vertex with exact
    pricing, and the float64 refinement the exact repair needs."""
    e_req = math.exp(epsilon)
    cone, masks, best_bound, rounds = _cone_phase(y, prior, e_req, max_rounds, deadline)
    # Gauss-Newton on the cone's active signatures sharpens its ill-determined duals (large ε).
    significant = cone.weights > 1e-6 * cone.weights.max()
    polished = polish_duals(y, prior, e_req, masks[significant], cone.alpha, cone.beta)
    best_bound = max(best_bound, lower_bound(y, prior, *polished, e_req))
    vertex, weights, upper, best_bound = _vertex_phase(y, prior, e_req, lp_epsilon, cone, masks, best_bound,
                                                       tolerance, max_rounds, deadline)
    outputs, matrix = _refine(vertex, weights, upper, y, prior, tolerance)
    return _ScaledSolution(outputs, matrix, best_bound, rounds, int(masks.shape[0]))


def _cone_phase(y, prior, e_req: float, max_rounds: int, deadline: Deadline):
    """Cone programs over a growing set of signatures until exact pricing finds nothing missing. They are solved at
    the requested ε: their duals give the certificate; the vertex is at ε_lp. Returns (the last cone solution, its
    signatures, the best lower bound, the rounds)."""
    masks, radius = initial_signatures(y, prior, e_req)
    rounds, best_bound, previous = 0, -math.inf, math.inf
    while True:
        deadline.check("the continuous optimal unbiased solver")
        cone = solve_signature_socp(y, prior, e_req, masks, deadline)
        rounds += 1
        best_bound = max(best_bound, lower_bound(y, prior, cone.alpha, cone.beta, e_req))
        if cone.objective - best_bound <= CONE_GAP * abs(cone.objective) or rounds >= max_rounds:
            break
        if previous - cone.objective <= CONE_GAP * abs(cone.objective):
            break  # more signatures no longer move the optimum: what is left is dual accuracy, fixed below
        previous = cone.objective
        active = cone.weights > 1e-9 * cone.weights.max()
        pricing = price(y, prior, cone.alpha, cone.beta, e_req)
        # Priced high sets enter as their interval band (non-intervals only arise from inexact duals and would make
        # the cone rows dense); the certificate prices every set anyway.
        fresh = _new_rows(masks, band_around(np.concatenate([masks[active], pricing.high]), radius))
        if not fresh.size:
            break
        masks = np.concatenate([masks, fresh])
        radius = max(1, radius // 2)
    return cone, masks, best_bound, rounds


def _vertex_phase(y, prior, e_req: float, lp_epsilon: float, cone: ConeSolution, masks, best_bound: float,
                  tolerance: float, max_rounds: int, deadline: Deadline):
    """HiGHS over the cone's columns at their optimal output values, then exact-pricing columns until the gap is
    met with room to spare (refinement and the exact repair cost a little). Returns (the LP, its weights, its
    objective, the best lower bound)."""
    k = y.size
    vertex = _VertexLP(y, prior, math.exp(lp_epsilon), deadline)
    rr_outputs = debiased_outputs(y, lp_epsilon)
    vertex.add(rr_outputs, np.eye(k, dtype=bool))  # ε-dbRR: the LP is always feasible
    # The rest of the cone's columns is interior-point dust; a singleton column at (nearly) ε-dbRR's output value
    # duplicates a column already there, and near-parallel pairs make the simplex declare infeasibility.
    positive = cone.weights > 1e-10 * cone.weights.max()
    singleton = masks.sum(axis=1) == 1
    duplicate = singleton & (np.abs(cone.outputs - rr_outputs[masks.argmax(axis=1)]) <= 1e-6 * np.abs(rr_outputs).max())
    positive &= ~duplicate
    vertex.add(cone.outputs[positive], masks[positive])
    weights = None
    for _ in range(max_rounds):
        try:
            weights, duals, upper = vertex.solve()
        except LabelDPError as error:
            if weights is None or isinstance(error, SolverTimeout):
                raise
            break  # numerical trouble after columns were added: the last optimal vertex stands (the gap is honest)
        best_bound = max(best_bound, lower_bound(y, prior, duals[:k], duals[k:], e_req))
        if upper - best_bound > 0.5 * tolerance * abs(upper):  # polish again on the vertex's support
            support = np.asarray(vertex.vectors)[weights > 0] == 1.0
            best_bound = max(best_bound, lower_bound(
                y, prior, *polish_duals(y, prior, e_req, support, cone.alpha, cone.beta), e_req))
        pricing = price(y, prior, duals[:k], duals[k:], math.exp(lp_epsilon))
        if upper - best_bound <= 0.5 * tolerance * abs(upper) or not pricing.t.size:
            break
        vertex.add(pricing.t[:COLUMNS_PER_ROUND], pricing.high[:COLUMNS_PER_ROUND])
    return vertex, weights, upper, best_bound


def _refine(vertex: _VertexLP, weights, upper: float, y, prior, tolerance: float):
    """(sorted distinct output values, labels × outputs matrix) of the vertex, refined in float64.

    HiGHS is feasible to ~1e-10, and the exact repair of a concentrated row (large ε) amplifies that residual by
    1 / Var. In (w, u = w t) the rows are linear and split: S w = 1 and S u = y, each with more columns than labels,
    so float64 refinement (min-norm corrections; the output values move by ~1e-10) removes the residual. It is
    tried first without the dust columns (weight < 1e-6 of the largest: the vertex usually needs them only to
    absorb the tolerance of the interior point's output values); that is kept only if it costs < 0.1 tolerance (a
    label with a tiny prior can need a light column)."""
    for used in (np.flatnonzero(weights >= 1e-6 * weights.max()), np.flatnonzero(weights > 0)):
        vectors = np.asarray(vertex.vectors)[used]  # (n, k)
        w, u = weights[used], weights[used] * np.asarray(vertex.outputs)[used]
        for _ in range(2):
            w = w + np.linalg.lstsq(vectors.T, 1.0 - vectors.T @ w, rcond=None)[0]
            u = u + np.linalg.lstsq(vectors.T, y - vectors.T @ u, rcond=None)[0]
        exact = max(np.abs(vectors.T @ w - 1.0).max(), np.abs(vectors.T @ u - y).max()) < 1e-13
        if np.all(w > 0) and exact:
            t = u / w
            loss = float(w @ _column_costs(vectors, t, y, prior))
            if loss <= upper + 0.1 * tolerance * abs(upper):
                break
    else:  # refinement would leave the simplex or cost too much: keep HiGHS's weights and output values
        w, u = weights[used], weights[used] * np.asarray(vertex.outputs)[used]
    ts = u / w
    matrix = (vectors * w[:, None]).T
    order = np.argsort(ts, kind="stable")
    ts, matrix = ts[order], matrix[:, order]
    outputs, first = np.unique(ts, return_index=True)  # equal output values: one output
    return outputs, np.add.reduceat(matrix, first, axis=1)


def solve_continuous_optimal_unbiased(values, prior, epsilon: float, *, tolerance: float = 5e-7,
                                 max_rounds: int = 30, deadline: Deadline = NO_DEADLINE) -> ExactSolution:
    """The optimal unbiased randomizer over output values in ℝ, certified to a relative gap ``tolerance``."""
    started = time.perf_counter()
    epsilon = float(epsilon)  # checked once, by labels_party.registry
    if epsilon < MIN_EPSILON:
        raise LabelDPError(f"the continuous optimal unbiased solver certifies epsilon >= {MIN_EPSILON:g} (below, its "
                           f"cone programs lose accuracy); got {epsilon:g}: use a mesh, dbrr or laplace",
                           code="epsilon_out_of_range")
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
    # The vertex is computed at ε_lp = ε(1 − margin) so that the exact repair fits; if the repair of a badly
    # conditioned vertex does not fit, the margin grows (and the certified gap says what that cost).
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
