"""DP quantiles of a dataset's labels: how a user chooses clip bounds without looking at the labels undisguised.

**Candidates.** The dataset's declared domain is the public outer range, and its finite support the candidate
values: the integers of an integer range, the listed values of a finite domain, the grid of a continuous one
(``grid_size`` points over [min, max]). Class labels have no order: refused. Every declared domain has finite
bounds (:mod:`shared.domains` refuses others), so no candidate lies outside them.

**Heavy tails** (``candidates: "log"``). On a wide declared range the support's values are spread evenly, so a
high quantile of heavy-tailed labels — wealth, prices, costs — has few candidates near it and very many in the
nearly empty tail above it: each tail candidate's weight is small, but their number wins, and the draw lands far
out (a 0.99 quantile at the 99.97th percentile, 1310 against a true 224.6, issue 39). With ``log`` the candidates
are spaced geometrically instead — :data:`LOG_POINTS` per sign from the support's smallest non-zero magnitude to
its largest, with 0 and both ends, snapped to the support — so every order of magnitude carries about the same
number of candidates and the draw's error is relative, a few candidates' ratio (Durfee, "Unbounded Differentially
Private Quantile and Maximum Estimation", NeurIPS 2023, which searches a geometric sequence of thresholds for the
same reason; the exponential mechanism itself is unchanged). The candidate set is a function of the public domain
alone.

**Mechanism.** For a quantile q of n covered labels, candidate v's penalty is

    D(v) = max(2·#{y < v} − R, R − 2·#{y ≤ v}, 0),   R = round(2·q·n),

twice the distance from the target rank q·n (rounded to a half: n is public, so R is) to the interval of ranks
[#{y < v}, #{y ≤ v}] that v covers — 0 exactly when v is a q-quantile of the labels, ties included. Changing one
label moves each count by at most 1, so D moves by at most 2: the exponential mechanism with weights
exp(−(ε_q/4)·D) = exp(ε_q·u/2) for the utility u = −D/2 of sensitivity 1 is ε_q-DP (McSherry & Talwar 2007,
Theorem 6; Smith 2011 for quantiles). It is sampled exactly (:mod:`shared.mechanisms.exponential`: a rational
rate, integer draws from the release's cryptographic source, no floats).

**Several quantiles** split ε evenly by basic composition: each is an independent draw at ε_q = ε·(1 − 10⁻¹²)/k
(the margin keeps the floating-point sum of the k certified ε inside the exact charge). The release's event is
the composition of k pure-ε :class:`~shared.mechanisms.events.ExponentialMechanismDpEvent`; its certified ε,
k·(4·s/t) rounded up, is at most ε, which every covered example is charged.

**Timing.** The exact sampler rejects until it keeps a candidate, and counting the labels' ranks runs a binary
search per label, so their running time depends on the labels. Counting and the draws therefore run inside
:func:`at_least`, padded to a floor computed from public inputs alone (:func:`draw_floor_seconds`: the number of
labels, of candidates and of quantiles), a few times the slowest time measured on the labels that cost most
(``bench/quantile_timing.py``); a computation that fails is padded too; one that overruns the floor (a machine much
busier or slower than the one it was measured on) is padded to the next doubling of the floor, so that its time
says only which of a few doublings it took, and logged for the operator. The sampler's own arithmetic is the same
whatever the penalties (:meth:`ExactExponential._split`, with the public bound 2n on them). The release-seconds
quota debits the padded wall-clock time, not the CPU time, which the padding does not hide
(:mod:`labels_party.runtime.quotas`). Not padded: the lookup of requested ids before the charge, which reads the label
version file as every release kind's does (its time follows that whole file's size and compression, the same for
every request on the version, not the requested examples' labels).

Why not OpenDP's ``make_private_quantile`` (its Rust core scores the candidates and runs report-noisy-max with
exact noise from its own cryptographic RNG): it draws from a source the service cannot inject, so neither a seeded
test nor a benchmark can reproduce a release, and its neighbouring relation is insert/delete or symmetric distance
over the dataset — here the examples are public and a neighbour changes one label, which the penalty above is
calibrated to directly.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from dp_accounting import dp_event

from shared.domains import Domain
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms import events
from shared.mechanisms.events import AboveThresholdDpEvent, ExponentialMechanismDpEvent
from shared.mechanisms.exponential import ExactExponential
from shared.mechanisms.integer_noise import DiscreteLaplace, _round_up
from shared.privacy import COMPOSITION_MARGIN, check_epsilon
from shared.schemas import MAX_QUANTILES

log = logging.getLogger(__name__)
PENALTY_SENSITIVITY = 2  # D counts ranks twice (half-integer targets): one label moves it by at most 2
MECHANISM = "quantiles"
# The floor (module docstring, "Timing"), from bench/quantile_timing.py's slowest cases on this 2-core machine
# (docs/results/quantile-timing.json): counting 0.35 µs per label (10⁶ labels over 10⁵ candidates, both cores busy),
# a draw 0.7 ms over 52 candidates and 26 ms over 10⁵ (0.26 µs per candidate: the penalties and a batch of 1.3·10⁵
# exact Bernoulli trials); each constant allows four to eight times that (slack 4.2 in the tightest case, idle).
SECONDS_PER_LABEL = 2e-6
DRAW_SECONDS = 0.006  # per quantile
DRAW_SECONDS_PER_CANDIDATE = 1e-6  # per quantile and candidate
MIN_SECONDS = 0.25


def draw_floor_seconds(labels: int, candidates: int, quantiles: int) -> float:
    """How long counting ``labels`` and the draws take at least, from public inputs only (module docstring,
    "Timing")."""
    return max(MIN_SECONDS, labels * SECONDS_PER_LABEL
               + quantiles * (DRAW_SECONDS + DRAW_SECONDS_PER_CANDIDATE * candidates))


@contextmanager
def at_least(seconds: float) -> Iterator[None]:
    """Take at least ``seconds``: what runs inside ends at the floor, whatever its own running time — and so does
    a failure inside (its answer, 503 ``release_failed``, is the same for every cause; its timing must be too)."""
    started = time.monotonic()
    try:
        yield
    finally:
        spent = time.monotonic() - started
        target = seconds
        if spent >= seconds > 0:  # over the floor (a machine far busier than measured): its timing would follow the
            # labels; padded to the next doubling of the floor, it says only which of a few doublings it took
            target = seconds * 2 ** math.ceil(math.log2(spent / seconds))
            log.warning("quantile counting and draws took %.2f s, over their floor of %.2f s: padded to %.2f s",
                        spent, seconds, target)
        if spent < target:
            time.sleep(target - spent)


def check_quantiles(quantiles: Sequence[float]) -> tuple[float, ...]:
    """Strictly increasing numbers in (0, 1), at most :data:`MAX_QUANTILES` — a public request's refusals."""
    values = tuple(float(q) for q in quantiles)
    if not values or len(values) > MAX_QUANTILES:
        raise LabelDPError(f"ask for 1 to {MAX_QUANTILES} quantiles", code=ErrorCode.INVALID_INPUT)
    if not all(0.0 < q < 1.0 for q in values):
        raise LabelDPError("quantiles must lie strictly between 0 and 1", code=ErrorCode.INVALID_INPUT)
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise LabelDPError("quantiles must be sorted and distinct (strictly increasing)", code=ErrorCode.INVALID_INPUT)
    return values


