"""Randomized-response family: every mechanism here is public given its parameters (no prior needed, or a prior
that is itself DP output), so both parties can rebuild it.

* K-ary randomized response (Definition 21), on any finite set of label values.
* Debiased randomized response (Definition 23): RR onto Φ(y) = ((e^ε+|Y|-1) y - Σ y') / (e^ε-1), unbiased.
* RR-on-Bins (Definition 22) for a given map Φ: Y → Ŷ (the optimal map is solved in labels_party).
* RR-Top-k over a given set of k candidate classes ("Deep Learning with Label DP").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np
from dp_accounting import dp_event

from shared import described
from shared.arrays import readonly
from shared.domains import FiniteLabels
from shared.errors import CertificationError, ErrorCode, LabelDPError
from shared.mechanisms import dyadic
from shared.mechanisms.events import LocalRandomizerDpEvent
from shared.mechanisms.finite import OnFiniteInputs, normalized_prior
from shared.privacy import check_epsilon, design_epsilon

DENSE_MATRIX_LIMIT = 4096  # ``matrix`` materializes m x m floats only up to this many outputs



def keep_epsilon(outputs: int, keep: int) -> float:
    """Exact privacy of randomized response over ``outputs`` values that keeps the true one with probability
    keep / 2**53 and spreads the rest evenly: log(p / q) = log(keep (outputs − 1) / (2**53 − keep)), an upper bound
    from the integers (0 for one output: nothing depends on the label). RR, RR-on-bins and RR-Top-k all use it."""
    if outputs <= 1:
        return 0.0
    return float(dyadic.log_ratio_upper(keep, dyadic.RESOLUTION - keep) + dyadic.log_ratio_upper(outputs - 1, 1))

@dataclass(frozen=True, eq=False)
class RandomizedResponse(OnFiniteInputs):
    """Randomized response over m output values (Definition 21; dbRR, Definition 23, when the outputs are the
    debiased Φ(y); RR-on-Bins, Definition 22, when several labels share a bin): each input label has its own
    output, ``output_values[bin_of_input[label]]`` (by default one output per input). The own output comes with
    probability keep / 2**53, otherwise one of the other m − 1 uniformly — an exact integer draw below m − 1,
    shifted past the own one. Nothing is materialized beyond the |Y| + m values, so memory and time are
    O(|Y| + m) at any size (a dense matrix at |Y| = 20,000 and m = 2,000 would be 320 MB before sampling tables).

    For an output o, the largest probability is p = keep / 2**53 (o is the label's own) and the smallest
    q = (1 − p)/(m − 1), so ``certified_epsilon`` = log(p / q), computed as an upper bound from the integers. Two
    bins may share an output value (their outputs are then indistinguishable, which only merges columns of an
    ε-DP matrix and stays ε-DP); ``certified_epsilon`` bounds the finer mechanism.
    """

    name: str
    epsilon: float
    input_values: np.ndarray = field(repr=False)
    output_values: np.ndarray = field(repr=False)
    keep: int  # numerator over 2**53
    parameters: MappingProxyType = field(default_factory=lambda: MappingProxyType({}), repr=False)
    bin_of_input: np.ndarray | None = field(default=None, repr=False)  # None: input i's own output is output i

    @staticmethod
    def keep_count(num_outputs: int, design: float) -> int:
        """round(2**53 · e^ε / (e^ε + m − 1)), the own output's count at the design ε."""
        if num_outputs == 1:
            return dyadic.RESOLUTION
        e = math.exp(design)
        return min(dyadic.RESOLUTION - 1, int(round(dyadic.RESOLUTION * e / (e + num_outputs - 1))))

    def __post_init__(self):
        object.__setattr__(self, "input_values", readonly(self.input_values, np.float64))
        object.__setattr__(self, "output_values", readonly(self.output_values, np.float64))
        if self.bin_of_input is None:
            if self.input_values.size != self.output_values.size:
                raise ValueError("randomized response without bins needs one output per input")
            object.__setattr__(self, "bin_of_input", readonly(np.arange(self.input_values.size), np.int64))
        else:
            object.__setattr__(self, "bin_of_input", readonly(self.bin_of_input, np.int64))
        bins = self.bin_of_input
        if self.output_values.size == 0 or bins.shape != self.input_values.shape:
            raise ValueError("randomized response needs outputs and one bin per input")
        if bins.size and (bins.min() < 0 or bins.max() >= self.output_values.size):
            raise ValueError("a bin index is outside the outputs")
        if not 0 < self.keep <= dyadic.RESOLUTION:
            raise CertificationError(f"{self.name}: keep count {self.keep} is not in (0, 2**53]")
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"{self.name}: sampled probabilities are {self.certified_epsilon!r}-DP, above "
                                     f"the requested epsilon {self.epsilon!r}; refusing to build it")

    @property
    def _m(self) -> int:
        return int(self.output_values.size)

    @property
    def _bins(self) -> np.ndarray:
        """``bin_of_input`` as built: __post_init__ replaced None with one bin per input."""
        assert self.bin_of_input is not None
        return self.bin_of_input

    @cached_property
    def certified_epsilon(self) -> float:
        return keep_epsilon(self._m, self.keep)

    @property
    def num_outputs(self) -> int:
        return self._m if self.keep < dyadic.RESOLUTION else int(np.unique(self._bins).size)

    @property
    def keep_probability(self) -> float:
        return self.keep / dyadic.RESOLUTION

    @property
    def other_probability(self) -> float:
        return (1 - self.keep_probability) / (self._m - 1) if self._m > 1 else 0.0

    # -- sampling ----------------------------------------------------------------------------------------------
    def sample_indices(self, rows, rng: np.random.Generator) -> np.ndarray:
        own = self._bins[np.asarray(rows, dtype=np.int64).ravel()]
        kept = rng.integers(0, dyadic.RESOLUTION, size=own.size, dtype=np.int64) < self.keep
        if self._m == 1:
            return own
        other = rng.integers(0, self._m - 1, size=own.size, dtype=np.int64)
        return np.where(kept, own, other + (other >= own))

    # -- utility (closed forms, O(|Y| + m)) ------------------------------------------------------------------------
    @property
    def _own_output(self) -> np.ndarray:
        return self.output_values[self._bins]

    @property
    def expected_output(self) -> np.ndarray:
        p, q = self.keep_probability, self.other_probability
        return q * self.output_values.sum() + (p - q) * self._own_output

    @property
    def conditional_variance(self) -> np.ndarray:
        p, q, o = self.keep_probability, self.other_probability, self.output_values
        second = q * np.sum(o * o) + (p - q) * self._own_output**2
        return np.maximum(second - self.expected_output**2, 0.0)

    def squared_loss_per_label(self) -> np.ndarray:
        """E[½ (M(y) − y)²] = ½ [(p − q)(o_y − y)² + q Σ_j (o_j − y)²] with o_y the label's own output."""
        p, q, o, y = self.keep_probability, self.other_probability, self.output_values, self.input_values
        around = np.sum(o * o) - 2 * y * o.sum() + o.size * y * y
        return 0.5 * ((p - q) * (self._own_output - y) ** 2 + q * around)

    def noisy_label_loss(self, prior) -> float:
        return float(normalized_prior(prior, self.input_values.size) @ self.squared_loss_per_label())

    def agreement_probability(self, prior) -> float:
        """Pr[M(y) = y] under the prior (labels whose own output equals them count)."""
        same = self._own_output == self.input_values
        return float(normalized_prior(prior, self.input_values.size) @ np.where(same, self.keep_probability, 0.0))

    @cached_property
    def matrix(self) -> np.ndarray:
        """The realized probabilities as a dense |Y| x m float matrix (small sizes only: tests and estimators)."""
        if max(self._m, self.input_values.size) > DENSE_MATRIX_LIMIT:
            raise LabelDPError(f"{self.name} over {self.input_values.size} labels and {self._m} outputs has no dense "
                               f"matrix; use its closed forms", code=ErrorCode.TOO_LARGE)
        matrix = np.full((self.input_values.size, self._m), self.other_probability)
        matrix[np.arange(self.input_values.size), self._bins] = self.keep_probability
        matrix.setflags(write=False)
        return matrix

    def dp_event(self) -> dp_event.DpEvent:
        """RR is dp-accounting's RandomizedResponseDpEvent: with probability noise_parameter a uniformly random
        bucket (possibly its own), here m·q; dbRR and RR-on-Bins a local randomizer at its certified ε."""
        if self.name == "rr" and self._m > 1:
            return dp_event.RandomizedResponseDpEvent(noise_parameter=self._m * self.other_probability,
                                                      num_buckets=self._m)
        return LocalRandomizerDpEvent(mechanism=self.name, epsilon=self.certified_epsilon)

    def describe(self, include_matrix: bool = True) -> dict[str, Any]:
        """The whole distribution in O(|Y| + m) numbers: the own output with keep/2**53, any other with the rest
        / (m − 1); ``output_of_input`` when labels share bins."""
        description = {"mechanism": self.name, "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon,
                       "input_values": self.input_values.tolist(), "output_values": self.output_values.tolist(),
                       "num_outputs": self.num_outputs, "keep_count_over_2_53": self.keep,
                       "parameters": dict(self.parameters)}
        if self._m != self.input_values.size or np.any(self._bins != np.arange(self._m)):
            description["output_of_input"] = self._bins.tolist()
        return description

    @classmethod
    def from_description(cls, description: dict) -> RandomizedResponse:
        """The randomized response ``describe()`` states, rebuilt exactly: the same values, keep count and bins,
        so the same draws from the same generator. Refuses (``invalid_mechanism_document``) a malformed
        description, sizes or bins that disagree, a keep count outside (0, 2**53] or not ε-DP at the described ε,
        and derived numbers (certified ε, outputs) that are not the rebuilt ones."""
        name = described.text(description, "mechanism")
        inputs = described.real_vector(description, "input_values")
        outputs = described.real_vector(description, "output_values")
        bins = (described.integer_vector(description, "output_of_input") if "output_of_input" in description
                else None)  # absent: one output per input, in order
        keep = described.integer(description, "keep_count_over_2_53", 1, dyadic.RESOLUTION)
        epsilon = described.real(description, "epsilon", positive=True)
        parameters = MappingProxyType(described.mapping(description, "parameters"))
        with described.building():
            FiniteLabels(inputs)  # labels are looked up by value: the inputs must be strictly increasing
            randomizer = cls(name, epsilon, inputs, outputs, keep, parameters, bin_of_input=bins)
        described.agrees(description, "certified_epsilon", randomizer.certified_epsilon)
        described.agrees(description, "num_outputs", randomizer.num_outputs)
        return randomizer


