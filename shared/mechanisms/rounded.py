"""A finite randomizer applied to continuous labels in [L, U] after unbiased randomized rounding onto its grid.

E[M(URR(y))] = E[URR(y)] + bias = y + bias(grid), so an unbiased finite mechanism stays unbiased on [L, U].
Privacy: for a label y the output distribution is a mixture of two rows of the finite matrix, so every likelihood
ratio is still bounded by the finite mechanism's column ratios — the certified ε carries over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.domains import ContinuousInterval
from shared.mechanisms.finite import FiniteRandomizer
from shared.mechanisms.randomized_response import RandomizedResponse


@dataclass(frozen=True, eq=False)
class RoundedRandomizer:
    domain: ContinuousInterval
    inner: FiniteRandomizer | RandomizedResponse  # a finite randomizer on the grid

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def epsilon(self) -> float:
        return self.inner.epsilon

    @property
    def certified_epsilon(self) -> float:
        return self.inner.certified_epsilon

    @property
    def num_outputs(self) -> int:
        return self.inner.num_outputs

    @property
    def input_values(self) -> np.ndarray:
        return self.inner.input_values

    @property
    def bias(self) -> np.ndarray:
        """Bias at the grid points (linear in between)."""
        return self.inner.bias

    @property
    def max_abs_bias(self) -> float:
        return self.inner.max_abs_bias

    def noisy_label_loss(self, grid_prior) -> float:
        """Loss for labels distributed on the grid (URR adds its own variance for off-grid labels)."""
        return self.inner.noisy_label_loss(grid_prior)

    def squared_loss_per_label(self) -> np.ndarray:
        return self.inner.squared_loss_per_label()

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        rows = self.domain.round_to_grid(labels, rng)
        return self.inner.output_values[self.inner.sample_indices(rows, rng)]

    def dp_event(self):
        return self.inner.dp_event()  # rounding is a mixture of rows: the inner randomizer's ε

    def describe(self, include_matrix: bool = True) -> dict:
        return {**self.inner.describe(include_matrix), "rounding": self.domain.describe()}
