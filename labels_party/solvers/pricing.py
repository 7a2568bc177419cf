"""Exact pricing of the optimal unbiased LP over all high sets and all output values, and the lower bound it
certifies (the continuous solver's certificate).

With duals (α_y, β_y) of the normalization and unbiasedness rows, a column (t, S) has reduced cost
rc(t, S) = Σ_y s_y c_y(t), c_y(t) = ½ p_y (t − y)² − α_y − β_y t, s_y = e^ε on S and 1 elsewhere. For fixed t the
best S is {y : c_y(t) < 0}, so min over S and t ∈ ℝ is the minimum of the piecewise quadratic

    rc*(t) = Σ_y c_y(t) + (e − 1) Σ_y min(c_y(t), 0),

whose pieces are cut by the roots of the c_y. :func:`price` sweeps the sorted roots once: each root moves one
label in or out of the negative set, so the quadratic's coefficients on every piece are prefix sums of ±(e − 1)
times that label's coefficients, and each piece's minimum is closed form — O(|Y| log |Y|) per pricing, where
evaluating every label on every piece was O(|Y|²) time and memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sparse
import scipy.sparse.linalg as sparse_linalg

from labels_party.solvers.staircase import Problem, runs


@dataclass(frozen=True)
class Pricing:
    best: float  # min over all t ∈ ℝ and all high sets of the reduced cost (may be ≥ 0)
    best_mass: float  # Σ_y s_y p_y of the minimizing column (its derivative along the prior)
    best_size: int  # |S| of the minimizing column
    t: np.ndarray  # output values of candidate columns with negative reduced cost, most negative first
    reduced_cost: np.ndarray
    sets: np.ndarray  # (candidates, |Y|) bool: each candidate's high set

    def intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t, first, last) of the candidates' high sets as intervals: the runs of each (a set that is not an
        interval only arises from inexact duals)."""
        piece, first, last = runs(self.sets)
        return self.t[piece], first, last


def _roots(a, b, d):
    """Where each c_y(t) = a t² + b t + d is negative: (enter, leave) with ±inf for unbounded ends, NaN where
    never. Roots are cancellation-free (q / a and d / q with q = −(b + sign(b) √disc) / 2): the textbook formula
    loses the small root of a label with a tiny prior, and a missed breakpoint would invalidate the bound."""
    k = a.size
    enter, leave = np.full(k, np.nan), np.full(k, np.nan)
    quadratic = a > 0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        disc = b * b - 4 * a * d
        two = quadratic & (disc > 0)
        sq = np.sqrt(np.where(two, disc, 0.0))
        q = -0.5 * (b + np.where(b >= 0, sq, -sq))
        r1, r2 = q / a, d / q
        enter[two], leave[two] = np.minimum(r1, r2)[two], np.maximum(r1, r2)[two]
        linear = ~quadratic
        root = -d / b
    rising, falling = linear & (b > 0), linear & (b < 0)  # b t + d < 0 below / above the root
    enter[rising], leave[rising] = -np.inf, root[rising]
    enter[falling], leave[falling] = root[falling], np.inf
    always = linear & (b == 0) & (d < 0)
    enter[always], leave[always] = -np.inf, np.inf
    # A root that overflows (a prior ~1e-300) comes out as ±inf: that end is then unbounded, as it should be.
    return enter, leave


def price(problem: Problem, alpha, beta, e: float, candidates: int = 64) -> Pricing:
    """Exact min over t ∈ ℝ and S of rc(t, S) at e (= e^ε), by one sweep over the sorted roots."""
    y, p = problem.y, problem.p
    a, b, d = 0.5 * p, -p * y - beta, 0.5 * p * y * y - alpha
    enter, leave = _roots(a, b, d)
    lift = e - 1.0
    starts_negative = enter == -np.inf
    has_enter = np.isfinite(enter)
    has_leave = np.isfinite(leave) & ~np.isnan(enter)
    times = np.concatenate([enter[has_enter], leave[has_leave]])
    labels = np.concatenate([np.flatnonzero(has_enter), np.flatnonzero(has_leave)])
    signs = np.concatenate([np.ones(int(has_enter.sum())), -np.ones(int(has_leave.sum()))])
    order = np.argsort(times, kind="stable")
    times, labels, signs = times[order], labels[order], signs[order]
    initial = np.array([a.sum(), b.sum(), d.sum()]) + lift * np.array(
        [a[starts_negative].sum(), b[starts_negative].sum(), d[starts_negative].sum()])
    steps = lift * signs[:, None] * np.stack([a[labels], b[labels], d[labels]], axis=1)
    coefficients = np.vstack([initial, initial + np.cumsum(steps, axis=0)])  # (pieces, 3): qa, qb, qd
    sizes = int(starts_negative.sum()) + np.concatenate([[0], np.cumsum(signs)]).astype(np.int64)
    lows = np.concatenate([[-np.inf], times])
    highs = np.concatenate([times, [np.inf]])
    qa, qb, qd = coefficients.T
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        t = np.clip(-qb / (2 * qa), lows, highs)
        rc = qa * t * t + qb * t + qd
    rc = np.where(np.isfinite(rc), rc, np.inf)  # far-out pieces: the positive quadratic term dominates
    best = int(np.argmin(rc))
    negative = np.flatnonzero(rc < 0)
    chosen = negative[np.argsort(rc[negative], kind="stable")][:candidates]
    sets = _high_sets(chosen, labels, signs, starts_negative, problem.k)
    return Pricing(float(rc[best]), float(2 * qa[best]), int(sizes[best]), t[chosen], rc[chosen], sets)


