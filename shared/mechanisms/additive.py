"""Additive noise mechanisms on a lattice: M(y) = low + step · (index(y) + Z), Z integer noise.

The label is mapped to its lattice index (exactly for labels on the lattice — integers, evenly spaced values —
and by unbiased randomized rounding otherwise, see :class:`~shared.domains.Lattice`), Z is drawn exactly by
:mod:`shared.mechanisms.integer_noise`, and the released value is a function of the integer index + Z alone.
Nothing is sampled in floating point, so no bit of the output depends on the label beyond what ε allows.

Noise distributions (Appendix F of the optimal-unbiased paper), calibrated to the lattice's range Δ = steps:
* discrete Laplace (Definition 17), scale Δ/ε;
* discrete staircase (Definition 19) with the r that minimizes the variance (the squared loss).
The continuous Laplace and staircase of Definitions 18 and 20 are their limits as the lattice step shrinks; the
lattice step (the domain's ``grid_size`` for continuous labels) is part of the mechanism's description.

Privacy: two labels' lattice rows are at most Δ apart, a rounded label is a mixture of two rows, and the noise
is exactly ε-DP for shifts up to Δ, so ``certified_epsilon`` is the noise's exact rational ε (rounded up).
Unclipped, y + Z is unbiased with noisy label loss step²·Var(Z)/2 (plus the rounding's variance off the
lattice). Clipped to the lattice ends (post-processing, same ε) it is biased; bias and loss are computed from
the realized pmf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from shared import described
from shared.domains import Lattice
from shared.errors import CertificationError
from shared.mechanisms.events import LocalRandomizerDpEvent
from shared.mechanisms.finite import normalized_prior
from shared.mechanisms.integer_noise import DiscreteLaplace, DiscreteStaircase, noise_from_description
from shared.privacy import check_epsilon


@dataclass(frozen=True, eq=False)
class AdditiveNoiseRandomizer:
    """M(y) = lattice value of (index(y) + Z), optionally clipped to the lattice ends."""

    name: str
    epsilon: float
    lattice: Lattice
    noise: DiscreteLaplace | DiscreteStaircase
    clip: bool
    input_values: np.ndarray | None = field(default=None, repr=False)  # the finite labels, for utility numbers

    def __post_init__(self):
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"{self.name}: noise is {self.certified_epsilon!r}-DP over {self.lattice.steps} "
                                     f"steps, above the requested {self.epsilon!r}")

    @property
    def certified_epsilon(self) -> float:
        return self.noise.certified_epsilon(self.lattice.steps)

    @property
    def num_outputs(self) -> int | None:
        return self.lattice.steps + 1 if self.clip else None  # unclipped: countably infinite

    @property
    def noise_variance(self) -> float:
        """Var of the added noise in label units (unclipped)."""
        return self.lattice.step**2 * self.noise.variance

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        index = self.lattice.round(labels, rng)
        noisy = index + self.noise.sample(index.size, rng)
        if self.clip:
            noisy = np.clip(noisy, 0, self.lattice.steps)
        return self.lattice.value(noisy)

    # -- utility, from the realized pmf ----------------------------------------------------------------------
    def _row_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """(E[out - x_k], E[(out - x_k)²]) in label units for every lattice index k."""
        d, h = self.lattice.steps, self.lattice.step
        k = np.arange(d + 1)
        if not self.clip:
            return np.zeros(d + 1), np.full(d + 1, h * h * self.noise.variance)
        z = np.arange(-d, d + 1)
        p = self.noise.pmf(z)
        zf = z.astype(np.float64)
        first, second = np.concatenate([[0.0], np.cumsum(zf * p)]), np.concatenate([[0.0], np.cumsum(zf * zf * p)])
        # interior outputs: z from -k+1 to d-k-1 (indices into the cumsums offset by d, plus one for the leading 0)
        lo, hi = -k + 1 + d, d - k - 1 + d + 1
        hi = np.maximum(hi, lo)
        tails = self._tails(k, p)  # Pr[Z >= k] = Pr[Z <= -k]
        top = self._tails(d - k, p)  # Pr[Z >= d - k]
        m1 = first[hi] - first[lo] - k * tails + (d - k) * top
        m2 = second[hi] - second[lo] + k * k * tails + (d - k) ** 2 * top
        return h * m1, h * h * m2

    def _tails(self, starts: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Pr[Z >= s] for each s in 0..d, from the pmf on [-d, d] and the exact tail beyond d."""
        d = self.lattice.steps
        beyond = self.noise.upper_tail(d + 1)
        suffix = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])  # suffix[i] = Σ_{z >= i - d, z <= d} p
        return suffix[np.asarray(starts) + d] + beyond

    def _values(self) -> np.ndarray:
        if self.input_values is None:
            raise ValueError(f"{self.name}: per-label quantities need the finite input labels")
        return self.input_values

    def _per_label(self) -> tuple[np.ndarray, np.ndarray]:
        """(bias, E[½ (M(y) - y)²]) for every input label; off-lattice labels mix their two rows."""
        values = self._values()
        m1, m2 = self._row_moments()
        position = self.lattice.positions(values)
        lower = np.minimum(np.floor(position).astype(np.int64), self.lattice.steps - 1)
        upper_weight = position - lower
        bias = np.zeros(values.size)
        loss = np.zeros(values.size)
        for row, weight in ((lower, 1 - upper_weight), (lower + 1, upper_weight)):
            offset = self.lattice.value(row) - values  # x_k - y
            bias += weight * m1[row]
            loss += weight * (m2[row] + 2 * offset * m1[row] + offset**2)
        return bias, 0.5 * loss

    @property
    def bias(self) -> np.ndarray:
        """E[M(y)] - y for every input label."""
        return self._per_label()[0]

    @property
    def max_abs_bias(self) -> float:
        return float(np.max(np.abs(self.bias)))

    def squared_loss_per_label(self) -> np.ndarray:
        return self._per_label()[1]

    def noisy_label_loss(self, prior) -> float:
        return float(normalized_prior(prior, self._values().size) @ self.squared_loss_per_label())

    def dp_event(self) -> dp_event.DpEvent:
        """Discrete Laplace noise is dp-accounting's DiscreteLaplaceDpEvent (pmf ∝ exp(-(s/t)|z|), sensitivity Δ
        steps); the staircase a local randomizer at its exact ε. Clipping is post-processing."""
        if isinstance(self.noise, DiscreteLaplace):
            return dp_event.DiscreteLaplaceDpEvent(noise_parameter=self.noise.s / self.noise.t,
                                                   sensitivity=int(self.lattice.steps))
        return LocalRandomizerDpEvent(mechanism=self.name, epsilon=self.certified_epsilon)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon,
                "low": self.lattice.low, "high": self.lattice.high, "clip": self.clip,
                "lattice": self.lattice.describe(), "noise": self.noise.describe(),
                "rounding": "labels off the lattice: unbiased randomized rounding to a neighbouring lattice point",
                "parameters": {"sensitivity_steps": self.lattice.steps}}

    @classmethod
    def from_description(cls, description: dict) -> AdditiveNoiseRandomizer:
        """The additive mechanism ``describe()`` states, rebuilt exactly: the same lattice numbers and integer
        noise parameters, so the same draws from the same generator. Refuses (``invalid_mechanism_document``) a
        malformed description, noise that is not ε-DP over the lattice at the described ε, and stated numbers
        (certified ε, the lattice's ends, its sensitivity) that are not the rebuilt ones. The finite input labels
        (``input_values``, for bias and loss) are not described: the rebuilt mechanism samples, certifies and
        describes itself as the original, and computes its per-label utility only given them (``dataclasses.replace``).
        """
        name = described.text(description, "mechanism")
        lattice = Lattice.from_description(described.mapping(description, "lattice"))
        noise = noise_from_description(described.mapping(description, "noise"))
        if isinstance(noise, DiscreteStaircase) and noise.period != lattice.steps:
            raise described.invalid(f"{name}: the staircase's period {noise.period} is not the lattice's "
                                    f"{lattice.steps} steps (its sensitivity)")
        clip = described.flag(description, "clip")
        epsilon = described.real(description, "epsilon", positive=True)
        with described.building(name):
            randomizer = cls(name, epsilon, lattice, noise, clip)
        described.agrees(description, "certified_epsilon", randomizer.certified_epsilon)
        described.agrees(description, "low", lattice.low)
        described.agrees(description, "high", lattice.high)
        described.agrees(described.mapping(description, "parameters"), "sensitivity_steps", lattice.steps)
        return randomizer


# -- constructors ----------------------------------------------------------------------------------------------

def laplace(lattice: Lattice, epsilon: float, *, clip: bool = False, input_values=None) -> AdditiveNoiseRandomizer:
    """Discrete Laplace noise of scale Δ/ε lattice steps (to one part in 2**31, never below)."""
    epsilon = check_epsilon(epsilon)
    noise = DiscreteLaplace.calibrated(epsilon, lattice.steps)
    return _finish("laplace", epsilon, lattice, noise, clip, input_values)


def staircase(lattice: Lattice, epsilon: float, *, clip: bool = False, input_values=None) -> AdditiveNoiseRandomizer:
    """Discrete staircase noise of period Δ lattice steps and the variance-optimal r."""
    epsilon = check_epsilon(epsilon)
    noise = DiscreteStaircase.calibrated(epsilon, lattice.steps)
    return _finish("staircase", epsilon, lattice, noise, clip, input_values)


def _finish(family, epsilon, lattice, noise, clip, input_values) -> AdditiveNoiseRandomizer:
    values = None if input_values is None else np.asarray(input_values, dtype=np.float64)
    return AdditiveNoiseRandomizer(f"{family}-clipped" if clip else family, epsilon, lattice, noise, bool(clip),
                                   values)

