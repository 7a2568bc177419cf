"""The optimal unbiased randomizer (optimal-unbiased paper, Algorithms 1–3) on a fixed output grid, via HiGHS.

LP (Algorithm 1) with the compact DP constraints: per output i one variable m_i with
m_i <= M[y, i] <= e^ε m_i for all y — exact (a column is ε-DP iff max/min <= e^ε) and 2|Y| rows per output
instead of |Y|² pairwise rows.

The LP solution carries solver tolerance, so it is repaired before it may be sampled (:func:`certify_solution`):
outputs with negligible mass are merged into their neighbours by unbiased randomized rounding, each column is
lifted to exact ε-DP, each row is renormalized and re-centered exactly, and finally the matrix is quantized and
certified by :class:`FiniteRandomizer`. The LP is solved at ε minus a 1e-6 margin so that the repair fits.
"""

from __future__ import annotations

import math

import numpy as np

from labels_party.core.solvers.deadline import NO_DEADLINE, Deadline
from labels_party.core.solvers.highs_lp import solve_lp
from shared.errors import CertificationError, ErrorCode, LabelDPError
from shared.mechanisms import dyadic
from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.privacy import SOLVER_MARGIN, design_epsilon

MAX_LP_VARIABLES = 2_000_000
# The LP solved at 1e-4 and failed (infeasible) at 1e-6 on four priors; the floor keeps a margin.
MIN_EPSILON = 1e-3
MESH_MARGINS = (SOLVER_MARGIN, 1e-5, 1e-4)  # relative margins the LP is solved at, tried in turn


def feasible_output_set(values, epsilon: float, mesh: int) -> np.ndarray:
    """Algorithm 2: ``mesh`` evenly spaced outputs between the extreme outputs of ε-dbRR.

    Proposition 7 guarantees the LP at this same ε is feasible. (Algorithm 3 as printed builds the grid with ε₁;
    feasibility needs the ε the LP uses, ε₂, so callers pass ε₂ — a typo in the paper.)
    """
    values = np.asarray(values, dtype=np.float64)
    if mesh < 2 or int(mesh) != mesh:
        raise LabelDPError(f"mesh must be an integer >= 2, got {mesh!r}", code=ErrorCode.INVALID_MESH)
    e = math.exp(epsilon)
    low = ((e + values.size - 1) * values[0] - values.sum()) / (e - 1)
    high = ((e + values.size - 1) * values[-1] - values.sum()) / (e - 1)
    return np.linspace(low, high, int(mesh))


def _build_lp(values, prior, outputs, epsilon, center=None, scale=None):
    """Columns: M[y, i] (y-major), then m_i. Rows: normalization (k), unbiasedness (k), lower DP (k n), upper
    DP (k n). Unbiasedness and cost are centered/scaled for conditioning (by the grid unless given)."""
    k, n = values.size, outputs.size
    center = 0.5 * (outputs[0] + outputs[-1]) if center is None else center
    scale = max(0.5 * (outputs[-1] - outputs[0]), 1e-12) if scale is None else scale
    z = (outputs - center) / scale
    e = math.exp(epsilon)
    y_idx = np.repeat(np.arange(k), n)
    i_idx = np.tile(np.arange(n), k)
    cell = y_idx * n + i_idx
    # x columns: 4 nonzeros each, in increasing row order.
    x_rows = np.stack([y_idx, k + y_idx, 2 * k + cell, 2 * k + k * n + cell], axis=1)
    x_vals = np.stack([np.ones(k * n), z[i_idx], np.ones(k * n), np.ones(k * n)], axis=1)
    # m columns: rows lower(y, i) for all y, then upper(y, i) for all y.
    ys = np.arange(k)
    m_rows = np.concatenate([2 * k + ys[None, :] * n + np.arange(n)[:, None],
                             2 * k + k * n + ys[None, :] * n + np.arange(n)[:, None]], axis=1)
    m_vals = np.concatenate([np.full((n, k), -1.0), np.full((n, k), -e)], axis=1)
    starts = np.concatenate([np.arange(k * n) * 4, k * n * 4 + np.arange(n + 1) * 2 * k])
    indices = np.concatenate([x_rows.ravel(), m_rows.ravel()])
    coefficients = np.concatenate([x_vals.ravel(), m_vals.ravel()])
    cost = np.concatenate([(prior[:, None] * 0.5 * ((outputs[None, :] - values[:, None]) / scale) ** 2).ravel(),
                           np.zeros(n)])
    num_rows = 2 * k + 2 * k * n
    row_lower = np.concatenate([np.ones(k), (values - center) / scale, np.zeros(k * n), np.full(k * n, -np.inf)])
    row_upper = np.concatenate([np.ones(k), (values - center) / scale, np.full(k * n, np.inf), np.zeros(k * n)])
    assert row_lower.size == num_rows
    num_cols = k * n + n
    return dict(cost=cost, col_lower=np.zeros(num_cols), col_upper=np.full(num_cols, np.inf),
                row_lower=row_lower, row_upper=row_upper, starts=starts, indices=indices, values=coefficients)


