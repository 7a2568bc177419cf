"""Algorithm 3 (LabelRandomizer) generalized to every mechanism, in two steps that a release keeps apart:

1. :func:`prepare` — from public inputs only (the domain, the mechanism, ε, the number of labels): split ε, refuse
   whatever the mechanism cannot take, build a mechanism that needs no prior, and state what the privatization
   costs (:meth:`Prepared.dp_event`). A release is charged this event *before* step 2 runs.
2. :func:`plan` / :func:`privatize` — from the labels: estimate the prior privately where the mechanism needs one,
   build and certify the mechanism at ε₂ on it (falling back deterministically when the solve cannot certify,
   :func:`labels_party.core.registry.build_on_private_prior`), and privatize. This step never refuses.

Privacy: the noisy prior is ε₁-DP and the per-label randomizer is ε₂-DP given it, so the message (prior,
mechanism description, noisy labels) is (ε₁ + ε₂)-label-DP by basic composition. Mechanisms without a prior get
all of ε.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event

from labels_party.core import registry
from labels_party.core.prior import NoisyPrior, estimate_prior, noise_event, prior_noise
from labels_party.core.registry import Built, MechanismFamily, MechanismOptions
from labels_party.core.solvers.deadline import Deadline
from shared.domains import Domain
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms.events import LocalRandomizerDpEvent, ParallelDpEvent
from shared.mechanisms.protocol import Mechanism
from shared.mechanisms.rounded import RoundedRandomizer
from shared.privacy import BudgetSplit, split_budget


@dataclass(frozen=True, eq=False)
class Prepared:
    """A privatization decided from public inputs: the mechanism family, the ε split and what it will cost."""

    domain: Domain
    family: MechanismFamily
    split: BudgetSplit
    options: MechanismOptions
    built: Built | None  # the mechanism itself when it needs no prior (it is public)
    allow_uninformative: bool = False  # research use: keep a mechanism whose output does not depend on the label

    @property
    def mechanism(self) -> str:
        return self.family.name

    @property
    def prior_epsilon(self) -> float:
        return self.split.prior_epsilon

    def with_deadline(self, deadline: Deadline) -> Prepared:
        """The same preparation whose solves stop at ``deadline`` (known only when computing starts)."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, deadline=deadline))

    def dp_event(self) -> dp_event.DpEvent:
        """What the privatization is charged: the mechanism's own event when it needs no prior; otherwise the
        prior's exact discrete-Laplace event composed with a local randomizer at ε₂ — an upper bound on the
        randomizer built later on the noisy prior, whose certified ε can only be smaller (it is certified at ε₂)."""
        if self.built is not None:
            return dp_event.ComposedDpEvent([self.built.mechanism.dp_event()])
        return dp_event.ComposedDpEvent([noise_event(prior_noise(self.split.prior_epsilon)),
                                         LocalRandomizerDpEvent(mechanism=self.mechanism,
                                                                epsilon=self.split.randomizer_epsilon)])


# What a plan's description adds to its mechanism's (Plan.describe): a job that rebuilds the mechanism from a stored
# description restates it with these (labels_party.releases.source).
PLAN_FIELDS = ("budget_split_rule", "randomizer_epsilon", "fallback", "fallback_from", "reason")


@dataclass(frozen=True, eq=False)
class Plan:
    """The mechanism built and certified from the labels' histogram (and the noisy prior, if any), before any
    label is sampled: what a release of any size — in process, row group by row group, or on Spark — needs."""

    mechanism: Mechanism
    split: BudgetSplit
    prior: NoisyPrior | None
    diagnostics: Mapping[str, float | int | str | None] = field(default_factory=dict)  # the solver's, see registry

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

    def describe(self) -> dict:
        """The public description a release stores: the mechanism's, how ε was split, and — when the solve on the
        noisy prior could not certify — which fallback was built and why (the fields of :data:`PLAN_FIELDS`)."""
        fallback = {key: self.diagnostics[key] for key in PLAN_FIELDS[2:] if key in self.diagnostics}
        return {**self.mechanism.describe(), "budget_split_rule": self.split.rule,
                "randomizer_epsilon": self.split.randomizer_epsilon, **fallback}


@dataclass(frozen=True, eq=False)
class Privatization(Plan):
    noisy_labels: np.ndarray | None = None


