"""Subset-selection randomizer (shared/mechanisms/subset.py; Chua et al., eq. (1) and Algorithm 1):
Pr[k ∈ S] = 1/2 if k = y else 1/(e^ε+1), independently over k; weights 2(e^ε+1)/(e^ε-1)·(1[k∈S] - 1/(e^ε+1))."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from shared.errors import CertificationError, LabelDPError
from shared.mechanisms import dyadic
from shared.mechanisms.subset import SubsetSelectionRandomizer
from shared.privacy import EXACT_MARGIN, design_epsilon

EPSILONS = [0.05, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0]
Z_TOL = 5.0


def all_subsets(k: int) -> np.ndarray:
    return np.array(list(itertools.product([0, 1], repeat=k)), dtype=bool)


def exact_set_probabilities(r: SubsetSelectionRandomizer, y: int) -> np.ndarray:
    """Pr[S | y] for every subset S (rows of all_subsets), from the realized inclusion probabilities."""
    p, q = r.inclusion_probabilities
    incl = np.full(r.num_classes, q)
    incl[y] = p
    sets = all_subsets(r.num_classes)
    return np.prod(np.where(sets, incl, 1 - incl), axis=1)


def paper_weights(sets, eps: float) -> np.ndarray:
    e = math.exp(eps)
    return 2 * (e + 1) / (e - 1) * (np.asarray(sets, dtype=np.float64) - 1 / (e + 1))


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("k", [2, 3, 10, 100])
def test_certified_epsilon_close_to_requested(eps, k):
    r = SubsetSelectionRandomizer.build(k, eps)
    assert r.num_classes == k and r.epsilon == eps
    assert r.certified_epsilon <= eps
    assert eps - r.certified_epsilon < 1e-8
    # recomputed from the realized probabilities with exact rational arithmetic
    n = dyadic.RESOLUTION
    ratio = Fraction(r.true_count * (n - r.other_count), r.other_count * (n - r.true_count))
    assert r.certified_epsilon == pytest.approx(math.log(ratio), abs=1e-13)
    assert r.certified_epsilon == pytest.approx(design_epsilon(eps), abs=1e-11)


@pytest.mark.parametrize("eps", EPSILONS)
def test_inclusion_probabilities(eps):
    r = SubsetSelectionRandomizer.build(5, eps)
    p, q = r.inclusion_probabilities
    assert p == 0.5
    # exactly 1/(e^ε'+1) at the design ε' the mechanism is built at (ε minus a 1e-9·max(1, ε) safety margin) ...
    assert q == pytest.approx(1 / (math.exp(r.design_epsilon) + 1), abs=1e-12)
    # ... which is within |dq/dε|·margin (<= margin·ε/4) of 1/(e^ε+1) at the requested ε
    slope = math.exp(eps) / (math.exp(eps) + 1) ** 2
    assert abs(q - 1 / (math.exp(eps) + 1)) <= slope * EXACT_MARGIN * max(1.0, eps) * 1.01 + 1e-15
    assert q > 1 / (math.exp(eps) + 1)  # the margin moves q toward 1/2, i.e. more private


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
@pytest.mark.parametrize("k", [2, 3, 6])
def test_exact_unbiasedness_by_enumeration(eps, k):
    r = SubsetSelectionRandomizer.build(k, eps)
    sets = all_subsets(k)
    weights = r.unbiased_weights(sets)
    assert weights.shape == (2**k, k)
    for y in range(k):
        probs = exact_set_probabilities(r, y)
        assert math.fsum(probs) == pytest.approx(1.0, abs=1e-14)
        expectation = probs @ weights
        np.testing.assert_allclose(expectation, np.eye(k)[y], rtol=0, atol=1e-12)


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_exact_unbiasedness_per_coordinate_many_classes(eps):
    k = 50
    r = SubsetSelectionRandomizer.build(k, eps)
    p, q = r.inclusion_probabilities
    w_in, w_out = r.unbiased_weights(np.ones((1, k)))[0], r.unbiased_weights(np.zeros((1, k)))[0]
    for y in (0, 17, 49):
        incl = np.full(k, q)
        incl[y] = p
        np.testing.assert_allclose(incl * w_in + (1 - incl) * w_out, np.eye(k)[y], rtol=0, atol=1e-12)


@pytest.mark.parametrize("eps", EPSILONS)
def test_weights_match_paper_formula(eps):
    r = SubsetSelectionRandomizer.build(4, eps)
    sets = all_subsets(4)
    w = r.unbiased_weights(sets)
    # the paper's formula at the ε the mechanism is built at agrees to 1e-9
    np.testing.assert_allclose(w, paper_weights(sets, r.design_epsilon), rtol=1e-9, atol=1e-9)
    # at the requested ε the difference is the margin times d/dε of the formula (≤ 2/ε² + 1 per unit)
    bound = (4 / (eps * eps) + 2) * EXACT_MARGIN * max(1.0, eps)
    assert np.max(np.abs(w - paper_weights(sets, eps))) <= bound
    # sanity of the closed form itself: values for k ∈ S and k ∉ S
    e = math.exp(r.design_epsilon)
    assert w[-1, 0] == pytest.approx(2 * (e + 1) / (e - 1) * (1 - 1 / (e + 1)), rel=1e-9)
    assert w[0, 0] == pytest.approx(-2 / (e - 1), rel=1e-9)


def test_monte_carlo_inclusion_frequencies():
    k, eps, n = 6, 1.0, 200_000
    r = SubsetSelectionRandomizer.build(k, eps)
    p, q = r.inclusion_probabilities
    rng = np.random.default_rng(20240601)
    labels = rng.integers(0, k, size=n)
    sets = r.sample(labels, rng)
    assert sets.shape == (n, k) and sets.dtype == bool
    is_true = np.zeros((n, k), dtype=bool)
    is_true[np.arange(n), labels] = True
    for c in range(k):
        hits_true = sets[is_true[:, c], c]
        hits_other = sets[~is_true[:, c], c]
        for hits, prob in ((hits_true, p), (hits_other, q)):
            z = (hits.mean() - prob) / math.sqrt(prob * (1 - prob) / hits.size)
            assert abs(z) < Z_TOL, (c, prob, hits.mean())
    # independence across classes: the pair (0, 1) for label 2 co-occurs with probability q²
    both = sets[labels == 2][:, [0, 1]].all(axis=1)
    assert abs(both.mean() - q * q) < Z_TOL * math.sqrt(q * q * (1 - q * q) / both.size)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_monte_carlo_mean_weights_are_one_hot(eps):
    k, n, y = 5, 200_000, 3
    r = SubsetSelectionRandomizer.build(k, eps)
    p, q = r.inclusion_probabilities
    w = r.unbiased_weights(r.sample(np.full(n, y), np.random.default_rng(77)))
    target = np.eye(k)[y]
    incl = np.where(np.arange(k) == y, p, q)
    se = np.sqrt(incl * (1 - incl) / n) / (p - q)  # exact standard error of the mean weight
    assert np.all(np.abs(w.mean(axis=0) - target) < Z_TOL * se)
    assert np.all(np.abs(w.std(axis=0) - se * math.sqrt(n)) < 0.02 * se * math.sqrt(n))


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0, 8.0])
def test_privacy_brute_force_three_classes(eps):
    r = SubsetSelectionRandomizer.build(3, eps)
    table = np.array([exact_set_probabilities(r, y) for y in range(3)])  # 3 labels x 8 subsets
    assert table.shape == (3, 8)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    worst = max(math.log(table[y, s] / table[y2, s]) for s in range(8) for y in range(3) for y2 in range(3))
    assert worst == pytest.approx(r.certified_epsilon, abs=1e-12)
    assert worst <= eps
    # with exact rational arithmetic from the integer thresholds
    n = dyadic.RESOLUTION
    p, q = Fraction(r.true_count, n), Fraction(r.other_count, n)
    rational = []
    for y in range(3):
        row = []
        for s in itertools.product([0, 1], repeat=3):
            prob = Fraction(1)
            for c, member in enumerate(s):
                pc = p if c == y else q
                prob *= pc if member else 1 - pc
            row.append(prob)
        rational.append(row)
    worst_exact = max(rational[y][s] / rational[y2][s] for s in range(8) for y in range(3) for y2 in range(3))
    assert math.log(worst_exact) == pytest.approx(r.certified_epsilon, abs=1e-13)


def test_single_class_and_validation():
    assert SubsetSelectionRandomizer.build(1, 1.0).certified_epsilon == 0.0
    assert SubsetSelectionRandomizer.build(7, 1.0).num_outputs == 128
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(LabelDPError):
            SubsetSelectionRandomizer.build(3, bad)


def test_sample_refuses_labels_outside_the_classes():
    mechanism = SubsetSelectionRandomizer.build(4, 1.0)
    for bad in ([-1], [4], [1.5]):
        with pytest.raises(LabelDPError):
            mechanism.sample(np.array(bad), np.random.default_rng(0))


@pytest.mark.parametrize(("eps", "k"), [(0.5, 3), (2.0, 10)])
def test_the_features_party_rebuilds_the_described_randomizer(eps, k):
    described = SubsetSelectionRandomizer.build(k, eps).describe()
    rebuilt = SubsetSelectionRandomizer.from_description(described)
    assert rebuilt == SubsetSelectionRandomizer.build(k, eps)
    assert rebuilt.inclusion_probabilities == (described["p_true"], described["p_other"])


def test_a_description_whose_probabilities_differ_is_refused():
    described = SubsetSelectionRandomizer.build(4, 1.0).describe()
    tampered = {**described, "p_other": described["p_other"] + 2.0 ** -53}
    with pytest.raises(CertificationError, match="inclusion probabilities"):
        SubsetSelectionRandomizer.from_description(tampered)
