"""Exact sampling: the realized distribution is the quantized matrix, and samples follow it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shared.errors import CertificationError
from shared.mechanisms import dyadic
from shared.mechanisms.finite import FiniteRandomizer


def test_quantized_rows_sum_exactly_and_stay_within_one_unit():
    rng = np.random.default_rng(3)
    probabilities = rng.dirichlet(np.full(37, 0.3), size=11)
    counts = dyadic.quantize_rows(probabilities)
    assert np.all(counts.sum(axis=1) == dyadic.RESOLUTION)
    assert np.max(np.abs(counts / dyadic.RESOLUTION - probabilities)) <= 2.0 / dyadic.RESOLUTION


def test_log_ratio_bound_on_known_counts():
    counts = np.array([[2, 0, 6], [1, 0, 9]])
    assert dyadic.log_ratio_bound(counts) == pytest.approx(np.log(2.0))
    assert dyadic.log_ratio_bound(np.array([[1, 3], [0, 4]])) == float("inf")


def test_samples_follow_the_exact_matrix_chi_square():
    rng = np.random.default_rng(20261122)
    probabilities = rng.dirichlet(np.ones(6), size=4)
    mechanism = FiniteRandomizer.from_probabilities("t", 50.0, np.arange(4), np.arange(6) * 1.5, probabilities)
    rows = rng.integers(0, 4, size=1_000_000)
    outputs = mechanism.sample_indices(rows, np.random.default_rng(7))
    for row in range(4):
        observed = np.bincount(outputs[rows == row], minlength=6)
        expected = mechanism.matrix[row] * observed.sum()
        assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_sampler_never_emits_a_zero_probability_output():
    matrix = np.array([[0.5, 0.0, 0.5], [0.25, 0.0, 0.75]])
    mechanism = FiniteRandomizer.from_probabilities("t", 5.0, [0, 1], [0, 1, 2], matrix)
    out = mechanism.sample_indices(np.repeat([0, 1], 200_000), np.random.default_rng(1))
    assert not np.any(out == 1)
    assert mechanism.num_outputs == 2


def test_uncertifiable_matrix_is_refused():
    matrix = np.array([[0.9, 0.1], [0.1, 0.9]])  # log 9 ≈ 2.197
    with pytest.raises(CertificationError):
        FiniteRandomizer.from_probabilities("t", 2.0, [0, 1], [0, 1], matrix)
    assert FiniteRandomizer.from_probabilities("t", 2.2, [0, 1], [0, 1], matrix).certified_epsilon == \
        pytest.approx(np.log(9.0), rel=1e-12)


def test_matrix_rows_that_do_not_sum_to_one_are_refused():
    with pytest.raises(CertificationError):
        FiniteRandomizer.from_probabilities("t", 1.0, [0, 1], [0, 1], [[0.5, 0.5], [0.5, 0.4]])


def test_mechanism_is_immutable():
    mechanism = FiniteRandomizer.from_probabilities("t", 1.0, [0, 1], [0, 1], [[0.6, 0.4], [0.4, 0.6]])
    with pytest.raises(ValueError):
        mechanism.counts[0, 0] = 1
    with pytest.raises(AttributeError):
        mechanism.epsilon = 3.0


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 6), outputs=st.integers(1, 300), concentration=st.floats(0.05, 5.0),
       zeros=st.integers(0, 4), seed=st.integers(0, 2**32 - 1))
def test_alias_table_samples_exactly_the_counts(rows, outputs, concentration, zeros, seed):
    """The alias table's implied distribution (integer sums over its buckets) equals the counts, exactly, for any
    count matrix — including zero columns, a single output, and non-power-of-two widths."""
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet(np.full(outputs, concentration), size=rows)
    probabilities[:, rng.integers(0, outputs, size=zeros)] = 0.0
    probabilities[:, 0] += 1e-12
    counts = dyadic.quantize_rows(probabilities / probabilities.sum(axis=1, keepdims=True))
    table = dyadic.AliasTable.of(counts)
    implied = table.distribution()
    np.testing.assert_array_equal(implied[:, :outputs], counts)
    assert np.all(implied[:, outputs:] == 0)  # padding buckets are never output
    drawn = table.sample(np.repeat(np.arange(rows), 50), rng)
    assert np.all(counts[np.repeat(np.arange(rows), 50), drawn] > 0)


@settings(max_examples=300, deadline=None)
@given(a=st.integers(1, 2**53), b=st.integers(1, 2**53))
def test_log_ratio_upper_never_understates(a, b):
    """The certified ε of every finite mechanism rests on this bound: compared with a 60-digit logarithm."""
    from decimal import Decimal, getcontext

    getcontext().prec = 60
    exact_value = Decimal(a).ln() - Decimal(b).ln()
    bound = float(dyadic.log_ratio_upper(a, b))
    assert Decimal(bound) >= exact_value
    larger_log = max(np.log(float(a)), np.log(float(b)))
    assert Decimal(bound) - exact_value <= Decimal(8 * float(np.spacing(larger_log)))  # and tight: a few ulps


def test_chunked_sampling_and_value_tables_release_what_the_index_path_releases():
    """sample() works SAMPLING_CHUNK labels at a time and reads output values from per-cell tables; with the same
    generator it must release exactly what one pass over output indices releases (the draws are the same words)."""
    from shared.mechanisms.finite import SAMPLING_CHUNK

    rng = np.random.default_rng(11)
    values = np.array([1.0, 2.0, 5.0, 7.0, 9.0])
    matrix = rng.dirichlet(np.ones(6), size=5) * 0.5 + 0.5 / 6  # ε-DP for a generous ε
    mechanism = FiniteRandomizer.from_probabilities("m", 5.0, values, np.linspace(-3, 12, 6), matrix)
    labels = rng.choice(values, size=3 * SAMPLING_CHUNK + 17)
    released = mechanism.sample(labels, np.random.default_rng(5))
    by_index = mechanism.output_values[mechanism.sample_indices(mechanism.row_of(labels), np.random.default_rng(5))]
    assert mechanism._value_tables is not None and np.array_equal(released, by_index)
    counts = np.array([[np.count_nonzero(released[labels == v] == o) for o in mechanism.output_values]
                       for v in values])
    expected = counts.sum(axis=1, keepdims=True) * mechanism.matrix
    assert stats.chisquare(counts.ravel(), expected.ravel(), ddof=0).pvalue > 1e-3
