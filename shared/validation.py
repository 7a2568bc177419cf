"""Unbiased validation on privatized labels: each candidate model's true-label loss, and its difference from the
constant predictor's, estimated from labels that an *unbiased* mechanism released — what a trainer that never sees
a true label chooses with (``auto``) and reports (every job's ``estimate``).

Why the estimates are unbiased (E over the mechanism's noise, for every true label y):

* **Squared loss, differences.** For two predictions f and g of one example, E[(f − ŷ)² − (g − ŷ)² | y] =
  (f − y)² − (g − y)² whenever E[ŷ | y] = y: the difference is linear in ŷ, so no correction is needed. Choosing
  between candidates (and against the constant) uses these paired terms: their variance is small when the
  candidates predict alike, which is what makes a choice on very noisy labels safe.
* **Squared loss, levels.** (f − ŷ)² − h(ŷ) with E[h(ŷ) | y] = Var(ŷ | y) (:mod:`shared.estimates`, from the
  mechanism's published matrix) has mean (f − y)².
* **Predicting the mean.** The labels' variance, the loss of the best constant, is estimated by
  s²(ŷ) − mean h(ŷ) (s² the sample variance with n − 1): E[s²(ŷ)] = Var(y) + E[Var(ŷ | y)]. The model's difference
  from it, mean[(f − ŷ)² − (ŷ − ȳ)²·n/(n − 1)], needs no h at all.
* **Poisson loss** f − y·log f (the log-likelihood without the label's own term) is linear in y: ŷ in place of y is
  unbiased as it is; the constant's is that of the labels' mean (plugged in: biased by O(Var/n)).
* **Accuracy** under K-ary randomized response (keep p, each other class q): E[1[ŷ = c] | y] = q + (p − q)·1[y = c],
  so (1[ŷ = c] − q)/(p − q) is unbiased for 1[y = c], for any class c a model predicts.

Each estimate's standard error is its per-example terms' sample standard deviation over √n (the examples are
independent, one draw each); intervals are normal at ``level``. They hold for models fixed before these labels were
looked at: a trainer chooses on one part of its validation labels and reports on another (``features_party.auto``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from shared.errors import ErrorCode, LabelDPError
from shared.estimates import check_unbiased, variance_correction
from shared.mechanisms.documents import Sampler
from shared.mechanisms.randomized_response import RandomizedResponse

METRICS = ("mse", "poisson", "accuracy")  # accuracy: higher is better; the others: lower
FAMILY_LEVEL = 0.95  # of a choice among many candidates: the chance that none no better than the constant qualifies


def eligibility_z(comparisons: int, level: float = FAMILY_LEVEL) -> float:
    """How many standard errors below 0 a candidate's difference from the constant must be for ``comparisons``
    such one-sided tests to admit one no better than the constant with probability at most 1 − ``level`` in all
    (Bonferroni: each at (1 − level) / comparisons). A trainer that judges a hundred candidates at 2 standard errors
    each lets through one that is worse about as often as not: issue 39's household-wealth table, at ε = 0.5,
    got a model 13 % worse than the mean, chosen at an estimated gain of 1,234 among 96."""
    if comparisons < 1 or not 0 < level < 1:
        raise ValueError(f"comparisons {comparisons} must be at least 1 and level {level} in (0, 1)")
    return NormalDist().inv_cdf(1 - (1 - level) / comparisons)


@dataclass(frozen=True)
class Estimate:
    """The mean of independent per-example terms, its standard error and normal interval."""

    estimate: float
    standard_error: float
    low: float
    high: float

    @classmethod
    def of(cls, terms: np.ndarray, level: float, widen: float = 0.0) -> Estimate:
        terms = np.asarray(terms, dtype=np.float64)
        estimate = float(terms.mean())
        error = float(terms.std(ddof=1) / math.sqrt(terms.size)) if terms.size > 1 else math.inf
        half = NormalDist().inv_cdf(0.5 + level / 2) * error + widen
        return cls(estimate, error, estimate - half, estimate + half)

    def upper(self, z: float) -> float:
        return self.estimate + z * self.standard_error


@dataclass(frozen=True)
class Comparison:
    """A model against the constant predictor on one set of privatized validation labels."""

    metric: str
    level: float
    num_examples: int
    model: Estimate
    constant: Estimate
    difference: Estimate  # model − constant: below 0 is better for losses, above 0 for accuracy
    constant_name: str  # what the constant is: "the labels' mean", "the mean 41.2", "class 3"

    @property
    def better(self) -> bool:
        """The model's interval of the difference lies on the good side of 0."""
        return self.difference.high < 0 if self.metric != "accuracy" else self.difference.low > 0

    @property
    def worse(self) -> bool:
        return self.difference.low > 0 if self.metric != "accuracy" else self.difference.high < 0

    def warning(self) -> str | None:
        """A sentence when the model is not shown to be better than the constant, else None."""
        if self.better:
            return None
        word = "loss" if self.metric != "accuracy" else "accuracy"
        verdict = "worse than" if self.worse else "not shown to be better than"
        return (f"the model is {verdict} the constant predictor ({self.constant_name}): estimated {self.metric} "
                f"{self.model.estimate:.4g} against {self.constant.estimate:.4g}, difference "
                f"{self.difference.estimate:+.4g} ({self.level:.0%} interval {self.difference.low:+.4g} to "
                f"{self.difference.high:+.4g}) on {self.num_examples} privatized validation labels; its {word} "
                "may be no better than knowing nothing")

    def to_dict(self) -> dict:
        return {"metric": self.metric, "level": self.level, "num_examples": self.num_examples,
                "model": asdict(self.model), "constant": asdict(self.constant),
                "difference": asdict(self.difference), "constant_name": self.constant_name,
                "better": self.better, "warning": self.warning()}


