"""Exact pricing of the optimal unbiased LP over interval high sets and all output values, and the lower bound it
certifies (the continuous solver's certificate).

With duals (α_y, β_y) of the normalization and unbiasedness rows, a column (t, S) has reduced cost
rc(t, S) = Σ_y s_y c_y(t), c_y(t) = ½ p_y (t − y)² − α_y − β_y t, s_y = e^ε on S and 1 elsewhere.

Only intervals S need pricing. Claim 11 of the optimal-unbiased paper turns any ε-DP unbiased randomizer into one
whose columns are staircases over intervals of the sorted labels (L*U⁺L*) without increasing the loss, so the
optimum over all randomizers equals the optimum of the LP over columns (t ∈ ℝ, interval S), and a lower bound on
that LP bounds every randomizer. (Pricing every subset instead, as an earlier version did, charges the
certificate for constraints no optimum needs: interior-point duals constrained on intervals left a far label
with a tiny prior free to join a prefix, and the all-sets bound was 1.8·10⁻³ below the optimum at |Y| = 4136.)

For an interval S the reduced cost is a quadratic in t, minimized in closed form,

    min_t rc(t, S) = D_S − s·α − (P_S + s·β)² / (2 A_S)    at t = (P_S + s·β) / A_S,

with A_S = Σ s p, P_S = Σ s p y, D_S = ½ Σ s p y² and s·x = Σ x + (e − 1) Σ_S x all differences of prefix sums:
:func:`price` evaluates every one of the |Y|(|Y| + 1)/2 intervals exactly, a block of first labels at a time
(O(|Y|²) time, O(|Y|) memory; 12.5 million intervals in ~0.3 s at |Y| = 5000).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sparse
import scipy.sparse.linalg as sparse_linalg

from labels_party.core.solvers.staircase import Problem

BLOCK = 64  # first labels per vectorized block of intervals


@dataclass(frozen=True)
class Pricing:
    best: float  # min over all intervals and t ∈ ℝ of the reduced cost (may be ≥ 0)
    per_mass: float  # max over intervals of −min_t rc / A_S: the shift along the prior that fixes every one
    per_size: float  # max over intervals of −min_t rc · |Y| / (|Y| + (e − 1)|S|): the uniform shift that does
    first: np.ndarray  # the most negative intervals (up to ``candidates``), most negative first ...
    last: np.ndarray
    t: np.ndarray  # ... the output value where each attains its minimum ...
    reduced_cost: np.ndarray  # ... and that minimum


def price(problem: Problem, alpha, beta, e: float | None = None, candidates: int = 64) -> Pricing:
    """Exact min over t ∈ ℝ of rc(t, S) for every interval S, at e = e^ε (the problem's unless given)."""
    e = problem.e if e is None else e
    k, lift = problem.k, e - 1.0
    zero = np.zeros(1)
    c0, c1, c2 = (np.concatenate([zero, np.cumsum(problem.p * problem.y**j)]) for j in range(3))
    xa, xb = np.concatenate([zero, np.cumsum(alpha)]), np.concatenate([zero, np.cumsum(beta)])
    best, per_mass, per_size = np.inf, 0.0, 0.0
    kept = [np.zeros((0, 4))]
    ends = np.arange(k)
    for a0 in range(0, k, BLOCK):
        starts = np.arange(a0, min(a0 + BLOCK, k))[:, None]
        b = ends[a0:][None, :]
        inside = b >= starts
        hi, lo = b + 1, starts
        mass = c0[-1] + lift * (c0[hi] - c0[lo])
        first_moment = c1[-1] + lift * (c1[hi] - c1[lo]) + xb[-1] + lift * (xb[hi] - xb[lo])
        value = (0.5 * (c2[-1] + lift * (c2[hi] - c2[lo])) - xa[-1] - lift * (xa[hi] - xa[lo])
                 - 0.5 * first_moment**2 / mass)
        value = np.where(inside, value, np.inf)
        best = min(best, float(value.min()))
        violated = inside & (value < 0)
        if violated.any():
            size = b - starts + 1
            per_mass = max(per_mass, float((-value[violated] / mass[violated]).max()))
            per_size = max(per_size, float((-value * k / (k + lift * size))[violated].max()))
            if candidates:
                rows, cols = np.nonzero(violated)
                order = np.argsort(value[rows, cols], kind="stable")[:candidates]
                rows, cols = rows[order], cols[order]
                kept.append(np.stack([starts[rows, 0], b[0, cols], first_moment[rows, cols] / mass[rows, cols],
                                      value[rows, cols]], axis=1))
    found = np.concatenate(kept)
    found = found[np.argsort(found[:, 3], kind="stable")[:candidates]]
    return Pricing(best, per_mass, per_size, found[:, 0].astype(np.int64), found[:, 1].astype(np.int64),
                   found[:, 2], found[:, 3])


def lower_bound(problem: Problem, alpha, beta) -> float:
    """A certified lower bound on the optimal loss from *any* duals (α, β), at the problem's ε.

    Lagrangian bound: for every feasible w over interval columns, loss = Σ(α + β·y) + Σ_S w_S rc_S, and
    Σ_S w_S ≤ 1 (each normalization row has s_y ≥ 1), so Σ(α + β·y) + min(0, min rc) is a bound (the plain one).
    Better: shifting the duals to (α − d, β) with d ≥ 0 raises every rc(t, S) by Σ_y s_y d_y — the same at every t
    — and costs Σ d, so the smallest shift along a direction that makes every interval's minimum nonnegative is
    closed form, and Σ(α + β·y) − Σ d is then a bound. Along the prior (d = δ p) the raise is δ A_S, which matters
    at large ε, where interior-point duals violate the constraints of columns with A_S ~ e^ε; uniformly
    (d = δ/|Y|) it is δ (|Y| + (e − 1)|S|)/|Y|. The best of the three bounds is returned.
    """
    objective = float(alpha.sum() + beta @ problem.y)
    pricing = price(problem, alpha, beta, candidates=0)
    if pricing.best >= 0:
        return objective
    # The shifts are computed in floating point: a hair more (1e-12 relative) keeps them on the safe side.
    shift = 1.0 + 1e-12
    return max(objective + pricing.best, objective - shift * pricing.per_mass * float(problem.p.sum()),
               objective - shift * pricing.per_size)


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