def _high_sets(pieces, labels, signs, starts_negative, k) -> np.ndarray:
    """The negative set of each chosen piece."""
    # Piece i lies after the first i events: a label is negative there iff it entered before and left after.
    never = np.iinfo(np.int64).max
    enter_at = np.where(starts_negative, -1, never)
    leave_at = np.full(k, never)
    position = np.arange(labels.size)
    enter_at[labels[signs > 0]] = position[signs > 0]
    leave_at[labels[signs < 0]] = position[signs < 0]
    return (enter_at[None, :] < pieces[:, None]) & (pieces[:, None] <= leave_at[None, :])


def lower_bound(problem: Problem, alpha, beta) -> float:
    """A certified lower bound on the optimal loss from *any* duals (α, β), at the problem's ε.

    Lagrangian bound: for every feasible w, loss = Σ(α + β·y) + Σ_S w_S rc_S, and Σ_S w_S ≤ 1 (each normalization
    row has s_y ≥ 1), so Σ(α + β·y) + min(0, min rc) is a bound (the plain one). Better: shifting the duals to
    (α − d, β) with d ≥ 0 raises every rc(t, S) by Σ_y s_y d_y and costs Σ d, so once no reduced cost is negative,
    Σ(α + β·y) − Σ d is a bound. Two shifts are tried and the best bound kept:

    * along the prior, d = δ p: the raise is δ A_S, which matters at large ε, where interior-point duals violate
      the constraints of columns with A_S ~ e^ε;
    * uniform, d = δ/|Y|: the raise is δ (|Y| + (e − 1)|S|) / |Y|.

    For a direction, the smallest δ is the root of the concave increasing f(δ) = min rc after the shift; Newton's
    method from δ = 0 approaches it from below (the tangent of a concave function lies above it), and the bound
    uses the first δ at which exact pricing finds nothing negative.
    """
    objective = float(alpha.sum() + beta @ problem.y)
    first = price(problem, alpha, beta, problem.e, candidates=0)
    if first.best >= 0:
        return objective
    best = objective + first.best
    uniform = np.full(problem.k, 1.0 / problem.k)
    prior_slope = (problem.p, lambda pr: pr.best_mass)
    uniform_slope = (uniform, lambda pr: (problem.k + (problem.e - 1.0) * pr.best_size) / problem.k)
    for direction, slope in (prior_slope, uniform_slope):
        delta = _feasible_shift(problem, alpha, beta, direction, slope, first)
        best = max(best, objective - delta * float(direction.sum()))
    return best


def _feasible_shift(problem, alpha, beta, direction, slope, start: Pricing) -> float:
    """The smallest δ found (Newton, then a verified step past it) with min rc(α − δ d, β) ≥ 0."""
    # Every s_y ≥ 1, so this δ always works: the raise δ Σ s d ≥ δ Σ d covers the worst violation.
    safe = -start.best / float(direction.sum())
    delta, pricing = 0.0, start
    for _ in range(30):
        step = -pricing.best / slope(pricing)
        delta = min(delta + step, safe)
        trial = delta * (1 + 1e-9) + 1e-300
        pricing = price(problem, alpha - trial * direction, beta, problem.e, candidates=0)
        if pricing.best >= 0:
            return trial
        if step <= 1e-12 * delta:
            break
    return safe


def polish_duals(problem: Problem, first, last, alpha, beta, steps: int = 3):
    """Newton's method on the dual optimality conditions of a set of active signatures: for each, min over t of
    rc(t, S) = D_S − s·α − (P_S + s·β)² / (2 A_S) must be zero. Interior-point duals are accurate only to ~10⁻⁸ of
    the scaled cones (Clarabel ends "almost solved" at large ε), and the certificate pays that on every active
    column; making the active constraints tight removes it. There are fewer conditions than duals, so each step is
    the least-norm one (the augmented system [μI Jᵀ; J −μI], a sparse LU; μ at rounding level). The unknowns are
    the prefix sums of α and β, where each row has at most six nonzeros. The rows must be the active set — a
    condition forced on an inactive signature moves the duals away — so callers pass a path of active
    intervals (:func:`.staircase.heaviest_path`)."""
    a_s, p_s, d_s = problem.moments(first, last)
    rows = problem.signature_rows(first, last)
    k = problem.k
    x, b = np.cumsum(alpha), np.cumsum(beta)
    for _ in range(steps):
        t = (p_s + rows @ b) / a_s
        residual = d_s - rows @ x - 0.5 * a_s * t * t
        jacobian = sparse.hstack([-rows, -sparse.diags(t) @ rows]).tocsc()
        m, n = jacobian.shape
        mu = 1e-13
        system = sparse.bmat([[mu * sparse.identity(n), jacobian.T], [jacobian, -mu * sparse.identity(m)]]).tocsc()
        try:
            step = sparse_linalg.splu(system).solve(np.concatenate([np.zeros(n), -residual]))[:n]
        except RuntimeError:  # singular: the rows were not an active set
            break
        if not np.all(np.isfinite(step)):
            break
        x, b = x + step[:k], b + step[k:]
    return np.diff(x, prepend=0.0), np.diff(b, prepend=0.0)