def certify_solution(values, outputs, matrix, epsilon: float, lp_epsilon: float, name: str,
                     parameters: dict) -> FiniteRandomizer:
    """Turn an LP solution (with tolerance) into an exactly normalized, unbiased, certified ε-DP randomizer."""
    values = np.asarray(values, dtype=np.float64)
    matrix = np.maximum(np.asarray(matrix, dtype=np.float64), 0.0)
    # 1. Outputs whose column is numerically zero are merged into the nearest kept outputs on either side by
    #    unbiased randomized rounding: preserves row sums and E[M(y)] exactly, and a sum of ε-DP columns is ε-DP.
    column_max = matrix.max(axis=0)
    keep = column_max >= 1e-9
    keep[np.argmax(column_max)] = True
    # Dust beyond the outermost kept outputs has no neighbour to be rounded into, and moving it inwards biases the
    # row by mass × distance (1e-10 × 80 breaks a 1e-8 margin): it is kept whenever quantization can certify it.
    certifiable = column_max * float(dyadic.RESOLUTION) * math.expm1(lp_epsilon / 2) >= 2.0 + math.exp(lp_epsilon)
    outside = (outputs < outputs[keep].min()) | (outputs > outputs[keep].max())
    keep |= certifiable & outside
    kept = np.flatnonzero(keep)
    for i in np.flatnonzero(~keep & (column_max > 0)):
        right = np.searchsorted(outputs[kept], outputs[i])
        if right == 0 or right == kept.size:
            # An extreme dust output has no neighbour beyond it: move its (≤1e-9) mass to the nearest kept output;
            # the small bias this creates is removed exactly in step 3.
            matrix[:, kept[min(right, kept.size - 1)]] += matrix[:, i]
            continue
        a, b = kept[right - 1], kept[right]
        w = (outputs[b] - outputs[i]) / (outputs[b] - outputs[a])
        matrix[:, a] += w * matrix[:, i]
        matrix[:, b] += (1 - w) * matrix[:, i]
    matrix, outputs = matrix[:, keep], outputs[keep]
    # 2. Lift every column to exact ε_lp-DP: entries below max·e^-ε_lp are raised to it (tolerance-sized moves).
    #    Quantization to 2^-53 (:mod:`shared.mechanisms.dyadic`) moves an entry by at most one unit, which for a
    #    column with a small maximum M is a large *relative* move of its smallest entry; such columns are lifted
    #    further, to log(e^ε_lp) − log(1 + (2 + e^ε_lp) / (M 2^53)), so the rounded column stays within the margin.
    column_max = matrix.max(axis=0, keepdims=True)
    rounding = np.log1p((2.0 + math.exp(lp_epsilon)) / (column_max * float(dyadic.RESOLUTION)))
    matrix = np.maximum(matrix, column_max * np.exp(-(lp_epsilon - rounding)))
    # 3. Restore Σ_i M = 1 and Σ_i M ŷ_i = y per row by M[y, i] *= 1 + a_y + b_y z_i (relative moves of the order
    #    of the solver tolerance divided by the row's variance, far inside the ε - ε_lp margin).
    z = (outputs - outputs.mean()) / max(np.ptp(outputs), 1e-12)
    zc = (values - outputs.mean()) / max(np.ptp(outputs), 1e-12)
    s0, s1, s2 = matrix.sum(axis=1), matrix @ z, matrix @ (z * z)
    for _ in range(3):
        # [s0 s1; s1 s2] [a; b] = [1 - s0; zc - s1]
        det = s0 * s2 - s1 * s1
        a = ((1 - s0) * s2 - (zc - s1) * s1) / det
        b = (s0 * (zc - s1) - s1 * (1 - s0)) / det
        matrix = matrix * (1 + a[:, None] + b[:, None] * z[None, :])
        s0, s1, s2 = matrix.sum(axis=1), matrix @ z, matrix @ (z * z)
    if np.any(matrix < 0):
        raise CertificationError(f"{name}: repair of the LP solution produced negative probabilities")
    return FiniteRandomizer.from_probabilities(name, epsilon, values, outputs, matrix,
                                               {**parameters, "lp_epsilon": lp_epsilon})


