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
SHA-256 of their registry indices, stored in a coverage file), chained to the previous entry by SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from labels_party.storage import DataStore
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


class BudgetLedger:
    """Per-example spent units of one dataset, stored in :class:`DataStore` files (int64, one per registry index)."""

    def __init__(self, store: DataStore):
        self.store = store

    def spent_vector(self, dataset) -> np.ndarray:
        spent = np.zeros(dataset.registry_size, dtype=np.int64)
        if dataset.spent_file:
            stored = self.store.read_array(dataset.spent_file)
            spent[: stored.size] = stored if stored.dtype.kind in "iu" else legacy_units(stored)
        return spent

    def remaining_units_for(self, dataset, covered: np.ndarray) -> int:
        spent = self.spent_vector(dataset)
        worst = int(spent[covered].max()) if covered.size else 0
        return max(0, dataset.epsilon_total_units - worst)

    def charge(self, dataset, covered: np.ndarray, units: int, fields: dict) -> tuple[LedgerRecord, str, str, str]:
        """Check and charge ``units`` to ``covered`` (registry indices), exactly. The caller holds the dataset row
        lock and commits. ``fields`` are the release's own record fields; the ledger adds the accounting ones.
        Returns (record, record json, prev hash, hash); mutates ``dataset`` (pointer, spent max, chain head)."""
        spent = self.spent_vector(dataset)
        worst = int(spent[covered].max()) if covered.size else 0
        if worst + units > dataset.epsilon_total_units:
            remaining = max(0, dataset.epsilon_total_units - worst)
            raise BudgetExceeded(f"release needs epsilon {units_epsilon(units):g} but covered examples have at "
                                 f"most {units_epsilon(remaining):.9g} left of "
                                 f"{units_epsilon(dataset.epsilon_total_units):g}", remaining)
        spent[covered] += units
        seq = dataset.ledger_seq + 1
        coverage = np.sort(covered).astype(np.int64)
        coverage_file = self.store.write_array(f"datasets/{dataset.id}/coverage_{seq:08d}.npy", coverage)
        record = LedgerRecord(**fields, seq=seq, dataset_id=dataset.id, charge_units=units,
                              charge=units_epsilon(units), examples_covered=int(coverage.size),
                              coverage=Coverage(file=coverage_file,
                                                sha256=hashlib.sha256(coverage.tobytes()).hexdigest()),
                              spent_max_after_units=int(spent.max()), epsilon_total_units=dataset.epsilon_total_units)
        record_json = canonical(record.model_dump(mode="json"))
        prev_hash = dataset.ledger_head
        digest = chain_hash(prev_hash, record_json)
        dataset.spent_file = self.store.write_array(f"datasets/{dataset.id}/spent_{seq:08d}.npy", spent)
        dataset.epsilon_spent_units = int(spent.max())
        dataset.ledger_seq = seq
        dataset.ledger_head = digest
        return record, record_json, prev_hash, digest


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
