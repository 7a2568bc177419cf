"""The privacy ledger, the one place that reads and writes budgets, charges and their records.

**Budgets and accounts.** A dataset has a per-example budget (ε_total in exact integer units of 10⁻⁹, and δ_total).
It is divided into *accounts*, one per organization that may release: the owner's and one per grant, each with an
allocation (ε units, δ) set by the owner (:mod:`labels_party.budgets`: allocations never sum beyond the dataset's
budget). An account's admission depends on its own spending only, so a refusal — or its absence — tells an
organization nothing about another's use; and every example's total over accounts stays within the dataset's
(ε_total, δ_total) by basic composition.

**Charges** (:class:`Charge`) are fixed before anything private is drawn (:mod:`labels_party.releases.transaction`).
Pure ε-DP events add their exact units per example. Events with δ > 0 — DP-SGD's subsampled Gaussian, the only
ones the service runs — add their Rényi-DP curve (dp-accounting's RDP accountant, at :data:`RDP_ORDERS`,
quantized *up* to units so that sums are exact integers); an example's spent ε in an account is its pure units
plus the ε of its summed curve at the account's δ (rounded up): the Gaussian events compose under RDP — many
central trainings cost what the accountant says, not the sum of their ε — and compose with the pure events by
basic composition.

**Records.** Each charge appends one :class:`LedgerRecord` (a frozen value built here, in one place): who, what
was requested, the charged ``dp_event`` (from which :func:`shared.mechanisms.events.epsilon_of` recomputes ε),
the charge (units, RDP curve), the account's allocation, the covered examples (count, SHA-256 and a coverage file
or range) and, through the hash chain, every record before it.

**State.** Per account, the spent state is kept as coverage classes (:class:`AccountState`): one int32 class id per
example and one row per class — (pure units, size) and the RDP curve when the account ran Gaussian events — so
it does not grow with releases × examples; every pass over it goes block by block (:data:`CHUNK`). The state can
always be rebuilt from the records alone (:meth:`Ledger.rebuild`, which :func:`verify` compares with it).

**Anchor.** Inside each charge, just before it commits, the data directory gets the dataset's new chain head and
the one before it (:class:`Anchor`). A database restored from a backup older than the data directory is behind its
anchor; a data directory without the anchor of a dataset that has records is not this database's: the service
refuses to start, and to charge, rather than re-draw releases it already delivered
(``docs/design/exact-ledger.md``, "Restoring").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Literal

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labels_party import db
from labels_party.labelstore import CoverageSet, read_coverage
from labels_party.storage import DataStore, MappedArray, write_npy
from shared.errors import LabelDPError
from shared.mechanisms import events

UNITS_PER_EPSILON = 10**9
COMPOSITION = ("per example and organization: pure epsilon-DP events add (exact integer units); Gaussian events "
               "add their RDP curves, converted at the organization's delta; the two add by basic composition; "
               "disjoint examples compose in parallel")
# dp-accounting's default orders; an account's curve is one int64 per order.
RDP_ORDERS: tuple[float, ...] = tuple(float(order) for order in rdp_privacy_accountant.RdpAccountant().orders)
RDP_CAP = 10**18  # units per order beyond which an order never gives the minimum (sums saturate, never wrap)
UNBOUNDED = 2**62  # the spent units of a curve no δ can convert (δ = 0): admits nothing
CHUNK = 1 << 22  # registry indices per step of a pass: bounded memory at any dataset size


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


def remaining_units(allocation_units: int, spent_units: int) -> int:
    """What an allocation has left once ``spent_units`` are spent: the one place remaining budget is computed."""
    return max(0, int(allocation_units) - int(spent_units))


def budget_figures(allocation_units: int, spent_units: int, delta: float) -> dict[str, float]:
    """An allocation as the API shows it: decimal ε from exact units (0.1 + 0.2 spent of 0.3 reads 0.3 and
    leaves exactly 0), and its δ."""
    return {"epsilon_total": units_epsilon(allocation_units), "epsilon_spent": units_epsilon(spent_units),
            "epsilon_remaining": units_epsilon(remaining_units(allocation_units, spent_units)), "delta_total": delta}


def legacy_units(spent: float | np.ndarray):
    """Float ε sums written before exact accounting, as units: rounded to 10⁻³ of a unit to shed the float noise of
    the sum (2.8559999999997965 for 2856 × 0.001), then up — a budget can only look more spent, never less."""
    return np.ceil(np.round(np.asarray(spent, dtype=np.float64) * UNITS_PER_EPSILON, 3)).astype(np.int64)


def canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def chain_hash(prev_hash: str, record_json: str) -> str:
    return hashlib.sha256((prev_hash + record_json).encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """A stored ledger entry: its record (the canonical JSON the chain hashes, and as parsed) and its links."""

    dataset_id: str
    seq: int
    record_json: str
    prev_hash: str
    hash: str

    @property
    def record(self) -> dict[str, Any]:
        return json.loads(self.record_json)


def entries(session: Session, dataset_id: str) -> list[Entry]:
    """A dataset's ledger entries in chain order (the only reader of ledger rows)."""
    rows = session.scalars(select(db.LedgerEntry).where(db.LedgerEntry.dataset_id == dataset_id)
                           .order_by(db.LedgerEntry.seq))
    return [Entry(r.dataset_id, r.seq, r.record, r.prev_hash, r.hash) for r in rows]


