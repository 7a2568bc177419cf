"""Additive noise mechanisms: y + Z for noise Z calibrated to the label range Δ = max(Y) - min(Y).

Noise distributions (Appendix F of the optimal-unbiased paper):
* Laplace (Definition 18) and discrete Laplace (Definition 17), scale b = Δ/ε;
* staircase (Definition 20, continuous, parameter γ) and discrete staircase (Definition 19, parameter r), with
  the parameter chosen to minimize the noise variance (the squared loss), by closed-form second moments.

Unclipped, y + Z is unbiased with noisy label loss Var(Z)/2. Clipped to [min Y, max Y] (post-processing, same
ε) it is biased; with discrete noise on integer labels the clipped mechanism has finitely many outputs and is
returned as an exact :class:`FiniteRandomizer` (see :func:`clipped_discrete`).

Certified ε comes from the parameters the sampler actually uses: the largest log-ratio of the noise density
between two points at most Δ apart (for the discrete distributions computed from the pmf itself).
Continuous noise is sampled with floating point, like every practical Laplace implementation; see docs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import integrate, optimize

from shared.errors import CertificationError
from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.privacy import check_epsilon, design_epsilon


@dataclass(frozen=True)
class LaplaceNoise:
    scale: float

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        return rng.laplace(0.0, self.scale, size)

    @property
    def variance(self) -> float:
        return 2.0 * self.scale**2

    def privacy_loss(self, sensitivity: float) -> float:
        return sensitivity / self.scale

    def cdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.where(x < 0, 0.5 * np.exp(x / self.scale), 1 - 0.5 * np.exp(-x / self.scale))

    def pdf(self, x):
        return np.exp(-np.abs(x) / self.scale) / (2 * self.scale)

    @property
    def breakpoints(self) -> tuple:
        return (0.0,)


@dataclass(frozen=True)
class StaircaseNoise:
    """Continuous staircase (Geng & Viswanath): density a·b^k on [kΔ, kΔ+γΔ), a·b^(k+1) on [kΔ+γΔ, (k+1)Δ)."""

    epsilon: float
    sensitivity: float
    gamma: float

    @property
    def _b(self) -> float:
        return math.exp(-self.epsilon)

    @property
    def _a(self) -> float:
        b = self._b
        return (1 - b) / (2 * self.sensitivity * (self.gamma + b * (1 - self.gamma)))

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        b, g, d = self._b, self.gamma, self.sensitivity
        sign = rng.choice(np.array([-1.0, 1.0]), size)
        period = rng.geometric(1 - b, size) - 1  # P(G = k) = (1-b) b^k, k >= 0
        in_high = rng.random(size) < g / (g + (1 - g) * b)
        u = rng.random(size)
        magnitude = np.where(in_high, period + g * u, period + g + (1 - g) * u) * d
        return sign * magnitude

    @property
    def variance(self) -> float:
        return staircase_second_moment(self.epsilon, self.sensitivity, self.gamma)

    def privacy_loss(self, sensitivity: float) -> float:
        # Density levels fall by the factor b once per half-period step; two points within Δ of each other are
        # at most one level apart, so the worst ratio is a / (a b) — computed from the b the sampler uses.
        if sensitivity > self.sensitivity:
            return float("inf")
        return -math.log(self._b)

    def pdf(self, x):
        x = np.abs(np.asarray(x, dtype=np.float64)) / self.sensitivity
        period = np.floor(x)
        level = period + (x - period >= self.gamma)
        return self._a * self._b**level

    def cdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        tail = np.vectorize(self._upper_tail)(np.abs(x))
        return np.where(x < 0, tail, 1 - tail)

    def _upper_tail(self, t: float) -> float:
        """P(Z >= t) for t >= 0."""
        a, b, g, d = self._a, self._b, self.gamma, self.sensitivity
        k = math.floor(t / d)
        r = t / d - k
        full = a * d * (g + b * (1 - g)) * b**k / (1 - b)  # mass of periods >= k
        inside = a * b**k * d * (min(r, g) + b * max(0.0, r - g))
        return full - inside

    @property
    def breakpoints(self) -> tuple:
        d = self.sensitivity
        return tuple(sorted({s * (k + o) * d for k in range(3) for o in (0.0, self.gamma) for s in (-1, 1)}))


def staircase_second_moment(epsilon: float, sensitivity: float, gamma: float) -> float:
    """E[Z²] of the continuous staircase, in closed form via Σ b^k k^j (j = 0, 1, 2)."""
    b = math.exp(-epsilon)
    d = sensitivity
    a = (1 - b) / (2 * d * (gamma + b * (1 - gamma)))
    g0, g1, g2 = 1 / (1 - b), b / (1 - b) ** 2, b * (1 + b) / (1 - b) ** 3
    w = gamma * d
    # ∫_{kΔ}^{kΔ+w} x² dx = w Δ² k² + Δ w² k + w³/3 ; the low part of a period is the full period minus that.
    high = w * d * d * g2 + d * w * w * g1 + w**3 / 3 * g0
    full = d**3 * (g2 + g1 + g0 / 3)
    return 2 * a * ((1 - b) * high + b * full)


@dataclass(frozen=True)
class DiscreteLaplaceNoise:
    """Pr[Z = k] ∝ exp(-|k| / scale) on the integers."""

    scale: float

    @property
    def _alpha(self) -> float:
        return math.exp(-1.0 / self.scale)

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        p = 1 - self._alpha  # the difference of two iid geometrics is discrete Laplace
        return (rng.geometric(p, size) - rng.geometric(p, size)).astype(np.float64)

    @property
    def variance(self) -> float:
        a = self._alpha
        return 2 * a / (1 - a) ** 2

    def pmf(self, k):
        a = self._alpha
        return (1 - a) / (1 + a) * a ** np.abs(np.asarray(k, dtype=np.float64))

    def privacy_loss(self, sensitivity: float) -> float:
        return _discrete_privacy_loss(self.pmf, int(sensitivity))

    def upper_tail(self, t: int) -> float:
        """Pr[Z >= t] for an integer t."""
        a = self._alpha
        return a**t / (1 + a) if t >= 1 else 1 - a ** (1 - t) / (1 + a)


@dataclass(frozen=True)
class DiscreteStaircaseNoise:
    """Definition 19: pmf a(r) on 0 <= |i| < r, e^-ε a(r) on r <= |i| < Δ, decaying by e^-ε per period Δ."""

    epsilon: float
    sensitivity: int
    r: int

    @property
    def _b(self) -> float:
        return math.exp(-self.epsilon)

    @property
    def _a(self) -> float:
        b, r, d = self._b, self.r, self.sensitivity
        return (1 - b) / (2 * r + 2 * b * (d - r) - (1 - b))

    def pmf(self, i):
        i = np.abs(np.asarray(i, dtype=np.int64))
        period, offset = np.divmod(i, self.sensitivity)
        return self._a * self._b ** (period + (offset >= self.r))

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        b, r, d, a = self._b, self.r, self.sensitivity, self._a
        level = np.where(np.arange(d) < r, 1.0, b)
        first = level * np.where(np.arange(d) == 0, 1.0, 2.0)  # period 0: offset 0 has one sign only
        p_first = a * first.sum()
        in_first = rng.random(size) < p_first
        offset = np.where(in_first, rng.choice(d, size, p=first / first.sum()),
                          rng.choice(d, size, p=level / level.sum()))
        period = np.where(in_first, 0, rng.geometric(1 - b, size))  # P(k) ∝ b^k, k >= 1
        sign = rng.choice(np.array([-1, 1]), size)
        return (sign * (period * d + offset)).astype(np.float64)

    @property
    def variance(self) -> float:
        return float(discrete_staircase_second_moments(self.epsilon, self.sensitivity)[self.r - 1])

    def upper_tail(self, t: int) -> float:
        """Pr[Z >= t] for an integer t, summed per period in closed form."""
        if t < 1:
            return 1 - self.upper_tail(1 - t)
        b, r, d, a = self._b, self.r, self.sensitivity, self._a
        k, j = divmod(t, d)
        later_periods = a * (r + b * (d - r)) * b ** (k + 1) / (1 - b)
        rest_of_period = a * b**k * (max(0, r - j) + b * (d - max(j, r)))
        return later_periods + rest_of_period

    def privacy_loss(self, sensitivity: float) -> float:
        return _discrete_privacy_loss(self.pmf, int(sensitivity))


def discrete_staircase_second_moments(epsilon: float, sensitivity: int) -> np.ndarray:
    """E[Z²] for r = 1..Δ, closed form (x = 0 contributes nothing, so both signs count every term)."""
    b = math.exp(-epsilon)
    d = sensitivity
    r = np.arange(1, d + 1, dtype=np.float64)
    g0, g1, g2 = 1 / (1 - b), b / (1 - b) ** 2, b * (1 + b) / (1 - b) ** 3

    def block(n):  # Σ_k b^k Σ_{j<n} (kΔ + j)²
        return n * d * d * g2 + d * n * (n - 1) * g1 + (n - 1) * n * (2 * n - 1) / 6 * g0

    a = (1 - b) / (2 * r + 2 * b * (d - r) - (1 - b))
    return 2 * a * ((1 - b) * block(r) + b * block(float(d)))


def _discrete_privacy_loss(pmf, sensitivity: int) -> float:
    """max over shifts 1..Δ and points of |log pmf(i) - log pmf(i + s)|, over three periods (the pmfs here
    repeat their shape with a constant decay beyond that)."""
    if sensitivity <= 0:
        return 0.0
    points = np.arange(-3 * sensitivity, 3 * sensitivity + 1)
    logp = np.log(pmf(points))
    worst = 0.0
    for s in range(1, sensitivity + 1):
        worst = max(worst, float(np.max(np.abs(logp[s:] - logp[:-s]))))
    return worst


@dataclass(frozen=True, eq=False)
class AdditiveNoiseRandomizer:
    """M(y) = y + Z, optionally clipped to [low, high]. Labels must lie in [low, high]."""

    name: str
    epsilon: float
    low: float
    high: float
    noise: Any
    clip: bool
    input_values: np.ndarray | None = field(default=None, repr=False)  # the finite labels, when known
    parameters: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"{self.name}: noise is {self.certified_epsilon!r}-DP for range "
                                     f"{self.high - self.low}, above the requested {self.epsilon!r}")

    @property
    def certified_epsilon(self) -> float:
        return self.noise.privacy_loss(self.high - self.low)

    num_outputs = None  # continuous or countably infinite support

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.float64).ravel()
        if np.any(~((labels >= self.low) & (labels <= self.high))):
            raise CertificationError(f"{self.name}: labels outside [{self.low}, {self.high}] break the "
                                     "sensitivity the noise was calibrated to")
        noisy = labels + self.noise.sample(labels.size, rng)
        return np.clip(noisy, self.low, self.high) if self.clip else noisy

    def _clipped_moments(self, y: float) -> tuple[float, float]:
        """(E[M(y)] - y, E[½ (M(y) - y)²]) for the clipped continuous mechanism, by quadrature."""
        lo, hi = self.low - y, self.high - y
        p_lo, p_hi = float(self.noise.cdf(lo)), 1 - float(self.noise.cdf(hi))
        points = [p for p in self.noise.breakpoints if lo < p < hi] or None
        m1 = integrate.quad(lambda z: z * self.noise.pdf(z), lo, hi, points=points, limit=200)[0]
        m2 = integrate.quad(lambda z: z * z * self.noise.pdf(z), lo, hi, points=points, limit=200)[0]
        return p_lo * lo + p_hi * hi + m1, 0.5 * (p_lo * lo * lo + p_hi * hi * hi + m2)

    def _values(self) -> np.ndarray:
        if self.input_values is None:
            raise ValueError(f"{self.name}: per-label quantities need the finite input labels")
        return self.input_values

    @property
    def bias(self) -> np.ndarray:
        values = self._values()
        if not self.clip:
            return np.zeros(values.size)
        return np.array([self._clipped_moments(y)[0] for y in values])

    @property
    def max_abs_bias(self) -> float:
        return float(np.max(np.abs(self.bias)))

    def squared_loss_per_label(self) -> np.ndarray:
        values = self._values()
        if not self.clip:
            return np.full(values.size, 0.5 * self.noise.variance)
        return np.array([self._clipped_moments(y)[1] for y in values])

    def noisy_label_loss(self, prior) -> float:
        return float(normalized_prior(prior, self._values().size) @ self.squared_loss_per_label())

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon,
                "low": self.low, "high": self.high, "clip": self.clip,
                "noise": {"type": type(self.noise).__name__, **self.noise.__dict__}, "parameters": self.parameters}


# -- constructors ----------------------------------------------------------------------------------------------

def laplace(low: float, high: float, epsilon: float, *, discrete: bool = False, clip: bool = False,
            input_values=None) -> AdditiveNoiseRandomizer | FiniteRandomizer:
    epsilon = check_epsilon(epsilon)
    sensitivity = high - low
    scale = sensitivity / design_epsilon(epsilon) if sensitivity > 0 else 1.0
    noise = DiscreteLaplaceNoise(scale) if discrete else LaplaceNoise(scale)
    return _finish("laplace", epsilon, low, high, noise, discrete, clip, input_values)


def staircase(low: float, high: float, epsilon: float, *, discrete: bool = False, clip: bool = False,
              input_values=None) -> AdditiveNoiseRandomizer | FiniteRandomizer:
    epsilon = check_epsilon(epsilon)
    eps = design_epsilon(epsilon)
    sensitivity = high - low
    if discrete:
        d = max(int(round(sensitivity)), 1)
        r = int(np.argmin(discrete_staircase_second_moments(eps, d))) + 1
        noise = DiscreteStaircaseNoise(eps, d, r)
    else:
        d = sensitivity if sensitivity > 0 else 1.0
        best = optimize.minimize_scalar(lambda g: staircase_second_moment(eps, d, g), bounds=(1e-9, 1 - 1e-9),
                                        method="bounded", options={"xatol": 1e-10})
        noise = StaircaseNoise(eps, d, float(best.x))
    return _finish("staircase", epsilon, low, high, noise, discrete, clip, input_values)


def _finish(family, epsilon, low, high, noise, discrete, clip, input_values):
    name = f"{family}{'-discrete' if discrete else ''}{'-clipped' if clip else ''}"
    if discrete and clip:
        return clipped_discrete(name, epsilon, noise, int(low), int(high), input_values)
    values = None if input_values is None else np.asarray(input_values, dtype=np.float64)
    return AdditiveNoiseRandomizer(name, epsilon, float(low), float(high), noise, clip, values,
                                   {"discrete": discrete, "clip": clip})


def clipped_discrete(name: str, epsilon: float, noise, low: int, high: int, input_values=None) -> FiniteRandomizer:
    """clip(y + Z, low, high) for integer labels: outputs low..high, the tails collapse onto the ends."""
    inputs = np.arange(low, high + 1) if input_values is None else np.asarray(input_values, dtype=np.float64)
    outputs = np.arange(low, high + 1, dtype=np.float64)
    matrix = noise.pmf(outputs[None, :] - inputs[:, None])
    for row, y in enumerate(inputs.astype(np.int64)):
        matrix[row, 0] = noise.upper_tail(int(y - low))  # Pr[y + Z <= low] = Pr[Z >= y - low] (symmetry)
        matrix[row, -1] = noise.upper_tail(int(high - y))  # Pr[y + Z >= high]
    if high == low:
        matrix[:, 0] = 1.0
    return FiniteRandomizer.from_probabilities(name, epsilon, inputs, outputs, matrix,
                                               {"noise": type(noise).__name__, **noise.__dict__})
