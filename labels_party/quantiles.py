"""DP quantiles of a dataset's labels: how a user chooses clip bounds without looking at the labels undisguised.

**Candidates.** The dataset's declared domain is the public outer range, and its finite support the candidate
values: the integers of an integer range, the listed values of a finite domain, the grid of a continuous one
(``grid_size`` points over [min, max]). Class labels have no order: refused. Every declared domain has finite
bounds (:mod:`shared.domains` refuses others), so no candidate lies outside them.

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
(:mod:`labels_party.quotas`). Not padded: the lookup of requested ids before the charge, which reads the label
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
from shared.errors import LabelDPError
from shared.mechanisms import events
from shared.mechanisms.events import ExponentialMechanismDpEvent
from shared.mechanisms.exponential import ExactExponential
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
        raise LabelDPError(f"ask for 1 to {MAX_QUANTILES} quantiles", code="invalid_input")
    if not all(0.0 < q < 1.0 for q in values):
        raise LabelDPError("quantiles must lie strictly between 0 and 1", code="invalid_input")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise LabelDPError("quantiles must be sorted and distinct (strictly increasing)", code="invalid_input")
    return values


@dataclass(frozen=True)
class QuantilePlan:
    """Everything decided from public inputs (the domain, the quantiles, ε) before any label is read."""

    quantiles: tuple[float, ...]
    epsilon: float
    candidates: np.ndarray  # increasing: the domain's support
    draw: ExactExponential  # each quantile's, the same rate

    @property
    def epsilon_per_quantile(self) -> float:
        return self.draw.certified_epsilon(PENALTY_SENSITIVITY)

    @property
    def certified_epsilon(self) -> float:
        return self.draw.certified_epsilon(PENALTY_SENSITIVITY, draws=len(self.quantiles))

    @property
    def prior_epsilon(self) -> float:
        return 0.0

    def floor_seconds(self, labels: int) -> float:
        """:func:`draw_floor_seconds` of this plan on ``labels`` covered labels (a public count)."""
        return draw_floor_seconds(labels, int(self.candidates.size), len(self.quantiles))

    def dp_event(self) -> dp_event.DpEvent:
        one = ExponentialMechanismDpEvent(epsilon=self.epsilon_per_quantile, candidates=int(self.candidates.size))
        return dp_event.ComposedDpEvent([one] * len(self.quantiles))


def check_ordered(domain: Domain) -> None:
    """Quantiles need ordered labels: class labels are refused (before any label is looked up)."""
    if domain.label_kind == "classes":
        raise LabelDPError("quantiles need ordered labels; this dataset's are classes",
                           code="mechanism_domain_mismatch")


def plan_quantiles(domain: Domain, quantiles: Sequence[float], epsilon: float) -> QuantilePlan:
    """Every refusal of a quantile release, before any label is read, and its mechanism."""
    check_ordered(domain)
    chosen = check_quantiles(quantiles)
    epsilon = check_epsilon(epsilon)
    per_quantile = Fraction(epsilon) * (1 - Fraction(COMPOSITION_MARGIN)) / len(chosen)
    draw = ExactExponential.calibrated(per_quantile, PENALTY_SENSITIVITY)
    return QuantilePlan(chosen, epsilon, np.asarray(domain.support().values, dtype=np.float64), draw)


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
                "candidate_rule": "the dataset's declared domain, its finite support: integers, listed values or "
                                  "the continuous grid",
                "utility": "D(v) = max(2·#{y < v} − R, R − 2·#{y ≤ v}, 0) with R = round(2·q·n); one label moves "
                           "D by at most 2; P(v) ∝ exp(−(ε_q/4)·D(v))",
                "composition": "basic: epsilon split evenly across the quantiles, one exact exponential-mechanism "
                               "draw each", "draw": plan.draw.describe(PENALTY_SENSITIVITY),
                "dp_event": events.to_dict(plan.dp_event())}


def release_quantiles(plan: QuantilePlan, counts: RankCounts, rng: np.random.Generator) -> PrivateQuantiles:
    """One exact exponential-mechanism draw per quantile (never refuses). The service pads the counting and the
    draws to the plan's floor (:func:`at_least`)."""
    bound = 2 * counts.total  # D <= 2n: the public bound that fixes the sampler's arithmetic
    values = tuple(float(plan.candidates[plan.draw.sample(penalties(counts, q), rng, bound=bound)])
                   for q in plan.quantiles)
    return PrivateQuantiles(plan, values, counts.total)


def private_quantiles(domain: Domain, labels, quantiles: Sequence[float], epsilon: float,
                      rng: np.random.Generator) -> PrivateQuantiles:
    """:func:`plan_quantiles` and :func:`release_quantiles` on labels in memory."""
    plan = plan_quantiles(domain, quantiles, epsilon)
    counts = RankCounts(plan.candidates)
    counts.add(labels)
    return release_quantiles(plan, counts, rng)
