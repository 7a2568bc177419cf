"""Private label prior (optimal-unbiased paper, Algorithm 4): histogram + Laplace(2/ε₁), clip at 0, normalize.

Changing one label moves one count down and another up, so the histogram has ℓ1 sensitivity 2. The discrete
Laplace (geometric) variant adds integer noise DLap(2/ε₁) instead; both are ε₁-DP. Clipping and normalizing are
post-processing. If every noisy count clips to zero the prior falls back to uniform (also post-processing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.mechanisms.additive import DiscreteLaplaceNoise, LaplaceNoise
from shared.privacy import check_epsilon

HISTOGRAM_SENSITIVITY = 2.0


@dataclass(frozen=True, eq=False)
class NoisyPrior:
    """A DP estimate of the label distribution — itself DP output, safe to publish."""

    weights: np.ndarray
    noisy_counts: np.ndarray
    epsilon: float
    noise: str
    scale: float

    def describe(self) -> dict:
        return {"weights": self.weights.tolist(), "noisy_counts": self.noisy_counts.tolist(),
                "epsilon": self.epsilon, "noise": self.noise, "scale": self.scale,
                "sensitivity": HISTOGRAM_SENSITIVITY}


def estimate_prior(histogram, epsilon: float, rng: np.random.Generator, *, discrete: bool = False) -> NoisyPrior:
    epsilon = check_epsilon(epsilon, "prior epsilon")
    histogram = np.asarray(histogram, dtype=np.float64)
    scale = HISTOGRAM_SENSITIVITY / epsilon
    noise = DiscreteLaplaceNoise(scale) if discrete else LaplaceNoise(scale)
    noisy = histogram + noise.sample(histogram.size, rng)
    clipped = np.maximum(noisy, 0.0)
    weights = clipped / clipped.sum() if clipped.sum() > 0 else np.full(histogram.size, 1.0 / histogram.size)
    return NoisyPrior(weights, noisy, epsilon, "discrete-laplace" if discrete else "laplace", scale)
