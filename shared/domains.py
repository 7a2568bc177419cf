"""Label domains: which labels a dataset may hold and how they map onto mechanism rows.

* :class:`FiniteLabels` — finite ordered real labels (weeks worked 1..52, ratings, …). Integer ranges
  (counts clipped to ``[min, max]``) are the special case built by :func:`integer_range`.
* :class:`ContinuousInterval` — real labels in ``[L, U]``. Mechanisms act on a finite grid that contains L and U;
  labels are first moved onto the grid by *unbiased randomized rounding* (paper, "Handling continuous Y"),
  which keeps E[label] unchanged, so any unbiased mechanism on the grid stays unbiased on [L, U].
* :class:`Classes` — K unordered classes ``0..K-1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import numpy as np

from shared import described
from shared.arrays import number, readonly
from shared.errors import ErrorCode, LabelDPError

# A label value a domain declares: within ±10¹⁵, so that every mechanism's outputs (dbRR's reach K/ε times the
# range), losses and solver diagnostics stay finite doubles — at ±1.7·10³⁰⁸ they were ±inf, and the release failed
# after it was charged; at ±10³⁰⁰ opt-unbiased's loss overflowed and its report was not JSON (issue 28, item 7).
# Checked here, where every domain is built (the API's schema states it too: shared.schemas.LabelValue).
LABEL_VALUE_LIMIT = 1e15


def _within_limit(values) -> None:
    if np.any(np.abs(np.asarray(values, dtype=np.float64)) > LABEL_VALUE_LIMIT):
        raise LabelDPError(f"label values must lie within ±{LABEL_VALUE_LIMIT:g}", code=ErrorCode.INVALID_DOMAIN)


@dataclass(frozen=True)
class FiniteLabels:
    """A strictly increasing, finite set of real labels."""

    values: np.ndarray = field(repr=False)
    label_kind: ClassVar[str] = "finite"  # how mechanisms see the domain: "finite", "continuous" or "classes"

    def support(self) -> FiniteLabels:
        """The finite labels a mechanism's matrix is indexed by: these."""
        return self

    def __post_init__(self):
        values = np.asarray(self.values, dtype=np.float64).ravel()
        if values.size == 0:
            raise LabelDPError("label domain is empty", code=ErrorCode.INVALID_DOMAIN)
        if not np.all(np.isfinite(values)):
            raise LabelDPError("label domain has a non-finite value", code=ErrorCode.INVALID_DOMAIN)
        _within_limit(values)
        with np.errstate(over="ignore"):  # the difference of two huge values is +inf, still increasing
            increasing = values.size < 2 or bool(np.all(np.diff(values) > 0))
        if not increasing:
            raise LabelDPError("label values must be strictly increasing (sorted, no duplicates)",
                               code=ErrorCode.INVALID_DOMAIN)
        object.__setattr__(self, "values", readonly(values, np.float64))

    @property
    def size(self) -> int:
        return int(self.values.size)

    @property
    def is_integer(self) -> bool:
        """True when every label is an integer (discrete additive mechanisms then apply)."""
        return bool(np.all(self.values == np.round(self.values)))

    @property
    def low(self) -> float:
        return float(self.values[0])

    @property
    def high(self) -> float:
        return float(self.values[-1])

    @cached_property
    def _step(self) -> float | None:
        """The spacing when the values are evenly spaced (integer ranges, grids), else None."""
        if self.size < 2:
            return None
        step = (self.high - self.low) / (self.size - 1)
        return step if np.array_equal(self.low + step * np.arange(self.size), self.values) else None

    def find(self, labels) -> tuple[np.ndarray, np.ndarray]:
        """(row index of each label, whether it is in the domain): arithmetic when the values are evenly spaced
        (10^7 labels in 0.05 s instead of 0.5 s for a binary search), a binary search otherwise."""
        labels = np.asarray(labels, dtype=np.float64).ravel()
        if self._step is not None:  # in place where possible: this runs on every released label
            position = labels - self.low
            position /= self._step
            np.rint(position, out=position)
            with np.errstate(invalid="ignore"):  # NaN and ±inf become some integer, clipped, then not found
                idx = position.astype(np.int64)
            np.clip(idx, 0, self.size - 1, out=idx)
        else:
            idx = np.minimum(np.searchsorted(self.values, labels), self.size - 1)
        return idx, self.values[idx] == labels

    def index_of(self, labels, *, what: str = "the domain") -> np.ndarray:
        """Row index of each label; raises if any label is not one of the values (NaN included)."""
        labels = np.asarray(labels, dtype=np.float64).ravel()
        idx, found = self.find(labels)
        if not np.all(found):
            first = labels[np.argmin(found)]
            raise LabelDPError(f"{int((~found).sum())} label(s) outside {what}, e.g. {number(first)}",
                               code=ErrorCode.LABEL_OUT_OF_DOMAIN)
        return idx

    def describe(self) -> dict:
        return {"kind": "finite", "values": self.values.tolist()}

    def rows(self, labels, rng: np.random.Generator, *, on_grid: bool = True) -> np.ndarray | None:
        """Each label's row of the support; every label must be one of the values."""
        return self.index_of(labels)


