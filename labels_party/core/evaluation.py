"""Private evaluation: the labels party scores the features party's predictions against the true labels and
releases only a noisy mean of a clipped per-example loss, charged to the scored examples.

Each per-example loss is clipped to an interval of width W (MSE: [0, C]; Poisson: [−C, C]; 0/1 error: [0, 1]; the
``mean`` metric scores no predictions: its per-example quantity is the label itself on the dataset's declared range
[L, U], public, so W = U − L and the release is a central DP estimate of the labels' mean — the constant predictor
that a trainer's ``auto`` job compares its models with) and
rounded to one of 2^20 + 1 evenly spaced levels of it (0/1 errors are already integers), so the sum of the
losses is an integer S that one label moves by at most 2^20 levels. The release is S + Z with Z discrete Laplace
(sampled exactly, :mod:`shared.mechanisms.integer_noise`) calibrated to that sensitivity — ε-DP in the labels —
reported as the mean low + W (S + Z) / (2^20 n). Rounding a loss moves it by at most W / 2^21; clipping biases
the loss when C is too small; nothing else about the labels is released.

The free alternative, the features party's unbiased MSE estimate from held-out labels it already has privatized by
an unbiased mechanism, is :mod:`shared.estimates` (built from the release's mechanism document).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from shared.domains import Domain
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms.integer_noise import DiscreteLaplace
from shared.privacy import check_epsilon

METRICS = ("mse", "poisson", "accuracy", "mean")
LOSS_LEVELS = 1 << 20  # levels per clipped loss range (the sum's sensitivity)
MAX_CLIP = 1e15  # keeps the clip range (2·clip for Poisson) and the integer sum of levels finite


@dataclass(frozen=True)
class PrivateEvaluation:
    metric: str
    value: float
    noise: DiscreteLaplace  # added to the integer sum of rounded losses
    unit: float  # value per unit of that sum: W / (levels · n)
    levels: int  # levels per clipped loss: the sum's sensitivity
    clip: float
    num_examples: int
    noisy_sum: int  # S + Z, the released integer

    @property
    def certified_epsilon(self) -> float:
        return self.noise.certified_epsilon(self.levels)

    def dp_event(self) -> dp_event.DpEvent:
        return dp_event.DiscreteLaplaceDpEvent(noise_parameter=self.noise.s / self.noise.t, sensitivity=self.levels)

    @property
    def noise_scale(self) -> float:
        """The noise's scale in units of the reported mean (W / (n ε), up to the 2**-31 calibration)."""
        return self.noise.scale * self.unit

    def confidence_interval(self, level: float = 0.95) -> tuple[float, float]:
        """Interval for the clipped, rounded mean accounting for the noise: its exact discrete-Laplace quantile,
        the smallest m with Pr[|Z| <= m] >= level."""
        alpha = self.noise.alpha
        m = max(0, math.ceil(math.log((1 - level) * (1 + alpha) / 2) / (-self.noise.s / self.noise.t)) - 1)
        half = m * self.unit
        return self.value - half, self.value + half


def clipped_losses(metric: str, predictions: np.ndarray | None, labels: np.ndarray, clip: float,
                   bounds: tuple[float, float] | None = None) -> tuple[np.ndarray, float, float]:
    """(per-example losses clipped to their interval, the interval's low end, its width); ``bounds``: the declared
    label range of the ``mean`` metric."""
    with np.errstate(over="ignore", invalid="ignore"):  # absurd labels overflow; the caller maps them into range
        return _clipped_losses(metric, predictions, labels, clip, bounds)


def _clipped_losses(metric, predictions, labels, clip, bounds):
    if metric == "mean":
        low, high = bounds
        return np.clip(labels, low, high), low, high - low
    if metric == "mse":
        return np.clip((predictions - labels) ** 2, 0.0, clip), 0.0, clip
    if metric == "poisson":  # ℓ_Poi with the prediction as the rate; can be negative, so clip on both sides
        rate = np.maximum(predictions, 1e-12)
        return np.clip(rate - labels * np.log(rate), -clip, clip), -clip, 2 * clip
    return (np.rint(predictions) != labels).astype(np.float64), 0.0, 1.0