def chain_intact(chain: Sequence[Entry], head: str | None = None) -> bool:
    """Whether ``chain`` (one dataset's entries in order) is unbroken and ends at ``head``."""
    return verify_chain([(e.seq, e.record_json, e.prev_hash, e.hash) for e in chain], head)


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


# An ε recomputed from an event's double parameters (a noise scale s/t as a double, times a sensitivity) may exceed
# the exact rational the mechanism was calibrated to by a few units in the last place; this relative slack absorbs
# that and nothing more: at ε ≤ 50 it is below 3·10⁻¹² absolute, far below one unit (10⁻⁹).
RECOMPUTATION_SLACK = Decimal(2) ** -44


def within_charge(epsilon: float, units: int) -> bool:
    """Is a recomputed ε (a float) at most the charged units (up to :data:`RECOMPUTATION_SLACK`)?"""
    return math.isfinite(epsilon) and Decimal(epsilon) * UNITS_PER_EPSILON * (1 - RECOMPUTATION_SLACK) <= units


# -- charges ----------------------------------------------------------------------------------------------------

_GAUSSIAN = (dp_event.GaussianDpEvent, dp_event.PoissonSampledDpEvent, dp_event.SelfComposedDpEvent)


def is_gaussian(event: dp_event.DpEvent) -> bool:
    """An event with δ > 0 (accounted through its RDP curve)."""
    return isinstance(event, _GAUSSIAN)


def rdp_curve(event: dp_event.DpEvent) -> np.ndarray:
    """The event's RDP at :data:`RDP_ORDERS` in units, rounded up (one more unit than the float's ceiling, so the
    integer curve is never below the accountant's); infinite orders saturate at :data:`RDP_CAP`."""
    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS))
    accountant.compose(event)
    curve = np.asarray(accountant.rdp, dtype=np.float64) * UNITS_PER_EPSILON
    finite = np.isfinite(curve) & (curve < RDP_CAP)
    return np.where(finite, np.ceil(np.where(finite, curve, 0.0)) + 1, RDP_CAP).astype(np.int64)


def rdp_epsilon_units(curves: np.ndarray, delta: float) -> np.ndarray:
    """ε (units, rounded up) of each row of summed curves at ``delta``; 0 for an empty curve, :data:`UNBOUNDED`
    where no finite ε exists (δ = 0)."""
    curves = np.atleast_2d(curves)
    out = np.zeros(curves.shape[0], dtype=np.int64)
    for row in np.flatnonzero(curves.any(axis=1)):
        epsilon = math.inf
        if delta > 0:
            epsilon, _order = rdp_privacy_accountant.compute_epsilon(
                RDP_ORDERS, np.minimum(curves[row], RDP_CAP) / UNITS_PER_EPSILON, delta)
        out[row] = charge_units(epsilon) if math.isfinite(epsilon) and epsilon < UNBOUNDED / 1e9 else UNBOUNDED
    return out


@dataclass(frozen=True)
class Charge:
    """What one privacy event costs each example it covers, fixed before anything private is drawn: pure ε units,
    and the RDP curve of an event with δ > 0 (then ``units`` is 0)."""

    units: int
    rdp: tuple[int, ...] | None = None

    @classmethod
    def of(cls, event: dp_event.DpEvent, epsilon_requested: float) -> Charge:
        """A pure event is charged the requested ε (rounded up to a unit), which must bound the event's ε (the
        ledger checks it on the record, :meth:`Ledger.charge`); a Gaussian one its own curve, whatever ε was
        requested (the request only calibrated its noise)."""
        if is_gaussian(event):
            return cls(0, tuple(int(v) for v in rdp_curve(event)))
        return cls(charge_units(epsilon_requested))

    @classmethod
    def of_record(cls, record: dict) -> Charge:
        """The charge a stored record made — also records written before exact units (a float ``charge``) and
        before δ was budgeted (a Gaussian event charged as pure ε then; its curve now)."""
        if record.get("rdp_units") is not None:
            return cls(int(record.get("charge_units", 0)), tuple(int(v) for v in record["rdp_units"]))
        event = events.from_dict(record["dp_event"]) if record.get("dp_event") else None
        if event is not None and is_gaussian(event):
            return cls(0, tuple(int(v) for v in rdp_curve(event)))
        units = int(record["charge_units"]) if "charge_units" in record else int(legacy_units(record["charge"]))
        return cls(units)

    @property
    def rdp_array(self) -> np.ndarray:
        """The RDP curve as an array (zeros for a pure charge)."""
        return np.asarray(self.rdp if self.rdp is not None else (0,) * len(RDP_ORDERS), dtype=np.int64)

    def standalone_units(self, delta: float) -> int:
        """This charge alone, as ε units at ``delta`` (what a release reports as its charged ε)."""
        if self.rdp is None:
            return self.units
        return self.units + int(rdp_epsilon_units(self.rdp_array, delta)[0])