# Additive noise is an integer number of lattice steps; beyond this many steps a domain should be declared
# continuous with an explicit grid_size.
MAX_LATTICE_STEPS = 1_000_000
_ROUNDING_BITS = 53


def unbiased_round(positions: np.ndarray, top: int, rng: np.random.Generator) -> np.ndarray:
    """Integers in [0, top] with E[result] = position: floor(position) + Bernoulli(fractional part), the
    Bernoulli drawn as a uniform 53-bit integer below the fractional part scaled to 2**53 (integer draws only).

    Privacy never depends on this rounding (any mixture of two lattice rows is as private as the rows); only
    unbiasedness does, to within 2**-53 of a step."""
    positions = np.clip(np.asarray(positions, dtype=np.float64), 0.0, float(top))
    lower = np.minimum(np.floor(positions).astype(np.int64), max(top - 1, 0))
    threshold = np.rint((positions - lower) * (1 << _ROUNDING_BITS)).astype(np.int64)
    draws = rng.integers(0, 1 << _ROUNDING_BITS, size=positions.size, dtype=np.int64)
    return lower + (draws < threshold)


@dataclass(frozen=True)
class Lattice:
    """Evenly spaced label values ``low + step·i`` for i = 0..steps: where additive noise lives.

    Labels are mapped to lattice indices (exactly when they lie on it, by unbiased randomized rounding when they
    do not), integer noise is added in steps, and a released value is ``low + step·index`` — a function of an
    integer, so its floating-point bits carry nothing else.
    """

    low: float
    step: float
    steps: int

    def __post_init__(self):
        if not (math.isfinite(self.low) and math.isfinite(self.step) and self.step > 0):
            raise LabelDPError("a lattice needs a finite low value and a positive step", code=ErrorCode.INVALID_DOMAIN)
        if not 1 <= self.steps <= MAX_LATTICE_STEPS:
            raise LabelDPError(f"additive noise needs a lattice of 1..{MAX_LATTICE_STEPS} steps, this domain needs "
                               f"{self.steps}; declare a continuous domain with a coarser grid_size",
                               code=ErrorCode.LATTICE_TOO_FINE)

    @property
    def high(self) -> float:
        return self.low + self.step * self.steps

    def positions(self, labels) -> np.ndarray:
        """(label - low) / step, snapped to the nearest integer when within 1e-9 of it (labels on the lattice)."""
        labels = np.asarray(labels, dtype=np.float64).ravel()
        bad = ~((labels >= self.low - 1e-9 * self.step) & (labels <= self.high + 1e-9 * self.step))
        if np.any(bad):
            raise LabelDPError(f"{int(bad.sum())} label(s) outside [{self.low:g}, {self.high:g}] or not finite, "
                               f"e.g. {number(labels[np.argmax(bad)])}", code=ErrorCode.LABEL_OUT_OF_DOMAIN)
        position = (labels - self.low) / self.step
        nearest = np.rint(position)
        return np.where(np.abs(position - nearest) <= 1e-9, nearest, position)

    def round(self, labels, rng: np.random.Generator) -> np.ndarray:
        """Lattice indices with E[value(index)] = label."""
        return unbiased_round(self.positions(labels), self.steps, rng)

    def value(self, indices) -> np.ndarray:
        return self.low + self.step * np.asarray(indices, dtype=np.float64)

    def describe(self) -> dict:
        return {"low": self.low, "step": self.step, "steps": int(self.steps)}

    @classmethod
    def from_description(cls, description: dict) -> Lattice:
        """The lattice ``describe()`` states, its numbers as written (an int ``low`` stays an int: the same
        released values, the same JSON); ``invalid_mechanism_document`` for anything else."""
        low, step = described.real(description, "low"), described.real(description, "step", positive=True)
        steps = described.integer(description, "steps", 1, MAX_LATTICE_STEPS)
        with described.building():
            return cls(low, step, steps)


