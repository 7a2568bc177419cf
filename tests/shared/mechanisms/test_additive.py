"""Additive noise mechanisms on a lattice (shared/mechanisms/additive.py): certified ε, outputs on the lattice,
unbiasedness, and the clipped variants' bias and loss against a brute-force matrix and Monte Carlo (fixed seeds)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from shared.domains import ContinuousInterval, FiniteLabels, Lattice, integer_range, lattice_of
from shared.errors import LabelDPError
from shared.mechanisms.additive import AdditiveNoiseRandomizer, laplace, staircase

EPSILONS = [0.1, 0.5, 1.0, 4.0, 8.0]
WEEKS = integer_range(1, 52)
DELTA = 51
Z_TOL = 5.0  # fixed seeds; 5 standard errors


def reference_clipped_matrix(mechanism: AdditiveNoiseRandomizer) -> np.ndarray:
    """Pr[output index = j | lattice index = i], by summing the noise pmf over a wide window (clip collects the
    tails at the ends). Independent of the mechanism's prefix-sum formulas."""
    d = mechanism.lattice.steps
    width = int(60 * math.sqrt(mechanism.noise.variance)) + 100  # the pmf beyond is below e^-40
    window = np.arange(-d - width, d + width + 1)
    p = mechanism.noise.pmf(window)
    rows = []
    for i in range(d + 1):
        out = np.clip(i + window, 0, d)
        rows.append(np.bincount(out, weights=p, minlength=d + 1))
    return np.array(rows)


@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("eps", EPSILONS)
def test_certified_epsilon_is_the_noise_s_exact_rational(family, eps):
    m = family(lattice_of(WEEKS), eps)
    assert m.lattice == Lattice(1.0, 1.0, DELTA)
    assert m.noise.epsilon(DELTA) <= Fraction(eps)
    assert m.certified_epsilon == m.noise.certified_epsilon(DELTA)
    assert eps * (1 - 2**-30) < m.certified_epsilon <= eps


@pytest.mark.parametrize("family", [laplace, staircase])
def test_unclipped_mechanisms_are_unbiased_and_output_integers(family):
    m = family(lattice_of(WEEKS), 0.5, input_values=WEEKS.values)
    np.testing.assert_array_equal(m.bias, np.zeros(52))
    np.testing.assert_allclose(m.squared_loss_per_label(), np.full(52, 0.5 * m.noise.variance), rtol=1e-12)
    n = 300_000
    labels = np.full(n, 10.0)
    out = m.sample(labels, np.random.default_rng(11))
    assert np.all(out == np.round(out))
    assert abs(np.mean(out - labels)) < Z_TOL * math.sqrt(m.noise_variance / n)
    assert np.mean(0.5 * (out - labels) ** 2) == pytest.approx(0.5 * m.noise_variance, rel=0.02)
    # whereas clipping the same noise is visibly biased (many standard errors)
    clipped = np.clip(out, 1, 52)
    assert np.mean(clipped - labels) > 20 * clipped.std() / math.sqrt(n)


@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0])
def test_clipped_bias_and_loss_match_the_brute_force_matrix(family, eps):
    m = family(lattice_of(WEEKS), eps, clip=True, input_values=WEEKS.values)
    assert m.num_outputs == 52 and m.name.endswith("-clipped")
    matrix = reference_clipped_matrix(m)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-12)
    ys = WEEKS.values
    np.testing.assert_allclose(m.bias, matrix @ ys - ys, rtol=0, atol=1e-9)
    np.testing.assert_allclose(m.squared_loss_per_label(), 0.5 * (matrix @ ys**2 - 2 * ys * (matrix @ ys) + ys**2),
                               rtol=1e-9, atol=1e-9)
    # clipping is post-processing: the matrix is within ε of itself across every pair of rows
    ratio = float(np.max(np.log(matrix.max(axis=0)) - np.log(matrix.min(axis=0))))
    assert ratio <= m.certified_epsilon * (1 + 1e-9)
    assert m.bias[9] > 0 and m.bias[9] == pytest.approx(-m.bias[-10], abs=1e-9)  # symmetric pull inward
    if eps <= 1:
        assert m.bias[9] > 5.0


