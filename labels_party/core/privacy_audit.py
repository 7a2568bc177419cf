"""An empirical privacy auditor: a statistically valid lower bound on a mechanism's ε from its samples alone.

For label DP, any two labels y, y' are neighbours. For an output event E, ε >= log(Pr[M(y) ∈ E] / Pr[M(y') ∈ E]);
the auditor samples M on candidate labels and turns that inequality into a 95 % lower bound:

1. ``samples`` draws per candidate label, split in half. On the *selection* half, every pair of candidates and
   every event — each single output value, and for ordered outputs each tail {out >= c} and {out <= c} — is
   scored by the log-ratio of Clopper–Pearson bounds, and the best (pair, event) is chosen.
2. On the *estimation* half, that one event gets a one-sided Clopper–Pearson lower bound on Pr[M(y) ∈ E] and an
   upper bound on Pr[M(y') ∈ E], each at 97.5 %; with probability >= 95 % both hold, and then
   ε >= log(lower / upper). Choosing on one half and estimating on the other keeps the bound valid however many
   events were searched (the approach of Jagielski, Ullman & Oprea, "Auditing Differentially Private Machine
   Learning", 2020).

A bound above a mechanism's certified ε would prove the implementation wrong; a bound close to it shows the
auditor has power. Candidates: every label when there are at most 64, otherwise the two lowest, the two highest
and two in the middle (extreme and adjacent pairs).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from shared.errors import ErrorCode, LabelDPError

MAX_ALL_PAIRS = 64
CONFIDENCE = 0.95


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    certified_epsilon: float
    empirical_epsilon_lower_bound: float
    samples: int  # per candidate label (half for selection, half for estimation)
    worst_pair: tuple[float, float]
    event: str
    probability_bounds: tuple[float, float]  # (lower bound under the first label, upper bound under the second)
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict:
        return asdict(self)


def candidate_labels(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.size <= MAX_ALL_PAIRS:
        return values
    middle = values.size // 2
    return values[np.unique([0, 1, middle - 1, middle, values.size - 2, values.size - 1])]


def _codes(outputs: np.ndarray) -> tuple[np.ndarray, bool]:
    """Outputs as a 1-d array of comparable codes, and whether they are ordered (numbers) or categorical (sets)."""
    outputs = np.asarray(outputs)
    if outputs.ndim == 2:  # label sets (subset selection): one bit per class
        if outputs.shape[1] > 62:
            raise LabelDPError("cannot audit sets over more than 62 classes", code=ErrorCode.INVALID_REQUEST)
        return outputs.astype(np.int64) @ (np.int64(1) << np.arange(outputs.shape[1], dtype=np.int64)), False
    return outputs.astype(np.float64), True


@dataclass(frozen=True)
class _Histogram:
    values: np.ndarray  # sorted distinct outputs
    counts: np.ndarray
    total: int

    @classmethod
    def of(cls, codes: np.ndarray) -> _Histogram:
        values, counts = np.unique(codes, return_counts=True)
        return cls(values, counts, int(codes.size))

    def on(self, grid: np.ndarray) -> np.ndarray:
        """Counts at each grid value (0 where this histogram has none)."""
        index = np.minimum(np.searchsorted(self.values, grid), self.values.size - 1)
        return np.where(self.values[index] == grid, self.counts[index], 0)


def _events(a: _Histogram, b: _Histogram, ordered: bool) -> tuple[np.ndarray, np.ndarray, list]:
    """(counts under a, counts under b, descriptions) for every event over the union of observed outputs."""
    grid = np.union1d(a.values, b.values)
    ca, cb = a.on(grid), b.on(grid)
    counts_a, counts_b = [ca], [cb]
    kinds = [("==", grid)]
    if ordered:
        counts_a += [np.cumsum(ca[::-1])[::-1], np.cumsum(ca)]
        counts_b += [np.cumsum(cb[::-1])[::-1], np.cumsum(cb)]
        kinds += [(">=", grid), ("<=", grid)]
    return np.concatenate(counts_a), np.concatenate(counts_b), kinds


def _describe(kinds: list, flat_index: int) -> str:
    for op, grid in kinds:
        if flat_index < grid.size:
            value = grid[flat_index]
            return f"output {op} {value:g}" if isinstance(value, float) else f"output set = {int(value):#b}"
        flat_index -= grid.size
    raise IndexError(flat_index)


def _cp_lower(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    return np.where(k > 0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)


def _cp_upper(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    return np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)


def audit(mechanism, labels, samples: int, rng: np.random.Generator) -> AuditResult:
    """Sample ``mechanism`` ``samples`` times on each candidate label and return the 95 % lower bound on ε."""
    if samples < 100:
        raise LabelDPError("an audit needs at least 100 samples per label", code=ErrorCode.INVALID_REQUEST)
    alpha = (1 - CONFIDENCE) / 2  # two one-sided bounds, Bonferroni
    candidates = candidate_labels(labels)
    half = samples // 2
    selection, estimation, ordered = {}, {}, True
    for label in candidates:
        codes, ordered = _codes(mechanism.sample(np.full(2 * half, label), rng))
        selection[label], estimation[label] = _Histogram.of(codes[:half]), _Histogram.of(codes[half:])
    if candidates.size <= MAX_ALL_PAIRS:
        pairs = list(itertools.permutations(candidates, 2))
    else:  # extremes and neighbours among the candidates, both directions
        ends = [(candidates[0], candidates[-1])] + list(itertools.pairwise(candidates))
        pairs = ends + [(b, a) for a, b in ends]
    best: tuple[float, tuple[Any, Any], list, int] | None = None
    for a, b in pairs:
        ka, kb, kinds = _events(selection[a], selection[b], ordered)
        score = np.log(np.maximum(_cp_lower(ka, half, alpha), 1e-300)) - np.log(_cp_upper(kb, half, alpha))
        index = int(np.argmax(score))
        if best is None or score[index] > best[0]:
            best = (float(score[index]), (a, b), kinds, index)
    assert best is not None  # there are at least two candidates, so at least one pair
    _, (a, b), kinds, index = best
    description = _describe(kinds, index)
    # the chosen event, counted afresh on the estimation half
    event_a, event_b = _event_count(estimation[a], kinds, index), _event_count(estimation[b], kinds, index)
    lower = float(_cp_lower(event_a, estimation[a].total, alpha))
    upper = float(_cp_upper(event_b, estimation[b].total, alpha))
    bound = max(0.0, math.log(lower / upper)) if lower > 0 else 0.0
    return AuditResult(mechanism.name, float(mechanism.certified_epsilon), bound, 2 * half, (float(a), float(b)),
                       description, (lower, upper))


def _event_count(histogram: _Histogram, kinds: list, flat_index: int) -> int:
    """How many of ``histogram``'s outputs fall in the event chosen on the selection half."""
    for op, grid in kinds:
        if flat_index < grid.size:
            value = grid[flat_index]
            if op == "==":
                return int(histogram.counts[histogram.values == value].sum())
            if op == ">=":
                return int(histogram.counts[histogram.values >= value].sum())
            return int(histogram.counts[histogram.values <= value].sum())
        flat_index -= grid.size
    raise IndexError(flat_index)
