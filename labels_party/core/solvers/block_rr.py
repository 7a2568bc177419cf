"""BlockRR (Liu & Ding, 2026, arXiv 2602.03277; the authors' code, yuyin132/BlockRR, calls it ``rrwithweight``):
randomized response in two blocks of classes, for imbalanced classes.

The prior p (the labels party's noisy histogram, or a public one) weighs a K x K matrix W = diag(p) V with V = 1 on
the diagonal and e^(-1/σ) elsewhere; the *majority* block S1 holds the classes that are the largest entry of their
own column of W (class j is in it iff p_j > e^(-1/σ) max_{i≠j} p_i: a set of the most likely classes), the *minority*
block S2 the others, and Δ the ``top`` most likely classes (Δ ⊆ S1). With E = e^ε, l1 = |S1|, l2 = |S2|, n = K and
d = |Δ|,

    T = (E + l1 − 1)(E + l2 − 1) − (l1 − d) l2,
    β = ((E − 1) + d l2 / n) / T,     γ = ((E − 1 + d) − d (E + l1 − 1) / n) / T,

and Pr[output j | label y] is, for y in S1: Eβ at j = y, β on the other majority classes, γ on the minority ones;
for y in S2: Eγ at j = y, 1/n on Δ, β on the other majority classes, γ on the other minority ones. β and γ solve
both rows' normalization, so every row sums to 1; every column takes only values among {β, Eβ} (minority column:
{γ, Eγ}; a column of Δ: {β, 1/n, Eβ}, and β ≤ 1/n ≤ Eβ always), so the matrix is ε-DP. σ → 0 puts every class in
S1 (plain RR); S1 the top k* classes with Δ = S1 and no minority output would be RRWithPrior.

The paper leaves σ and |Δ| to the user (a grid per ε); this builds the authors' defaults, σ = 1 and |Δ| = 1, and the
matrix is quantized and certified like every finite randomizer (:class:`~shared.mechanisms.finite.
FiniteRandomizer`), built at :func:`~shared.privacy.design_epsilon` so that the certificate stays within ε.
"""

from __future__ import annotations

import math

import numpy as np

from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.privacy import design_epsilon

SHARPNESS = 1.0  # σ: the off-diagonal weight e^(-1/σ) of W (the authors' default)
TOP = 1  # |Δ|: how many of the most likely classes a minority label's flat 1/K goes to (the authors' default)


def majority_block(prior: np.ndarray, sharpness: float = SHARPNESS) -> np.ndarray:
    """Which classes are their own column's largest entry of W = diag(p) V (a boolean mask over the classes)."""
    if prior.size == 1:
        return np.ones(1, dtype=bool)
    order = np.sort(prior)
    largest, second = order[-1], order[-2]
    others_max = np.where(prior == largest, second, largest)  # max over i ≠ j of p_i
    return prior > math.exp(-1.0 / sharpness) * others_max - 1e-15 * largest


def block_rr_matrix(prior, epsilon: float, sharpness: float = SHARPNESS, top: int = TOP
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the K x K matrix Pr[output j | label i], the majority mask, the Δ mask) at ``epsilon`` exactly."""
    prior = normalized_prior(prior, np.asarray(prior).size)
    n = prior.size
    majority = majority_block(prior, sharpness)
    ranked = np.argsort(-prior, kind="stable")
    delta = np.zeros(n, dtype=bool)
    delta[ranked[:min(top, int(majority.sum()))]] = True
    e = math.exp(epsilon)
    l1, l2, d = int(majority.sum()), int(n - majority.sum()), int(delta.sum())
    t = (e + l1 - 1) * (e + l2 - 1) - (l1 - d) * l2
    beta = ((e - 1) + d * l2 / n) / t
    gamma = ((e - 1 + d) - d * (e + l1 - 1) / n) / t
    matrix = np.where(majority[None, :], beta, gamma) * np.ones((n, 1))
    minority_rows = ~majority
    matrix[np.ix_(minority_rows, delta)] = 1.0 / n
    diagonal = np.where(majority, e * beta, e * gamma)
    matrix[np.arange(n), np.arange(n)] = diagonal
    return matrix, majority, delta


def block_rr(classes, prior, epsilon: float, sharpness: float = SHARPNESS, top: int = TOP) -> FiniteRandomizer:
    """BlockRR on ``classes`` (the domain's class values) under ``prior``, certified at ≤ ``epsilon``."""
    epsilon = float(epsilon)  # valid: checked by labels_party.core.registry
    matrix, majority, delta = block_rr_matrix(prior, design_epsilon(epsilon), sharpness, top)
    values = np.asarray(classes, dtype=np.float64)
    return FiniteRandomizer.from_probabilities("block-rr", epsilon, values, values, matrix, parameters={
        "sharpness": sharpness, "top": top, "majority": [float(v) for v in values[majority]],
        "delta": [float(v) for v in values[delta]]})
