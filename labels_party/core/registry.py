"""The mechanism registry: every mechanism family the labels party offers, looked up by its wire name.

A family states the label kinds it accepts, the options that apply to it, whether it needs a (private) prior,
the largest label domain it handles within the service's solver limit, and a builder that returns the certified
mechanism *with* the solver's diagnostics. The service, the CLI and the benchmarks go through :func:`build`;
nothing else dispatches on a mechanism's name.

ε's validity (a positive finite number, the mechanisms' own certification range) is checked at this module's entry
points; the service checks its deployment range before it gets here (``transaction.run``), and the ledger
recomputes the charged ε from the record. Solvers and mechanism constructors below this boundary receive a valid
ε and certify what they build.

Two entry points, for two situations. :func:`build` is for public inputs (the CLI, benchmarks, a known prior): a
solve that cannot certify raises. In a release the prior is a *private* quantity (a noisy histogram), so whether a
solve certifies, fails or times out depends on the labels; there :func:`check` runs first, on public inputs only,
and refuses everything it can (label kind, options, |Y| limits, the solvers' ε floors), and then
:func:`build_on_private_prior` never refuses: a build on the noisy prior that cannot certify in time is replaced
by the family's *fallback* — a mechanism built from public inputs alone (dbRR for regression, RR for classes) —
chosen deterministically, so the outcome is a function of the (published) noisy prior and carries nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

import numpy as np

from labels_party.core.solvers import opt_unbiased_continuous, opt_unbiased_mesh
from labels_party.core.solvers.block_rr import block_rr
from labels_party.core.solvers.deadline import NO_DEADLINE, Deadline, SolverTimeout
from labels_party.core.solvers.opt_unbiased_continuous import solve_continuous_optimal_unbiased
from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased
from labels_party.core.solvers.rp_with_prior import rp_with_prior
from labels_party.core.solvers.rr_on_bins import solve_rr_on_bins
from labels_party.core.solvers.rr_with_prior import rr_with_prior
from shared.arrays import number
from shared.domains import ContinuousInterval, Domain, FiniteLabels, lattice_of
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms import additive
from shared.mechanisms.alibi import AlibiRandomizer
from shared.mechanisms.finite import FiniteRandomizer
from shared.mechanisms.protocol import Mechanism, uninformative_reason
from shared.mechanisms.randomized_response import (
    RandomizedResponse,
    debiased_randomized_response,
    randomized_response,
)
from shared.mechanisms.rounded import RoundedRandomizer
from shared.mechanisms.subset import SubsetSelectionRandomizer
from shared.privacy import check_epsilon
from shared.schemas import MECHANISMS, Solver

REGRESSION = frozenset({"finite", "continuous"})  # an integer range is a finite domain on an integer lattice
CLASSES = frozenset({"classes"})


@dataclass(frozen=True)
class MechanismOptions:
    """Knobs beyond ε; each family says which apply. ``clip``: clip additive noise to the label range (biased;
    additive noise is always integer noise on the domain's lattice, see :func:`shared.domains.lattice_of`).
    ``solver``: opt-unbiased's solver — ``"continuous"`` (outputs anywhere in ℝ: cone programs, certified gap;
    the default) or ``"mesh"`` (an LP over a fixed mesh of outputs; the default when ``mesh``, its number of
    outputs, is given)."""

    mesh: int | None = None
    clip: bool = False
    solver: Solver | None = None
    deadline: Deadline = field(default=NO_DEADLINE, compare=False)  # past it solvers raise SolverTimeout

    @property
    def chosen_solver(self) -> Solver:
        return self.solver or ("mesh" if self.mesh is not None else "continuous")

    def chosen(self) -> set[str]:
        """The options set to something other than their default (the deadline is not an option)."""
        return {f.name for f in fields(self) if f.name != "deadline" and getattr(self, f.name) != f.default}


@dataclass(frozen=True)
class Built:
    """A certified mechanism and what its construction reported (solver gaps, sizes); diagnostics are public
    functions of the public inputs (the domain, ε and the noisy prior)."""

    mechanism: Mechanism
    diagnostics: Mapping[str, float | int | str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class MechanismFamily:
    name: str  # a key of shared.schemas.MECHANISMS, which declares its label kinds and whether it needs a prior
    options: frozenset[str]  # which MechanismOptions apply
    max_labels: int | None  # within the default 60 s solver limit on the reference machine; None: no solve
    beyond_limit: str  # what to use instead when a domain is larger
    builder: Callable[[Domain, FiniteLabels, float, np.ndarray | None, MechanismOptions], Built]
    on_grid: bool = True  # samples from the finite support: continuous labels are rounded to the grid first
    max_mesh_cells: int | None = None  # labels x outputs of a mesh LP (when the family solves one)
    # Built instead of this family when a build on a private prior cannot certify or runs out of time: a family
    # without a prior, on the same label kinds (see build_on_private_prior).
    fallback: str | None = None
    # The smallest ε its solver certifies, by the options (None: every ε the library certifies).
    min_epsilon: Callable[[MechanismOptions], float] | None = None
    # At most how many numbers its description publishes on |Y| labels (by default inputs, outputs and one more
    # vector: RR's bins, RR-Top-k's candidates); a document's size is predicted from it before a release is charged.
    published: Callable[[int, MechanismOptions], int] = lambda labels, _options: 3 * labels
    column_per_class: bool = False  # releases one column per class (a set, a vector), not one label per example

    @property
    def label_kinds(self) -> frozenset[str]:
        kinds = MECHANISMS[self.name]
        return (REGRESSION if kinds.regression else frozenset()) | (CLASSES if kinds.classes else frozenset())

    @property
    def needs_prior(self) -> bool:
        return MECHANISMS[self.name].prior

    def published_numbers(self, labels: int, options: MechanismOptions) -> int:
        """:attr:`published`, or its fallback's when that publishes more (a release may end with either)."""
        own = self.published(labels, options)
        return max(own, FAMILIES[self.fallback].published(labels, options)) if self.fallback else own

    def check(self, domain, options: MechanismOptions, epsilon: float | None = None) -> FiniteLabels:
        """Refuse a domain, options, size or ε this family cannot take (before any solve, on public inputs only);
        the finite support."""
        kind = domain.label_kind
        if kind not in self.label_kinds:
            accepting = ", ".join(f.name for f in FAMILIES.values() if kind in f.label_kinds)
            what = "classification" if kind == "classes" else "regression"
            raise LabelDPError(f"mechanism {self.name!r} does not fit {what} labels; use one of {accepting}",
                               code=ErrorCode.MECHANISM_DOMAIN_MISMATCH)
        for option in sorted(options.chosen() - self.options):
            code = ErrorCode.INVALID_MESH if option in ("mesh", "solver") else ErrorCode.INVALID_OPTION
            users = ", ".join(f.name for f in FAMILIES.values() if option in f.options)
            raise LabelDPError(f"{option} only applies to {users}", code=code)
        if options.mesh is not None and options.chosen_solver != "mesh":
            raise LabelDPError(f"a mesh size only applies to the mesh solver, not {options.solver!r}",
                               code=ErrorCode.INVALID_MESH)
        labels = domain.support()
        if self.max_labels is not None and labels.size > self.max_labels:
            instead = f"use {self.beyond_limit}"
            if kind != "classes":  # a concrete grid: randomized rounding onto it keeps unbiased mechanisms unbiased
                instead = (f"declare it continuous on [{number(labels.low)}, {number(labels.high)}] with "
                           f"\"grid_size\": {self.max_labels}, or {instead}")
            raise LabelDPError(f"{self.name} handles at most {self.max_labels:,} labels within this service's "
                               f"limits; this domain has {labels.size:,}: {instead}", code=ErrorCode.DOMAIN_TOO_LARGE)
        if self.max_mesh_cells is not None and options.chosen_solver == "mesh":
            cells = labels.size * (options.mesh or 2 * labels.size)
            if cells > self.max_mesh_cells:
                raise LabelDPError(f"the mesh LP handles at most {self.max_mesh_cells} labels x outputs; this request "
                                   f"needs {cells}: use the continuous solver (\"solver\": \"continuous\", up to "
                                   f"{self.max_labels} labels) or a smaller mesh", code=ErrorCode.DOMAIN_TOO_LARGE)
        floor = self.min_epsilon(options) if self.min_epsilon is not None else 0.0
        if epsilon is not None and epsilon < floor:
            raise LabelDPError(f"{self.name} ({options.chosen_solver} solver) certifies a randomizer epsilon >= "
                               f"{floor:g}; this request leaves it {epsilon:.6g}: use dbrr or laplace, or a larger "
                               "epsilon", code=ErrorCode.EPSILON_OUT_OF_RANGE)
        return labels