def prepare(domain, mechanism: str, epsilon: float, num_labels: int, *, prior_epsilon: float | None = None,
            options: MechanismOptions | None = None, allow_uninformative: bool = False) -> Prepared:
    """Everything public: refusals (family, label kind, options, |Y| limits, ε split, the solver's ε floor) and,
    for mechanisms without a prior, the mechanism itself.

    Unless ``allow_uninformative``, a mechanism without a prior whose output does not depend on the label is refused
    here, before any charge (400 ``uninformative_release``). What the noisy prior makes uninformative cannot be
    known before it is drawn (and paid for): :func:`plan` builds the family's fallback then
    (:func:`labels_party.core.registry.build_on_private_prior`), RR or dbRR, informative at every ε the library
    certifies (tests/labels_party/api/test_uninformative.py)."""
    options = options or MechanismOptions()
    family = registry.family(mechanism)
    if num_labels <= 0:
        raise LabelDPError("no labels to privatize", code=ErrorCode.EMPTY_LABELS)
    if family.needs_prior:
        split = split_budget(epsilon, domain.support().size, num_labels, prior_epsilon)
        prior_noise(split.prior_epsilon)  # refuses an ε₁ the discrete Laplace cannot calibrate
    else:
        if prior_epsilon is not None:
            raise LabelDPError(f"mechanism {mechanism!r} uses no prior; do not pass a prior epsilon",
                               code=ErrorCode.INVALID_EPSILON)
        split = BudgetSplit(epsilon, 0.0, epsilon, "no prior needed")
    registry.check(mechanism, domain, split.randomizer_epsilon, options)
    built = None if family.needs_prior else registry.build(mechanism, domain, split.randomizer_epsilon, None, options)
    if built is not None and not allow_uninformative:
        registry.refuse_uninformative(built.mechanism, split.randomizer_epsilon, prior_known=False)
    return Prepared(domain, family, split, options, built, allow_uninformative)


def plan(prepared: Prepared, counts: np.ndarray | None, rng: np.random.Generator) -> Plan:
    """Draw the prior from the exact support ``counts`` where the mechanism needs one and build the mechanism on it
    (never refuses: see :func:`labels_party.core.registry.build_on_private_prior`)."""
    if prepared.built is not None:
        return Plan(prepared.built.mechanism, prepared.split, None, prepared.built.diagnostics)
    prior = estimate_prior(counts, prepared.split.prior_epsilon, rng)
    built = registry.build_on_private_prior(prepared.mechanism, prepared.domain, prepared.split.randomizer_epsilon,
                                            prior.weights, prepared.options,
                                            allow_uninformative=prepared.allow_uninformative)
    return Plan(built.mechanism, prepared.split, prior, built.diagnostics)


def support_rows(domain: Domain, labels: np.ndarray, mechanism: str, rng: np.random.Generator) -> np.ndarray | None:
    """Each label's row of the finite support (the domain decides: randomized rounding onto a continuous domain's
    grid); None for mechanisms on raw continuous labels."""
    return domain.rows(labels, rng, on_grid=registry.family(mechanism).on_grid)


def privatize(prepared: Prepared, labels, rng: np.random.Generator) -> Privatization:
    """Plan on ``labels`` and sample them; ``rng`` is :func:`shared.randomness.secure_rng` for releases (tests and
    benchmarks pass a seeded one)."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    finite = prepared.domain.support()
    rows = support_rows(prepared.domain, labels, prepared.mechanism, rng)
    counts = np.bincount(rows, minlength=finite.size) if rows is not None else None
    planned = plan(prepared, counts, rng)
    on_support = finite.values[rows] if rows is not None else labels
    return Privatization(planned.mechanism, planned.split, planned.prior, planned.diagnostics,
                         planned.sampler.sample(on_support, rng))


def privatize_labels(domain, labels, mechanism: str, epsilon: float, rng: np.random.Generator, *,
                     prior_epsilon: float | None = None, options: MechanismOptions | None = None,
                     allow_uninformative: bool = False) -> Privatization:
    """:func:`prepare` and :func:`privatize` in one call (the CLI, tests and benchmarks)."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    return privatize(prepare(domain, mechanism, epsilon, labels.size, prior_epsilon=prior_epsilon, options=options,
                             allow_uninformative=allow_uninformative), labels, rng)