def solve_optimal_unbiased(values, prior, epsilon: float, *, mesh: int | None = None, outputs=None,
                           solver: str = "choose", deadline: Deadline = NO_DEADLINE) -> FiniteRandomizer:
    """Algorithm 1 on the grid of Algorithm 2 (``mesh`` points, default 2|Y| — the number of outputs Theorem 6
    says suffice) or on explicit ``outputs``."""
    epsilon = float(epsilon)  # valid: checked by labels_party.core.registry
    if epsilon < MIN_EPSILON:
        raise LabelDPError(f"the mesh LP certifies epsilon >= {MIN_EPSILON:g} (below, e^epsilon - 1 drowns in HiGHS's "
                           f"tolerances); got {epsilon:g}: use dbrr or laplace", code=ErrorCode.EPSILON_OUT_OF_RANGE)
    values = np.asarray(values, dtype=np.float64)
    prior = normalized_prior(prior, values.size)
    if values.size == 1:
        return FiniteRandomizer.from_probabilities("opt-unbiased", epsilon, values, values, np.ones((1, 1)),
                                                   {"mesh": 1})
    # The repair of a badly conditioned LP solution (large ε: probabilities near e^-ε) can overshoot a 1e-6 margin
    # (10 labels at ε = 12: 11 of 30 priors by 3e-5 to 1e-4); then the LP is solved again with a wider one.
    for margin in MESH_MARGINS:
        lp_epsilon = design_epsilon(epsilon, margin)
        grid = feasible_output_set(values, lp_epsilon, 2 * values.size if mesh is None else mesh) \
            if outputs is None else np.asarray(outputs, dtype=np.float64)
        if (values.size + 1) * grid.size > MAX_LP_VARIABLES:
            raise LabelDPError(f"LP too large: {values.size} labels x {grid.size} outputs", code=ErrorCode.INVALID_MESH)
        lp = solve_lp(**_build_lp(values, prior, grid, lp_epsilon), solver=solver,
                      time_limit=deadline.solver_seconds())
        matrix = lp.x[: values.size * grid.size].reshape(values.size, grid.size)
        try:
            return certify_solution(values, grid, matrix, epsilon, lp_epsilon, "opt-unbiased",
                                    {"mesh": int(grid.size), "grid_low": float(grid[0]),
                                     "grid_high": float(grid[-1]), "lp_objective": lp.objective})
        except CertificationError:
            if margin == MESH_MARGINS[-1]:
                raise
    raise AssertionError("unreachable")