def _on_domain(domain, finite: FiniteRandomizer | RandomizedResponse) -> Mechanism:
    """A finite randomizer over a continuous domain's grid rounds its inputs onto the grid first."""
    return RoundedRandomizer(domain, finite) if isinstance(domain, ContinuousInterval) else finite


def _opt_unbiased(domain, labels, epsilon, prior, options) -> Built:
    if options.chosen_solver == "continuous":
        solution = solve_continuous_optimal_unbiased(labels.values, prior, epsilon, deadline=options.deadline)
        return Built(_on_domain(domain, solution.mechanism), {
            "solver": "continuous", "optimality_gap": solution.optimality_gap, "lower_bound": solution.lower_bound,
            "cone_programs": solution.cone_programs, "solve_seconds": solution.seconds})
    finite = solve_optimal_unbiased(labels.values, prior, epsilon, mesh=options.mesh, deadline=options.deadline)
    return Built(_on_domain(domain, finite), {"solver": "mesh", "mesh": finite.parameters.get("mesh")})


def _additive(build):
    def builder(domain, labels, epsilon, _prior, options) -> Built:
        lattice = lattice_of(domain)
        return Built(build(lattice, epsilon, clip=options.clip, input_values=labels.values),
                     {"lattice_step": lattice.step})
    return builder