@dataclass(frozen=True)
class AboveThreshold:
    """One quantile's sweep (``method: "above-threshold"``), from the end of the candidates farther from the
    quantile: for q ≥ 1/2 upward, the first candidate v whose count of labels at or below it, plus ``query`` noise,
    reaches round(q·n) plus ``threshold`` noise; for q < 1/2 downward, the first whose count at or above it reaches
    round((1 − q)·n) so. Far from the quantile the count is far from the target, so the noise seldom stops a sweep
    early; the candidates beyond the answer are never reached. Counts move by at most 1 when one label changes,
    all in one direction (monotone), so discrete Laplace noise of ε/2 on each side makes the sweep ε-DP
    (:class:`~shared.mechanisms.events.AboveThresholdDpEvent`). Every candidate's noise is drawn, wherever the
    sweep stops: its time depends on the (public) number of candidates only."""

    threshold: DiscreteLaplace
    query: DiscreteLaplace

    @classmethod
    def calibrated(cls, epsilon: Fraction) -> AboveThreshold:
        half = epsilon / 2
        return cls(DiscreteLaplace.calibrated(half, 1), DiscreteLaplace.calibrated(half, 1))

    @property
    def epsilon(self) -> Fraction:
        return self.threshold.epsilon(1) + self.query.epsilon(1)

    def sample(self, counts: RankCounts, quantile: float, rng: np.random.Generator) -> int:
        """The index of the candidate where the sweep stops (the last one swept if it never does)."""
        n = counts.total
        upward = quantile >= 0.5
        if upward:
            swept, target = counts.at_most(), round(Fraction(quantile) * n)
        else:  # #{y >= v} = n − #{y < v}, from the highest candidate down
            swept, target = (n - counts.below())[::-1], round((1 - Fraction(quantile)) * n)
        noisy_target = target + int(self.threshold.sample(1, rng)[0])
        reached = np.flatnonzero(swept + self.query.sample(swept.size, rng) >= noisy_target)
        step = int(reached[0]) if reached.size else swept.size - 1
        return step if upward else swept.size - 1 - step

    def probabilities(self, counts: RankCounts, quantile: float, width: int = 4000) -> np.ndarray:
        """The exact distribution of :meth:`sample`'s index (for tests), summed over the threshold noise within
        ±``width`` (the rest of its mass is below 10⁻¹⁵ at the scales tested)."""
        n = counts.total
        upward = quantile >= 0.5
        swept = counts.at_most() if upward else (n - counts.below())[::-1]
        target = round(Fraction(quantile) * n) if upward else round((1 - Fraction(quantile)) * n)
        t = np.arange(-width, width + 1)
        weight = self.threshold.pmf(t)
        rate, alpha = self.query.s / self.query.t, self.query.alpha
        going, out = np.ones(t.size), np.zeros(swept.size)
        for i, count in enumerate(swept):
            z = (target - int(count)) + t  # Pr[Z >= z] for a discrete Laplace Z, vectorized over the threshold
            stops = np.where(z >= 1, np.exp(-rate * np.maximum(z, 1)) / (1 + alpha),
                             1 - np.exp(-rate * (1 - np.minimum(z, 1))) / (1 + alpha))
            if i == swept.size - 1:
                stops = np.ones(t.size)
            out[i] = float(np.sum(weight * going * stops))
            going = going * (1 - stops)
        return out if upward else out[::-1]

    def describe(self) -> dict:
        return {"threshold_noise": self.threshold.describe(), "query_noise": self.query.describe(),
                "rule": "q >= 1/2: the first candidate v, lowest first, with #{y <= v} + Z_v >= round(q·n) + Z_T; "
                        "q < 1/2: the first, highest first, with #{y >= v} + Z_v >= round((1 − q)·n) + Z_T; else "
                        "the last swept; Z_T and every Z_v discrete Laplace, each at half the quantile's ε"}