def lattice_of(domain) -> Lattice:
    """The lattice additive noise uses on a regression domain: the domain's grid for a continuous interval; for
    finite labels the lattice through them when they are evenly spaced (integers: step 1 or their common gap),
    otherwise the lattice whose step is at most their smallest gap (labels are then rounded onto it)."""
    if isinstance(domain, ContinuousInterval):
        return domain.lattice
    if not isinstance(domain, FiniteLabels):
        raise LabelDPError("additive noise needs ordered (regression) labels", code=ErrorCode.MECHANISM_DOMAIN_MISMATCH)
    if domain.size < 2:
        raise LabelDPError("additive noise needs at least two label values", code=ErrorCode.INVALID_DOMAIN)
    with np.errstate(over="ignore"):  # spans beyond the float range are refused just below
        span = domain.high - domain.low
        smallest_gap = float(np.min(np.diff(domain.values)))
    ratio = span / smallest_gap if smallest_gap > 0 and math.isfinite(smallest_gap) else math.inf
    if not (math.isfinite(span) and math.isfinite(ratio)) or ratio > MAX_LATTICE_STEPS + 0.5:
        raise LabelDPError(f"additive noise needs a lattice of at most {MAX_LATTICE_STEPS} steps; these labels need "
                           "more (range / smallest gap); declare a continuous domain with a grid_size",
                           code=ErrorCode.LATTICE_TOO_FINE)
    steps = max(1, int(round(ratio)))
    offsets = (domain.values - domain.low) / (span / steps)
    if np.max(np.abs(offsets - np.rint(offsets))) > 1e-9:  # not evenly spaced: a lattice at least that fine
        steps = int(math.ceil(ratio - 1e-9))
    if steps > MAX_LATTICE_STEPS:
        raise LabelDPError(f"additive noise needs a lattice of at most {MAX_LATTICE_STEPS} steps; these labels need "
                           f"{steps}; declare a continuous domain with a grid_size", code=ErrorCode.LATTICE_TOO_FINE)
    return Lattice(domain.low, span / steps, steps)


def integer_range(low: float, high: float) -> FiniteLabels:
    """Integer labels ``low..high`` inclusive (counts clipped to a known maximum, weeks worked, …); the bounds may
    be any numbers of integer value (``1.0``), others are refused."""
    if int(low) != low or int(high) != high:
        raise LabelDPError("integer range bounds must be integers", code=ErrorCode.INVALID_DOMAIN)
    if high < low:
        raise LabelDPError(f"empty integer range {low}:{high}", code=ErrorCode.INVALID_DOMAIN)
    if high - low + 1 > 100_000:
        raise LabelDPError("integer range has more than 100000 labels", code=ErrorCode.INVALID_DOMAIN)
    return FiniteLabels(np.arange(int(low), int(high) + 1, dtype=np.float64))


@dataclass(frozen=True)
class ContinuousInterval:
    """Real labels in ``[low, high]``, handled on an evenly spaced grid of ``grid_size`` points."""

    low: float
    high: float
    grid_size: int = 101
    label_kind: ClassVar[str] = "continuous"

    def support(self) -> FiniteLabels:
        """The finite labels a mechanism's matrix is indexed by: the grid."""
        return self.grid

    def __post_init__(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.high <= self.low:
            raise LabelDPError("continuous domain needs finite bounds with low < high", code=ErrorCode.INVALID_DOMAIN)
        _within_limit([self.low, self.high])
        if int(self.grid_size) != self.grid_size or self.grid_size < 2:
            raise LabelDPError("continuous domain grid needs at least 2 points", code=ErrorCode.INVALID_DOMAIN)

    @property
    def grid(self) -> FiniteLabels:
        return FiniteLabels(np.linspace(self.low, self.high, int(self.grid_size)))

    def check(self, labels) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.float64).ravel()
        bad = ~((labels >= self.low) & (labels <= self.high))  # also catches NaN
        if np.any(bad):
            raise LabelDPError(f"{int(bad.sum())} label(s) outside [{self.low}, {self.high}] or not finite, "
                               f"e.g. {number(labels[np.argmax(bad)])}", code=ErrorCode.LABEL_OUT_OF_DOMAIN)
        return labels

    def round_to_grid(self, labels, rng: np.random.Generator) -> np.ndarray:
        """Unbiased randomized rounding: returns grid *indices* with E[grid[index]] = label exactly
        (up to the 2**-53 resolution of the rounding probability)."""
        return self.lattice.round(self.check(labels), rng)

    @property
    def lattice(self) -> Lattice:
        return Lattice(self.low, (self.high - self.low) / (self.grid_size - 1), int(self.grid_size) - 1)

    def describe(self) -> dict:
        return {"kind": "continuous", "min": self.low, "max": self.high, "grid_size": int(self.grid_size)}

    def rows(self, labels, rng: np.random.Generator, *, on_grid: bool = True) -> np.ndarray | None:
        """Each label's row of the grid by unbiased randomized rounding (drawn once: the histogram and the sampler
        see the same rounded label); None for a mechanism on the raw labels (``on_grid`` False), which are only
        checked."""
        labels = self.check(labels)
        return self.round_to_grid(labels, rng) if on_grid else None


