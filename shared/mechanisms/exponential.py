"""The exponential mechanism over a finite candidate set, sampled exactly from uniformly random integers alone.

Candidate i has an integer penalty ``D_i >= 0`` (a score, lower is better) and is drawn with probability

    P(i) = exp(-(s/t) · D_i) / Σ_j exp(-(s/t) · D_j)

for an exact rational rate s/t. A penalty whose sensitivity (its largest change when one label changes) is Δ gives
a mechanism that is 2·Δ·(s/t)-DP: each weight moves by a factor of at most exp(Δ·s/t) and so does their sum
(McSherry & Talwar, "Mechanism Design via Differential Privacy", FOCS 2007, Theorem 6: weights exp(ε·u / (2Δu))
are ε-DP). :meth:`ExactExponential.calibrated` picks s/t <= ε / (2Δ).

Sampling is rejection from the uniform distribution: a candidate i uniform on {0..m-1} (``rng.integers``) is kept
with probability exp(-(s/t)·(D_i − min D)) — one Bernoulli(exp(-r/t)) for the fractional part r = s·ΔD mod t and
⌊s·ΔD / t⌋ Bernoulli(exp(-1)) for the integer part, all from Canonne, Kamath & Steinke's exact Algorithm 1
(:func:`shared.mechanisms.integer_noise.bernoulli_exp_neg`). The first kept candidate has exactly the distribution
P; each trial keeps at least the best candidate's 1/m, so a batch of 2m trials usually decides. Nothing here is a
float: the Gumbel-max trick (argmax of score + Gumbel noise) realizes P only up to the rounding of the floats it
draws, which is why it is not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from shared.mechanisms.integer_noise import _ratio_at_most, _round_up, bernoulli_exp_neg

MAX_BATCH = 1 << 17  # trials per vectorized round
MAX_WHOLE = 1 << 62  # ⌊rate · penalty⌋ counted in int64


@dataclass(frozen=True)
class ExactExponential:
    """Weights exp(-(s/t)·D) over integer penalties D: an exact rational rate, calibrated as the discrete Laplace's
    scale is (:class:`~shared.mechanisms.integer_noise.DiscreteLaplace`: to one part in 2**31, never above the
    request)."""

    s: int
    t: int

    @classmethod
    def calibrated(cls, epsilon: Fraction | float, sensitivity: int) -> ExactExponential:
        """The largest rate s/t (to one part in 2**31) with 2·sensitivity·s/t <= ``epsilon``."""
        if sensitivity < 1:
            raise ValueError("sensitivity must be a positive integer")
        return cls(*_ratio_at_most(Fraction(epsilon) / (2 * int(sensitivity))))

    def epsilon(self, sensitivity: int) -> Fraction:
        return Fraction(2 * int(sensitivity) * self.s, self.t)

    def certified_epsilon(self, sensitivity: int, draws: int = 1) -> float:
        """ε of ``draws`` independent draws (basic composition), rounded up to a double."""
        return _round_up(int(draws) * self.epsilon(sensitivity))

    def sample(self, penalties, rng: np.random.Generator, *, bound: int | None = None) -> int:
        """One candidate index, drawn with probability exactly P (the module docstring). ``bound``: a public
        upper bound on the penalties' excess over their minimum, which picks the arithmetic of :meth:`_split`
        (int64 when ``s·bound`` fits, else Python integers) so that the choice does not depend on the penalties;
        without it, Python integers."""
        excess = _excess(penalties)
        if bound is not None and int(excess.max()) > bound:
            raise ValueError("a penalty is above its stated bound")
        whole, fraction = self._split(excess, bound)
        m = excess.size
        batch = min(MAX_BATCH, 2 * m + 16)  # one round decides with probability >= 1 - e^-2 (each trial: >= 1/m)
        while True:
            picked = rng.integers(0, m, size=batch, dtype=np.int64)
            kept = bernoulli_exp_neg(fraction[picked], self.t, rng)
            remaining = whole[picked].copy()
            alive = np.flatnonzero(kept & (remaining > 0))
            while alive.size:  # ⌊γ⌋ successes of Bernoulli(exp(-1)) in a row; each round keeps ~37 %
                heads = bernoulli_exp_neg(np.ones(alive.size, dtype=np.int64), 1, rng)
                kept[alive[~heads]] = False
                remaining[alive] -= 1
                alive = alive[heads & (remaining[alive] > 0)]
            first = np.flatnonzero(kept)
            if first.size:
                return int(picked[first[0]])

    def probabilities(self, penalties) -> np.ndarray:
        """P as floats, for tests and utility (privacy rests on the exact sampler, not on these)."""
        excess = _excess(penalties).astype(np.float64)
        weights = np.exp(-(self.s / self.t) * excess)
        return weights / weights.sum()

    def _split(self, excess: np.ndarray, bound: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(⌊s·ΔD/t⌋, s·ΔD mod t) for every candidate, the same operations whatever the penalties (their running
        time must not depend on them: :mod:`labels_party.core.quantiles`, "Timing"). s·ΔD can pass 2**63 even where the
        quotient (a count of Bernoulli(exp(-1)) successes) is small: int64 only when ``s·bound`` is below 2**63,
        else Python integers (about 0.2 µs per candidate)."""
        if bound is not None and self.s * max(int(bound), 1) < 1 << 63:
            product = excess * np.int64(self.s)
            return product // self.t, product % self.t
        if bound is None:
            bound = int(excess.max())
        if self.s * int(bound) // self.t > MAX_WHOLE:  # the quotient of the largest possible penalty
            raise ValueError("a penalty times the rate is beyond 2**62")
        product = excess.astype(object) * self.s
        return (product // self.t).astype(np.int64), (product % self.t).astype(np.int64)

    def describe(self, sensitivity: int) -> dict:
        return {"type": "exponential-mechanism", "rate": self.s / self.t, "rate_rational": f"{self.s}/{self.t}",
                "penalty_sensitivity": int(sensitivity),
                "sampler": "uniform candidate kept with probability exp(-rate·(D − min D)): CKS20 Algorithm 1 "
                           "Bernoulli(exp(-γ)) (exact, integer draws only)"}


def _excess(penalties) -> np.ndarray:
    """The penalties less their minimum: integers >= 0 (the best candidate has weight exactly 1)."""
    penalties = np.asarray(penalties)
    if penalties.ndim != 1 or penalties.size == 0 or not np.issubdtype(penalties.dtype, np.integer):
        raise ValueError("the exponential mechanism needs a non-empty vector of integer penalties")
    return penalties.astype(np.int64) - int(penalties.min())