@dataclass(frozen=True)
class QuantilePlan:
    """Everything decided from public inputs (the domain, the quantiles, ε) before any label is read."""

    quantiles: tuple[float, ...]
    epsilon: float
    candidates: np.ndarray  # increasing: the domain's support, or a log grid on it
    draw: ExactExponential | AboveThreshold  # each quantile's, the same
    candidate_rule: str = "support"  # a key of CANDIDATE_RULES

    @property
    def method(self) -> str:
        return "above-threshold" if isinstance(self.draw, AboveThreshold) else "exponential"

    @property
    def epsilon_per_quantile(self) -> float:
        if isinstance(self.draw, AboveThreshold):
            return _round_up(self.draw.epsilon)
        return self.draw.certified_epsilon(PENALTY_SENSITIVITY)

    @property
    def certified_epsilon(self) -> float:
        if isinstance(self.draw, AboveThreshold):
            return _round_up(len(self.quantiles) * self.draw.epsilon)
        return self.draw.certified_epsilon(PENALTY_SENSITIVITY, draws=len(self.quantiles))

    @property
    def prior_epsilon(self) -> float:
        return 0.0

    def floor_seconds(self, labels: int) -> float:
        """:func:`draw_floor_seconds` of this plan on ``labels`` covered labels (a public count)."""
        return draw_floor_seconds(labels, int(self.candidates.size), len(self.quantiles))

    def dp_event(self) -> dp_event.DpEvent:
        kind = AboveThresholdDpEvent if isinstance(self.draw, AboveThreshold) else ExponentialMechanismDpEvent
        one = kind(epsilon=self.epsilon_per_quantile, candidates=int(self.candidates.size))
        return dp_event.ComposedDpEvent([one] * len(self.quantiles))


