"""One entry point from (mechanism name, label domain, ε, prior) to a certified mechanism object.

Used by the CLI and, later, the service. Names are the wire/CLI names. Mechanisms that need a prior get one
that is either known (public) or a DP estimate (see :mod:`labels_party.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labels_party.solvers.classification import rr_with_prior
from labels_party.solvers.deadline import NO_DEADLINE, Deadline
from labels_party.solvers.exact_unbiased import solve_exact_optimal_unbiased
from labels_party.solvers.opt_unbiased import solve_optimal_unbiased
from labels_party.solvers.rr_on_bins import solve_rr_on_bins
from shared.domains import Classes, ContinuousInterval, FiniteLabels, lattice_of
from shared.errors import LabelDPError
from shared.mechanisms import additive
from shared.mechanisms.randomized_response import debiased_randomized_response, randomized_response
from shared.mechanisms.rounded import RoundedRandomizer
from shared.mechanisms.subset import SubsetSelectionRandomizer
from shared.privacy import check_epsilon
from shared.schemas import CLASSIFICATION_MECHANISMS, REGRESSION_MECHANISMS

REGRESSION = REGRESSION_MECHANISMS
CLASSIFICATION = CLASSIFICATION_MECHANISMS
NEEDS_PRIOR = ("opt-unbiased", "rr-on-bins", "rr-with-prior")
ADDITIVE = ("laplace", "staircase")
MECHANISMS = tuple(dict.fromkeys(REGRESSION + CLASSIFICATION))


@dataclass(frozen=True)
class MechanismOptions:
    """Knobs beyond ε. ``clip``: clip additive noise to the label range (biased). Additive noise is always integer
    noise on the domain's lattice (see :func:`shared.domains.lattice_of`)."""

    mesh: int | None = None
    clip: bool = False
    exact: bool = False  # opt-unbiased over continuous outputs (cone program + HiGHS vertex, certified gap)
    deadline: Deadline = NO_DEADLINE  # solvers past it raise SolverTimeout (503, nothing charged)


# The largest label domains (|Y|, or grid points of a continuous domain) each solver family handles within the
# default 60 s solver limit on the reference machine (2 cores; docs/design/exact-ledger.md has the measurements:
# exact solver 800 labels in 23 s and 630 MB; RR-on-Bins, O(|Y|³), 1000 labels in 4.5 s and 2000 in 50-110 s;
# the mesh LP 100 labels x 200 outputs in 8 s but 200 x 400 in 81 s). Larger domains are refused up front (400
# domain_too_large) with the alternative; the solver time limit (503) is the backstop for slower priors.
MAX_LABELS = {"opt-unbiased": 800, "rr-on-bins": 1500, "rr-with-prior": 2000, "subset": 256}
MAX_MESH_CELLS = 40_000  # labels x outputs of the mesh LP


def _check_size(name: str, size: int, options: MechanismOptions) -> None:
    limit = MAX_LABELS.get(name)
    if limit is not None and size > limit:
        alternative = ("classes: use rr" if name in ("rr-with-prior", "subset") else
                       "declare a continuous domain with a grid_size at most that, or use laplace, staircase, dbrr")
        raise LabelDPError(f"{name} handles at most {limit} labels within this service's solver limit; this domain "
                           f"has {size}: {alternative}", code="domain_too_large")
    if name == "opt-unbiased" and not options.exact:
        cells = size * (options.mesh or 2 * size)
        if cells > MAX_MESH_CELLS:
            raise LabelDPError(f"the mesh LP handles at most {MAX_MESH_CELLS} labels x outputs; this request needs "
                               f"{cells}: use the exact solver (\"exact\": true, up to {MAX_LABELS[name]} labels) "
                               "or a smaller mesh", code="domain_too_large")


def needs_prior(name: str) -> bool:
    return name in NEEDS_PRIOR


def support(domain) -> FiniteLabels:
    """The finite labels a mechanism's matrix is indexed by (the grid for continuous domains)."""
    if isinstance(domain, ContinuousInterval):
        return domain.grid
    if isinstance(domain, Classes):
        return FiniteLabels(np.arange(domain.num_classes, dtype=np.float64))
    return domain


def build_mechanism(name: str, domain, epsilon: float, prior=None, options: MechanismOptions | None = None):
    options = options or MechanismOptions()
    epsilon = check_epsilon(epsilon)
    kind = "classification" if isinstance(domain, Classes) else "regression"
    allowed = CLASSIFICATION if kind == "classification" else REGRESSION
    if name not in MECHANISMS:
        raise LabelDPError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISMS)}",
                           code="unknown_mechanism")
    if name not in allowed:
        raise LabelDPError(f"mechanism {name!r} does not fit {kind} labels; use one of {', '.join(allowed)}",
                           code="mechanism_domain_mismatch")
    labels = support(domain)
    _check_size(name, labels.size, options)
    if needs_prior(name) and prior is None:
        raise LabelDPError(f"mechanism {name!r} needs a label prior", code="prior_required")
    if (options.mesh is not None or options.exact) and name != "opt-unbiased":
        raise LabelDPError("mesh and exact only apply to opt-unbiased", code="invalid_mesh")
    if options.mesh is not None and options.exact:
        raise LabelDPError("choose either a mesh or exact, not both", code="invalid_mesh")

    if name in ADDITIVE:
        build = additive.laplace if name == "laplace" else additive.staircase
        return build(lattice_of(domain), epsilon, clip=options.clip, input_values=labels.values)
    if options.clip:
        raise LabelDPError("clip only applies to laplace and staircase", code="invalid_option")

    if name == "subset":
        return SubsetSelectionRandomizer.build(domain.num_classes, epsilon)
    if name == "rr":
        finite = randomized_response(labels.values, epsilon)
    elif name == "rr-with-prior":
        finite = rr_with_prior(prior, epsilon)
    elif name == "dbrr":
        finite = debiased_randomized_response(labels.values, epsilon)
    elif name == "rr-on-bins":
        finite = solve_rr_on_bins(labels.values, prior, epsilon, deadline=options.deadline)
    elif options.exact:
        finite = solve_exact_optimal_unbiased(labels.values, prior, epsilon, deadline=options.deadline).mechanism
    else:
        finite = solve_optimal_unbiased(labels.values, prior, epsilon, mesh=options.mesh, deadline=options.deadline)
    return RoundedRandomizer(domain, finite) if isinstance(domain, ContinuousInterval) else finite