@pytest.mark.parametrize("family", [laplace, staircase])
def test_clipped_sampling_matches_the_matrix(family):
    m = family(lattice_of(WEEKS), 1.0, clip=True, input_values=WEEKS.values)
    n = 200_000
    out = m.sample(np.full(n, 10.0), np.random.default_rng(5))
    freq = np.bincount(out.astype(np.int64) - 1, minlength=52) / n
    p = reference_clipped_matrix(m)[9]
    assert np.all(np.abs(freq - p) <= Z_TOL * np.sqrt(p * (1 - p) / n) + 1e-12)
    assert abs(out.mean() - 10 - m.bias[9]) < Z_TOL * out.std() / math.sqrt(n)


@pytest.mark.parametrize("family", [laplace, staircase])
def test_continuous_labels_are_rounded_onto_the_grid_without_bias(family):
    domain = ContinuousInterval(0.0, 10.0, grid_size=41)  # step 0.25
    m = family(lattice_of(domain), 1.0, input_values=domain.grid.values)
    assert m.lattice.steps == 40 and m.lattice.step == 0.25
    labels = np.random.default_rng(1).uniform(0, 10, size=200_000)
    out = m.sample(labels, np.random.default_rng(2))
    assert np.all(out * 4 == np.round(out * 4))  # grid values only
    error = out - labels
    assert abs(error.mean()) < Z_TOL * error.std() / math.sqrt(error.size)
    # the noise scale in label units is (U - L)/ε, as for the continuous Laplace of Definition 18
    if family is laplace:
        assert m.noise.scale * m.lattice.step == pytest.approx(10.0, rel=1e-9)


@pytest.mark.parametrize("family", [laplace, staircase])
def test_clipped_loss_for_labels_off_the_lattice_by_monte_carlo(family):
    values = np.array([0.5, 1.25, 3.0])  # irregular: lattice of 4 steps of 0.625, 1.25 lies off it
    m = family(lattice_of(FiniteLabels(values)), 0.5, clip=True, input_values=values)
    bias, loss = m.bias, m.squared_loss_per_label()
    rng = np.random.default_rng(4242)
    n = 300_000
    for i, y in enumerate(values):
        err = m.sample(np.full(n, y), rng) - y
        assert np.all((y + err >= 0.5 - 1e-12) & (y + err <= 3.0 + 1e-12))
        assert abs(err.mean() - bias[i]) < Z_TOL * err.std() / math.sqrt(n), (y, err.mean(), bias[i])
        half_sq = 0.5 * err**2
        assert abs(half_sq.mean() - loss[i]) < Z_TOL * half_sq.std() / math.sqrt(n), (y, half_sq.mean(), loss[i])


def test_noisy_label_loss_is_prior_weighted_loss():
    values = np.array([0.0, 2.5, 5.0, 10.0])
    m = staircase(lattice_of(FiniteLabels(values)), 1.0, clip=True, input_values=values)
    prior = np.array([1.0, 2.0, 3.0, 4.0])
    assert m.noisy_label_loss(prior) == pytest.approx(float(prior @ m.squared_loss_per_label()) / 10, rel=1e-12)


@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("clip", [False, True])
def test_labels_off_the_domain_are_refused(family, clip):
    m = family(lattice_of(WEEKS), 1.0, clip=clip)
    rng = np.random.default_rng(0)
    assert m.sample(np.array([1.0, 52.0, 26.0]), rng).shape == (3,)  # the boundary labels are fine
    for bad in ([0.0], [53.0], [np.nan], [-np.inf]):
        with pytest.raises(LabelDPError) as err:
            m.sample(np.array(bad), rng)
        assert err.value.code == "label_out_of_domain"
    with pytest.raises(LabelDPError, match=r"e\.g\. 15002$"):  # numbers as numbers, never np.float64(15002.0)
        m.sample(np.array([15002.0]), rng)


def test_lattice_of_finite_domains():
    assert lattice_of(FiniteLabels(np.array([0.0, 10.0, 20.0]))) == Lattice(0.0, 10.0, 2)
    assert lattice_of(FiniteLabels(np.array([1.0, 2.0, 5.0]))) == Lattice(1.0, 1.0, 4)
    for values in ([0.0, 1e-9, 1.0], [0.0, 5e-324, 1.0]):
        with pytest.raises(LabelDPError) as err:
            lattice_of(FiniteLabels(np.array(values)))
        assert err.value.code == "lattice_too_fine" and len(str(err.value)) < 200
    with pytest.raises(LabelDPError) as err:  # beyond ±10¹⁵ no domain is built (its range would overflow)
        FiniteLabels(np.array([-1e308, 1e308]))
    assert err.value.code == "invalid_domain"
    with pytest.raises(LabelDPError):
        lattice_of(FiniteLabels(np.array([3.0])))