def _finite(build):
    def builder(domain, labels, epsilon, prior, options) -> Built:
        return Built(_on_domain(domain, build(labels, epsilon, prior, options)))
    return builder


# The |Y| limits: docs/design/exact-ledger.md has the measurements (continuous solver 800 labels in 23 s and 630 MB;
# RR-on-Bins, O(|Y|²) time and O(|Y|) memory since the hot-paths issue, 50,000 labels in 9 s; the mesh LP 100 labels
# x 200 outputs in 8 s but 200 x 400 in 81 s). Larger domains are refused up front (400 domain_too_large) with the
# alternative; the solver time limit (503) is the backstop for slower priors.
MAX_MESH_CELLS = 40_000  # labels x outputs of the mesh LP
# The continuous solver takes 1000 labels in 0.7-3.5 s (ε = 1-8) and 5000 in ~30 s, but a release's mechanism
# document carries the exact |Y| x outputs counts: 2 million numbers (34 MB of JSON) at 1000 labels.
MAX_CONTINUOUS_LABELS = 1000
_WIDE = "laplace, staircase or dbrr (any size)"

def _opt_unbiased_numbers(labels: int, options: MechanismOptions) -> int:
    """Inputs, outputs (the mesh, or at most 2|Y| from the continuous solver) and their exact counts."""
    outputs = options.mesh or 2 * labels
    return labels * outputs + labels + outputs


def _matrix_numbers(labels: int, _options: MechanismOptions) -> int:
    """Inputs, outputs (at most as many) and the exact counts of a whole matrix (RPWithPrior, BlockRR)."""
    return labels * labels + 2 * labels


