"""Classification randomizers that need a prior: RRWithPrior ("Deep Learning with Label DP", Algorithm 2), for one
prior (a finite matrix) or vectorized with one prior per example (multi-stage training, group priors)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shared.errors import CertificationError, ErrorCode, LabelDPError
from shared.mechanisms import dyadic
from shared.mechanisms.events import LocalRandomizerDpEvent
from shared.mechanisms.finite import normalized_prior
from shared.mechanisms.randomized_response import RandomizedResponse, TopKRandomizedResponse, keep_epsilon, rr_top_k
from shared.privacy import check_epsilon, design_epsilon


def top_k_candidates(priors, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """For each row of priors (n, K): the classes sorted by prior (descending; ties by smaller class id) and
    k* = argmax_k e^ε/(e^ε+k-1) Σ_{top k} p, the smallest maximizing k (deterministic tie-breaking)."""
    priors = np.atleast_2d(priors)
    order = np.argsort(-priors, axis=1, kind="stable")
    e = math.exp(epsilon)
    ks = np.arange(1, priors.shape[1] + 1)
    correct = e / (e + ks - 1) * np.cumsum(np.take_along_axis(priors, order, axis=1), axis=1)
    return order, np.argmax(correct >= correct.max(axis=1, keepdims=True) * (1 - 1e-12), axis=1) + 1


def best_top_k(prior, epsilon: float) -> tuple[np.ndarray, int]:
    """:func:`top_k_candidates` for one prior: (its class order, k*)."""
    order, k = top_k_candidates(prior, epsilon)
    return order[0], int(k[0])


def rr_with_prior(prior, epsilon: float) -> TopKRandomizedResponse:
    """RR-Top-k over the k* most likely classes under the prior: maximizes Pr[output = true label] among all
    ε-DP randomizers (optimality theorem of the paper; checked against an LP in the tests)."""
    epsilon = float(epsilon)  # valid: checked by labels_party.core.registry
    prior = normalized_prior(prior, np.asarray(prior).size)
    order, k = best_top_k(prior, design_epsilon(epsilon))
    return rr_top_k(prior.size, np.sort(order[:k]), epsilon, name="rr-with-prior")


@dataclass(frozen=True, eq=False)
class PerExampleRelease:
    """Labels privatized by RRWithPrior with one (label-independent) prior per example."""

    outputs: np.ndarray  # released class per example
    k: np.ndarray  # size of each example's candidate set
    epsilon: float
    certified_epsilon: float  # max over the k's used of the exact log-ratio of the sampled probabilities

    def dp_event(self) -> LocalRandomizerDpEvent:
        return LocalRandomizerDpEvent(mechanism="rr-with-prior", epsilon=self.certified_epsilon)


def keep_counts(num_classes: int, epsilon: float) -> np.ndarray:
    """counts[k] / 2**53 = Pr[report the true label | it is among the k candidates], rounded as RR-Top-k with one
    prior rounds it (:meth:`RandomizedResponse.keep_count`); counts[0] is unused."""
    return np.array([dyadic.RESOLUTION] + [RandomizedResponse.keep_count(k, epsilon)
                                           for k in range(1, num_classes + 1)], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class PerExamplePlan:
    """RRWithPrior for one prior per example, decided from the priors alone (they come from features): each
    example's candidate classes and k, the keep probabilities, and the certified ε of the sampled
    probabilities — all before any label is read."""

    order: np.ndarray  # (n, K): classes by prior, descending
    k: np.ndarray  # (n,)
    counts: np.ndarray  # keep counts over 2**53 per k
    epsilon: float
    certified_epsilon: float

    def dp_event(self) -> LocalRandomizerDpEvent:
        return LocalRandomizerDpEvent(mechanism="rr-with-prior", epsilon=self.certified_epsilon)

    def informative(self) -> tuple[np.ndarray, PerExamplePlan]:
        """Which examples have k ≥ 2 (a mask over the rows) and the plan of those alone. An example with k = 1 gets
        RR-Top-1: its prior's most likely class whatever its label, an output that says nothing about the label
        and that anyone holding the prior computes. The certified ε is unchanged: k = 1 contributes 0 to its max
        (:func:`keep_epsilon` of one output)."""
        mask = self.k >= 2
        return mask, PerExamplePlan(self.order[mask], self.k[mask], self.counts, self.epsilon, self.certified_epsilon)


def plan_per_example(priors, epsilon: float) -> PerExamplePlan:
    epsilon = check_epsilon(epsilon)
    priors = np.asarray(priors, dtype=np.float64)
    if priors.ndim != 2 or not np.all(np.isfinite(priors)) or np.any(priors < 0) or np.any(priors.sum(axis=1) <= 0):
        raise LabelDPError("every prior must be finite, non-negative and not all zero", code=ErrorCode.INVALID_PRIOR)
    priors = priors / priors.sum(axis=1, keepdims=True)
    eps = design_epsilon(epsilon)
    order, k = top_k_candidates(priors, eps)
    counts = keep_counts(priors.shape[1], eps)
    certified = max(keep_epsilon(int(kk), int(counts[kk])) for kk in np.unique(k))
    if certified > epsilon:
        raise CertificationError(f"rr-with-prior: sampled probabilities are {certified}-DP, above {epsilon}")
    return PerExamplePlan(order, k, counts, epsilon, certified)


def sample_per_example(plan: PerExamplePlan, labels, rng: np.random.Generator) -> PerExampleRelease:
    """Vectorized RRWithPrior: each example gets RR-Top-k over the k* most likely classes of *its* prior.

    Each example's randomizer is ε-DP in its own label given its prior, and the priors must not depend on the
    labels (they come from features), so the release is ε-label-DP per example.
    """
    labels = np.asarray(labels, dtype=np.int64)
    order, k = plan.order, plan.k
    n, num_classes = order.shape
    rank = np.argsort(order, axis=1)[np.arange(n), labels]  # position of the true label in its example's order
    in_top = rank < k
    keep = in_top & (rng.integers(0, dyadic.RESOLUTION, size=n, dtype=np.int64) < plan.counts[k])
    # Not kept but a candidate: uniform over the other k − 1 candidates; not a candidate: uniform over all k.
    other = rng.integers(0, np.maximum(k - 1, 1))
    other = np.where(other >= rank, other + 1, other)
    anyone = rng.integers(0, k)
    position = np.where(keep, rank, np.where(in_top, other, anyone))
    outputs = order[np.arange(n), np.minimum(position, num_classes - 1)]
    return PerExampleRelease(outputs, k, plan.epsilon, plan.certified_epsilon)


def rr_with_prior_per_example(priors, labels, epsilon: float, rng: np.random.Generator) -> PerExampleRelease:
    """:func:`plan_per_example` and :func:`sample_per_example` in one call."""
    return sample_per_example(plan_per_example(priors, epsilon), labels, rng)
