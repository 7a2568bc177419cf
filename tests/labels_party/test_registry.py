"""The mechanism registry: one family per wire name, in agreement with what both parties agree on
(``shared.schemas``), each with its label kinds, options, prior need and |Y| limit; builds return the certified
mechanism with the solver's diagnostics (so no caller solves twice)."""

from __future__ import annotations

import numpy as np
import pytest

from labels_party import registry
from labels_party.registry import MechanismOptions
from shared import schemas
from shared.domains import Classes, ContinuousInterval, integer_range
from shared.errors import LabelDPError


def test_families_agree_with_the_wire_schema():
    assert set(registry.FAMILIES) == set(schemas.MechanismName.__args__)
    for name, family in registry.FAMILIES.items():
        assert (name in schemas.REGRESSION_MECHANISMS) == bool(family.label_kinds & registry.REGRESSION)
        assert (name in schemas.CLASSIFICATION_MECHANISMS) == bool(family.label_kinds & registry.CLASSES)
    assert {name for name, f in registry.FAMILIES.items() if f.needs_prior} == set(schemas.GroupMechanism.__args__)
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
