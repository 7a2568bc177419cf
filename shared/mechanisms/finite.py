"""Finite label randomizers: an input set, an output set and the exact |Y| x |Ŷ| conditional distribution.

A :class:`FiniteRandomizer` cannot exist uncertified: construction quantizes the matrix to the probabilities the
sampler realizes (:mod:`shared.mechanisms.dyadic`), computes ``certified_epsilon`` from them, and refuses with
:class:`~shared.errors.CertificationError` if that exceeds the declared ``epsilon``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from shared import described
from shared.arrays import readonly
from shared.domains import FiniteLabels
from shared.errors import CertificationError, ErrorCode, LabelDPError
from shared.mechanisms import dyadic
from shared.mechanisms.events import LocalRandomizerDpEvent

SAMPLING_CHUNK = 1 << 16  # labels per vectorized pass (512 KB per array: the passes stay in cache)
VALUE_TABLE_CELLS = 1 << 20  # rows x buckets up to which sampling reads output values straight from 8 MB tables


def normalized_prior(prior, size: int) -> np.ndarray:
    """A probability vector of the given length; weights need not be normalized but must be valid."""
    prior = np.asarray(prior, dtype=np.float64).ravel()
    if prior.size != size:
        raise LabelDPError(f"prior has {prior.size} weights for {size} labels", code=ErrorCode.INVALID_PRIOR)
    if not np.all(np.isfinite(prior)) or np.any(prior < 0) or prior.sum() <= 0:
        raise LabelDPError("prior weights must be finite, non-negative and not all zero", code=ErrorCode.INVALID_PRIOR)
    return prior / prior.sum()


class OnFiniteInputs:
    """What every randomizer over a finite set of input labels shares: the label → row lookup, sampling output
    values through ``sample_indices``, and the bias from ``expected_output``. Subclasses are frozen dataclasses
    with ``name``, ``input_values`` and ``output_values``."""

    name: str
    input_values: np.ndarray
    output_values: np.ndarray

    @cached_property
    def _inputs(self) -> FiniteLabels:
        return FiniteLabels(self.input_values)

    def row_of(self, labels) -> np.ndarray:
        return self._inputs.index_of(labels, what=f"the inputs of {self.name}")

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        """Privatized labels (output values) for true labels (input values), ``SAMPLING_CHUNK`` labels at a time:
        the label lookup and the sampler's passes then work in cache, and their memory does not grow with the
        number of labels (only the result does)."""
        labels = np.asarray(labels, dtype=np.float64).ravel()
        released = np.empty(labels.size, dtype=np.float64)
        for start in range(0, labels.size, SAMPLING_CHUNK):
            part = labels[start:start + SAMPLING_CHUNK]
            released[start:start + part.size] = self.sample_rows(self.row_of(part), rng)
        return released

    def sample_indices(self, rows, rng: np.random.Generator) -> np.ndarray:
        """Output indices for input row indices (each subclass samples its own way)."""
        raise NotImplementedError

    def sample_rows(self, rows, rng: np.random.Generator) -> np.ndarray:
        """Output values for input row indices."""
        return self.output_values[self.sample_indices(rows, rng)]

    @property
    def expected_output(self) -> np.ndarray:
        """E[M(y)] for every input label (each subclass computes its own)."""
        raise NotImplementedError

    @property
    def bias(self) -> np.ndarray:
        """E[M(y)] - y for every input label."""
        return self.expected_output - self.input_values

    @property
    def max_abs_bias(self) -> float:
        return float(np.max(np.abs(self.bias)))


@dataclass(frozen=True, eq=False)
class FiniteRandomizer(OnFiniteInputs):
    """Pr[output = output_values[j] | label = input_values[i]] = matrix[i, j], exactly as sampled.

    ``epsilon`` is the privacy parameter the mechanism was requested at; ``certified_epsilon`` (≤ epsilon,
    enforced) is what the realized probabilities actually guarantee. ``parameters`` documents how the mechanism
    was built (for audit records); it plays no role in sampling.
    """

    name: str
    epsilon: float
    input_values: np.ndarray = field(repr=False)
    output_values: np.ndarray = field(repr=False)
    counts: np.ndarray = field(repr=False)  # integer numerators over 2**53, rows sum to exactly 2**53
    parameters: MappingProxyType = field(default_factory=lambda: MappingProxyType({}), repr=False)

    @classmethod
    def from_probabilities(cls, name: str, epsilon: float, input_values, output_values, probabilities,
                           parameters: dict[str, Any] | None = None) -> FiniteRandomizer:
        probabilities = np.asarray(probabilities, dtype=np.float64)
        input_values = np.asarray(input_values, dtype=np.float64).ravel()
        output_values = np.asarray(output_values, dtype=np.float64).ravel()
        if probabilities.shape != (input_values.size, output_values.size):
            raise ValueError(f"matrix shape {probabilities.shape} does not match "
                             f"{input_values.size} inputs x {output_values.size} outputs")
        if not np.all(np.isfinite(probabilities)) or np.any(probabilities < 0):
            raise CertificationError(f"{name}: matrix has negative or non-finite entries")
        row_sums = probabilities.sum(axis=1)
        if np.any(np.abs(row_sums - 1.0) > 1e-9):
            worst = row_sums[np.argmax(np.abs(row_sums - 1))]
            raise CertificationError(f"{name}: rows do not sum to 1 (worst {worst!r})")
        return cls(name=name, epsilon=float(epsilon), input_values=input_values, output_values=output_values,
                   counts=dyadic.quantize_rows(probabilities), parameters=MappingProxyType(dict(parameters or {})))

    def __post_init__(self):
        object.__setattr__(self, "input_values", readonly(self.input_values, np.float64))
        object.__setattr__(self, "output_values", readonly(self.output_values, np.float64))
        object.__setattr__(self, "counts", readonly(self.counts, np.int64))
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise LabelDPError(f"epsilon must be a positive finite number, got {self.epsilon!r}",
                               code=ErrorCode.INVALID_EPSILON)
        if self.counts.shape != (self.input_values.size, self.output_values.size):
            raise ValueError(f"{self.name}: counts of shape {self.counts.shape} for {self.input_values.size} inputs "
                             f"x {self.output_values.size} outputs")
        if not dyadic.rows_are_distributions(self.counts):
            raise CertificationError(f"{self.name}: counts are not a row-stochastic matrix over 2**53")
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"{self.name}: realized probabilities are {self.certified_epsilon!r}-DP, "
                                     f"above the requested epsilon {self.epsilon!r}; refusing to build it")

    # -- the distribution ---------------------------------------------------------------------------------------
    @cached_property
    def matrix(self) -> np.ndarray:
        """Exact sampled probabilities (dyadic rationals, exact in float64)."""
        m = self.counts / float(dyadic.RESOLUTION)
        m.setflags(write=False)
        return m

    @property
    def num_outputs(self) -> int:
        """Outputs that can actually occur."""
        return int(np.count_nonzero(self.counts.max(axis=0)))

    @cached_property
    def certified_epsilon(self) -> float:
        """max over outputs of log(max_y Pr[out | y] / min_y Pr[out | y]) on the realized probabilities."""
        return dyadic.log_ratio_bound(self.counts)

    # -- utility ---------------------------------------------------------------------------------------------
    @cached_property
    def expected_output(self) -> np.ndarray:
        return self.matrix @ self.output_values

    @property
    def conditional_variance(self) -> np.ndarray:
        """Var[M(y)] for every input label (the extra label noise an unbiased mechanism injects)."""
        centered = self.output_values[None, :] - self.expected_output[:, None]
        return np.sum(self.matrix * centered**2, axis=1)

    def squared_loss_per_label(self) -> np.ndarray:
        """E[½ (M(y) - y)²] for every input label."""
        diff = self.output_values[None, :] - self.input_values[:, None]
        return 0.5 * np.sum(self.matrix * diff**2, axis=1)

    def noisy_label_loss(self, prior) -> float:
        """G(M; P) = E_{y~P, ŷ~M(y)} ½(ŷ - y)² (Definition 4 with the squared loss, as in the paper)."""
        return float(normalized_prior(prior, self.input_values.size) @ self.squared_loss_per_label())

    def agreement_probability(self, prior) -> float:
        """Pr[M(y) = y] under the prior (classification utility; outputs and inputs share values)."""
        same = self.output_values[None, :] == self.input_values[:, None]
        return float(normalized_prior(prior, self.input_values.size) @ np.sum(self.matrix * same, axis=1))

    # -- sampling ----------------------------------------------------------------------------------------------
    @cached_property
    def _alias(self) -> dyadic.AliasTable:
        return dyadic.AliasTable.of(self.counts)

    def sample_indices(self, rows, rng: np.random.Generator) -> np.ndarray:
        """Output indices for input row indices (vectorized; exact probabilities of ``matrix``)."""
        return self._alias.sample(rows, rng)

    @cached_property
    def _value_tables(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each alias-table cell's two possible output values (its own bucket's, its alias'), when the tables are
        small: sampling then reads values directly instead of indices and then values (one pass fewer)."""
        alias = self._alias
        if alias.flat_alias.size > VALUE_TABLE_CELLS:
            return None
        outputs = np.concatenate([self.output_values, np.zeros((1 << alias.bits) - self.output_values.size)])
        own = np.tile(outputs, self.input_values.size)  # padding buckets are never their own output (threshold 0)
        return own, outputs[alias.flat_alias]

    def sample_rows(self, rows, rng: np.random.Generator) -> np.ndarray:
        tables = self._value_tables
        if tables is None:
            return self.output_values[self.sample_indices(rows, rng)]
        cell, own = self._alias.draw(rows, rng)
        return np.where(own, tables[0][cell], tables[1][cell])

    def dp_event(self) -> LocalRandomizerDpEvent:
        """A local randomizer at its certified ε (computed from the exact counts it samples)."""
        return LocalRandomizerDpEvent(mechanism=self.name, epsilon=self.certified_epsilon)

    # -- what the features party receives ------------------------------------------------------------------------
    def describe(self, include_matrix: bool = True) -> dict[str, Any]:
        """Public description: all of it is a function of DP outputs (noisy prior) and public parameters."""
        description = {
            "mechanism": self.name,
            "epsilon": self.epsilon,
            "certified_epsilon": self.certified_epsilon,
            "input_values": self.input_values.tolist(),
            "output_values": self.output_values.tolist(),
            "num_outputs": self.num_outputs,
            "parameters": dict(self.parameters),
        }
        if include_matrix:
            description["matrix_counts_over_2_53"] = self.counts.tolist()
        return description

    @classmethod
    def from_description(cls, description: dict) -> FiniteRandomizer:
        """The randomizer ``describe()`` (with its matrix) states, rebuilt exactly: the same values and integer
        counts, so the same alias tables and the same draws from the same generator. Refuses
        (``invalid_mechanism_document``) a malformed description, counts that are not distributions over 2**53 or
        not ε-DP at the described ε, and derived numbers (certified ε, outputs) that are not the rebuilt ones.
        Fields it does not read (a release's budget split, a rounding domain) are left to their readers."""
        name = described.text(description, "mechanism")
        inputs = described.real_vector(description, "input_values")
        outputs = described.real_vector(description, "output_values")
        counts = described.integer_matrix(description, "matrix_counts_over_2_53")
        epsilon = described.real(description, "epsilon", positive=True)
        parameters = MappingProxyType(described.mapping(description, "parameters"))
        with described.building():
            FiniteLabels(inputs)  # labels are looked up by value: the inputs must be strictly increasing
            randomizer = cls(name, epsilon, inputs, outputs, counts, parameters)
        described.agrees(description, "certified_epsilon", randomizer.certified_epsilon)
        described.agrees(description, "num_outputs", randomizer.num_outputs)
        return randomizer
