"""Exact sampling from finite distributions, so that certification can use the probabilities actually sampled.

A row of probabilities is stored as integer thresholds ``0 = T[-1] <= T[0] <= ... <= T[m-1] = 2**53``. Sampling
draws an integer ``u`` uniformly from ``[0, 2**53)`` and returns the first ``j`` with ``u < T[j]``. Hence output
``j`` is produced with probability exactly ``(T[j] - T[j-1]) / 2**53`` — a dyadic rational that float64 represents
exactly. Every privacy and utility number of a finite mechanism is computed from these realized probabilities,
never from the (rounded, solver-tolerance-laden) floats it was built from.
"""

from __future__ import annotations

import numpy as np

RESOLUTION_BITS = 53
RESOLUTION = 1 << RESOLUTION_BITS  # 2**53: every count and every count / 2**53 is exact in float64


def quantize_rows(probabilities: np.ndarray) -> np.ndarray:
    """Integer counts (each row sums to exactly 2**53) nearest to the given row-stochastic matrix.

    Rounding is done on the cumulative sums, so each entry moves by less than one unit (2**-53) and the row
    total is exact by construction.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    cumulative = np.cumsum(probabilities, axis=1)
    cumulative /= cumulative[:, -1:]
    thresholds = np.rint(cumulative * RESOLUTION).astype(np.int64)
    thresholds[:, -1] = RESOLUTION
    thresholds = np.maximum.accumulate(thresholds, axis=1)
    return np.diff(thresholds, axis=1, prepend=0)


def log_ratio_bound(counts: np.ndarray) -> float:
    """max over columns of log(max_row / min_row) for a nonnegative count matrix (columns = outputs).

    Columns that are zero in every row are never sampled and impose nothing; a column that is zero in some rows
    but not others gives +inf (that output would identify the input).
    """
    counts = np.asarray(counts)
    high = counts.max(axis=0)
    low = counts.min(axis=0)
    used = high > 0
    if np.any(low[used] == 0):
        return float("inf")
    if not np.any(used):
        return 0.0
    # log(a) - log(b) of integers below 2**53 (exact as floats); np.log is correctly rounded to ~1 ulp.
    return float(np.max(np.log(high[used].astype(np.float64)) - np.log(low[used].astype(np.float64))))


def sample_rows(counts: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each entry of ``rows`` (an input index), draw an output index from that row of ``counts``."""
    rows = np.asarray(rows, dtype=np.int64).ravel()
    thresholds = np.cumsum(counts, axis=1)
    draws = rng.integers(0, RESOLUTION, size=rows.size, dtype=np.int64)
    out = np.empty(rows.size, dtype=np.int64)
    if rows.size == 0:
        return out
    # Group the draws by input row (a stable radix sort for small integer keys), then one binary search per row.
    key = rows.astype(np.int16) if counts.shape[0] < 32_768 else rows
    order = np.argsort(key, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=counts.shape[0]))])
    for row in np.flatnonzero(np.diff(bounds)):
        members = order[bounds[row]:bounds[row + 1]]
        out[members] = np.searchsorted(thresholds[row], draws[members], side="right")
    return out
