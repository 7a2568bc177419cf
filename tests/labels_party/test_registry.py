"""The mechanism registry: one family per wire name, in agreement with what both parties agree on
(``shared.schemas``), each with its label kinds, options, prior need and |Y| limit; builds return the certified
mechanism with the solver's diagnostics (so no caller solves twice)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labels_party.core import registry
from labels_party.core.registry import MechanismOptions
from shared import schemas
from shared.domains import Classes, ContinuousInterval, integer_range
from shared.errors import LabelDPError


def test_families_are_the_wire_schemas_mechanisms_with_their_declared_kinds():
    """shared.schemas.MECHANISMS declares each mechanism once; the registry builds exactly those, and the wire's
    enums (a release's mechanism, a group release's) and per-kind lists all come from that one table."""
    assert set(registry.FAMILIES) == set(schemas.MECHANISMS)
    assert list(schemas.MECHANISMS) == list(schemas.MechanismName.__args__)
    assert schemas.REGRESSION_MECHANISMS == ("opt-unbiased", "rr-on-bins", "laplace", "staircase", "dbrr", "rr",
                                             "rp-with-prior")
    assert schemas.CLASSIFICATION_MECHANISMS == ("rr", "rr-with-prior", "subset", "block-rr", "alibi")
    assert schemas.GroupMechanism.__args__ == ("opt-unbiased", "rr-on-bins", "rr-with-prior", "rp-with-prior",
                                               "block-rr")
    for name, family in registry.FAMILIES.items():
        assert (name in schemas.REGRESSION_MECHANISMS) == (family.label_kinds >= registry.REGRESSION)
        assert (name in schemas.CLASSIFICATION_MECHANISMS) == ("classes" in family.label_kinds)
        assert family.needs_prior == (name in schemas.GroupMechanism.__args__)
    with pytest.raises(TypeError):
        registry.FAMILIES["mine"] = registry.FAMILIES["rr"]  # read-only


def test_exact_solve_reports_its_certificate():
    prior = np.array([0.4, 0.3, 0.2, 0.1])
    built = registry.build("opt-unbiased", integer_range(1, 4), 1.0, prior, MechanismOptions(solver="continuous"))
    assert built.diagnostics["solver"] == "continuous" and 0 <= built.diagnostics["optimality_gap"] <= 1e-6
    assert built.diagnostics["cone_programs"] >= 1
    assert built.mechanism.certified_epsilon <= 1.0
    mesh = registry.build("opt-unbiased", integer_range(1, 4), 1.0, prior, MechanismOptions(mesh=16))
    assert mesh.diagnostics == {"solver": "mesh", "mesh": 16}
    # the continuous optimum is at least as good as the mesh LP's
    assert built.mechanism.noisy_label_loss(prior) <= mesh.mechanism.noisy_label_loss(prior) + 1e-9


@pytest.mark.parametrize(("name", "domain", "options", "code"), [
    ("nonsense", integer_range(0, 3), MechanismOptions(), "unknown_mechanism"),
    ("subset", integer_range(0, 3), MechanismOptions(), "mechanism_domain_mismatch"),
    ("laplace", Classes(3), MechanismOptions(), "mechanism_domain_mismatch"),
    ("rr", integer_range(0, 3), MechanismOptions(clip=True), "invalid_option"),
    ("laplace", integer_range(0, 3), MechanismOptions(mesh=8), "invalid_mesh"),
    ("opt-unbiased", integer_range(0, 3), MechanismOptions(mesh=8, solver="continuous"), "invalid_mesh"),
    ("opt-unbiased", integer_range(0, 1000), MechanismOptions(), "domain_too_large"),
    ("rr-on-bins", ContinuousInterval(0, 1, 50_001), MechanismOptions(), "domain_too_large"),
    ("rr-with-prior", Classes(3), MechanismOptions(), "prior_required"),
])
def test_refusals_come_before_any_solve(name, domain, options, code):
    with pytest.raises(LabelDPError) as err:
        registry.build(name, domain, 1.0, None, options)
    assert err.value.code == code


def test_limits_name_the_alternative():
    with pytest.raises(LabelDPError, match="grid_size") as err:
        registry.build("opt-unbiased", integer_range(0, 18_497), 1.0, np.full(18_498, 1 / 18_498))
    # a concrete grid on the domain's own range, and the families that take it as it is
    assert 'continuous on [0, 18497] with "grid_size": 1000' in str(err.value)
    assert "rr-on-bins (up to 50,000 labels)" in str(err.value) and "laplace" in str(err.value)
    with pytest.raises(LabelDPError, match="use rr") as err:
        registry.build("subset", Classes(300), 1.0)
    assert "grid_size" not in str(err.value)


def test_the_continuous_solver_is_the_default_and_a_mesh_size_means_the_mesh():
    prior = np.array([0.4, 0.3, 0.2, 0.1])
    assert registry.build("opt-unbiased", integer_range(1, 4), 1.0, prior).diagnostics["solver"] == "continuous"
    assert registry.build("opt-unbiased", integer_range(1, 4), 1.0, prior,
                          MechanismOptions(mesh=16)).diagnostics == {"solver": "mesh", "mesh": 16}
    assert registry.build("opt-unbiased", integer_range(1, 4), 1.0, prior,
                          MechanismOptions(solver="mesh")).diagnostics == {"solver": "mesh", "mesh": 8}
    with pytest.raises(LabelDPError) as err:
        registry.build("opt-unbiased", integer_range(1, 4), 1.0, prior, MechanismOptions(mesh=16, solver="continuous"))
    assert err.value.code == "invalid_mesh"
    assert registry.family("rr").max_labels is None and registry.family("subset").max_labels == 256


# -- builds on a private prior never refuse ------------------------------------------------------------------------

PRIOR_FAMILIES = [("opt-unbiased", MechanismOptions(solver="continuous")),
                  ("opt-unbiased", MechanismOptions(solver="mesh")),
                  ("rr-on-bins", MechanismOptions()), ("rr-with-prior", MechanismOptions())]


@st.composite
def noisy_priors(draw, size: int):
    """What a noisy histogram can clip and normalize to: point masses (at the extremes too), sparse and dense
    weights, all zeros but one tiny weight."""
    kind = draw(st.sampled_from(["point", "two", "sparse", "dense"]))
    weights = np.zeros(size)
    if kind == "point":
        weights[draw(st.sampled_from([0, size - 1, draw(st.integers(0, size - 1))]))] = 1.0
    elif kind == "two":
        weights[0] = 1.0
        weights[size - 1] = draw(st.floats(1e-9, 1.0))
    else:
        counts = draw(st.lists(st.integers(0, 10**6 if kind == "dense" else 3), min_size=size, max_size=size))
        weights = np.asarray(counts, dtype=np.float64)
        weights[draw(st.integers(0, size - 1))] += 1
    return weights / weights.sum()


@pytest.mark.parametrize(("name", "options"), PRIOR_FAMILIES, ids=["continuous", "mesh", "bins", "rr-with-prior"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_build_on_a_private_prior_certifies_or_falls_back_deterministically(name, options, data):
    """Whatever the noisy prior, a build that passed the public check returns a mechanism certified at ε — the
    family's own or, when its solve cannot certify, its fallback built from public inputs — and the same prior
    gives the same choice (so the outcome is a function of the published prior, nothing else)."""
    size = data.draw(st.integers(2, 12), label="labels")
    domain = Classes(size) if name == "rr-with-prior" else integer_range(0, size - 1)
    family = registry.family(name)
    floor = family.min_epsilon(options) if family.min_epsilon else 1e-6
    epsilon = data.draw(st.one_of(st.sampled_from([floor, 12.0, 16.0, 20.0, 50.0]), st.floats(floor, 50.0)),
                        label="epsilon")
    prior = data.draw(noisy_priors(size), label="prior")
    registry.check(name, domain, epsilon, options)
    built = registry.build_on_private_prior(name, domain, epsilon, prior, options)
    assert built.mechanism.certified_epsilon <= epsilon
    again = registry.build_on_private_prior(name, domain, epsilon, prior, options)
    assert again.diagnostics.get("fallback") == built.diagnostics.get("fallback")
    assert built.mechanism.certified_epsilon > 0  # never a release whose output does not depend on the label
    if "fallback" in built.diagnostics:
        assert built.diagnostics["fallback"] == family.fallback == built.mechanism.name
        assert built.diagnostics["reason"] in ("certification_failed", "solver_failed", "uninformative")
        if built.diagnostics["reason"] == "uninformative":  # the family's own build would have said nothing
            own = registry.build_on_private_prior(name, domain, epsilon, prior, options, allow_uninformative=True)
            assert own.mechanism.certified_epsilon == 0.0 and own.mechanism.name == name


def test_the_failures_of_issue_26_now_fall_back():
    """A point mass at an extreme label at ε₂ ≥ 16 made the continuous solver's repair fail (a 400 that depended on
    the label): it is the fallback now; and the mesh LP at ε₂ = 12 certifies after a wider margin."""
    domain, point = integer_range(0, 9), np.eye(10)[9]
    built = registry.build_on_private_prior("opt-unbiased", domain, 16.0, point)
    assert (built.diagnostics["fallback"], built.diagnostics["reason"]) == ("dbrr", "certification_failed")
    assert built.mechanism.certified_epsilon <= 16.0
    with pytest.raises(LabelDPError):  # the public entry point still says the solve itself failed
        registry.build("opt-unbiased", domain, 16.0, point)
    rng = np.random.default_rng(0)
    for _ in range(10):
        prior = rng.dirichlet(np.full(10, 0.1))
        mesh = registry.build_on_private_prior("opt-unbiased", domain, 12.0, prior, MechanismOptions(solver="mesh"))
        assert "fallback" not in mesh.diagnostics and mesh.mechanism.certified_epsilon <= 12.0
