"""Integer noise sampled exactly: discrete Laplace and discrete staircase from uniformly random integers alone.

Why not ``rng.laplace``/``rng.geometric``: those invert a float uniform, so their outputs live on a sparse,
label-dependent set of doubles and their far tails are cut off — a published ``y + noise`` can then rule out
labels (Mironov, "On significance of the least significant bits for differential privacy", CCS 2012).

The samplers here follow Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (2020):

* Algorithm 1 — Bernoulli(exp(-n/d)) for integers 0 <= n <= d: draw ``A_K ~ Bernoulli(n / (d K))`` for K = 1, 2, …
  until one fails; return whether the failing K is odd.
* Algorithm 2 — the geometric part of the discrete Laplace: ``U`` uniform on {0..t-1} accepted with probability
  exp(-U/t), plus ``t·V`` with ``V`` the number of Bernoulli(exp(-1)) successes before a failure, gives
  ``X`` with Pr[X = x] ∝ exp(-x/t); then ``Y = X // s`` has Pr[Y = y] ∝ exp(-y s/t). A uniform sign, rejecting
  "negative zero", gives the discrete Laplace with scale t/s.

Every draw is ``rng.integers(0, n)`` with integer ``n`` — exactly uniform given uniform bits — so the realized
distribution is exactly the stated one, and the privacy parameter is the exact rational ``s/t`` per unit of
sensitivity. The loops are vectorized: each round handles all samples still pending, and the pending set shrinks
geometrically, so a batch costs a small constant number of passes.

The staircase (optimal-unbiased paper, Definition 19) reuses the same geometric for its periods; its offset
within a period comes from two integer weights (see :class:`DiscreteStaircase`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from shared import described
from shared.errors import ErrorCode, LabelDPError

# Numerators and denominators are kept below these so that every intermediate (d·K, U + t·V) fits in int64.
_PRECISION = 1 << 31  # rational approximations of a scale are exact to better than 1 part in 2**31
_MAX_DENOMINATOR = 1 << 56


def bernoulli_exp_neg(numerator, denominator, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-numerator/denominator)) per entry, for integers 0 <= numerator <= denominator
    (CKS20 Algorithm 1). Arrays broadcast; returns booleans."""
    n, d = np.broadcast_arrays(np.asarray(numerator, dtype=np.int64), np.asarray(denominator, dtype=np.int64))
    n, d = n.ravel(), d.ravel()
    if np.any(n < 0) or np.any(n > d) or np.any(d <= 0) or np.any(d > _MAX_DENOMINATOR):
        raise ValueError("bernoulli_exp_neg needs 0 <= numerator <= denominator <= 2**56")
    return _bernoulli_exp_neg(n, d, rng)


def _bernoulli_exp_neg(n: np.ndarray, d: np.ndarray | int, rng: np.random.Generator) -> np.ndarray:
    per_entry = d if isinstance(d, np.ndarray) and d.ndim > 0 else None  # None: one denominator for all entries
    result = np.empty(n.size, dtype=bool)
    k = 1
    active = np.arange(n.size)
    while active.size:
        # A_K ~ Bernoulli(γ / K) with γ = n/d: a uniform integer below d·K falls below n. K stays tiny
        # (Pr[K > m] = γ^m / m!); the bound keeps d·K inside int64 even for d = 2**56.
        if k > 64:
            raise ArithmeticError("Bernoulli(exp(-gamma)) ran past K = 64")
        high = d * k if per_entry is None else per_entry[active] * k
        heads = rng.integers(0, high, size=active.size, dtype=np.int64) < n[active]
        result[active[~heads]] = (k & 1) == 1
        active = active[heads]
        k += 1
    return result


