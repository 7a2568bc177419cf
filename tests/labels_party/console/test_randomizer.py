"""A release's randomizer as a bounded matrix (labels_party/http/console/randomizer.py): block averages of the
mechanism's own probabilities, from its public description, without ever expanding randomized response."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from labels_party.http.console import randomizer
from shared.mechanisms.finite import FiniteRandomizer
from shared.mechanisms.randomized_response import randomized_response, rr_on_bins
from shared.mechanisms.subset import SubsetSelectionRandomizer


def _blocks_by_hand(matrix: np.ndarray, cells: int) -> np.ndarray:
    """The definition: rows split into consecutive blocks (averaged), columns into consecutive blocks (summed)."""
    row_blocks = np.array_split(np.arange(matrix.shape[0]), min(cells, matrix.shape[0]))
    col_blocks = np.array_split(np.arange(matrix.shape[1]), min(cells, matrix.shape[1]))
    return np.array([[matrix[np.ix_(r, c)].sum(axis=1).mean() for c in col_blocks] for r in row_blocks])


@pytest.mark.parametrize("shape, cells", [((100, 150), 48), ((7, 5), 48), ((48, 200), 48), ((1000, 3), 16)])
def test_dense_blocks_are_block_averages_and_rows_still_sum_to_one(shape, cells):
    rng = np.random.default_rng(7)
    matrix = rng.random(shape)
    matrix /= matrix.sum(axis=1, keepdims=True)
    blocks = randomizer.downsample_dense(matrix, cells)
    assert blocks.shape == (min(shape[0], cells), min(shape[1], cells))
    np.testing.assert_allclose(blocks.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(blocks, _blocks_by_hand(matrix, cells), rtol=1e-12)
    if shape[0] <= cells and shape[1] <= cells:
        np.testing.assert_allclose(blocks, matrix)  # nothing to downsample: the matrix itself


@pytest.mark.parametrize("size", [5, 60, 500])
def test_randomized_response_blocks_equal_the_dense_matrix_blocks(size):
    mechanism = randomized_response(np.arange(size, dtype=float), 1.3)
    description = mechanism.describe()
    blocks = randomizer.blocks(description)
    np.testing.assert_allclose(blocks.matrix, randomizer.downsample_dense(mechanism.matrix), rtol=1e-12, atol=1e-15)
    assert (blocks.num_inputs, blocks.num_outputs) == (size, size)
    assert blocks.downsampled == (size > randomizer.MAX_CELLS)


def test_rr_on_bins_blocks_follow_the_bins():
    values = np.arange(300, dtype=float)
    bins = (values // 40).astype(np.int64)  # 8 bins
    mechanism = rr_on_bins(values, bins, np.arange(8) * 40 + 20.0, 2.0)
    blocks = randomizer.blocks(mechanism.describe())
    assert blocks.matrix.shape == (48, 8)
    np.testing.assert_allclose(blocks.matrix, randomizer.downsample_dense(mechanism.matrix), rtol=1e-12)


def test_a_finite_randomizer_is_read_from_its_exact_counts():
    rng = np.random.default_rng(3)
    probabilities = rng.random((60, 90)) + 1.0
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    mechanism = FiniteRandomizer.from_probabilities("opt-unbiased", 5.0, np.arange(60), np.linspace(-5, 64, 90),
                                                    probabilities)
    blocks = randomizer.blocks(mechanism.describe())
    np.testing.assert_allclose(blocks.matrix, randomizer.downsample_dense(mechanism.matrix), rtol=1e-12)
    assert blocks.inputs == ("0", "59") and blocks.outputs == ("-5", "64")


def test_a_wide_randomized_response_is_never_expanded():
    values = np.arange(50_000, dtype=float)
    description = rr_on_bins(values, (values // 1000).astype(np.int64), np.arange(50) * 1000 + 500.0,
                             1.0).describe()
    tracemalloc.start()  # never expanded: what it allocates, not how long it takes (which load stretches)
    try:
        blocks = randomizer.blocks(description)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # 1.2 MB; one row per label (50,000 × 48) would be 19 MB, the matrix 20 GB
    assert blocks.matrix.shape == (48, 48)
    np.testing.assert_allclose(blocks.matrix.sum(axis=1), 1.0, rtol=1e-12)
    plain = randomizer.blocks(randomized_response(values, 1.0).describe())
    assert plain.matrix.shape == (48, 48) and plain.num_outputs == 50_000


def test_subset_blocks_are_inclusion_probabilities():
    mechanism = SubsetSelectionRandomizer.build(10, 1.0)
    p, q = mechanism.inclusion_probabilities
    blocks = randomizer.blocks(mechanism.describe())
    expected = np.full((10, 10), q)
    np.fill_diagonal(expected, p)
    np.testing.assert_allclose(blocks.matrix, expected, rtol=1e-12)
    wide = randomizer.blocks(SubsetSelectionRandomizer.build(200, 1.0).describe())
    np.testing.assert_allclose(wide.matrix, randomizer.downsample_dense(
        np.where(np.eye(200, dtype=bool), *SubsetSelectionRandomizer.build(200, 1.0).inclusion_probabilities)),
        rtol=1e-12)


def test_additive_noise_and_other_releases_have_no_matrix():
    assert randomizer.blocks({"mechanism": "laplace", "noise": {"type": "discrete-laplace", "scale": 3.0}}) is None
    assert randomizer.blocks({"mechanism": "evaluation", "value": 1.5}) is None


def test_sampled_values_and_summed_bars_are_bounded():
    values = list(np.linspace(0, 1, 1000))
    picked = randomizer.sample_values(values, 32)
    assert len(picked) == 32 and picked[0] == (0, "0") and picked[-1] == (999, "1")
    assert randomizer.sample_values([]) == [] and randomizer.sample_values([2.5]) == [(0, "2.5")]
    bars = randomizer.summed_bars(list(range(1000)), 64)
    assert bars.size == 64 and bars.sum() == sum(range(1000))
