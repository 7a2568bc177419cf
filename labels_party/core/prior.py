"""Private label prior (optimal-unbiased paper, Algorithm 4, with integer noise): histogram + DLap(2/ε₁), clip at
0, normalize.

Changing one label moves one count down and another up, so the histogram has ℓ1 sensitivity 2. The noise is the
discrete Laplace drawn exactly (:mod:`shared.mechanisms.integer_noise`), so the published noisy counts are
integers and carry no floating-point residue of the true counts; the algorithm's continuous Laplace would (the
least-significant-bit attack in ``tests/attacks.py``). Clipping and normalizing are post-processing. If every noisy
count clips to zero the prior falls back to uniform (also post-processing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from shared.mechanisms.integer_noise import DiscreteLaplace
from shared.privacy import check_epsilon

HISTOGRAM_SENSITIVITY = 2


@dataclass(frozen=True, eq=False)
class NoisyPrior:
    """A DP estimate of the label distribution — itself DP output, safe to publish."""

    weights: np.ndarray
    noisy_counts: np.ndarray  # integers
    epsilon: float  # requested ε₁
    noise: DiscreteLaplace

    @property
    def certified_epsilon(self) -> float:
        return self.noise.certified_epsilon(HISTOGRAM_SENSITIVITY)

    def dp_event(self) -> dp_event.DpEvent:
        return noise_event(self.noise)

    @property
    def scale(self) -> float:
        return self.noise.scale

    def describe(self) -> dict:
        return {"weights": self.weights.tolist(), "noisy_counts": self.noisy_counts.tolist(),
                "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon, "noise": "discrete-laplace",
                "scale": self.scale, "scale_rational": self.noise.describe()["scale_rational"],
                "sensitivity": HISTOGRAM_SENSITIVITY}


def prior_noise(epsilon: float) -> DiscreteLaplace:
    """The noise of a prior at ``epsilon``: public, known before any count is (what a release is charged for)."""
    return DiscreteLaplace.calibrated(check_epsilon(epsilon, "prior epsilon"), HISTOGRAM_SENSITIVITY)


def noise_event(noise: DiscreteLaplace) -> dp_event.DpEvent:
    return dp_event.DiscreteLaplaceDpEvent(noise_parameter=noise.s / noise.t, sensitivity=HISTOGRAM_SENSITIVITY)


def estimate_prior(histogram, epsilon: float, rng: np.random.Generator) -> NoisyPrior:
    histogram = np.asarray(histogram)
    if np.any(histogram != np.round(histogram)) or np.any(histogram < 0):
        raise ValueError("a histogram holds non-negative integer counts")
    noise = prior_noise(epsilon)
    noisy = histogram.astype(np.int64) + noise.sample(histogram.size, rng)
    clipped = np.maximum(noisy, 0).astype(np.float64)
    weights = clipped / clipped.sum() if clipped.sum() > 0 else np.full(histogram.size, 1.0 / histogram.size)
    return NoisyPrior(weights, noisy, epsilon, noise)
