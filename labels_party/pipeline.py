"""Algorithm 3 (LabelRandomizer) generalized to every mechanism: split ε, estimate the prior privately where the
mechanism needs one, build and certify the mechanism at ε₂, and privatize the labels.

Privacy: the noisy prior is ε₁-DP and the per-label randomizer is ε₂-DP given it, so the message (prior,
mechanism description, noisy labels) is (ε₁ + ε₂)-label-DP by basic composition. Mechanisms without a prior get
all of ε.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labels_party.mechanisms import ADDITIVE, MechanismOptions, build_mechanism, needs_prior, support
from labels_party.prior import NoisyPrior, estimate_prior
from shared.domains import ContinuousInterval
from shared.errors import LabelDPError
from shared.mechanisms.rounded import RoundedRandomizer
from shared.privacy import BudgetSplit, check_epsilon, split_budget


@dataclass(frozen=True, eq=False)
class Privatization:
    mechanism: object
    split: BudgetSplit
    prior: NoisyPrior | None
    noisy_labels: np.ndarray

    @property
    def certified_epsilon(self) -> float:
        """ε₁ (Laplace prior, exact by its scale) + the mechanism's certified ε₂."""
        return (self.prior.epsilon if self.prior else 0.0) + self.mechanism.certified_epsilon


def os_entropy_rng() -> np.random.Generator:
    """A generator seeded from the operating system's entropy pool: the only source for real releases."""
    return np.random.default_rng(np.random.SeedSequence())


def privatize_labels(domain, labels, mechanism: str, epsilon: float, rng: np.random.Generator, *,
                     prior_epsilon: float | None = None, discrete_prior: bool = False,
                     options: MechanismOptions | None = None) -> Privatization:
    epsilon = check_epsilon(epsilon)
    labels = np.asarray(labels, dtype=np.float64).ravel()
    if labels.size == 0:
        raise LabelDPError("no labels to privatize", code="empty_labels")
    finite = support(domain)
    if isinstance(domain, ContinuousInterval):
        labels = domain.check(labels)
        if mechanism not in ADDITIVE:
            # Round once; the prior histogram and the finite mechanism both see the same rounded labels.
            labels = finite.values[domain.round_to_grid(labels, rng)]
    else:
        domain.index_of(labels)  # every label must belong to the declared domain
    if needs_prior(mechanism):
        split = split_budget(epsilon, finite.size, labels.size, prior_epsilon)
        histogram = np.bincount(finite.index_of(labels), minlength=finite.size)
        prior = estimate_prior(histogram, split.prior_epsilon, rng, discrete=discrete_prior)
    else:
        if prior_epsilon is not None:
            raise LabelDPError(f"mechanism {mechanism!r} uses no prior; do not pass a prior epsilon",
                               code="invalid_epsilon")
        split, prior = BudgetSplit(epsilon, 0.0, epsilon, "no prior needed"), None
    built = build_mechanism(mechanism, domain, split.randomizer_epsilon, prior.weights if prior else None,
                            options)
    sampler = built.inner if isinstance(built, RoundedRandomizer) else built  # labels already on the grid
    return Privatization(built, split, prior, sampler.sample(labels, rng))
