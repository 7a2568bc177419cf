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

import numpy as np

from shared.errors import LabelDPError


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class FiniteLabels:
    """A strictly increasing, finite set of real labels."""

    values: np.ndarray = field(repr=False)

    def __post_init__(self):
        values = np.asarray(self.values, dtype=np.float64).ravel()
        if values.size == 0:
            raise LabelDPError("label domain is empty", code="invalid_domain")
        if not np.all(np.isfinite(values)):
            raise LabelDPError("label domain has a non-finite value", code="invalid_domain")
        if values.size > 1 and np.any(np.diff(values) <= 0):
            raise LabelDPError("label values must be strictly increasing (sorted, no duplicates)",
                               code="invalid_domain")
        object.__setattr__(self, "values", _frozen(values))

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

    def index_of(self, labels) -> np.ndarray:
        """Row index of each label; raises if any label is not in the domain (NaN included)."""
        labels = np.asarray(labels, dtype=np.float64).ravel()
        idx = np.searchsorted(self.values, labels)
        idx = np.minimum(idx, self.size - 1)
        bad = self.values[idx] != labels
        if np.any(bad):
            first = labels[np.argmax(bad)]
            raise LabelDPError(f"{int(bad.sum())} label(s) outside the domain, e.g. {first!r}",
                               code="label_out_of_domain")
        return idx.astype(np.int64)

    def histogram(self, labels) -> np.ndarray:
        return np.bincount(self.index_of(labels), minlength=self.size).astype(np.float64)

    def describe(self) -> dict:
        return {"kind": "finite", "values": self.values.tolist()}


def integer_range(low: int, high: int) -> FiniteLabels:
    """Integer labels ``low..high`` inclusive (counts clipped to a known maximum, weeks worked, …)."""
    if int(low) != low or int(high) != high:
        raise LabelDPError("integer range bounds must be integers", code="invalid_domain")
    if high < low:
        raise LabelDPError(f"empty integer range {low}:{high}", code="invalid_domain")
    if high - low + 1 > 100_000:
        raise LabelDPError("integer range has more than 100000 labels", code="invalid_domain")
    return FiniteLabels(np.arange(int(low), int(high) + 1, dtype=np.float64))


@dataclass(frozen=True)
class ContinuousInterval:
    """Real labels in ``[low, high]``, handled on an evenly spaced grid of ``grid_size`` points."""

    low: float
    high: float
    grid_size: int = 101

    def __post_init__(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.high <= self.low:
            raise LabelDPError("continuous domain needs finite bounds with low < high", code="invalid_domain")
        if int(self.grid_size) != self.grid_size or self.grid_size < 2:
            raise LabelDPError("continuous domain grid needs at least 2 points", code="invalid_domain")

    @property
    def grid(self) -> FiniteLabels:
        return FiniteLabels(np.linspace(self.low, self.high, int(self.grid_size)))

    def check(self, labels) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.float64).ravel()
        bad = ~((labels >= self.low) & (labels <= self.high))  # also catches NaN
        if np.any(bad):
            raise LabelDPError(f"{int(bad.sum())} label(s) outside [{self.low}, {self.high}] or not finite, "
                               f"e.g. {labels[np.argmax(bad)]!r}", code="label_out_of_domain")
        return labels

    def round_to_grid(self, labels, rng: np.random.Generator) -> np.ndarray:
        """Unbiased randomized rounding: returns grid *indices* with E[grid[index]] = label exactly
        (up to the 53-bit resolution of the uniform draw)."""
        labels = self.check(labels)
        step = (self.high - self.low) / (self.grid_size - 1)
        position = np.clip((labels - self.low) / step, 0.0, self.grid_size - 1)
        lower = np.minimum(np.floor(position).astype(np.int64), self.grid_size - 2)
        up_probability = position - lower
        return lower + (rng.random(labels.size) < up_probability)

    def describe(self) -> dict:
        return {"kind": "continuous", "min": self.low, "max": self.high, "grid_size": int(self.grid_size)}


@dataclass(frozen=True)
class Classes:
    """K unordered classes, labelled ``0..K-1``."""

    num_classes: int

    def __post_init__(self):
        if int(self.num_classes) != self.num_classes or self.num_classes < 2:
            raise LabelDPError("a class domain needs at least 2 classes", code="invalid_domain")

    @property
    def size(self) -> int:
        return int(self.num_classes)

    def index_of(self, labels) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.float64).ravel()
        ok = (labels == np.round(labels)) & (labels >= 0) & (labels < self.num_classes)
        if not np.all(ok):
            raise LabelDPError(f"{int((~ok).sum())} label(s) are not classes 0..{self.num_classes - 1}, "
                               f"e.g. {labels[np.argmax(~ok)]!r}", code="label_out_of_domain")
        return labels.astype(np.int64)

    def histogram(self, labels) -> np.ndarray:
        return np.bincount(self.index_of(labels), minlength=self.size).astype(np.float64)

    def describe(self) -> dict:
        return {"kind": "classes", "num_classes": int(self.num_classes)}


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
                    raise LabelDPError(f"bad label range {spec!r}", code="invalid_domain")
                count = int(math.floor((stop - start) / step + 1e-9)) + 1
                return FiniteLabels(start + step * np.arange(count))
            raise LabelDPError(f"bad label range {spec!r}", code="invalid_domain")
        return FiniteLabels(np.array([float(p) for p in spec.split(",")]))
    except ValueError as err:
        if isinstance(err, LabelDPError):
            raise
        raise LabelDPError(f"cannot parse label spec {spec!r}: {err}", code="invalid_domain") from None


def domain_from_spec(spec: dict):
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
    raise LabelDPError(f"unknown label kind {kind!r}", code="invalid_domain")


def domain_spec(kind: str, *, values=None, low=None, high=None, num_classes=None, grid_size=None) -> dict:
    """The canonical stored description of a dataset's label domain (validated by building it)."""
    for bound in (low, high):
        if bound is not None and not math.isfinite(bound):
            raise LabelDPError("label bounds must be finite numbers", code="invalid_domain")
    if kind == "finite":
        spec = {"kind": "finite", "values": [float(v) for v in values]}
    elif kind == "integer":
        if int(low) != low or int(high) != high:
            raise LabelDPError("integer label bounds must be integers", code="invalid_domain")
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
