"""Subset-selection randomizer for K classes (Chua et al., "Convex Optimization with Local Label DP", eq. (1)).

Each class k is put in the released set S independently, with probability 1/2 if k is the true label and
1/(e^ε+1) otherwise. Changing the label from y to y' changes only the inclusion probabilities of y and y', so
the worst likelihood ratio is (p (1-q)) / (q (1-p)) with p = 1/2, q = 1/(e^ε+1), which equals e^ε.

The features party trains with the unbiased weights w_k = 2(e^ε+1)/(e^ε-1) · (1[k∈S] - 1/(e^ε+1)):
E[w_k | y] = 1[k = y], so Σ_k w_k ℓ(f(x), k) is an unbiased estimate of ℓ(f(x), y) (Algorithm 1, line 10).

Inclusion uses integer thresholds over 2**53 like the finite randomizers, so ``certified_epsilon`` is computed
from the probabilities actually sampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shared.domains import Classes
from shared.errors import CertificationError
from shared.mechanisms import dyadic
from shared.mechanisms.events import LocalRandomizerDpEvent
from shared.mechanisms.finite import SAMPLING_CHUNK
from shared.privacy import check_epsilon, design_epsilon


@dataclass(frozen=True)
class SubsetSelectionRandomizer:
    name = "subset"
    num_classes: int
    epsilon: float
    design_epsilon: float

    @classmethod
    def build(cls, num_classes: int, epsilon: float) -> SubsetSelectionRandomizer:
        epsilon = check_epsilon(epsilon)
        return cls(int(num_classes), epsilon, design_epsilon(epsilon))

    @classmethod
    def from_description(cls, description: dict) -> SubsetSelectionRandomizer:
        """The randomizer a release describes (its ``describe()``), rebuilt from K and ε; the rebuilt inclusion
        probabilities must be the described ones, so weights computed from it are those of the sampled sets."""
        randomizer = cls.build(description["num_classes"], description["epsilon"])
        if randomizer.inclusion_probabilities != (description["p_true"], description["p_other"]):
            raise CertificationError("subset: the described inclusion probabilities are not the ones of K and ε")
        return randomizer

    def __post_init__(self):
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"subset: realized probabilities are {self.certified_epsilon}-DP")

    @property
    def true_count(self) -> int:
        return dyadic.RESOLUTION // 2

    @property
    def other_count(self) -> int:
        return int(round(dyadic.RESOLUTION / (math.exp(self.design_epsilon) + 1)))

    @property
    def inclusion_probabilities(self) -> tuple[float, float]:
        """(Pr[k ∈ S | k = y], Pr[k ∈ S | k ≠ y]) exactly as sampled."""
        return self.true_count / dyadic.RESOLUTION, self.other_count / dyadic.RESOLUTION

    @property
    def certified_epsilon(self) -> float:
        p, q = self.true_count, self.other_count
        n = dyadic.RESOLUTION
        if self.num_classes < 2:
            return 0.0
        return float(dyadic.log_ratio_upper(p, q) + dyadic.log_ratio_upper(n - q, n - p))  # log(p(n-q) / (q(n-p)))

    @property
    def num_outputs(self) -> int:
        return 2**self.num_classes

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        """Boolean (n, K) membership matrix of the released sets, built ``SAMPLING_CHUNK`` labels at a time (the
        K draws per label are int64: only the booleans grow with n)."""
        labels = Classes(self.num_classes).index_of(labels)
        released = np.empty((labels.size, self.num_classes), dtype=bool)
        for start in range(0, labels.size, SAMPLING_CHUNK):
            part = labels[start:start + SAMPLING_CHUNK]
            draws = rng.integers(0, dyadic.RESOLUTION, size=(part.size, self.num_classes), dtype=np.int64)
            own = draws[np.arange(part.size), part] < self.true_count
            np.less(draws, self.other_count, out=released[start:start + part.size])
            released[start + np.arange(part.size), part] = own
        return released

    def unbiased_weights(self, sets) -> np.ndarray:
        """w_k = (1[k∈S] - q) / (p - q): E[w | y] = one_hot(y) exactly for the sampled p, q.

        With p = 1/2 and q = 1/(e^ε+1) this is the paper's 2(e^ε+1)/(e^ε-1) (1[k∈S] - 1/(e^ε+1)); using the
        realized p, q keeps it exactly unbiased after rounding."""
        p, q = self.inclusion_probabilities
        return (np.asarray(sets, dtype=np.float64) - q) / (p - q)

    def dp_event(self) -> LocalRandomizerDpEvent:
        return LocalRandomizerDpEvent(mechanism=self.name, epsilon=self.certified_epsilon)

    def describe(self) -> dict:
        p, q = self.inclusion_probabilities
        return {"mechanism": self.name, "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon,
                "num_classes": self.num_classes, "p_true": p, "p_other": q}
