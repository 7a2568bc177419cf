"""The privacy-budget ledger: exact per-example accounting, charge-before-visible, and a hash-chained audit log.

Accounting model. ε is kept in integer units of 10⁻⁹ (:data:`UNITS_PER_EPSILON`): a requested ε is converted from
the shortest decimal that prints as it (what the client sent: 0.1 is exactly 100 000 000 units) and rounded *up*
to a unit when charged; a budget is rounded down. Sums are integer sums, so 0.1 + 0.2 is exactly 0.3 and no
charge is too small to count. Every release charges its units to exactly the examples it covers; releases are
pure ε-DP in the labels they cover, so an example's spent ε is the sum of the charges covering it (basic
composition, tight for pure DP), and the dataset's spent ε is the maximum over examples (disjoint releases compose
in parallel). A release is admitted iff every covered example has spent + charge <= total, exactly.

Each ledger entry is a :class:`LedgerRecord`, built in one place (:meth:`BudgetLedger.charge`) from the release
draft — in the spirit of dp-accounting's ``DpEvent``: it holds the mechanism's own ``dp_event()`` (from which
:func:`shared.mechanisms.events.epsilon_of` recomputes ε), the requested, certified and charged ε, the content
hash of the mechanism's full description, the requesting organization and the covered examples (count and
SHA-256 of their registry indices, stored once in a content-addressed coverage file or named as a range), chained
to the previous entry by SHA-256.

State. The per-example spent units are kept as coverage classes (:class:`BudgetState`): one class id per example
and one (spent, size) row per class — never one vector per release — so the state does not grow with releases ×
examples; every pass over it goes block by block (:data:`CHUNK`) in bounded memory.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from labels_party.labelstore import CoverageSet, read_coverage
from labels_party.storage import DataStore, MappedArray, write_npy
from shared.errors import LabelDPError

UNITS_PER_EPSILON = 10**9
COMPOSITION = "pure epsilon-DP events add per example (exact integer units); disjoint examples compose in parallel"


def charge_units(epsilon: float) -> int:
    """ε as charged: the decimal the client sent, rounded up to a unit of 10⁻⁹."""
    return _units(epsilon, ROUND_CEILING)


def budget_units(epsilon: float) -> int:
    """A budget: the decimal the owner sent, rounded down to a unit."""
    return _units(epsilon, ROUND_FLOOR)


def _units(epsilon: float, rounding: str) -> int:
    return int((Decimal(repr(float(epsilon))) * UNITS_PER_EPSILON).to_integral_value(rounding=rounding))


def units_epsilon(units: int) -> float:
    """Units as the nearest double (integer division is correctly rounded: 300000000 units print as 0.3)."""
    return int(units) / UNITS_PER_EPSILON


def legacy_units(spent: float | np.ndarray):
    """Float ε sums written before exact accounting, as units: rounded to 10⁻³ of a unit to shed the float noise of
    the sum (2.8559999999997965 for 2856 × 0.001), then up — a budget can only look more spent, never less."""
    return np.ceil(np.round(np.asarray(spent, dtype=np.float64) * UNITS_PER_EPSILON, 3)).astype(np.int64)


def canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def chain_hash(prev_hash: str, record_json: str) -> str:
    return hashlib.sha256((prev_hash + record_json).encode()).hexdigest()


class Actor(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    org: str
    role: str


class Coverage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    file: str
    sha256: str


class LedgerRecord(BaseModel):
    """One privacy event, completely documented: enough to recompute its ε and every example's budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["label_release"] = "label_release"
    seq: int
    dataset_id: str
    release_id: str
    created_at: str
    actor: Actor  # the organization the release went to
    mechanism: str
    request: dict[str, Any]  # the request's privacy parameters (no example ids, features or predictions)
    label_version: int
    epsilon_requested: float
    epsilon_certified: float
    charge_units: int  # exact; 1 unit = 10⁻⁹ ε
    charge: float  # the same as a decimal, for reading
    delta: float = 0.0
    dp_event: dict[str, Any]  # shared.mechanisms.events.to_dict of the mechanism's dp_event()
    mechanism_hash: str  # SHA-256 of the full public description (GET /v1/mechanisms/{hash})
    examples_covered: int
    coverage: Coverage
    spent_max_after_units: int
    epsilon_total_units: int
    composition: str = COMPOSITION


def recorded_charge_units(record: dict) -> int:
    """The charge of a stored record, also for records written before exact accounting (a float ``charge``)."""
    if "charge_units" in record:
        return int(record["charge_units"])
    return int(legacy_units(record["charge"]))


class BudgetExceeded(LabelDPError):
    code = "budget_exceeded"

    def __init__(self, message: str, remaining_units: int):
        super().__init__(message)
        self.remaining = units_epsilon(remaining_units)


CHUNK = 1 << 22  # registry indices per step of a budget pass: bounded memory at any dataset size


