"""Algorithm 3 (LabelRandomizer) generalized to every mechanism: split ε, estimate the prior privately where the
mechanism needs one, build and certify the mechanism at ε₂, and privatize the labels.

Privacy: the noisy prior is ε₁-DP and the per-label randomizer is ε₂-DP given it, so the message (prior,
mechanism description, noisy labels) is (ε₁ + ε₂)-label-DP by basic composition. Mechanisms without a prior get
all of ε.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event

from labels_party import registry
from labels_party.prior import NoisyPrior, estimate_prior
from labels_party.registry import MechanismOptions, support
from shared.domains import ContinuousInterval
from shared.errors import LabelDPError
from shared.mechanisms.events import ParallelDpEvent
from shared.mechanisms.rounded import RoundedRandomizer
from shared.privacy import BudgetSplit, split_budget


@dataclass(frozen=True, eq=False)
class Plan:
    """The mechanism built and certified from the labels' histogram (and the noisy prior, if any), before any
    label is sampled: what a release of any size — in process, row group by row group, or on Spark — needs."""

    mechanism: object
    split: BudgetSplit
    prior: NoisyPrior | None
    diagnostics: Mapping[str, float | int | str] = field(default_factory=dict)  # the solver's, see registry

    @property
    def certified_epsilon(self) -> float:
        """The prior's certified ε₁ (exact rational of its discrete Laplace) + the mechanism's certified ε₂."""
        return (self.prior.certified_epsilon if self.prior else 0.0) + self.mechanism.certified_epsilon

    def dp_event(self) -> dp_event.DpEvent:
        """Basic composition on the same labels: the noisy prior, then the randomizer built on it."""
        events = ([self.prior.dp_event()] if self.prior else []) + [self.mechanism.dp_event()]
        return dp_event.ComposedDpEvent(events)

    @property
    def sampler(self):
        """What draws the released values from labels already in the support (on the grid for continuous
        domains: the rounding happened when the histogram was taken)."""
        return self.mechanism.inner if isinstance(self.mechanism, RoundedRandomizer) else self.mechanism


@dataclass(frozen=True, eq=False)
class Privatization(Plan):
    noisy_labels: np.ndarray | None = None


def support_rows(domain, labels: np.ndarray, mechanism: str, rng: np.random.Generator) -> np.ndarray | None:
    """Each label's row of the finite support (randomized rounding for on-grid continuous labels: draw once, and
    let the histogram and the sampler see the same rounded label); None for mechanisms on raw continuous labels."""
    if isinstance(domain, ContinuousInterval):
        labels = domain.check(labels)
        return domain.round_to_grid(labels, rng) if registry.family(mechanism).on_grid else None
    return domain.index_of(labels)  # every label must belong to the declared domain


def plan_privatization(domain, counts: np.ndarray | None, num_labels: int, mechanism: str, epsilon: float,
                       rng: np.random.Generator, *, prior_epsilon: float | None = None,
                       options: MechanismOptions | None = None) -> Plan:
    """Split ε, estimate the prior from the exact support ``counts`` where the mechanism needs one, build and
    certify the mechanism."""
    family = registry.family(mechanism)
    finite = support(domain)
    if family.needs_prior:
        split = split_budget(epsilon, finite.size, num_labels, prior_epsilon)
        prior = estimate_prior(counts, split.prior_epsilon, rng)
    else:
        if prior_epsilon is not None:
            raise LabelDPError(f"mechanism {mechanism!r} uses no prior; do not pass a prior epsilon",
                               code="invalid_epsilon")
        split, prior = BudgetSplit(epsilon, 0.0, epsilon, "no prior needed"), None
    built = registry.build(mechanism, domain, split.randomizer_epsilon, prior.weights if prior else None, options)
    return Plan(built.mechanism, split, prior, built.diagnostics)


def privatize_labels(domain, labels, mechanism: str, epsilon: float, rng: np.random.Generator, *,
                     prior_epsilon: float | None = None,
                     options: MechanismOptions | None = None) -> Privatization:
    """``rng`` is :func:`shared.randomness.secure_rng` for releases; tests and benchmarks pass a seeded one."""
    registry.family(mechanism)  # an unknown mechanism is refused before anything else
    labels = np.asarray(labels, dtype=np.float64).ravel()
    if labels.size == 0:
        raise LabelDPError("no labels to privatize", code="empty_labels")
    finite = support(domain)
    rows = support_rows(domain, labels, mechanism, rng)
    counts = np.bincount(rows, minlength=finite.size) if rows is not None else None
    plan = plan_privatization(domain, counts, labels.size, mechanism, epsilon, rng, prior_epsilon=prior_epsilon,
                              options=options)
    on_support = finite.values[rows] if rows is not None else labels
    return Privatization(plan.mechanism, plan.split, plan.prior, plan.diagnostics,
                         plan.sampler.sample(on_support, rng))


@dataclass(frozen=True, eq=False)
class GroupPrivatization:
    """One private prior and one randomizer per group of examples (groups computed from features only)."""

    groups: list  # group keys, in the order of ``parts``
    parts: list[Privatization]
    noisy_labels: np.ndarray  # aligned with the input labels

    @property
    def certified_epsilon(self) -> float:
        """Groups are disjoint, so every example pays only its own group's ε₁ + ε₂ (parallel composition)."""
        return max(part.certified_epsilon for part in self.parts)

    def dp_event(self) -> ParallelDpEvent:
        return ParallelDpEvent([part.dp_event() for part in self.parts])


def privatize_by_group(domain, labels, groups, mechanism: str, epsilon: float, rng: np.random.Generator, *,
                       prior_epsilon: float, options: MechanismOptions | None = None) -> GroupPrivatization:
    """Per group: a discrete-Laplace histogram at ε_p = ``prior_epsilon`` and the mechanism at ε − ε_p built on
    that group's noisy prior (for regression the optimal unbiased randomizer per group — the extension the
    optimal-unbiased paper leaves open; for classes RRWithPrior per group)."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    groups = np.asarray(groups).ravel()
    if groups.size != labels.size:
        raise LabelDPError("one group per label is needed", code="invalid_request")
    keys, inverse = np.unique(groups, return_inverse=True)
    noisy = np.empty(labels.size)
    parts = []
    for index, _key in enumerate(keys):
        members = np.flatnonzero(inverse == index)
        part = privatize_labels(domain, labels[members], mechanism, epsilon, rng, prior_epsilon=prior_epsilon,
                                options=options)
        noisy[members] = part.noisy_labels
        parts.append(part)
    return GroupPrivatization(list(keys), parts, noisy)