def _no_vectors(_labels: int, _options: MechanismOptions) -> int:
    return 0  # a few parameters (additive noise on a lattice, subset selection's two probabilities)


def _opt_unbiased_floor(options: MechanismOptions) -> float:
    return (opt_unbiased_continuous.MIN_EPSILON if options.chosen_solver == "continuous"
            else opt_unbiased_mesh.MIN_EPSILON)


FAMILIES: Mapping[str, MechanismFamily] = MappingProxyType({family.name: family for family in (
    MechanismFamily("opt-unbiased", frozenset({"mesh", "solver"}), MAX_CONTINUOUS_LABELS,
                    "rr-on-bins (up to 50,000 labels), " + _WIDE, _opt_unbiased, max_mesh_cells=MAX_MESH_CELLS,
                    fallback="dbrr", min_epsilon=_opt_unbiased_floor, published=_opt_unbiased_numbers),
    MechanismFamily("rr-on-bins", frozenset(), 50_000, _WIDE, _finite(
        lambda labels, e, prior, options: solve_rr_on_bins(labels.values, prior, e, deadline=options.deadline)),
                    fallback="dbrr"),
    MechanismFamily("laplace", frozenset({"clip"}), None, "", _additive(additive.laplace),
                    on_grid=False, published=_no_vectors),
    MechanismFamily("staircase", frozenset({"clip"}), None, "", _additive(additive.staircase),
                    on_grid=False, published=_no_vectors),
    MechanismFamily("dbrr", frozenset(), None, "", _finite(
        lambda labels, e, _prior, _options: debiased_randomized_response(labels.values, e))),
    MechanismFamily("rr", frozenset(), None, "", _finite(
        lambda labels, e, _prior, _options: randomized_response(labels.values, e))),
    MechanismFamily("rr-with-prior", frozenset(), 2000, "rr", _finite(
        lambda _labels, e, prior, _options: rr_with_prior(prior, e)), fallback="rr"),
    # Published peers (issue 41): RPWithPrior (Liu & Huang, TMLR 2026) and BlockRR (Liu & Ding, 2026), on the
    # noisy prior like RR-on-Bins and RRWithPrior; their documents publish the whole matrix, hence the |Y| limits.
    MechanismFamily("rp-with-prior", frozenset(), MAX_CONTINUOUS_LABELS,
                    "rr-on-bins (up to 50,000 labels), " + _WIDE, _finite(
                        lambda labels, e, prior, _options: rp_with_prior(labels.values, prior, e)),
                    fallback="dbrr", published=_matrix_numbers),
    MechanismFamily("block-rr", frozenset(), 256, "rr-with-prior or rr", _finite(
        lambda labels, e, prior, _options: block_rr(labels.values, prior, e)), fallback="rr",
                    published=_matrix_numbers),
    # ALIBI (Malek et al., NeurIPS 2021): one integer vector of K noisy coordinates per example, trained on its
    # posterior (the trainer's alibi loss); K columns per example, hence the limit.
    MechanismFamily("alibi", frozenset(), 256, "rr", lambda _domain, labels, e, _p, _o:
                    Built(AlibiRandomizer.build(labels.size, e)), published=_no_vectors, column_per_class=True),
    MechanismFamily("subset", frozenset(), 256, "rr", lambda _domain, labels, e, _p, _o:
                    Built(SubsetSelectionRandomizer.build(labels.size, e)), published=_no_vectors,
                    column_per_class=True),
)})


def family(name: str) -> MechanismFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise LabelDPError(f"unknown mechanism {name!r}; choose one of {', '.join(FAMILIES)}",
                           code=ErrorCode.UNKNOWN_MECHANISM) from None


def check(name: str, domain, epsilon: float, options: MechanismOptions | None = None) -> MechanismFamily:
    """Every refusal of building ``name`` on ``domain`` at ``epsilon`` that public inputs decide (the family, label
    kind, options, |Y| limits, ε and the solver's ε floor); after it, :func:`build_on_private_prior` cannot
    refuse."""
    chosen = family(name)
    chosen.check(domain, options or MechanismOptions(), check_epsilon(epsilon))
    return chosen