@dataclass(frozen=True)
class PrivatizedLabels:
    """Validation labels released by an unbiased mechanism, with what makes losses on them unbiased."""

    noisy: np.ndarray
    mechanism: Sampler
    num_classes: int | None = None  # classes: K, released by K-ary randomized response

    def __post_init__(self) -> None:
        if self.num_classes is None:
            check_unbiased(self.mechanism)
        elif not _is_k_ary_rr(self.mechanism, self.num_classes):
            raise LabelDPError("class labels validate on K-ary randomized response only (mechanism 'rr')",
                               code=ErrorCode.MECHANISM_BIASED)

    def __len__(self) -> int:
        return int(self.noisy.size)

    def subset(self, mask: np.ndarray) -> PrivatizedLabels:
        return PrivatizedLabels(self.noisy[mask], self.mechanism, self.num_classes)

    # -- per-example unbiased terms ------------------------------------------------------------------------------

    def squared_difference(self, f: np.ndarray, g: np.ndarray | float) -> np.ndarray:
        """(f − ŷ)² − (g − ŷ)²: mean (f − y)² − (g − y)² (no correction: linear in ŷ)."""
        return (f - self.noisy) ** 2 - (g - self.noisy) ** 2

    def squared(self, f: np.ndarray | float) -> tuple[np.ndarray, float]:
        """(f − ŷ)² − h(ŷ), mean (f − y)²; and the bound on the correction's bias (0 when h is exact)."""
        correction, bias = variance_correction(self.mechanism, self.noisy)
        return (f - self.noisy) ** 2 - correction, bias

    def poisson(self, rate: np.ndarray | float) -> np.ndarray:
        rate = np.maximum(np.broadcast_to(np.asarray(rate, dtype=np.float64), self.noisy.shape), 1e-12)
        return rate - self.noisy * np.log(rate)

    def correct(self, classes: np.ndarray) -> np.ndarray:
        """(1[ŷ = c] − q)/(p − q) for each example's predicted class c: mean 1[y = c]."""
        rr = self.mechanism
        assert isinstance(rr, RandomizedResponse)
        p, q = rr.keep_probability, rr.other_probability
        return ((np.asarray(classes) == self.noisy).astype(np.float64) - q) / (p - q)

    def class_frequencies(self) -> np.ndarray:
        """Each class's share of the true labels, estimated without bias (may be below 0 or above 1)."""
        assert self.num_classes is not None
        return np.array([self.correct(np.full(self.noisy.size, k)).mean() for k in range(self.num_classes)])


def _is_k_ary_rr(mechanism: Sampler, num_classes: int) -> bool:
    return (isinstance(mechanism, RandomizedResponse) and mechanism.output_values.size == num_classes
            and mechanism.input_values.size == num_classes and mechanism.keep_probability > mechanism.other_probability)


def compare(labels: PrivatizedLabels, predictions: np.ndarray, metric: str, *, constant: float | int | None = None,
            level: float = 0.95) -> Comparison:
    """The model's ``predictions`` (values, rates or classes) against a constant: ``constant`` (a value, or a class
    for accuracy), or — for the squared loss, when None — predicting the labels' mean (their variance)."""
    if metric not in METRICS:
        raise LabelDPError(f"metric must be one of {', '.join(METRICS)}", code=ErrorCode.INVALID_INPUT)
    if not 0 < level < 1:
        raise LabelDPError(f"level must be strictly between 0 and 1, not {level!r}", code=ErrorCode.INVALID_INPUT)
    n = len(labels)
    if n < 2:
        raise LabelDPError("a comparison with a standard error needs at least 2 validation labels",
                           code=ErrorCode.INVALID_INPUT)
    predictions = np.asarray(predictions, dtype=np.float64).ravel()
    if predictions.size != n or not np.all(np.isfinite(predictions)):
        raise LabelDPError(f"{predictions.size} finite predictions are needed for {n} labels",
                           code=ErrorCode.INVALID_INPUT)
    if metric == "accuracy":
        if constant is None:
            constant = int(np.argmax(labels.class_frequencies()))
        model, fixed = labels.correct(predictions), labels.correct(np.full(n, int(constant)))
        return _comparison(metric, level, model, fixed, model - fixed, f"class {int(constant)}")
    if metric == "poisson":
        mean = float(labels.noisy.mean()) if constant is None else float(constant)
        model, fixed = labels.poisson(predictions), labels.poisson(mean)
        return _comparison(metric, level, model, fixed, model - fixed, f"the mean {mean:.4g}")
    model, bias = labels.squared(predictions)
    if constant is not None:
        fixed, _ = labels.squared(float(constant))
        return _comparison(metric, level, model, fixed, labels.squared_difference(predictions, float(constant)),
                           f"the mean {float(constant):.4g}", widen=bias)
    spread = (labels.noisy - labels.noisy.mean()) ** 2 * n / (n - 1)
    correction = model - (predictions - labels.noisy) ** 2 + spread  # spread − h(ŷ): mean Var(y)
    difference = (predictions - labels.noisy) ** 2 - spread
    return _comparison(metric, level, model, correction, difference, "the labels' mean", widen=bias)


def _comparison(metric: str, level: float, model: np.ndarray, constant: np.ndarray, difference: np.ndarray,
                name: str, widen: float = 0.0) -> Comparison:
    return Comparison(metric, level, int(model.size), Estimate.of(model, level, widen),
                      Estimate.of(constant, level, widen), Estimate.of(difference, level), name)
