"""Every mechanism, every ε it accepts: certified or refused. A hypothesis sweep over mechanisms × label kinds × ε
from EPSILON_MIN to EPSILON_MAX (log-uniform, plus the edges and the saturation point) and just outside."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labels_party.core.registry import MechanismOptions, build_mechanism
from shared.domains import Classes, ContinuousInterval, FiniteLabels, integer_range
from shared.errors import LabelDPError
from shared.privacy import EPSILON_MAX, EPSILON_MIN, SATURATION_EPSILON

DOMAINS = {
    "integer": integer_range(0, 11),
    "fractional": FiniteLabels(np.array([0.5, 1.25, 3.0, 4.0])),
    "continuous": ContinuousInterval(-2.0, 5.0, 9),
    "classes": Classes(6),
}
REGRESSION = (("opt-unbiased", MechanismOptions(mesh=16)), ("opt-unbiased", MechanismOptions(solver="continuous")),
              ("rr-on-bins", MechanismOptions()), ("dbrr", MechanismOptions()), ("rr", MechanismOptions()),
              ("laplace", MechanismOptions()), ("laplace", MechanismOptions(clip=True)),
              ("staircase", MechanismOptions()), ("staircase", MechanismOptions(clip=True)))
CASES = [(name, kind, options) for kind in ("integer", "fractional", "continuous") for name, options in REGRESSION]
CASES += [(name, "classes", MechanismOptions()) for name in ("rr", "rr-with-prior", "subset")]

log_uniform = st.floats(math.log(EPSILON_MIN), math.log(EPSILON_MAX)).map(math.exp) \
    .map(lambda e: min(max(e, EPSILON_MIN), EPSILON_MAX))
epsilons = st.one_of(st.sampled_from([EPSILON_MIN, EPSILON_MAX, SATURATION_EPSILON, 1.0]), log_uniform)


def _prior(size: int) -> np.ndarray:
    return np.linspace(1.0, 4.0, size) ** 2


def _build(name, kind, options, epsilon):
    domain = DOMAINS[kind]
    size = domain.size if hasattr(domain, "size") else domain.grid_size
    prior = _prior(size) if name in ("opt-unbiased", "rr-on-bins", "rr-with-prior") else None
    return domain, build_mechanism(name, domain, epsilon, prior, options)


def _labels(domain) -> np.ndarray:
    if isinstance(domain, Classes):
        return np.arange(domain.size, dtype=np.float64)
    if isinstance(domain, ContinuousInterval):
        return np.linspace(domain.low, domain.high, 7)
    return domain.values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), epsilon=epsilons)
def test_every_accepted_epsilon_is_certified_or_refused(case, epsilon):
    name, kind, options = case
    try:
        domain, mechanism = _build(name, kind, options, epsilon)
    except LabelDPError as err:  # a clean refusal, which the service turns into a 4xx
        assert err.code in {"epsilon_out_of_range", "certification_failed", "solver_failed"}, err.code
        assert str(err)
        return
    certified = mechanism.certified_epsilon
    assert math.isfinite(certified) and certified <= epsilon
    # 0 only for a mechanism whose output does not depend on the label at all (one possible output)
    assert certified > 0 or mechanism.num_outputs == 1
    if epsilon >= SATURATION_EPSILON and name not in ("laplace", "staircase"):
        assert certified <= SATURATION_EPSILON * (1 + 1e-12)
    out = mechanism.sample(_labels(domain), np.random.default_rng(0))
    assert len(out) == _labels(domain).size


OUTSIDE = [0.0, -1.0, float("nan"), float("inf"), 5e-324, 1e-300, 1e-17, math.nextafter(EPSILON_MIN, 0),
           math.nextafter(EPSILON_MAX, math.inf), 500.0, 1e4]


@pytest.mark.parametrize("epsilon", OUTSIDE)
@pytest.mark.parametrize(("name", "kind", "options"), CASES[::3] + CASES[-3:])
def test_epsilon_outside_the_range_is_refused_with_a_code(name, kind, options, epsilon):
    with pytest.raises(LabelDPError) as err:
        _build(name, kind, options, epsilon)
    expected = "epsilon_out_of_range" if (math.isfinite(epsilon) and epsilon > 0) else "invalid_epsilon"
    assert err.value.code == expected


def test_solver_floors_are_declared_and_named():
    domain = DOMAINS["integer"]
    with pytest.raises(LabelDPError) as err:
        build_mechanism("opt-unbiased", domain, 0.005, _prior(12), MechanismOptions(solver="continuous"))
    assert err.value.code == "epsilon_out_of_range" and "0.01" in str(err.value)
    with pytest.raises(LabelDPError) as err:
        build_mechanism("opt-unbiased", domain, 5e-4, _prior(12), MechanismOptions(mesh=24))
    assert err.value.code == "epsilon_out_of_range" and "0.001" in str(err.value)
