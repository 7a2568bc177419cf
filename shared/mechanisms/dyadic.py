"""Exact sampling from finite distributions, so that certification can use the probabilities actually sampled.

A row of probabilities is stored as integer counts summing to ``2**53``; output ``j`` is produced with probability
exactly ``counts[j] / 2**53`` — a dyadic rational that float64 represents exactly — by an alias table built in
integer arithmetic (:class:`AliasTable`) from one uniform 53-bit draw per label. Every privacy and utility number
of a finite mechanism is computed from these realized probabilities, never from the (rounded,
solver-tolerance-laden) floats it was built from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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


def rows_are_distributions(counts: np.ndarray) -> bool:
    """Whether every row of an integer count matrix is a distribution over 2**53: entries in [0, 2**53] summing to
    exactly 2**53. The int64 row sum alone is not enough for counts read from a document: 1025 entries of up to 2**53
    can reach 2**63 and wrap around to exactly 2**53. Such a row's float64 sum is at least ~2**63, while a true
    2**53 sums in float64 to within a factor 1 + m·2**-53 of it, so requiring the float sum below 2**54 rules the
    wrap out."""
    counts = np.asarray(counts)
    if counts.ndim != 2 or np.any(counts < 0) or np.any(counts > RESOLUTION):
        return False
    return bool(np.all(counts.sum(axis=1) == RESOLUTION)
                and np.all(counts.sum(axis=1, dtype=np.float64) < 2.0 * RESOLUTION))


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
    return float(np.max(log_ratio_upper(high[used], low[used])))


def log_ratio_upper(numerator, denominator) -> np.ndarray:
    """An upper bound on log(numerator / denominator) for positive integers below 2**53 (exact as floats): the
    float difference of the logs plus four units in the last place of the larger log. Each log is within one ulp
    (libm), and the subtraction adds at most one more, so the exact value can be a few ulps above the computed
    difference (measured: up to 7e-15); the certified ε must never be understated."""
    numerator, denominator = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    log_num, log_den = np.log(numerator), np.log(denominator)
    bound = log_num - log_den + 4 * np.spacing(np.maximum(np.abs(log_num), np.abs(log_den)))
    return np.where(numerator == denominator, 0.0, bound)  # a ratio of exactly 1 is exactly 0


@dataclass(frozen=True, eq=False)
class AliasTable:
    """Walker's alias method in exact integer arithmetic (Vose's construction), for every row of a count matrix.

    The m outputs are padded with zero-count outputs to M = 2^b buckets, so that each bucket holds exactly
    C = 2**53 / M units. One uniform 53-bit draw w gives the bucket j = w >> (53 - b) and a uniform u = w mod C
    within it; the output is j if u < threshold[j], else alias[j]. Vose's construction only adds and subtracts
    integers, so Pr[output = x] = (Σ_j [j = x]·threshold[j] + [alias[j] = x]·(C − threshold[j])) / 2**53 equals
    counts[x] / 2**53 exactly (``distribution`` recomputes it; the tests compare integers). Sampling is a handful
    of vectorized passes with no sort.
    """

    threshold: np.ndarray  # rows x M, in [0, C]
    alias: np.ndarray  # rows x M
    bits: int  # M = 2**bits

    @classmethod
    def of(cls, counts: np.ndarray) -> AliasTable:
        counts = np.asarray(counts, dtype=np.int64)
        rows, m = counts.shape
        bits = max(0, (m - 1).bit_length())
        buckets = 1 << bits
        capacity = RESOLUTION >> bits
        mass = np.zeros((rows, buckets), dtype=np.int64)
        mass[:, :m] = counts
        threshold = np.full((rows, buckets), capacity, dtype=np.int64)
        alias = np.tile(np.arange(buckets, dtype=np.int64), (rows, 1))
        # Per-row stacks of under- and over-full buckets, processed for all rows at once: each round pairs one
        # under-full bucket l with one over-full g in every row that still has both (at most M rounds).
        small = mass < capacity
        order = np.argsort(~small, axis=1, kind="stable")  # small buckets first
        n_small = small.sum(axis=1)
        small_stack = order.copy()
        large_stack = np.argsort(small, axis=1, kind="stable")  # large buckets first
        n_large = buckets - n_small
        while True:
            active = np.flatnonzero((n_small > 0) & (n_large > 0))
            if active.size == 0:
                break
            n_small[active] -= 1
            low = small_stack[active, n_small[active]]
            high = large_stack[active, n_large[active] - 1]
            threshold[active, low] = mass[active, low]
            alias[active, low] = high
            mass[active, high] -= capacity - mass[active, low]
            moved = mass[active, high] < capacity
            movers = active[moved]
            n_large[movers] -= 1
            small_stack[movers, n_small[movers]] = high[moved]
            n_small[movers] += 1
        # What is left in either stack holds exactly `capacity` (integer arithmetic): it keeps itself.
        return cls(threshold, alias, bits)

    def distribution(self) -> np.ndarray:
        """The exact counts (over 2**53) this table samples, per row and bucket."""
        rows, buckets = self.threshold.shape
        capacity = RESOLUTION >> self.bits
        out = self.threshold.copy()
        np.add.at(out, (np.repeat(np.arange(rows), buckets), self.alias.ravel()), (capacity - self.threshold).ravel())
        return out

    def draw(self, rows: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(the (row, bucket) cell of each draw in the flattened tables, whether the bucket's own output is taken),
        from one uniform 53-bit integer draw per row: its top ``bits`` bits pick the bucket, the rest is the uniform
        position inside it. Each step is one vectorized pass (callers pass chunks of ~10^5 rows, so the passes stay
        in cache)."""
        draws = rng.integers(0, RESOLUTION, size=rows.size, dtype=np.int64)
        within_bits = RESOLUTION_BITS - self.bits
        cell = np.asarray(rows, dtype=np.int64).ravel() << self.bits
        cell |= draws >> within_bits
        draws &= (1 << within_bits) - 1
        return cell, draws < self._flat_threshold[cell]

    def sample(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One output index per row index."""
        cell, own = self.draw(rows, rng)
        return np.where(own, cell & ((1 << self.bits) - 1), self.flat_alias[cell])

    @cached_property
    def _flat_threshold(self) -> np.ndarray:
        return np.ascontiguousarray(self.threshold).ravel()

    @cached_property
    def flat_alias(self) -> np.ndarray:
        return np.ascontiguousarray(self.alias).ravel()