@dataclass(frozen=True, eq=False)
class GroupPrivatization:
    """One private prior and one randomizer per group of examples (groups computed from features only)."""

    groups: list  # group keys, in the order of ``parts``
    sizes: np.ndarray  # examples per group
    parts: list[Privatization]
    noisy_labels: np.ndarray  # aligned with the input labels
    grid: np.ndarray  # the domain's finite support: every group's inputs (and the classes' outputs)

    @property
    def certified_epsilon(self) -> float:
        """Groups are disjoint, so every example pays only its own group's ε₁ + ε₂ (parallel composition)."""
        return max(part.certified_epsilon for part in self.parts)

    def dp_event(self) -> ParallelDpEvent:
        return ParallelDpEvent([part.dp_event() for part in self.parts])

    def describe(self) -> dict:
        """Columnar, each thing once: ``groups`` holds one column per field (name, examples, certified ε, the
        index of its randomizer in ``mechanisms``, its prior's noisy counts); ``mechanisms`` holds each distinct
        randomizer once, without ``input_values`` / ``output_values`` where they are the release's ``grid``;
        ``noisy_prior`` what every group's prior shares (the same ε₁ and noise). A thousand groups on 256 classes
        are ~10⁵ small integers, not a thousand 256 x 256 matrices."""
        grid = self.grid.tolist()
        index: dict[str, int] = {}
        mechanisms: list[dict] = []
        chosen = []
        for part in self.parts:
            description = {k: v for k, v in part.describe().items()
                           if not (k in ("input_values", "output_values") and v == grid)}
            key = json.dumps(description, sort_keys=True)
            if key not in index:
                index[key] = len(mechanisms)
                mechanisms.append(description)
            chosen.append(index[key])
        priors = [part.prior for part in self.parts if part.prior is not None]
        shared = None
        if priors:  # every group's prior has the same ε₁ and noise: only its counts differ
            shared = {k: v for k, v in priors[0].describe().items() if k not in ("weights", "noisy_counts")}
            shared["weights"] = WEIGHTS_RULE
        return {"grid": grid, "mechanisms": mechanisms, "noisy_prior": shared,
                "groups": {"group": [str(key) for key in self.groups], "examples": self.sizes.tolist(),
                           "certified_epsilon": [part.certified_epsilon for part in self.parts],
                           "mechanism": chosen,
                           "noisy_counts": [part.prior.noisy_counts.tolist() for part in self.parts
                                            if part.prior is not None]}}


# A noisy prior's weights are post-processing of its published integer counts (labels_party.core.prior); a group
# release publishes only the counts.
WEIGHTS_RULE = "max(noisy_counts, 0) / their sum; uniform when every count is at most 0"


def prepare_groups(domain, mechanism: str, epsilon: float, *, prior_epsilon: float,
                   options: MechanismOptions | None = None, allow_uninformative: bool = False) -> Prepared:
    """The same public preparation for every group: ε_p for each group's prior is given, so the split does not
    depend on a group's size (which could be 1). Each example pays its own group's ε (parallel composition), so
    the prepared event is what every covered example is charged."""
    return prepare(domain, mechanism, epsilon, 1, prior_epsilon=prior_epsilon, options=options,
                   allow_uninformative=allow_uninformative)


def privatize_by_group(prepared: Prepared, labels, groups, rng: np.random.Generator) -> GroupPrivatization:
    """Per group: a discrete-Laplace histogram at ε_p and the mechanism at ε − ε_p built on that group's noisy
    prior (for regression the optimal unbiased randomizer per group — the extension the optimal-unbiased paper
    leaves open; for classes RRWithPrior per group)."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    groups = np.asarray(groups).ravel()
    if groups.size != labels.size:
        raise LabelDPError("one group per label is needed", code=ErrorCode.INVALID_REQUEST)
    keys, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    noisy = np.empty(labels.size)
    parts = []
    by_group = np.argsort(inverse, kind="stable")
    for members in np.split(by_group, np.cumsum(sizes)[:-1]):  # each group's rows, one pass over all of them
        part = privatize(prepared, labels[members], rng)
        noisy[members] = part.noisy_labels
        parts.append(dataclasses.replace(part, noisy_labels=None))  # the labels live in ``noisy`` only
    return GroupPrivatization(list(keys), sizes, parts, noisy, prepared.domain.support().values)
