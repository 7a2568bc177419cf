"""Every mechanism, several ε: certified ε <= requested, rows sum to 1, unbiased ones have |bias| <= 1e-6."""

import numpy as np
import pytest

from labels_party.core.registry import MechanismOptions, build_mechanism
from shared.domains import Classes, ContinuousInterval, FiniteLabels, integer_range
from shared.mechanisms import dyadic
from shared.mechanisms.finite import FiniteRandomizer
from shared.mechanisms.rounded import RoundedRandomizer

EPSILONS = [0.05, 0.25, 1.0, 4.0, 8.0]
WEEKS = integer_range(1, 12)
PRIOR = np.linspace(1.0, 3.0, WEEKS.size) ** 2

REGRESSION_CASES = [
    ("opt-unbiased", MechanismOptions(mesh=24), True),
    ("rr-on-bins", MechanismOptions(), False),
    ("dbrr", MechanismOptions(), True),
    ("rr", MechanismOptions(), False),
    ("laplace", MechanismOptions(), True),
    ("laplace", MechanismOptions(clip=True), False),
    ("staircase", MechanismOptions(), True),
    ("staircase", MechanismOptions(clip=True), False),
]


def _check_rows(mechanism):
    inner = mechanism.inner if isinstance(mechanism, RoundedRandomizer) else mechanism
    if isinstance(inner, FiniteRandomizer):
        assert np.all(inner.counts.sum(axis=1) == dyadic.RESOLUTION)
        assert np.all(np.abs(inner.matrix.sum(axis=1) - 1.0) <= 1e-15)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize(("name", "options", "unbiased"), REGRESSION_CASES,
                         ids=[f"{c[0]}-{'clip' if c[1].clip else 'raw'}" for c in REGRESSION_CASES])
def test_regression_mechanisms_are_certified(name, options, unbiased, epsilon):
    prior = PRIOR if name in ("opt-unbiased", "rr-on-bins") else None
    mechanism = build_mechanism(name, WEEKS, epsilon, prior, options)
    assert mechanism.certified_epsilon <= epsilon
    assert mechanism.certified_epsilon >= epsilon - 2e-6 * max(1.0, epsilon)  # each is tight at its ε
    _check_rows(mechanism)
    if unbiased:
        assert mechanism.max_abs_bias <= 1e-6
    elif name in ("rr", "rr-on-bins") or options.clip:
        assert mechanism.max_abs_bias > 1e-3
    assert mechanism.noisy_label_loss(PRIOR) > 0


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("name", ["rr", "rr-with-prior", "subset"])
def test_classification_mechanisms_are_certified(name, epsilon):
    prior = np.array([0.5, 0.2, 0.2, 0.05, 0.05]) if name == "rr-with-prior" else None
    mechanism = build_mechanism(name, Classes(5), epsilon, prior)
    assert mechanism.certified_epsilon <= epsilon
    _check_rows(mechanism)


@pytest.mark.parametrize("name", ["opt-unbiased", "dbrr", "rr-on-bins"])
def test_continuous_domain_keeps_certification_and_unbiasedness(name):
    domain = ContinuousInterval(0.0, 400.0, grid_size=9)
    prior = np.ones(9) if name != "dbrr" else None
    mechanism = build_mechanism(name, domain, 1.0, prior)
    assert isinstance(mechanism, RoundedRandomizer)
    assert mechanism.certified_epsilon <= 1.0
    labels = np.random.default_rng(5).uniform(0, 400, size=400_000)
    noisy = mechanism.sample(labels, np.random.default_rng(6))
    if name != "rr-on-bins":
        spread = np.std(noisy - labels) / np.sqrt(labels.size)
        assert abs(np.mean(noisy - labels)) < 4 * spread
    else:
        assert mechanism.max_abs_bias > 1.0


def test_non_integer_finite_labels_get_lattice_noise():
    # evenly spaced fractional labels: the lattice through them (step 0.25, 4 steps), noise in whole steps
    quarters = FiniteLabels(np.array([0.0, 0.25, 0.5, 0.75, 1.0]))
    mechanism = build_mechanism("laplace", quarters, 1.0)
    assert (mechanism.lattice.step, mechanism.lattice.steps) == (0.25, 4)
    assert mechanism.noise.scale == pytest.approx(4.0, rel=1e-9)  # Δ/ε in steps
    out = mechanism.sample(np.full(1000, 0.5), np.random.default_rng(0))
    assert np.all(out * 4 == np.round(out * 4))  # every output is on the lattice
    # irregular labels: a lattice whose step is at most their smallest gap (0.75 → 4 steps of 0.625 over 2.5)
    irregular = FiniteLabels(np.array([0.5, 1.25, 3.0]))
    mechanism = build_mechanism("laplace", irregular, 1.0)
    assert mechanism.lattice.steps == 4 and mechanism.lattice.step == pytest.approx(0.625)
    assert mechanism.certified_epsilon <= 1.0
    out = mechanism.sample(np.full(200_000, 1.25), np.random.default_rng(1))
    offsets = (out - 0.5) / 0.625
    assert np.allclose(offsets, np.round(offsets))
    assert abs(out.mean() - 1.25) < 5 * out.std() / np.sqrt(out.size)  # randomized rounding keeps it unbiased