def charged_units(record: dict) -> int:
    """What a stored record charged each covered example, as ε units on its own (an event with δ > 0: its ε at the
    recorded δ)."""
    return Charge.of_record(record).standalone_units(float(record.get("delta") or 0.0))


# -- records ----------------------------------------------------------------------------------------------------

class Actor(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    org: str
    role: str


class Coverage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    file: str
    sha256: str


class AccountTerms(BaseModel):
    """The account a charge went to, as it stood: its allocation of every covered example's budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    org: str
    epsilon_units: int
    delta: float


class LedgerRecord(BaseModel):
    """One privacy event, completely documented: enough to recompute its (ε, δ) and every example's budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["label_release"] = "label_release"
    seq: int
    dataset_id: str
    release_id: str
    created_at: str
    actor: Actor  # the organization the release went to
    account: AccountTerms
    mechanism: str
    request: dict[str, Any]  # the request's privacy parameters (no example ids, features or predictions)
    label_version: int
    epsilon_requested: float
    dp_event: dict[str, Any]  # shared.mechanisms.events.to_dict of the charged event
    charge_units: int  # pure ε, exact; 1 unit = 10⁻⁹ ε
    charge: float  # the same as a decimal, for reading
    rdp_units: list[int] | None  # the RDP curve charged at RDP_ORDERS (events with δ > 0), else None
    delta: float  # the δ at which rdp_units convert to ε (the account's); 0 for pure events
    examples_covered: int
    coverage: Coverage
    spent_max_after_units: int  # the account's, after this charge
    epsilon_total_units: int  # the dataset's
    delta_total: float
    composition: str = COMPOSITION


UNNAMED = "(unrecorded)"  # the organization of a record written before records named their actor


@dataclass(frozen=True)
class RecordSummary:
    """What the console and reports read from a stored record — the one place that reads a record's fields, in
    every shape the ledger has written (records before actors, accounts or exact units included)."""

    release_id: str
    org: str  # who the release went to (UNNAMED for records that did not say)
    mechanism: str
    charged_units: int  # on its own, at the record's δ
    examples_covered: int
    created_at: datetime | None
    account: str  # the account it was charged to ("" before per-organization accounts)
    spent_max_after_units: int | None  # the account's largest per-example spent after it (None: not recorded)

    @classmethod
    def of(cls, record: dict[str, Any]) -> RecordSummary:
        created = record.get("created_at")
        return cls(str(record["release_id"]), str((record.get("actor") or {}).get("org") or UNNAMED),
                   str(record.get("mechanism") or UNNAMED), charged_units(record),
                   int(record.get("examples_covered") or 0),
                   datetime.fromisoformat(created) if isinstance(created, str) else None,
                   str((record.get("account") or {}).get("org") or ""),
                   int(record["spent_max_after_units"]) if record.get("spent_max_after_units") is not None else None)


class RecordFields(BaseModel):
    """What the caller of :meth:`Ledger.charge` says about a charge; the ledger adds the rest of the record."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    release_id: str
    created_at: str
    actor: Actor
    mechanism: str
    request: dict[str, Any]
    label_version: int


@dataclass(frozen=True)
class Charged:
    """A charge made (not yet committed): its record, what it charged each covered example on its own (ε units at
    the account's δ), and the budget files it superseded (to remove once the caller committed)."""

    record: LedgerRecord
    standalone_units: int
    superseded: tuple[str, ...]


# -- state ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AccountState:
    """One account's spent state as coverage classes: ``classes[i]`` is the class of registry index ``i``; per class
    ``units`` (pure ε), ``sizes``, ``rdp`` (its summed curve, or None while the account ran no Gaussian event) and
    ``spent`` — units plus the curve's ε at the account's δ, kept so that a charge converts only the classes it
    touches (a conversion is ~0.1 ms: thousands of classes would make every charge slow). Indices at or beyond
    ``len(classes)`` form the *fresh* class, id ``len(units)``, with nothing spent."""

    classes: np.ndarray  # int32, memory-mapped
    units: np.ndarray  # int64 per class
    sizes: np.ndarray  # int64 per class
    spent: np.ndarray  # int64 per class, at the account's δ
    rdp: np.ndarray | None  # int64 (classes, len(RDP_ORDERS))
    registry_size: int
    mapped: MappedArray | None = None

    def forget(self) -> None:
        """Drop the class file's pages read so far from the resident set (passes stay bounded in memory)."""
        if self.mapped is not None:
            self.mapped.forget()

    @property
    def fresh(self) -> int:
        return self.units.size

    def with_fresh(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(units, sizes, rdp) per class with the fresh class last; rdp as zeros when the account has none."""
        rdp = self.rdp if self.rdp is not None else np.zeros((self.units.size, len(RDP_ORDERS)), np.int64)
        return (np.append(self.units, 0), np.append(self.sizes, self.registry_size - self.classes.size),
                np.vstack([rdp, np.zeros((1, len(RDP_ORDERS)), np.int64)]))

    def spent_with_fresh(self) -> np.ndarray:
        """Spent units per class at the account's δ, the fresh class last."""
        return np.append(self.spent, 0)

    def spent_at(self, delta: float) -> np.ndarray:
        """Spent units per class if the curves converted at ``delta`` (a new allocation), the fresh class last."""
        units, _, rdp = self.with_fresh()
        return units + (rdp_epsilon_units(rdp, delta) if self.rdp is not None else 0)

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


def _chunks(coverage, *forgettable) -> Iterator[np.ndarray]:
    for start in range(0, coverage.size, CHUNK):
        yield coverage.slice(start, start + CHUNK).astype(np.int64, copy=False)
        coverage.forget()
        for item in forgettable:
            item.forget()


def _covered_mask(coverage, start: int, stop: int) -> np.ndarray:
    low, high = coverage.position([start, stop])
    mask = np.zeros(stop - start, dtype=bool)
    mask[coverage.slice(int(low), int(high)) - start] = True
    return mask


class BudgetExceeded(LabelDPError):
    """The one budget refusal: a charge some covered example cannot afford in the organization's account. Its
    figures are told to the dataset's owner only (:meth:`told_to`): another organization learns only that its own
    allocation does not allow the request."""

    code = "budget_exceeded"

    def __init__(self, needed_units: int, remaining_units: int, allocation_units: int = 0):
        super().__init__("not enough budget for this request in this organization's allocation")
        self.needed_units, self.remaining_units, self.allocation_units = needed_units, remaining_units, allocation_units

    def told_to(self, owner: bool) -> LabelDPError:
        if not owner:
            return LabelDPError(f"not enough budget for this request (epsilon {units_epsilon(self.needed_units):g} "
                                "on every covered example) in this organization's allocation", code=self.code)
        return LabelDPError(f"budget exceeded: release needs epsilon {units_epsilon(self.needed_units):g} but "
                            f"covered examples have at most {units_epsilon(self.remaining_units):.9g} left of this "
                            f"organization's {units_epsilon(self.allocation_units):g}", code=self.code)


class LedgerRollback(LabelDPError):
    """The database is behind the data directory (restored from an older backup): nothing may be charged."""

    code = "ledger_rollback"


@dataclass(frozen=True)
class Anchor:
    """A dataset's chain head as the data directory knows it: written, durably, inside each charge's transaction
    just before it commits — the new head, and the one before it (if the commit then fails, the database is at the
    previous one) — and confirmed after the commit (the previous one is then the new one too: a database one
    charge behind is refused)."""

    seq: int
    head: str
    previous_seq: int
    previous_head: str

    def admits(self, seq: int, head: str) -> bool:
        return (seq, head) in ((self.seq, self.head), (self.previous_seq, self.previous_head))


@dataclass
class Ledger:
    """Budgets, charges, records and anchors of every dataset in one :class:`DataStore`."""

    store: DataStore

    # -- reading ------------------------------------------------------------------------------------------------
    def state(self, account: db.BudgetAccount, registry_size: int) -> AccountState:
        if account.spent_file is None or account.classes_file is None:  # written together: never charged
            empty = np.zeros(0, np.int64)
            return AccountState(np.zeros(0, np.int32), empty, empty, empty, None, registry_size)
        table = self.store.read_array(account.spent_file)  # (units, size, spent) per class
        classes = MappedArray(self.store.path(account.classes_file))
        rdp = self.store.read_array(account.rdp_file) if account.rdp_file else None
        return AccountState(classes.array, table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy(), rdp,
                            registry_size, classes)

    def spent_vector(self, account: db.BudgetAccount, registry_size: int) -> np.ndarray:
        """Every example's spent units in one account (registry_size int64s: small datasets and tests)."""
        state = self.state(account, registry_size)
        return state.spent_with_fresh()[state.block(0, registry_size)]

    def spent_classes(self, account: db.BudgetAccount, registry_size: int,
                      delta: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(spent units, number of examples) per class of one account, the fresh class included; summaries.
        ``delta``: the δ its curves convert at, if not the account's own (what a new allocation would make it)."""
        state = self.state(account, registry_size)
        spent = state.spent_with_fresh() if delta is None else state.spent_at(delta)
        sizes = state.with_fresh()[1]
        return spent[sizes > 0], sizes[sizes > 0]

    def reprice(self, dataset: db.Dataset, account: db.BudgetAccount, delta: float) -> None:
        """Make ``delta`` the account's δ: its classes' spent ε convert at it from now on (an allocation changed)."""
        state = self.state(account, dataset.registry_size)
        account.delta = delta
        if account.spent_file is None or state.rdp is None:
            return
        spent = state.spent_at(delta)[:-1]
        generation = account.generation + 1
        directory = f"datasets/{dataset.id}/budget/{account.org_id}"
        account.spent_file = self._write_table(directory, generation, state.units, state.sizes, spent)
        account.generation = generation
        account.spent_max_units = int(spent[state.sizes > 0].max()) if np.any(state.sizes > 0) else 0

    def _write_table(self, directory: str, generation: int, units: np.ndarray, sizes: np.ndarray,
                     spent: np.ndarray) -> str:
        return self.store.write_array(f"{directory}/spent_{generation:08d}.npy",
                                      np.column_stack([units, sizes, spent]).astype(np.int64))

    def spent_by_example(self, accounts: Sequence[db.BudgetAccount], registry_size: int
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(total spent units over all accounts, number of examples) per distinct total: the per-example
        distribution, one pass block by block (the owner's console and summaries)."""
        states = [(self.state(a, registry_size), a.delta) for a in accounts]
        spent = [state.spent_with_fresh() for state, _ in states]
        totals: dict[int, int] = {}
        for start in range(0, registry_size, CHUNK):
            stop = min(registry_size, start + CHUNK)
            block = np.zeros(stop - start, dtype=np.int64)
            for (state, _), values in zip(states, spent, strict=True):
                block += values[state.block(start, stop)]
                state.forget()
            values, counts = np.unique(block, return_counts=True)
            for value, count in zip(values.tolist(), counts.tolist(), strict=True):
                totals[value] = totals.get(value, 0) + count
        keys = sorted(totals)
        return np.asarray(keys, dtype=np.int64), np.asarray([totals[k] for k in keys], dtype=np.int64)

    # -- charging -----------------------------------------------------------------------------------------------
    def charge(self, session: Session, dataset_id: str, org_id: int, coverage: CoverageSet,
               event: dp_event.DpEvent, epsilon_requested: float, fields: RecordFields) -> Charged:
        """Charge ``event`` to the covered examples of ``org_id``'s account on the dataset, exactly: lock the
        dataset's and the account's rows, admit the charge (:class:`BudgetExceeded` if any covered example has too
        little left), append the record — refused if the ε recomputed from its ``dp_event`` exceeds what it charges
        — and anchor the new chain head. The caller commits, then removes ``Charged.superseded``."""
        dataset = session.get(db.Dataset, dataset_id, with_for_update=True)
        account = session.scalar(select(db.BudgetAccount).where(
            db.BudgetAccount.dataset_id == dataset_id, db.BudgetAccount.org_id == org_id).with_for_update())
        if dataset is None or account is None:  # an admitted organization always has an account (possibly empty)
            raise BudgetExceeded(0, 0)
        cost = Charge.of(event, epsilon_requested)
        self.check_anchor(dataset)
        state = self.state(account, dataset.registry_size)
        covered = read_coverage(self.store, coverage.file)
        touched = np.zeros(state.fresh + 1, dtype=np.int64)
        for chunk in _chunks(covered, state):
            touched += np.bincount(state.class_at(chunk), minlength=state.fresh + 1)
        units, sizes, rdp = state.with_fresh()
        hit = touched > 0
        new_units = units + cost.units * hit
        new_rdp = rdp + (cost.rdp_array[None, :] * hit[:, None] if cost.rdp is not None else 0)
        new_rdp = np.minimum(new_rdp, RDP_CAP)
        has_rdp = state.rdp is not None or cost.rdp is not None
        before = state.spent_with_fresh()
        spent_after = before.copy()  # only the touched classes move, and only they are converted
        spent_after[hit] = new_units[hit] + (rdp_epsilon_units(new_rdp[hit], account.delta) if has_rdp else 0)
        needed = cost.standalone_units(account.delta)
        if covered.size and int(spent_after[hit].max()) > account.epsilon_units:
            raise BudgetExceeded(needed, remaining_units(account.epsilon_units, int(before[hit].max())),
                                 account.epsilon_units)
        generation = account.generation + 1
        directory = f"datasets/{dataset.id}/budget/{account.org_id}"
        old_files = [f for f in (account.spent_file, account.classes_file, account.rdp_file) if f]
        rows = np.column_stack([new_units[:, None], new_rdp])
        # Classes covered in part (or the fresh class) split; classes that end up equal merge: one class per
        # distinct (units, curve), so the number of classes never exceeds the number of distinct histories.
        if account.classes_file is None or bool(np.any(hit & (touched < sizes))) or touched[-1] > 0:
            values, new_sizes, new_spent, classes_file = self._split(
                directory, generation, dataset.registry_size, state, covered, touched, rows, spent_after)
        else:  # every touched class is covered whole: only their values move
            values, new_sizes, new_spent = rows[:-1], sizes[:-1], spent_after[:-1]
            classes_file = account.classes_file
        spent_file = self._write_table(directory, generation, values[:, 0], new_sizes, new_spent)
        rdp_file = (self.store.write_array(f"{directory}/rdp_{generation:08d}.npy", values[:, 1:].copy())
                    if has_rdp else None)
        account.spent_max_units = int(new_spent[new_sizes > 0].max()) if np.any(new_sizes > 0) else 0
        account.spent_file, account.classes_file, account.rdp_file = spent_file, classes_file, rdp_file
        account.generation = generation
        others = session.scalar(select(func.coalesce(func.sum(db.BudgetAccount.spent_max_units), 0)).where(
            db.BudgetAccount.dataset_id == dataset.id, db.BudgetAccount.id != account.id))
        dataset.epsilon_spent_units = int(others or 0) + account.spent_max_units
        record = self._append(session, dataset, account, coverage, cost, {
            **fields.model_dump(), "epsilon_requested": epsilon_requested, "dp_event": events.to_dict(event)})
        keep = {spent_file, classes_file, rdp_file, *old_files}
        superseded = tuple(f"{directory}/{p.name}" for p in self.store.path(directory).glob("*.npy")
                           if f"{directory}/{p.name}" not in keep)
        return Charged(record, needed, superseded)

    def _split(self, directory: str, generation: int, registry_size: int, state: AccountState, covered,
               touched: np.ndarray, rows: np.ndarray, spent_after: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """Rewrite the class file: one class per distinct row (so classes merge as well as split); the new classes'
        rows, sizes and spent units."""
        units, sizes, rdp = state.with_fresh()
        old_rows = np.column_stack([units[:, None], rdp])
        candidates = np.vstack([old_rows[sizes - touched > 0], rows[touched > 0]])
        values = np.unique(candidates, axis=0)

        def position(table: np.ndarray) -> np.ndarray:  # each row's index in values (-1 for rows never used)
            found = {tuple(row): i for i, row in enumerate(values.tolist())}
            return np.asarray([found.get(tuple(row), -1) for row in table.tolist()], dtype=np.int64)

        to_uncovered, to_covered = position(old_rows), position(rows)
        new_spent = np.zeros(values.shape[0], dtype=np.int64)  # a row's spent is the same wherever it comes from
        remaining, hit = sizes - touched > 0, touched > 0
        new_spent[to_uncovered[remaining]] = state.spent_with_fresh()[remaining]
        new_spent[to_covered[hit]] = spent_after[hit]
        new_sizes = np.zeros(values.shape[0], dtype=np.int64)

        def blocks():
            for start in range(0, registry_size, CHUNK):
                stop = min(registry_size, start + CHUNK)
                old = state.block(start, stop)
                new = np.where(_covered_mask(covered, start, stop), to_covered[old], to_uncovered[old])
                new_sizes[:] += np.bincount(new, minlength=values.shape[0])
                covered.forget()
                state.forget()
                yield new

        classes_file = self.store.write_with(f"{directory}/classes_{generation:08d}.npy",
                                             lambda path: write_npy(path, np.int32, registry_size, blocks()))
        return values, new_sizes, new_spent, classes_file

    def _append(self, session: Session, dataset: db.Dataset, account: db.BudgetAccount, coverage: CoverageSet,
                charge: Charge, fields: dict[str, Any]) -> LedgerRecord:
        """The record and its chained entry (the only place a ledger entry is written), after checking that the
        record alone recomputes the charge: its curve, and for a pure event an ε within the units charged."""
        seq = dataset.ledger_seq + 1
        owner = session.get(db.Organization, account.org_id)
        org = owner.name if owner is not None else "?"
        record = LedgerRecord(
            **fields, seq=seq, dataset_id=dataset.id,
            account=AccountTerms(org=org, epsilon_units=account.epsilon_units, delta=account.delta),
            charge_units=charge.units, charge=units_epsilon(charge.units),
            rdp_units=list(charge.rdp) if charge.rdp is not None else None,
            delta=account.delta if charge.rdp is not None else 0.0, examples_covered=coverage.size,
            coverage=Coverage(file=coverage.file, sha256=coverage.sha256),
            spent_max_after_units=account.spent_max_units, epsilon_total_units=dataset.epsilon_total_units,
            delta_total=dataset.delta_total)
        recorded = Charge.of_record(record.model_dump(mode="json"))
        if recorded != charge or (charge.rdp is None and not within_charge(
                events.epsilon_of(events.from_dict(record.dp_event)), record.charge_units)):
            raise LabelDPError("the release's privacy event does not fit its charge; nothing was charged",
                               code="certification_failed")
        record_json = canonical(record.model_dump(mode="json"))
        digest = chain_hash(dataset.ledger_head, record_json)
        session.add(db.LedgerEntry(dataset_id=dataset.id, seq=seq, release_id=record.release_id, record=record_json,
                                   prev_hash=dataset.ledger_head, hash=digest))
        previous = (dataset.ledger_seq, dataset.ledger_head)
        dataset.ledger_seq, dataset.ledger_head = seq, digest
        # Before the commit, so that the data directory never lags the database: a database later found behind
        # this anchor (and its predecessor) was restored from an older backup.
        self.anchor(dataset, previous)
        return record

    # -- the anchor ---------------------------------------------------------------------------------------------
    def read_anchor(self, dataset_id: str) -> Anchor | None:
        try:
            data = json.loads(self.store.path(f"anchors/{dataset_id}.json").read_text())
        except FileNotFoundError:
            return None
        return Anchor(int(data["seq"]), str(data["head"]), int(data["previous_seq"]), str(data["previous_head"]))

    def anchor(self, dataset: db.Dataset, previous: tuple[int, str] | None = None) -> None:
        """Write ``dataset``'s chain head (and the head before it) to the data directory, durably."""
        previous_seq, previous_head = previous or (dataset.ledger_seq, dataset.ledger_head)
        self.store.write_with(f"anchors/{dataset.id}.json", lambda path: path.write_text(json.dumps({
            "seq": dataset.ledger_seq, "head": dataset.ledger_head, "previous_seq": previous_seq,
            "previous_head": previous_head})))

    def confirm(self, dataset: db.Dataset) -> None:
        """After a charge committed, with ``dataset``'s row locked and fresh: its head alone is admitted from now
        on (the lock keeps a later charge's pending anchor from being overwritten with this older head)."""
        anchor = self.read_anchor(dataset.id)
        if anchor is not None and (anchor.seq, anchor.head) == (dataset.ledger_seq, dataset.ledger_head):
            self.anchor(dataset)

    def check_anchor(self, dataset: db.Dataset) -> None:
        """Refuse a dataset whose database chain is not where the data directory saw it last: behind it (a
        database restored from an older backup), beside it, or a dataset with records and no anchor (a data
        directory that is not this database's, or whose anchors were removed)."""
        anchor = self.read_anchor(dataset.id)
        if anchor is None and dataset.ledger_seq == 0:
            return
        if anchor is None or not anchor.admits(dataset.ledger_seq, dataset.ledger_head):
            raise LedgerRollback(rollback_message(dataset.id))

    def anchored_datasets(self) -> list[str]:
        directory = self.store.path("anchors")
        return sorted(p.stem for p in directory.glob("*.json")) if directory.exists() else []

    # -- rebuilding and verifying from the records ---------------------------------------------------------------
    def rebuild(self, dataset: db.Dataset, account: db.BudgetAccount, records: Sequence[dict]) -> None:
        """Write ``account``'s state from its records alone (a migration from older state layouts, once)."""
        recomputed = _Recomputed(self.store, records, dataset.registry_size)
        keys, values = recomputed.class_values()
        index = {key: i for i, key in enumerate(keys)}
        directory = f"datasets/{dataset.id}/budget/{account.org_id}"
        generation = account.generation + 1
        new_sizes = np.zeros(len(keys), dtype=np.int64)

        def blocks():
            for _start, _stop, pure, signature in recomputed.blocks():
                pairs, inverse = np.unique(np.column_stack([pure, signature]), axis=0, return_inverse=True)
                ids = np.asarray([index[tuple(pair)] for pair in pairs.tolist()], dtype=np.int64)[inverse.ravel()]
                new_sizes[:] += np.bincount(ids, minlength=len(keys))
                yield ids

        classes_file = self.store.write_with(f"{directory}/classes_{generation:08d}.npy",
                                             lambda path: write_npy(path, np.int32, dataset.registry_size, blocks()))
        has_rdp = bool(values[:, 1:].any())
        spent = values[:, 0] + (rdp_epsilon_units(values[:, 1:], account.delta) if has_rdp else 0)
        account.classes_file = classes_file
        account.spent_file = self._write_table(directory, generation, values[:, 0], new_sizes, spent)
        account.rdp_file = (self.store.write_array(f"{directory}/rdp_{generation:08d}.npy", values[:, 1:].copy())
                            if has_rdp else None)
        account.generation = generation
        account.spent_max_units = int(spent[new_sizes > 0].max()) if np.any(new_sizes > 0) else 0

    def differences(self, dataset: db.Dataset, account: db.BudgetAccount, records: Sequence[dict]) -> list[str]:
        """Where ``account``'s stored state differs from the one its records imply (empty: none), compared
        exactly, example by example, in blocks."""
        recomputed = _Recomputed(self.store, records, dataset.registry_size)
        try:
            state = self.state(account, dataset.registry_size)
            if not np.array_equal(state.spent_with_fresh(), state.spent_at(account.delta)):
                return ["a class's spent epsilon is not its units and curve at the account's delta"]
            return self._compare(state, recomputed)
        except OSError:  # a coverage or budget file is gone (the records name the missing coverage files)
            return ["its budget cannot be recomputed: a file it depends on is missing"]

    @staticmethod
    def _compare(state: AccountState, recomputed: _Recomputed) -> list[str]:
        units, _, rdp = state.with_fresh()
        seen: dict[int, tuple[int, int]] = {}  # class -> (Gaussian signature, an example of it)
        for start, stop, pure, signature in recomputed.blocks():
            stored = state.block(start, stop)
            state.forget()
            if not np.array_equal(units[stored], pure):
                return ["per-example spent units differ from the records"]
            pairs, first = np.unique(np.column_stack([stored, signature]), axis=0, return_index=True)
            for (cls, sig), at in zip(pairs.tolist(), first.tolist(), strict=True):
                if seen.setdefault(cls, (sig, start + at))[0] != sig:
                    return ["examples of one class have different Gaussian histories"]
        for cls, (sig, example) in seen.items():
            if not np.array_equal(rdp[cls], recomputed.curve_of(sig, example)):
                return ["a class's RDP curve differs from its records"]
        return []


def rollback_message(dataset_id: str) -> str:
    return (f"the database is behind the data directory for dataset {dataset_id} (restored from an older backup?): "
            "releases it no longer knows were delivered and would be drawn again. Restore the database and the "
            "data directory from the same backup (docs/design/exact-ledger.md, 'Restoring')")


class _Recomputed:
    """Every example's charges in one account recomputed from its records: per block of registry indices, the
    summed pure units and a signature of the Gaussian records that covered it (a sum of per-record 64-bit tags
    modulo 2⁶⁴ — a multiset hash); the curve of a signature is the sum of the curves of the Gaussian records that
    cover one example that has it."""

    def __init__(self, store: DataStore, records: Sequence[dict], registry_size: int):
        self.store, self.registry_size = store, registry_size
        self.charges = [(record, Charge.of_record(record), _tag(record)) for record in records]

    def blocks(self) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """(start, stop, pure units, signature as int64) per block."""
        coverages = [read_coverage(self.store, record["coverage"]["file"]) for record, _, _ in self.charges]
        for start in range(0, self.registry_size, CHUNK):
            stop = min(self.registry_size, start + CHUNK)
            pure = np.zeros(stop - start, dtype=np.int64)
            signature = np.zeros(stop - start, dtype=np.uint64)
            for coverage, (_record, charge, tag) in zip(coverages, self.charges, strict=True):
                low, high = coverage.position([start, stop])
                where = coverage.slice(int(low), int(high)) - start
                pure[where] += charge.units
                if charge.rdp is not None:
                    signature[where] += np.uint64(tag)
                coverage.forget()
            yield start, stop, pure, signature.view(np.int64)

    def class_values(self) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The distinct (units, signature) pairs, sorted, and their rows (units, curve...)."""
        representative: dict[tuple[int, int], int] = {}
        for start, _stop, pure, signature in self.blocks():
            pairs, first = np.unique(np.column_stack([pure, signature]), axis=0, return_index=True)
            for pair, at in zip(pairs.tolist(), first.tolist(), strict=True):
                representative.setdefault(tuple(pair), start + at)
        keys = sorted(representative)
        rows = np.zeros((len(keys), 1 + len(RDP_ORDERS)), dtype=np.int64)
        for i, (units, sig) in enumerate(keys):
            rows[i, 0] = units
            rows[i, 1:] = self.curve_of(sig, representative[(units, sig)])
        return keys, rows

    def curve_of(self, signature: int, example: int) -> np.ndarray:
        curve = np.zeros(len(RDP_ORDERS), dtype=np.int64)
        if signature == 0:
            return curve
        for record, charge, _tag_value in self.charges:
            if charge.rdp is None:
                continue
            coverage = read_coverage(self.store, record["coverage"]["file"])
            at = int(coverage.position([example])[0])
            if at < coverage.size and int(coverage.slice(at, at + 1)[0]) == example:
                curve = np.minimum(curve + charge.rdp_array, RDP_CAP)
        return curve


def _tag(record: dict) -> int:
    return int.from_bytes(hashlib.sha256(canonical(record).encode()).digest()[:8], "little") | 1