@dataclass(frozen=True)
class BudgetState:
    """Every example's spent units as coverage classes: ``classes[i]`` is the class of registry index ``i`` and
    ``spent[c]``/``sizes[c]`` the units and member count of class ``c``. Indices at or beyond ``len(classes)``
    (examples uploaded since the last split) form the *fresh* class, id ``len(spent)``, with nothing spent.
    The state is one int32 per example plus one row per class, whatever the number of releases."""

    classes: np.ndarray  # int32, memory-mapped
    spent: np.ndarray  # int64 per class
    sizes: np.ndarray  # int64 per class
    registry_size: int
    mapped: MappedArray | None = None  # the class file's mapping (for forget())

    def forget(self) -> None:
        """Drop the class file's pages read so far from the resident set (passes stay bounded in memory)."""
        if self.mapped is not None:
            self.mapped.forget()

    @property
    def fresh(self) -> int:
        return self.spent.size

    def spent_with_fresh(self) -> tuple[np.ndarray, np.ndarray]:
        """(spent, size) per class, the fresh class last."""
        return (np.append(self.spent, 0),
                np.append(self.sizes, self.registry_size - self.classes.size).astype(np.int64))

    def class_at(self, indices: np.ndarray) -> np.ndarray:
        """Class of each (sorted) registry index."""
        out = np.full(indices.size, self.fresh, dtype=np.int64)
        inside = int(np.searchsorted(indices, self.classes.size))
        out[:inside] = self.classes[indices[:inside]]
        return out

    def block(self, start: int, stop: int) -> np.ndarray:
        """Class of registry indices start..stop-1."""
        out = np.full(stop - start, self.fresh, dtype=np.int64)
        known = max(0, min(stop, self.classes.size) - start)
        out[:known] = self.classes[start:start + known]
        return out

    def spent_block(self, start: int, stop: int) -> np.ndarray:
        return np.append(self.spent, 0)[self.block(start, stop)]


def _chunks(coverage: MappedArray, state: BudgetState):
    for start in range(0, coverage.size, CHUNK):
        yield coverage.slice(start, start + CHUNK).astype(np.int64, copy=False)
        coverage.forget()
        state.forget()


def _covered_mask(coverage: MappedArray, start: int, stop: int) -> np.ndarray:
    low, high = coverage.position([start, stop])
    mask = np.zeros(stop - start, dtype=bool)
    mask[coverage.slice(int(low), int(high)) - start] = True
    return mask