def randomized_response(values, epsilon: float) -> RandomizedResponse:
    """Output the true label w.p. e^ε/(e^ε+K-1), each other label w.p. 1/(e^ε+K-1)."""
    epsilon = check_epsilon(epsilon)
    values = np.asarray(values, dtype=np.float64)
    keep = RandomizedResponse.keep_count(values.size, design_epsilon(epsilon))
    return RandomizedResponse("rr", epsilon, values, values, keep, MappingProxyType({"num_labels": values.size}))


def debiased_outputs(values, epsilon: float) -> np.ndarray:
    """Φ(y) of debiased RR: the unique outputs that make RR over them unbiased (Definition 23)."""
    values = np.asarray(values, dtype=np.float64)
    e = np.exp(epsilon)
    return ((e + values.size - 1) * values - values.sum()) / (e - 1)


def debiased_randomized_response(values, epsilon: float) -> RandomizedResponse:
    """RR whose report for label j is Φ(j): E[output | y] = y exactly (up to the sampled rounding)."""
    epsilon = check_epsilon(epsilon)
    values = np.asarray(values, dtype=np.float64)
    keep = RandomizedResponse.keep_count(values.size, design_epsilon(epsilon))
    if values.size == 1:
        outputs = values
    else:  # Φ from the *sampled* p and q: q Σ_j Φ_j + (p − q) Φ_y = y exactly, since Σ Φ = Σ y when (m−1) q = 1 − p
        p = keep / dyadic.RESOLUTION
        q = (1 - p) / (values.size - 1)
        outputs = (values - q * values.sum()) / (p - q)
    return RandomizedResponse("dbrr", epsilon, values, outputs, keep, MappingProxyType({"num_labels": values.size}))