def check_ordered(domain: Domain) -> None:
    """Quantiles need ordered labels: class labels are refused (before any label is looked up)."""
    if domain.label_kind == "classes":
        raise LabelDPError("quantiles need ordered labels; this dataset's are classes",
                           code=ErrorCode.MECHANISM_DOMAIN_MISMATCH)


LOG_POINTS = 200  # candidates per sign of a log grid


def log_candidates(support: np.ndarray, points: int = LOG_POINTS) -> np.ndarray:
    """A geometric grid over the support's range (see the module's "Heavy tails"), snapped to the support: increasing,
    distinct, with both ends of the support and 0 when it lies inside."""
    support = np.asarray(support, dtype=np.float64)
    magnitudes = np.abs(support[support != 0])
    targets = [support[:1], support[-1:]]
    if magnitudes.size:
        low, high = float(magnitudes.min()), float(magnitudes.max())
        ladder = np.geomspace(low, high, points) if high > low else np.array([low])
        targets += [ladder[ladder <= support[-1]], -ladder[-ladder >= support[0]]]
        if support[0] <= 0 <= support[-1]:
            targets.append(np.zeros(1))
    wanted = np.concatenate(targets)
    index = np.clip(np.searchsorted(support, wanted), 1, support.size - 1) if support.size > 1 \
        else np.zeros(wanted.size, dtype=np.int64)
    if support.size > 1:  # the nearer of the two neighbours
        index = np.where(np.abs(support[index - 1] - wanted) <= np.abs(support[index] - wanted), index - 1, index)
    return np.unique(support[index])


CANDIDATE_RULES = {
    "support": "the dataset's declared domain, its finite support: integers, listed values or the continuous grid",
    "log": f"a geometric grid of {LOG_POINTS} magnitudes per sign from the support's smallest non-zero magnitude to "
           "its largest, with 0 and both ends, each snapped to the nearest value of the support",
}


METHODS = ("exponential", "above-threshold")


def plan_quantiles(domain: Domain, quantiles: Sequence[float], epsilon: float, candidates: str = "support",
                   method: str = "exponential") -> QuantilePlan:
    """Every refusal of a quantile release, before any label is read, and its mechanism."""
    check_ordered(domain)
    chosen = check_quantiles(quantiles)
    epsilon = check_epsilon(epsilon)
    if candidates not in CANDIDATE_RULES or method not in METHODS:
        raise LabelDPError(f"candidates must be one of {', '.join(CANDIDATE_RULES)} and method one of "
                           f"{', '.join(METHODS)}", code=ErrorCode.INVALID_INPUT)
    per_quantile = Fraction(epsilon) * (1 - Fraction(COMPOSITION_MARGIN)) / len(chosen)
    draw: ExactExponential | AboveThreshold = (
        AboveThreshold.calibrated(per_quantile) if method == "above-threshold"
        else ExactExponential.calibrated(per_quantile, PENALTY_SENSITIVITY))
    support = np.asarray(domain.support().values, dtype=np.float64)
    values = log_candidates(support) if candidates == "log" else support
    return QuantilePlan(chosen, epsilon, values, draw, candidates)