def build(name: str, domain, epsilon: float, prior=None, options: MechanismOptions | None = None) -> Built:
    """The certified mechanism ``name`` on ``domain`` at ``epsilon`` (with its diagnostics), from public inputs.
    ``prior``: label weights known in public, required by the families that need one. A solve that cannot certify
    raises (:class:`~shared.errors.CertificationError`, a solver error or timeout)."""
    chosen = family(name)
    options = options or MechanismOptions()
    epsilon = check_epsilon(epsilon)
    labels = chosen.check(domain, options, epsilon)
    if chosen.needs_prior and prior is None:
        raise LabelDPError(f"mechanism {name!r} needs a label prior", code=ErrorCode.PRIOR_REQUIRED)
    return chosen.builder(domain, labels, epsilon, prior, options)


def refuse_uninformative(mechanism: Mechanism, epsilon: float, *, prior_known: bool) -> None:
    """Refuse (400 ``uninformative_release``) a mechanism built from public inputs whose output does not depend on
    the label: releasing it would charge ``epsilon`` for noise alone. Research use opts in
    (``allow_uninformative``) and does not call this."""
    reason = uninformative_reason(mechanism)
    if reason is None:
        return
    better = "a prior that is less concentrated on one label, " if prior_known else ""
    raise LabelDPError(f"{reason}, so its release would carry no information about the labels for epsilon "
                       f"{epsilon:g}: use a larger epsilon, {better}or another mechanism (rr, dbrr, opt-unbiased); "
                       "allow_uninformative (CLI: --allow-uninformative) opts in for research",
                       code=ErrorCode.UNINFORMATIVE_RELEASE)


def build_on_private_prior(name: str, domain, epsilon: float, prior,
                           options: MechanismOptions | None = None, *, allow_uninformative: bool = False) -> Built:
    """:func:`build` on a private (noisy) prior, after :func:`check` passed: never refuses. If the solve cannot
    certify, fails or runs past the deadline — outcomes that depend on the prior — the family's fallback is built
    instead from public inputs alone, deterministically, and the diagnostics say so (``fallback``, ``reason``).
    So is a mechanism that the noisy prior makes *uninformative* (reason ``uninformative``: RRWithPrior keeping only
    the most likely class, RR-on-Bins with one bin — its output would not depend on the label), unless
    ``allow_uninformative``. The release was charged before the prior was drawn, so refusing here would charge ε
    for nothing; the fallback spends it on labels that say something. Every branch is a function of the noisy prior
    (already ε₁-DP and published with the release) and of public parameters: post-processing, so neither the
    choice nor its record reveals anything more."""
    chosen = family(name)
    options = options or MechanismOptions()
    try:
        built = chosen.builder(domain, chosen.check(domain, options, epsilon), epsilon, prior, options)
        if allow_uninformative or uninformative_reason(built.mechanism) is None:
            return built
        reason = "uninformative"
    except SolverTimeout:
        reason = "solver_timeout"
    except LabelDPError as err:  # certification_failed, solver_failed: the repaired solution did not certify
        reason = err.code
    except (ArithmeticError, ValueError, np.linalg.LinAlgError):  # a numerical breakdown on this prior
        reason = "solver_failed"
    assert chosen.fallback is not None  # every family built on a private prior names its fallback (FAMILIES)
    replacement = family(chosen.fallback)
    built = replacement.builder(domain, replacement.check(domain, MechanismOptions()), epsilon, None,
                                MechanismOptions())
    return Built(built.mechanism, {**built.diagnostics, "fallback": replacement.name, "fallback_from": name,
                                   "reason": reason})


def build_mechanism(name: str, domain, epsilon: float, prior=None, options: MechanismOptions | None = None):
    """:func:`build` without the diagnostics."""
    return build(name, domain, epsilon, prior, options).mechanism