def rr_on_bins(values, bin_of_label, bin_outputs, epsilon: float, name: str = "rr-on-bins",
               parameters: dict | None = None) -> RandomizedResponse:
    """RR over the m bin outputs: Φ(y) = bin_outputs[bin_of_label[y]] w.p. e^ε/(e^ε+m-1), each other output
    w.p. 1/(e^ε+m-1)."""
    epsilon = check_epsilon(epsilon)
    bin_outputs = np.asarray(bin_outputs, dtype=np.float64)
    keep = RandomizedResponse.keep_count(bin_outputs.size, design_epsilon(epsilon))
    return RandomizedResponse(name, epsilon, values, bin_outputs, keep,
                              MappingProxyType({"num_bins": int(bin_outputs.size), **(parameters or {})}),
                              bin_of_input=bin_of_label)


@dataclass(frozen=True, eq=False)
class TopKRandomizedResponse(OnFiniteInputs):
    """RR-Top-k over classes 0..K−1 ("Deep Learning with Label DP"): a label among the k ``candidates`` is reported
    with probability keep / 2**53, otherwise one of the other k − 1 candidates uniformly (an exact integer draw
    below k − 1, shifted past its own); a label outside them reports a uniformly random candidate (an integer draw
    below k). Non-candidates are never output. The distribution is these three numbers — k, keep and the
    candidates — so memory, sampling tables and the description are O(K), never a K x K matrix (a group release
    builds one per group).

    For a candidate output c the largest probability is p = keep / 2**53 (c is the label) and the smallest
    q = (1 − p)/(k − 1) (another candidate; a non-candidate label gives 1/k, in between since p ≥ 1/k), so
    ``certified_epsilon`` = log(p / q), an upper bound computed from the integers."""

    name: str
    epsilon: float
    num_classes: int
    candidates: np.ndarray = field(repr=False)  # sorted class ids
    keep: int  # numerator over 2**53
    parameters: MappingProxyType = field(default_factory=lambda: MappingProxyType({}), repr=False)

    def __post_init__(self):
        object.__setattr__(self, "candidates", readonly(self.candidates, np.int64))
        candidates, k = self.candidates, self.candidates.size
        if k == 0 or np.any(np.diff(candidates) <= 0) or candidates[0] < 0 or candidates[-1] >= self.num_classes:
            raise ValueError("RR-Top-k needs sorted, distinct candidate classes")
        if not dyadic.RESOLUTION // k <= self.keep <= dyadic.RESOLUTION:
            raise CertificationError(f"{self.name}: keep count {self.keep} is not in [2**53 / k, 2**53]")
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"{self.name}: sampled probabilities are {self.certified_epsilon!r}-DP, above "
                                     f"the requested epsilon {self.epsilon!r}; refusing to build it")

    @cached_property
    def certified_epsilon(self) -> float:
        return keep_epsilon(self.candidates.size, self.keep)

    @cached_property
    def input_values(self) -> np.ndarray:  # type: ignore[override]  # the classes, derived (not a field)
        return readonly(np.arange(self.num_classes), np.float64)

    @property
    def output_values(self) -> np.ndarray:  # type: ignore[override]
        return self.input_values

    @property
    def num_outputs(self) -> int:
        return int(self.candidates.size)

    @property
    def _p(self) -> float:
        return self.keep / dyadic.RESOLUTION

    @property
    def _q(self) -> float:
        k = self.candidates.size
        return (1 - self._p) / (k - 1) if k > 1 else 0.0

    @cached_property
    def _rank(self) -> np.ndarray:
        """Each class's position among the candidates, −1 outside them."""
        rank = np.full(self.num_classes, -1, dtype=np.int64)
        rank[self.candidates] = np.arange(self.candidates.size)
        return rank

    def sample_indices(self, rows, rng: np.random.Generator) -> np.ndarray:
        rank = self._rank[np.asarray(rows, dtype=np.int64).ravel()]
        k = self.candidates.size
        in_top = rank >= 0
        kept = in_top & (rng.integers(0, dyadic.RESOLUTION, size=rank.size, dtype=np.int64) < self.keep)
        other = rng.integers(0, max(k - 1, 1), size=rank.size, dtype=np.int64)
        other = other + (other >= rank)
        anyone = rng.integers(0, k, size=rank.size, dtype=np.int64)
        return self.candidates[np.where(kept, rank, np.where(in_top, np.minimum(other, k - 1), anyone))]

    # -- utility (closed forms, O(K)) ------------------------------------------------------------------------------
    @property
    def expected_output(self) -> np.ndarray:
        y, c = self.input_values, self.candidates.astype(np.float64)
        inside = self._q * c.sum() + (self._p - self._q) * y
        return np.where(self._rank >= 0, inside, c.mean())

    def squared_loss_per_label(self) -> np.ndarray:
        """E[½ (M(y) − y)²]: q Σ_c (c − y)² for a candidate y (its own term is 0), the mean over c otherwise."""
        y, c = self.input_values, self.candidates.astype(np.float64)
        around = np.sum(c * c) - 2 * y * c.sum() + c.size * y * y
        return 0.5 * np.where(self._rank >= 0, self._q * around, around / c.size)

    def noisy_label_loss(self, prior) -> float:
        return float(normalized_prior(prior, self.num_classes) @ self.squared_loss_per_label())

    def agreement_probability(self, prior) -> float:
        """Pr[M(y) = y] under the prior: p on the candidates, 0 elsewhere."""
        return float(normalized_prior(prior, self.num_classes) @ np.where(self._rank >= 0, self._p, 0.0))

    @cached_property
    def matrix(self) -> np.ndarray:
        """The realized probabilities as a dense K x K float matrix (small sizes only: tests and estimators)."""
        if self.num_classes > DENSE_MATRIX_LIMIT:
            raise LabelDPError(f"{self.name} over {self.num_classes} classes has no dense matrix; use its closed "
                               "forms", code=ErrorCode.TOO_LARGE)
        k, inside = self.candidates.size, self._rank >= 0
        matrix = np.zeros((self.num_classes, self.num_classes))
        matrix[np.ix_(~inside, self.candidates)] = 1.0 / k
        matrix[np.ix_(inside, self.candidates)] = self._q
        matrix[self.candidates, self.candidates] = self._p
        matrix.setflags(write=False)
        return matrix

    def dp_event(self) -> LocalRandomizerDpEvent:
        return LocalRandomizerDpEvent(mechanism=self.name, epsilon=self.certified_epsilon)

    def describe(self) -> dict[str, Any]:
        """The whole distribution in O(K) numbers: the candidates and the keep count (the outputs are the
        candidates among ``output_values``, the classes)."""
        return {"mechanism": self.name, "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon,
                "input_values": self.input_values.tolist(), "output_values": self.output_values.tolist(),
                "num_outputs": self.num_outputs, "candidates": self.candidates.tolist(),
                "keep_count_over_2_53": self.keep, "parameters": dict(self.parameters)}

    @classmethod
    def from_description(cls, description: dict) -> TopKRandomizedResponse:
        """The RR-Top-k ``describe()`` states, rebuilt exactly: K (the classes its inputs and outputs list), the
        candidates and the keep count, so the same draws from the same generator. Refuses
        (``invalid_mechanism_document``) a malformed description, inputs or outputs other than 0..K−1, candidates
        that are not sorted distinct classes, a keep count outside [2**53 / k, 2**53] or not ε-DP at the described
        ε, and derived numbers (certified ε, outputs) that are not the rebuilt ones."""
        name = described.text(description, "mechanism")
        inputs = described.real_vector(description, "input_values")
        outputs = described.real_vector(description, "output_values")
        if not (np.array_equal(inputs, np.arange(inputs.size)) and np.array_equal(outputs, inputs)):
            raise described.invalid(f"{name}: the inputs and outputs of RR-Top-k are the classes 0..K-1")
        candidates = described.integer_vector(description, "candidates")
        keep = described.integer(description, "keep_count_over_2_53", 1, dyadic.RESOLUTION)
        epsilon = described.real(description, "epsilon", positive=True)
        parameters = MappingProxyType(described.mapping(description, "parameters"))
        with described.building():
            randomizer = cls(name, epsilon, inputs.size, candidates, keep, parameters)
        described.agrees(description, "certified_epsilon", randomizer.certified_epsilon)
        described.agrees(description, "num_outputs", randomizer.num_outputs)
        return randomizer


def rr_top_k(num_classes: int, candidates, epsilon: float, name: str = "rr-top-k",
             parameters: dict | None = None) -> TopKRandomizedResponse:
    """RR-Top-k: if y is a candidate, report y w.p. e^ε/(e^ε+k-1) and each other candidate w.p. 1/(e^ε+k-1);
    otherwise report a uniformly random candidate. Outputs are the classes; non-candidates are never output."""
    epsilon = check_epsilon(epsilon)
    candidates = np.sort(np.asarray(candidates, dtype=np.int64))
    keep = RandomizedResponse.keep_count(candidates.size, design_epsilon(epsilon))
    return TopKRandomizedResponse(name, epsilon, int(num_classes), candidates, keep,
                                  MappingProxyType({"k": int(candidates.size), **(parameters or {})}))
