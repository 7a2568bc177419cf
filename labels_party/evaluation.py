"""Private evaluation: the labels party scores the features party's predictions against the true labels and
releases only a Laplace-noised mean of a clipped per-example loss, charged to the scored examples.

Each per-example loss is clipped to an interval of width W (MSE: [0, C]; Poisson: [−C, C]; 0/1 error: [0, 1]);
changing one label moves the mean by at most W/n, so Laplace noise of scale W/(n ε) makes the released mean ε-DP
in the labels. Clipping biases the loss when C is too small; nothing else about the labels is released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shared.errors import LabelDPError
from shared.mechanisms.additive import LaplaceNoise

METRICS = ("mse", "poisson", "accuracy")


@dataclass(frozen=True)
class PrivateEvaluation:
    metric: str
    value: float
    noise_scale: float
    clip: float
    num_examples: int

    def confidence_interval(self, level: float = 0.95) -> tuple[float, float]:
        """Interval for the clipped mean accounting for the Laplace noise (its exact quantile)."""
        half = -self.noise_scale * math.log(1 - level)
        return self.value - half, self.value + half


def clipped_losses(metric: str, predictions: np.ndarray, labels: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
    """(per-example losses clipped to their interval, the interval's width)."""
    if metric == "mse":
        return np.clip((predictions - labels) ** 2, 0.0, clip), clip
    if metric == "poisson":  # ℓ_Poi with the prediction as the rate; can be negative, so clip on both sides
        rate = np.maximum(predictions, 1e-12)
        return np.clip(rate - labels * np.log(rate), -clip, clip), 2 * clip
    return (np.rint(predictions) != labels).astype(np.float64), 1.0


def evaluate(metric: str, predictions, labels, epsilon: float, clip: float,
             rng: np.random.Generator) -> PrivateEvaluation:
    if metric not in METRICS:
        raise LabelDPError(f"metric must be one of {', '.join(METRICS)}", code="invalid_metric")
    if metric != "accuracy" and not (math.isfinite(clip) and clip > 0):
        raise LabelDPError("clip must be positive and finite", code="invalid_request")
    predictions = np.asarray(predictions, dtype=np.float64)
    if not np.all(np.isfinite(predictions)):
        raise LabelDPError("predictions must be finite numbers", code="invalid_request")
    losses, width = clipped_losses(metric, predictions, np.asarray(labels, dtype=np.float64), clip)
    scale = width / (losses.size * epsilon)
    value = float(losses.mean() + LaplaceNoise(scale).sample(1, rng)[0])
    if metric == "accuracy":
        value = 1.0 - value  # accuracy = 1 − mean 0/1 error; the noise is the same
    return PrivateEvaluation(metric, value, scale, 1.0 if metric == "accuracy" else clip, int(losses.size))


def unbiased_mse_estimate(predictions, noisy_labels, mechanism) -> tuple[float, float]:
    """The features party's own estimate of the true-label MSE from labels privatized by an *unbiased* mechanism.

    E[(f − ŷ)² | y] = (f − y)² + Var(ŷ | y), and Var(ŷ | y) depends on the unknown y; with h solving
    Σ_ŷ M[y, ŷ] h(ŷ) = Var(ŷ | y) for every y (least squares on the public matrix, exact when M has full row
    rank), E[(f − ŷ)² − h(ŷ) | y] = (f − y)². Additive noise has constant variance, so h is that constant.
    Returns (estimate, standard error from the per-example terms)."""
    predictions = np.asarray(predictions, dtype=np.float64)
    noisy_labels = np.asarray(noisy_labels, dtype=np.float64)
    if hasattr(mechanism, "noise"):  # unclipped additive noise
        correction = np.full(noisy_labels.size, mechanism.noise.variance)
    else:
        h, *_ = np.linalg.lstsq(mechanism.matrix, mechanism.conditional_variance, rcond=None)
        index = np.searchsorted(mechanism.output_values, noisy_labels)
        correction = h[np.minimum(index, h.size - 1)]
    terms = (predictions - noisy_labels) ** 2 - correction
    return float(terms.mean()), float(terms.std(ddof=1) / math.sqrt(terms.size))