def geometric_exp(s: int, t: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` integers Y >= 0 with Pr[Y = y] = (1 - e^(-s/t)) e^(-y s/t), exactly (CKS20 Algorithm 2's core)."""
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        u = rng.integers(0, t, size=pending.size, dtype=np.int64)
        accepted = _bernoulli_exp_neg(u, t, rng)  # U accepted with probability exp(-U/t)
        done, u = pending[accepted], u[accepted]
        pending = pending[~accepted]
        v = np.zeros(done.size, dtype=np.int64)  # successes of Bernoulli(exp(-1)) before the first failure
        running = np.arange(done.size)
        while running.size:
            heads = _bernoulli_exp_neg(np.ones(running.size, dtype=np.int64), 1, rng)
            running = running[heads]
            v[running] += 1
        if v.size and int(v.max()) > ((1 << 62) - t) // t:  # Pr ≈ exp(-2**62 / t): never, but never wrap around
            raise ArithmeticError("geometric draw out of int64 range")
        out[done] = (u + t * v) // s
    return out


def discrete_laplace(s: int, t: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` integers with Pr[Z = z] ∝ exp(-|z| s/t) (scale t/s), exactly (CKS20 Algorithm 2)."""
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        y = geometric_exp(s, t, pending.size, rng)
        negative = rng.integers(0, 2, size=pending.size, dtype=np.int64) == 1
        keep = ~(negative & (y == 0))  # "-0" is rejected so that 0 is not counted twice
        out[pending[keep]] = np.where(negative, -y, y)[keep]
        pending = pending[~keep]
    return out


def discrete_gaussian(variance: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` integers with Pr[Z = z] ∝ exp(-z² / (2 variance)), exactly (CKS20 Algorithm 3, for an integer
    σ² = ``variance``): Y from the discrete Laplace of scale t = ⌊σ⌋ + 1, kept with probability
    exp(-(|Y| - σ²/t)² / (2σ²)) = exp(-(|Y| t - σ²)² / (2σ² t²)) — a rational exponent, drawn as its whole part's
    Bernoulli(exp(-1)) trials and one Bernoulli of the remainder."""
    variance = int(variance)
    if not 1 <= variance <= 1 << 24:
        raise ValueError("discrete Gaussian needs an integer variance in [1, 2**24]")
    t = math.isqrt(variance) + 1
    denominator = 2 * variance * t * t
    largest = (math.isqrt((1 << 63) - 1) + variance) // t  # |Y| beyond it: (|Y| t - σ²)² leaves int64
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        y = discrete_laplace(1, t, pending.size, rng)
        if np.abs(y).max(initial=0) > largest:  # |Y| > 180 t at σ² = 2**24: Pr < exp(-180), but never wrap around
            raise ArithmeticError("discrete Laplace draw out of range")
        gap = np.abs(y) * t - variance
        whole, rest = np.divmod(gap * gap, denominator)
        keep = _bernoulli_exp_neg(rest, denominator, rng)
        trials = np.flatnonzero(keep & (whole > 0))
        while trials.size:  # each unit of the whole part: one more Bernoulli(exp(-1)) that must succeed
            heads = _bernoulli_exp_neg(np.ones(trials.size, dtype=np.int64), 1, rng)
            keep[trials[~heads]] = False
            whole[trials] -= 1
            trials = trials[heads & (whole[trials] > 0)]
        out[pending[keep]] = y[keep]
        pending = pending[~keep]
    return out


def discrete_gaussian_pmf(variance: int, z) -> np.ndarray:
    """Pr[Z = z] of :func:`discrete_gaussian` (normalized over |z| ≤ 40σ, where all but 10⁻³⁰⁰ of the mass is)."""
    sigma = math.sqrt(variance)
    support = np.arange(-int(40 * sigma) - 1, int(40 * sigma) + 2)
    total = np.exp(-support.astype(np.float64) ** 2 / (2 * variance)).sum()
    return np.exp(-np.asarray(z, dtype=np.float64) ** 2 / (2 * variance)) / total


def _ratio_at_most(value: Fraction) -> tuple[int, int]:
    """(s, t) with s/t <= value and t <= 2**56: within one part in 2**31 of value, or in s when the cap on t
    binds (rates below 2**-25; e.g. ε = 10⁻⁶ over 10⁶ steps gives s = 72057, 1.4e-5 below the request)."""
    if value <= 0:
        raise ValueError("needs a positive rate")
    if value >= 1:
        t = _PRECISION
    else:
        t = min(_MAX_DENOMINATOR, -(-_PRECISION * value.denominator // value.numerator))  # ceil(2^31 / value)
    s = math.floor(value * t)
    if s < 1:
        raise LabelDPError("epsilon is too small for this sensitivity (noise scale above 2**56)",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    return s, t


def _round_up(value: Fraction) -> float:
    """The smallest float >= value (certified ε must never be understated)."""
    approx = float(value)
    return approx if Fraction(approx) >= value else math.nextafter(approx, math.inf)


@dataclass(frozen=True)
class DiscreteLaplace:
    """Pr[Z = z] ∝ exp(-|z| s/t) on the integers: scale t/s, an exact rational.

    Shifting the input by up to ``sensitivity`` changes log Pr by at most ``sensitivity · s/t`` — the ε of
    :meth:`epsilon`, exact, because the sampler realizes this pmf exactly.
    """

    s: int
    t: int

    def __post_init__(self):
        if not (1 <= self.s <= _MAX_DENOMINATOR and 1 <= self.t <= _MAX_DENOMINATOR):
            raise ValueError("discrete Laplace needs integers 1 <= s, t <= 2**56 (its draws stay inside int64)")

    @classmethod
    def calibrated(cls, epsilon: float | Fraction, sensitivity: int) -> DiscreteLaplace:
        """The smallest scale (see :func:`_ratio_at_most` for the precision) whose exact ε at ``sensitivity`` is
        <= ``epsilon``."""
        if sensitivity < 1:
            raise ValueError("sensitivity must be a positive integer")
        return cls(*_ratio_at_most(Fraction(epsilon) / sensitivity))

    def epsilon(self, sensitivity: int) -> Fraction:
        return Fraction(self.s * int(sensitivity), self.t)

    def certified_epsilon(self, sensitivity: int) -> float:
        return _round_up(self.epsilon(sensitivity))

    @property
    def scale(self) -> float:
        return self.t / self.s

    @property
    def alpha(self) -> float:
        """exp(-s/t): the pmf's ratio between neighbouring integers."""
        return math.exp(-self.s / self.t)

    @property
    def _one_minus_alpha(self) -> float:
        return -math.expm1(-self.s / self.t)  # no cancellation when s/t is tiny

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        return discrete_laplace(self.s, self.t, int(size), rng)

    def pmf(self, z) -> np.ndarray:
        a = self.alpha
        return self._one_minus_alpha / (1 + a) * np.exp(-self.s / self.t * np.abs(np.asarray(z, dtype=np.float64)))

    def upper_tail(self, z: int) -> float:
        """Pr[Z >= z] for an integer z."""
        rate, a = self.s / self.t, self.alpha
        return math.exp(-rate * z) / (1 + a) if z >= 1 else 1 - math.exp(-rate * (1 - z)) / (1 + a)

    @property
    def variance(self) -> float:
        return 2 * self.alpha / self._one_minus_alpha**2

    def describe(self) -> dict:
        return {"type": "discrete-laplace", "scale": self.scale, "scale_rational": f"{self.t}/{self.s}",
                "sampler": "CKS20 Algorithm 2 (exact, integer draws only)"}

    @classmethod
    def from_description(cls, description: dict) -> DiscreteLaplace:
        """The noise ``describe()`` states, from its exact scale ``t/s`` (as written, unreduced: the sampler draws
        below t); ``scale`` must be that ratio's float."""
        t, s = described.ratio(description, "scale_rational", _MAX_DENOMINATOR)
        with described.building():
            noise = cls(s, t)
        described.agrees(description, "scale", noise.scale)
        return noise


@dataclass(frozen=True)
class DiscreteStaircase:
    """The discrete staircase (optimal-unbiased paper, Definition 19, after Geng & Viswanath) as sampled.

    |Z| = k·Δ + j with the period k geometric, Pr[k] ∝ exp(-k s/t), and the offset j in [0, Δ) with integer
    weight ``w_low`` for j < r and ``w_high`` for j >= r, sampled as one uniform integer below
    r·w_low + (Δ - r)·w_high; the sign is uniform with "-0" rejected. Definition 19 has w_low / w_high = e^ε
    exactly; integers can only come close, so the weights are chosen with w_high <= w_low <= e^ε · w_high.
    Then for any shift of at most Δ the log-ratio of the realized pmf is at most ε = s/t: within a period it
    is log(w_low / w_high) <= ε, across a period boundary ε - log(w_low / w_high) ∈ [0, ε], and across zero
    at most ε. So :meth:`epsilon` is exactly s/t for sensitivities up to Δ.
    """

    s: int
    t: int
    period: int  # Δ, the sensitivity in lattice steps
    r: int
    w_low: int
    w_high: int

    def __post_init__(self):
        if not (1 <= self.s <= _MAX_DENOMINATOR and 1 <= self.t <= _MAX_DENOMINATOR):
            raise ValueError("staircase needs integers 1 <= s, t <= 2**56 (its draws stay inside int64)")
        if not (1 <= self.r <= self.period) or not (1 <= self.w_high <= self.w_low):
            raise ValueError("staircase needs 1 <= r <= period and 1 <= w_high <= w_low")
        if self._total_weight > 1 << 62:
            raise ValueError("staircase offset weights above 2**62 in total (one int64 draw below them)")
        # Logs of integers below 2**62 are correct to ~1e-14; calibrated() leaves 1e-12 of room.
        if math.log(self.w_low) - math.log(self.w_high) > self.s / self.t - 1e-13:
            raise ValueError("staircase weights exceed the ratio e^epsilon")

    @classmethod
    def calibrated(cls, epsilon: float, sensitivity: int) -> DiscreteStaircase:
        """The variance-minimizing r for the requested ε (closed-form second moments), ε = s/t <= epsilon."""
        if sensitivity < 1:
            raise ValueError("sensitivity must be a positive integer")
        s, t = _ratio_at_most(Fraction(epsilon))
        eps = s / t
        r = int(np.argmin(discrete_staircase_second_moments(eps, sensitivity))) + 1
        # Integer weights with r·w_low + (Δ-r)·w_high <= 2**62 (one uniform draw below it) and w_low / w_high
        # just under e^ε: within ~1e-12 of it while e^ε is moderate; where e^ε exceeds what 62 bits express,
        # the ratio saturates below it (more private, not less).
        budget = 1 << 62
        ratio = math.exp(eps) * (1 - 1e-12) if eps < 43 else math.inf
        if r * min(ratio, 2.0**62) + (sensitivity - r) <= 2.0**22:
            w_high = 1 << 40
        else:
            w_high = max(1, int(budget / (r * min(ratio, 2.0**62) + (sensitivity - r))))
        ceiling = (budget - (sensitivity - r) * w_high) // r
        w_low = max(w_high, min(ceiling, int(w_high * ratio) if ratio < 2.0**62 else ceiling))
        return cls(s, t, sensitivity, r, w_low, w_high)

    def epsilon(self, sensitivity: int) -> Fraction:
        if sensitivity > self.period:
            raise ValueError("the staircase is calibrated for shifts up to its period")
        return Fraction(self.s, self.t)

    def certified_epsilon(self, sensitivity: int) -> float:
        return _round_up(self.epsilon(sensitivity))

    @property
    def _total_weight(self) -> int:
        return self.r * self.w_low + (self.period - self.r) * self.w_high

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        size = int(size)
        out = np.empty(size, dtype=np.int64)
        pending = np.arange(size)
        low_mass = self.r * self.w_low
        while pending.size:
            k = geometric_exp(self.s, self.t, pending.size, rng)
            u = rng.integers(0, self._total_weight, size=pending.size, dtype=np.int64)
            j = np.where(u < low_mass, u // self.w_low, self.r + (u - low_mass) // self.w_high)
            magnitude = k * self.period + j
            negative = rng.integers(0, 2, size=pending.size, dtype=np.int64) == 1
            keep = ~(negative & (magnitude == 0))
            out[pending[keep]] = np.where(negative, -magnitude, magnitude)[keep]
            pending = pending[~keep]
        return out

    # -- the realized distribution (for utility numbers; privacy is the exact ε above) ----------------------
    @property
    def _b(self) -> float:
        return math.exp(-self.s / self.t)

    @property
    def _one_minus_b(self) -> float:
        return -math.expm1(-self.s / self.t)

    def _offset_weights(self) -> np.ndarray:
        return np.where(np.arange(self.period) < self.r, self.w_low, self.w_high).astype(np.float64)

    @property
    def _zero_mass(self) -> float:
        """Pr[|Z| = 0] before the sign (the "-0" rejection renormalizes by 2 - this)."""
        return self._one_minus_b * self.w_low / self._total_weight

    def pmf(self, z) -> np.ndarray:
        m = np.abs(np.asarray(z, dtype=np.int64))
        k, j = np.divmod(m, self.period)
        w = np.where(j < self.r, self.w_low, self.w_high).astype(np.float64)
        decay = np.exp(-self.s / self.t * k.astype(np.float64))
        return self._one_minus_b * decay * w / self._total_weight / (2 - self._zero_mass)

    def upper_tail(self, z: int) -> float:
        """Pr[Z >= z] for an integer z."""
        if z < 1:
            return 1 - self.upper_tail(1 - z)
        b, one_minus_b, total = self._b, self._one_minus_b, self._total_weight
        k, j = divmod(int(z), self.period)
        w = self._offset_weights()
        rest_of_period = w[j:].sum() / total
        later = b / one_minus_b * w.sum() / total
        return one_minus_b * math.exp(-self.s / self.t * k) * (rest_of_period + later) / (2 - self._zero_mass)

    @property
    def variance(self) -> float:
        c, d = self._one_minus_b, self.period
        g0, g1, g2 = _geometric_moments(self.s / self.t)
        j = np.arange(d, dtype=np.float64)
        w = self._offset_weights() / self._total_weight
        second = c * float(np.sum(w * (d * d * g2 + 2 * d * j * g1 + j * j * g0)))  # E[|Z|²] before sign
        return 2 * second / (2 - self._zero_mass)

    def describe(self) -> dict:
        return {"type": "discrete-staircase", "period": self.period, "r": self.r,
                "epsilon_rational": f"{self.s}/{self.t}", "offset_weights": [self.w_low, self.w_high],
                "sampler": "exact geometric periods (CKS20) and one uniform integer for the offset"}

    @classmethod
    def from_description(cls, description: dict) -> DiscreteStaircase:
        """The noise ``describe()`` states: its exact ε ``s/t`` (as written), period, r and integer offset
        weights."""
        s, t = described.ratio(description, "epsilon_rational", _MAX_DENOMINATOR)
        period = described.integer(description, "period", 1)
        r = described.integer(description, "r", 1)
        weights = described.integer_vector(description, "offset_weights")
        if weights.size != 2:
            raise described.invalid("'offset_weights' must be [w_low, w_high]")
        with described.building():
            return cls(s, t, period, r, int(weights[0]), int(weights[1]))


def noise_from_description(description: dict) -> DiscreteLaplace | DiscreteStaircase:
    """The integer noise a description's ``type`` names, rebuilt exactly."""
    kind = described.text(description, "type")
    if kind == "discrete-laplace":
        return DiscreteLaplace.from_description(description)
    if kind == "discrete-staircase":
        return DiscreteStaircase.from_description(description)
    raise described.invalid(f"unknown noise type {kind!r}")


def discrete_staircase_second_moments(epsilon: float, sensitivity: int) -> np.ndarray:
    """E[Z²] of Definition 19 for r = 1..Δ, closed form (x = 0 contributes nothing, so both signs count every
    term). Used to choose r."""
    b, c = math.exp(-epsilon), -math.expm1(-epsilon)  # c = 1 - b without cancellation
    d = sensitivity
    r = np.arange(1, d + 1, dtype=np.float64)
    g0, g1, g2 = _geometric_moments(epsilon)

    def block(n):  # Σ_k b^k Σ_{j<n} (kΔ + j)²
        return n * d * d * g2 + d * n * (n - 1) * g1 + (n - 1) * n * (2 * n - 1) / 6 * g0

    a = c / (2 * r + 2 * b * (d - r) - c)
    return 2 * a * (c * block(r) + b * block(float(d)))


def _geometric_moments(epsilon: float) -> tuple[float, float, float]:
    """Σ_k b^k k^p for p = 0, 1, 2 with b = e^-ε (the staircase's periods are geometric in b)."""
    b, c = math.exp(-epsilon), -math.expm1(-epsilon)  # c = 1 - b without cancellation
    return 1 / c, b / c**2, b * (1 + b) / c**3