class RankCounts:
    """#{y < v} and #{y ≤ v} for every candidate v, added up over batches of labels (bounded memory)."""

    def __init__(self, candidates: np.ndarray):
        self.candidates = candidates
        size = candidates.size + 1
        self._above, self._from = np.zeros(size, np.int64), np.zeros(size, np.int64)

    def add(self, labels) -> None:
        labels = np.asarray(labels, dtype=np.float64)
        # #{c ≤ y} = j means y < c_k exactly for k ≥ j; #{c < y} = j means y ≤ c_k exactly for k ≥ j
        self._above += np.bincount(np.searchsorted(self.candidates, labels, side="right"), minlength=self._above.size)
        self._from += np.bincount(np.searchsorted(self.candidates, labels, side="left"), minlength=self._from.size)

    @property
    def total(self) -> int:
        return int(self._above.sum())

    def below(self) -> np.ndarray:
        """#{y < v} per candidate."""
        return np.cumsum(self._above)[:-1]

    def at_most(self) -> np.ndarray:
        """#{y ≤ v} per candidate."""
        return np.cumsum(self._from)[:-1]


def penalties(counts: RankCounts, quantile: float) -> np.ndarray:
    """D(v) of the module docstring for every candidate."""
    target = round(Fraction(quantile) * 2 * counts.total)
    below, at_most = 2 * counts.below(), 2 * counts.at_most()
    return np.maximum(np.maximum(below - target, target - at_most), 0)


@dataclass(frozen=True)
class PrivateQuantiles:
    plan: QuantilePlan
    values: tuple[float, ...]
    num_examples: int

    @property
    def certified_epsilon(self) -> float:
        return self.plan.certified_epsilon

    def describe(self) -> dict:
        plan = self.plan
        values = {repr(q): v for q, v in zip(plan.quantiles, self.values, strict=True)}
        return {"mechanism": MECHANISM, "values": values,
                "epsilon": plan.epsilon, "epsilon_per_quantile": plan.epsilon_per_quantile,
                "certified_epsilon": plan.certified_epsilon, "num_examples": self.num_examples,
                "candidates": int(plan.candidates.size), "candidate_low": float(plan.candidates[0]),
                "candidate_high": float(plan.candidates[-1]),
                "candidate_rule": CANDIDATE_RULES[plan.candidate_rule],
                "method": plan.method, **self._method(),
                "composition": f"basic: epsilon split evenly across the quantiles, one exact {plan.method} draw "
                               "each",
                "dp_event": events.to_dict(plan.dp_event())}

    def _method(self) -> dict:
        if isinstance(self.plan.draw, AboveThreshold):
            return {"sweep": self.plan.draw.describe()}
        return {"utility": "D(v) = max(2·#{y < v} − R, R − 2·#{y ≤ v}, 0) with R = round(2·q·n); one label moves "
                           "D by at most 2; P(v) ∝ exp(−(ε_q/4)·D(v))",
                "draw": self.plan.draw.describe(PENALTY_SENSITIVITY)}


def release_quantiles(plan: QuantilePlan, counts: RankCounts, rng: np.random.Generator) -> PrivateQuantiles:
    """One exact draw per quantile (never refuses): the exponential mechanism's, or an AboveThreshold sweep's. The
    service pads the counting and the draws to the plan's floor (:func:`at_least`)."""
    draw = plan.draw
    if isinstance(draw, AboveThreshold):
        indices = [draw.sample(counts, q, rng) for q in plan.quantiles]
    else:
        bound = 2 * counts.total  # D <= 2n: the public bound that fixes the sampler's arithmetic
        indices = [draw.sample(penalties(counts, q), rng, bound=bound) for q in plan.quantiles]
    return PrivateQuantiles(plan, tuple(float(plan.candidates[i]) for i in indices), counts.total)


def private_quantiles(domain: Domain, labels, quantiles: Sequence[float], epsilon: float,
                      rng: np.random.Generator, candidates: str = "support",
                      method: str = "exponential") -> PrivateQuantiles:
    """:func:`plan_quantiles` and :func:`release_quantiles` on labels in memory."""
    plan = plan_quantiles(domain, quantiles, epsilon, candidates, method)
    counts = RankCounts(plan.candidates)
    counts.add(labels)
    return release_quantiles(plan, counts, rng)