@dataclass(frozen=True)
class Classes:
    """K unordered classes, labelled ``0..K-1``."""

    num_classes: int
    label_kind: ClassVar[str] = "classes"

    def support(self) -> FiniteLabels:
        """The finite labels a mechanism's matrix is indexed by: the class indices."""
        return FiniteLabels(np.arange(self.num_classes, dtype=np.float64))

    def __post_init__(self):
        if int(self.num_classes) != self.num_classes or self.num_classes < 2:
            raise LabelDPError("a class domain needs at least 2 classes", code=ErrorCode.INVALID_DOMAIN)

    @property
    def size(self) -> int:
        return int(self.num_classes)

    def index_of(self, labels) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.float64).ravel()
        ok = (labels == np.round(labels)) & (labels >= 0) & (labels < self.num_classes)
        if not np.all(ok):
            raise LabelDPError(f"{int((~ok).sum())} label(s) are not classes 0..{self.num_classes - 1}, "
                               f"e.g. {number(labels[np.argmax(~ok)])}", code=ErrorCode.LABEL_OUT_OF_DOMAIN)
        return labels.astype(np.int64)

    def describe(self) -> dict:
        return {"kind": "classes", "num_classes": int(self.num_classes)}

    def rows(self, labels, rng: np.random.Generator, *, on_grid: bool = True) -> np.ndarray | None:
        """Each label's class index; every label must be a class."""
        return self.index_of(labels)


# Every label domain a dataset declares; each knows its ``label_kind`` and its finite ``support()``.
Domain = FiniteLabels | ContinuousInterval | Classes


def parse_label_spec(spec: str) -> FiniteLabels:
    """``"1:52"`` (integer range), ``"0:1:0.25"`` (start:stop:step, inclusive) or ``"1,2,5,10"`` (explicit)."""
    spec = spec.strip()
    try:
        if ":" in spec:
            parts = [float(p) for p in spec.split(":")]
            if len(parts) == 2:
                return integer_range(parts[0], parts[1])
            if len(parts) == 3:
                start, stop, step = parts
                if step <= 0 or stop < start:
                    raise LabelDPError(f"bad label range {spec!r}", code=ErrorCode.INVALID_DOMAIN)
                count = int(math.floor((stop - start) / step + 1e-9)) + 1
                return FiniteLabels(start + step * np.arange(count))
            raise LabelDPError(f"bad label range {spec!r}", code=ErrorCode.INVALID_DOMAIN)
        return FiniteLabels(np.array([float(p) for p in spec.split(",")]))
    except ValueError as err:
        if isinstance(err, LabelDPError):
            raise
        raise LabelDPError(f"cannot parse label spec {spec!r}: {err}", code=ErrorCode.INVALID_DOMAIN) from None


def domain_from_spec(spec: dict) -> Domain:
    """Rebuild a domain from its ``describe()`` form (also the dataset-creation fields)."""
    kind = spec.get("kind")
    if kind == "finite":
        return FiniteLabels(np.asarray(spec["values"], dtype=np.float64))
    if kind == "integer":
        return integer_range(spec["min"], spec["max"])
    if kind == "continuous":
        return ContinuousInterval(float(spec["min"]), float(spec["max"]), int(spec.get("grid_size") or 101))
    if kind == "classes":
        return Classes(int(spec["num_classes"]))
    raise LabelDPError(f"unknown label kind {kind!r}", code=ErrorCode.INVALID_DOMAIN)


def domain_spec(kind: str, *, values=None, low=None, high=None, num_classes=None, grid_size=None) -> dict:
    """The canonical stored description of a dataset's label domain (validated by building it)."""
    for bound in (low, high):
        if bound is not None and not math.isfinite(bound):
            raise LabelDPError("label bounds must be finite numbers", code=ErrorCode.INVALID_DOMAIN)
    spec: dict[str, object]
    if kind == "finite":
        spec = {"kind": "finite", "values": [float(v) for v in values]}
    elif kind == "integer":
        if int(low) != low or int(high) != high:
            raise LabelDPError("integer label bounds must be integers", code=ErrorCode.INVALID_DOMAIN)
        spec = {"kind": "integer", "min": int(low), "max": int(high)}
    elif kind == "continuous":
        spec = {"kind": "continuous", "min": float(low), "max": float(high), "grid_size": int(grid_size or 101)}
    else:
        spec = {"kind": "classes", "num_classes": int(num_classes)}
    domain_from_spec(spec)
    return spec


def check_labels(domain, labels) -> None:
    """Raise if any label is outside the domain, NaN or infinite."""
    if isinstance(domain, ContinuousInterval):
        domain.check(labels)
    else:
        domain.index_of(labels)
