"""Staircase columns over interval high sets: the arithmetic the continuous optimal unbiased solver is made of.

A column of the optimal unbiased randomizer (Claim 12 and Theorem 6 of the optimal-unbiased paper) is a weight
times the staircase vector s_y = e^ε on an interval [first, last] of the sorted labels and 1 elsewhere. Every sum
over labels that the solver needs — the column's prior mass A, first and second moments, its cost at an output
value t, its inner product with dual variables — is a difference of prefix sums, so a column is two integers and
each such quantity is O(1): nothing the solver keeps is |Y| long per column. Working sets of intervals are plain
integer arrays (``first``, ``last``); an interval's code ``first·|Y| + last`` dedupes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sparse


@dataclass(frozen=True, eq=False)
class Problem:
    """Sorted labels ``y`` (scaled), their prior ``p`` (sums to 1) and e = e^ε."""

    y: np.ndarray
    p: np.ndarray
    e: float

    @property
    def k(self) -> int:
        return int(self.y.size)

    @cached_property
    def _prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Prefix sums (leading 0) of p, p y and p y²."""
        zero = np.zeros(1)
        return (np.concatenate([zero, np.cumsum(self.p)]), np.concatenate([zero, np.cumsum(self.p * self.y)]),
                np.concatenate([zero, np.cumsum(self.p * self.y**2)]))

    def inside(self, first, last) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Σ p, Σ p y, Σ p y² over each interval."""
        c0, c1, c2 = self._prefix
        first, last = np.asarray(first), np.asarray(last) + 1
        return c0[last] - c0[first], c1[last] - c1[first], c2[last] - c2[first]

    def moments(self, first, last) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A = Σ s p, P = Σ s p y, D = ½ Σ s p y² of each interval's staircase vector s (1 outside, e inside)."""
        c0, c1, c2 = self._prefix
        m0, m1, m2 = self.inside(first, last)
        lift = self.e - 1.0
        return c0[-1] + lift * m0, c1[-1] + lift * m1, 0.5 * (c2[-1] + lift * m2)

    def column_costs(self, first, last, t) -> np.ndarray:
        """Σ_y p_y v_y ½ (t − y)² for the vectors v scaled to a maximum of 1 (e^-ε outside, 1 inside)."""
        a, p, d = self.moments(first, last)
        return (0.5 * a * t * t - p * t + d) / self.e

    def signature_rows(self, first, last, weights=None) -> sparse.csr_matrix:
        """(intervals × k) rows of s·x written on the prefix sums X_j = x_0 + … + x_j of x: s·x = X_{k−1} +
        (e − 1)(X_last − X_{first−1}), so each row has at most three nonzeros; rows are multiplied by
        ``weights``."""
        first, last = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64)
        count, k, lift = first.size, self.k, self.e - 1.0
        weights = np.ones(count) if weights is None else np.asarray(weights, dtype=np.float64)
        rows = np.arange(count)
        entries = [(rows, np.full(count, k - 1), weights),
                   (rows, last, lift * weights)]
        inner = first >= 1
        entries.append((rows[inner], first[inner] - 1, -lift * weights[inner]))
        r, c, v = (np.concatenate(part) for part in zip(*entries, strict=True))
        return sparse.csr_matrix((v, (r, c)), shape=(count, k))  # duplicates (last = k − 1) are summed

    def vector_sums(self, first, last, weights) -> np.ndarray:
        """Σ_j weights_j v_j(y) for every label y, with v_j scaled to a maximum of 1 (O(intervals + k))."""
        steps = np.zeros(self.k + 1)
        lift = 1.0 - 1.0 / self.e
        np.add.at(steps, first, lift * weights)
        np.add.at(steps, np.asarray(last) + 1, -lift * weights)
        return np.sum(weights) / self.e + np.cumsum(steps[:-1])

    def differenced_columns(self, first, last, t) -> sparse.csc_matrix:
        """(2k × intervals) columns of the equality rows written as row y minus row y − 1 (an invertible change
        of the system): the normalization block of a scaled staircase vector then has nonzeros only at 0, first
        and last + 1, and the unbiasedness block is the same times t — at most six entries per column."""
        first, last = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64)
        count, k = first.size, self.k
        t = np.asarray(t, dtype=np.float64)
        columns = np.arange(count)
        lift = 1.0 - 1.0 / self.e
        r = [np.zeros(count, dtype=np.int64)]
        c = [columns]
        v = [np.where(first == 0, 1.0, 1.0 / self.e)]
        inner = first >= 1
        r.append(first[inner])
        c.append(columns[inner])
        v.append(np.full(int(inner.sum()), lift))
        ends = last + 1 < k
        r.append(last[ends] + 1)
        c.append(columns[ends])
        v.append(np.full(int(ends.sum()), -lift))
        rows, cols, vals = np.concatenate(r), np.concatenate(c), np.concatenate(v)
        return sparse.csc_matrix((np.concatenate([vals, vals * t[cols]]),
                                  (np.concatenate([rows, rows + k]), np.concatenate([cols, cols]))),
                                 shape=(2 * k, count))


def codes(k: int, first, last) -> np.ndarray:
    return np.asarray(first, dtype=np.int64) * k + np.asarray(last, dtype=np.int64)


def decode(k: int, code) -> tuple[np.ndarray, np.ndarray]:
    code = np.asarray(code, dtype=np.int64)
    return code // k, code % k


def band(k: int, first, last, radius: int) -> np.ndarray:
    """Codes of the intervals whose ends are within ``radius`` of one of the given intervals (sorted, unique)."""
    shifts = np.arange(-radius, radius + 1)
    f, g = np.broadcast_arrays(np.asarray(first)[:, None, None] + shifts[None, :, None],
                               np.asarray(last)[:, None, None] + shifts[None, None, :])
    f, g = f.ravel(), g.ravel()
    ok = (f >= 0) & (g < k) & (f <= g)
    return np.unique(codes(k, f[ok], g[ok]))


def heaviest_path(k: int, first, last, weights) -> np.ndarray:
    """Indices of the intervals on the heaviest monotone path through the given ones: from some [0, l] to some
    [f, |Y| − 1], each step moving one end by one (Theorem 6's structure of the optimal randomizer's high sets).
    A dynamic program over the intervals in order of first + last; intervals off the path are never on it."""
    first, last = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64)
    position = {int(code): i for i, code in enumerate(codes(k, first, last))}
    best = np.full(first.size, -np.inf)
    previous = np.full(first.size, -1)
    for i in np.argsort(first + last, kind="stable"):
        f, g = int(first[i]), int(last[i])
        steps = [j for j in (position.get((f - 1) * k + g), position.get(f * k + g - 1))
                 if j is not None and np.isfinite(best[j])]
        if steps:
            j = max(steps, key=lambda j: best[j])
            best[i], previous[i] = best[j] + weights[i], j
        elif f == 0:
            best[i] = weights[i]
    ends = np.flatnonzero((last == k - 1) & np.isfinite(best))
    if not ends.size:
        return np.zeros(0, dtype=np.int64)
    path, at = [], int(ends[np.argmax(best[ends])])
    while at >= 0:
        path.append(at)
        at = int(previous[at])
    return np.array(path[::-1], dtype=np.int64)