@dataclass(frozen=True)
class EvaluationPlan:
    """A private evaluation decided from public inputs (metric, ε, clip): its noise, hence its privacy event."""

    metric: str
    clip: float
    levels: int
    noise: DiscreteLaplace
    bounds: tuple[float, float] | None = None  # the mean metric's declared label range

    def dp_event(self) -> dp_event.DpEvent:
        return dp_event.DiscreteLaplaceDpEvent(noise_parameter=self.noise.s / self.noise.t, sensitivity=self.levels)


def plan_evaluation(metric: str, epsilon: float, clip: float, domain: Domain | None = None) -> EvaluationPlan:
    """Every refusal of an evaluation (before any label is read) and its noise; ``domain``, the dataset's, gives the
    ``mean`` metric its range (class labels have no mean: refused)."""
    if metric not in METRICS:
        raise LabelDPError(f"metric must be one of {', '.join(METRICS)}", code=ErrorCode.INVALID_METRIC)
    epsilon = check_epsilon(epsilon)
    if metric == "mean":
        if domain is None or domain.label_kind == "classes":
            raise LabelDPError("the mean metric needs ordered numeric labels; this dataset's are classes",
                               code=ErrorCode.MECHANISM_DOMAIN_MISMATCH)
        values = domain.support().values
        low, high = float(values.min()), float(values.max())
        if high <= low:
            raise LabelDPError("the dataset's declared range holds one value: its mean is public, nothing to estimate",
                               code=ErrorCode.INVALID_INPUT)
        return EvaluationPlan(metric, high - low, LOSS_LEVELS, DiscreteLaplace.calibrated(epsilon, LOSS_LEVELS),
                              (low, high))
    if metric != "accuracy" and not (math.isfinite(clip) and 0 < clip <= MAX_CLIP):
        raise LabelDPError(f"clip must be positive and at most {MAX_CLIP:g}", code=ErrorCode.INVALID_REQUEST)
    levels = 1 if metric == "accuracy" else LOSS_LEVELS
    return EvaluationPlan(metric, 1.0 if metric == "accuracy" else clip, levels,
                          DiscreteLaplace.calibrated(epsilon, levels))


def check_predictions(predictions) -> np.ndarray:
    predictions = np.asarray(predictions, dtype=np.float64)
    if not np.all(np.isfinite(predictions)):
        raise LabelDPError("predictions must be finite numbers", code=ErrorCode.INVALID_REQUEST)
    return predictions


def score(plan: EvaluationPlan, predictions, labels, rng: np.random.Generator) -> PrivateEvaluation:
    """The noisy mean clipped loss of ``predictions`` against ``labels`` (never refuses); for the ``mean`` metric
    (no predictions) the noisy mean of the labels on the declared range."""
    predictions = None if plan.metric == "mean" else check_predictions(predictions)
    metric, clip = plan.metric, plan.clip
    labels = np.asarray(labels, dtype=np.float64)
    losses, low, width = clipped_losses(metric, predictions, labels, clip, plan.bounds)
    # A loss that is not a number (inf - inf for absurd labels) is a function of the label like any other: it is
    # mapped into the clip range, never refused (a refusal would depend on the label).
    losses = np.clip(np.nan_to_num(losses, nan=low + width, posinf=low + width, neginf=low), low, low + width)
    units = np.rint((losses - low) / width * plan.levels).astype(np.int64)  # each in [0, levels]
    noisy_sum = int(units.sum()) + int(plan.noise.sample(1, rng)[0])
    unit = width / (plan.levels * losses.size)
    mean = low + noisy_sum * unit
    value = 1.0 - mean if metric == "accuracy" else mean  # accuracy = 1 − mean 0/1 error; same noise
    return PrivateEvaluation(metric, float(value), plan.noise, unit, plan.levels, clip, int(losses.size), noisy_sum)


def evaluate(metric: str, predictions, labels, epsilon: float, clip: float, rng: np.random.Generator, *,
             domain: Domain | None = None) -> PrivateEvaluation:
    """:func:`plan_evaluation` and :func:`score` in one call."""
    plan = plan_evaluation(metric, epsilon, clip, domain)
    return score(plan, None if metric == "mean" else check_predictions(predictions), labels, rng)