class BudgetLedger:
    """Per-example spent units of one dataset as :class:`BudgetState` files in :class:`DataStore` (one class file
    and one small per-class table per generation; a charge supersedes the previous generation's files)."""

    def __init__(self, store: DataStore):
        self.store = store

    def state(self, dataset) -> BudgetState:
        if dataset.spent_file is None:
            return BudgetState(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64),
                               dataset.registry_size)
        if dataset.classes_file is None:  # written before coverage classes: one value per example
            stored = self.store.read_array(dataset.spent_file)
            vector = stored if stored.dtype.kind in "iu" else legacy_units(stored)
            spent, classes, sizes = np.unique(vector.astype(np.int64), return_inverse=True, return_counts=True)
            return BudgetState(classes.astype(np.int32), spent, sizes.astype(np.int64), dataset.registry_size)
        table = self.store.read_array(dataset.spent_file)
        classes = MappedArray(self.store.path(dataset.classes_file))
        return BudgetState(classes.array, table[:, 0].copy(), table[:, 1].copy(), dataset.registry_size, classes)

    def spent_vector(self, dataset) -> np.ndarray:
        """Every example's spent units (registry_size int64s: for small datasets, tests and audits in blocks)."""
        return self.state(dataset).spent_block(0, dataset.registry_size)

    def spent_classes(self, dataset) -> tuple[np.ndarray, np.ndarray]:
        """(spent units, number of examples) per class, including the fresh class; for summaries."""
        spent, sizes = self.state(dataset).spent_with_fresh()
        return spent[sizes > 0], sizes[sizes > 0]

    def _touched(self, state: BudgetState, coverage: MappedArray) -> np.ndarray:
        counts = np.zeros(state.fresh + 1, dtype=np.int64)
        for chunk in _chunks(coverage, state):
            counts += np.bincount(state.class_at(chunk), minlength=state.fresh + 1)
        return counts

    def remaining_units_for(self, dataset, coverage: MappedArray) -> int:
        state = self.state(dataset)
        touched = self._touched(state, coverage)
        spent, _ = state.spent_with_fresh()
        worst = int(spent[touched > 0].max()) if coverage.size else 0
        return max(0, dataset.epsilon_total_units - worst)

    def charge(self, dataset, coverage: CoverageSet, units: int,
               fields: dict) -> tuple[LedgerRecord, str, str, str, list[str]]:
        """Check and charge ``units`` to the examples of ``coverage``, exactly. The caller holds the dataset row
        lock, commits, and then removes the superseded files (the last element). Mutates ``dataset`` (state
        files, spent max, chain head)."""
        state = self.state(dataset)
        covered = read_coverage(self.store, coverage.file)
        touched = self._touched(state, covered)
        spent, sizes = state.spent_with_fresh()
        worst = int(spent[touched > 0].max()) if covered.size else 0
        if worst + units > dataset.epsilon_total_units:
            remaining = max(0, dataset.epsilon_total_units - worst)
            raise BudgetExceeded(f"release needs epsilon {units_epsilon(units):g} but covered examples have at "
                                 f"most {units_epsilon(remaining):.9g} left of "
                                 f"{units_epsilon(dataset.epsilon_total_units):g}", remaining)
        seq = dataset.ledger_seq + 1
        old_files = [f for f in (dataset.spent_file, dataset.classes_file) if f]
        split = (dataset.classes_file is None or bool(np.any((touched > 0) & (touched < sizes)))
                 or touched[-1] > 0)
        if split:
            new_spent, new_sizes, classes_file = self._split(dataset, state, covered, touched, units, seq)
        else:  # every touched class is covered whole: only their values move
            new_spent, new_sizes = spent[:-1] + units * (touched[:-1] > 0), sizes[:-1]
            classes_file = dataset.classes_file
        spent_file = self.store.write_array(f"datasets/{dataset.id}/budget/spent_{seq:08d}.npy",
                                            np.column_stack([new_spent, new_sizes]).astype(np.int64))
        spent_max = int(new_spent[new_sizes > 0].max()) if np.any(new_sizes > 0) else 0
        record = LedgerRecord(**fields, seq=seq, dataset_id=dataset.id, charge_units=units,
                              charge=units_epsilon(units), examples_covered=coverage.size,
                              coverage=Coverage(file=coverage.file, sha256=coverage.sha256),
                              spent_max_after_units=spent_max, epsilon_total_units=dataset.epsilon_total_units)
        record_json = canonical(record.model_dump(mode="json"))
        prev_hash = dataset.ledger_head
        digest = chain_hash(prev_hash, record_json)
        dataset.spent_file, dataset.classes_file = spent_file, classes_file
        dataset.epsilon_spent_units = spent_max
        dataset.ledger_seq = seq
        dataset.ledger_head = digest
        # The previous generation stays one charge longer: a reader that fetched the row just before this commit
        # (an early budget check, the console, verify-audit) can still open its files. Older ones go.
        keep = {spent_file, classes_file, *old_files}
        budget_dir = f"datasets/{dataset.id}/budget"
        superseded = [f"{budget_dir}/{p.name}" for p in self.store.path(budget_dir).glob("*.npy")
                      if f"{budget_dir}/{p.name}" not in keep]
        return record, record_json, prev_hash, digest, superseded

    def _split(self, dataset, state: BudgetState, covered: MappedArray, touched: np.ndarray, units: int,
               seq: int) -> tuple[np.ndarray, np.ndarray, str]:
        """Rewrite the class file: one class per distinct spent value (so classes merge as well as split)."""
        spent, sizes = state.spent_with_fresh()
        uncovered_value = np.where(sizes - touched > 0, spent, -1)
        covered_value = np.where(touched > 0, spent + units, -1)
        values = np.unique(np.concatenate([uncovered_value, covered_value]))
        values = values[values >= 0]
        to_uncovered = np.searchsorted(values, uncovered_value)
        to_covered = np.searchsorted(values, covered_value)
        new_sizes = np.zeros(values.size, dtype=np.int64)

        def blocks():
            for start in range(0, dataset.registry_size, CHUNK):
                stop = min(dataset.registry_size, start + CHUNK)
                old = state.block(start, stop)
                new = np.where(_covered_mask(covered, start, stop), to_covered[old], to_uncovered[old])
                new_sizes[:] += np.bincount(new, minlength=values.size)
                covered.forget()
                state.forget()
                yield new

        def write(path):
            write_npy(path, np.int32, dataset.registry_size, blocks())

        classes_file = self.store.write_with(f"datasets/{dataset.id}/budget/classes_{seq:08d}.npy", write)
        return values, new_sizes, classes_file


def verify_chain(entries, head: str | None = None) -> bool:
    """entries: (seq, record_json, prev_hash, hash) ordered by seq, for one dataset."""
    previous = "0" * 64
    for expected_seq, (seq, record_json, prev_hash, digest) in enumerate(entries, start=1):
        if seq != expected_seq or prev_hash != previous or chain_hash(prev_hash, record_json) != digest:
            return False
        if json.loads(record_json).get("seq") != seq:
            return False
        previous = digest
    return head is None or head == previous


def within_charge(epsilon: float, units: int) -> bool:
    """Is a recomputed ε (a float) at most the charged units, compared exactly?"""
    return math.isfinite(epsilon) and Decimal(epsilon) * UNITS_PER_EPSILON <= units
