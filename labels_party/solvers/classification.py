"""Classification randomizers that need a prior: RRWithPrior ("Deep Learning with Label DP", Algorithm 2)."""

from __future__ import annotations

import math

import numpy as np

from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.mechanisms.randomized_response import rr_top_k
from shared.privacy import check_epsilon, design_epsilon


def best_top_k(prior, epsilon: float) -> tuple[np.ndarray, int]:
    """Classes sorted by prior (descending; ties by smaller class id) and k* = argmax_k e^ε/(e^ε+k-1) Σ_{top k} p
    (the smallest maximizing k — deterministic tie-breaking)."""
    order = np.lexsort((np.arange(prior.size), -prior))
    e = math.exp(epsilon)
    k = np.arange(1, prior.size + 1)
    correct = e / (e + k - 1) * np.cumsum(prior[order])
    return order, int(np.argmax(correct >= correct.max() * (1 - 1e-12))) + 1


def rr_with_prior(prior, epsilon: float) -> FiniteRandomizer:
    """RR-Top-k over the k* most likely classes under the prior: maximizes Pr[output = true label] among all
    ε-DP randomizers (optimality theorem of the paper; checked against an LP in the tests)."""
    epsilon = check_epsilon(epsilon)
    prior = normalized_prior(prior, np.asarray(prior).size)
    order, k = best_top_k(prior, design_epsilon(epsilon))
    return rr_top_k(prior.size, np.sort(order[:k]), epsilon, name="rr-with-prior")
