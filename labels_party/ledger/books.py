"""The spent state of every account (coverage classes), the charge, the anchor, and their recomputation from
the records alone."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labels_party.ledger import agreement, chain, key_certificates, revocations
from labels_party.ledger.charges import RDP_CAP, Charge, rdp_curve, rdp_epsilon_units, rdp_orders
from labels_party.ledger.records import (
    AccountTerms,
    Charged,
    Coverage,
    DocumentFact,
    LabelsFact,
    LedgerRecord,
    OwnerFact,
    RecordFields,
    SourceFact,
    SpentState,
    canonical,
    chain_hash,
    entries,
    records_by_org,
    secret_digest,
)
from labels_party.ledger.signing import HeadSigner
from labels_party.ledger.units import remaining_units, units_epsilon, within_charge
from labels_party.store import db
from labels_party.store.labelstore import CoverageSet, RangeCoverage, RegistryPart, read_coverage
from labels_party.store.storage import DataStore, MappedArray, write_npy
from shared.errors import ErrorCode, LabelDPError
from shared.service.keys import ApiKeyColumns, Principal

if TYPE_CHECKING:  # dp-accounting is imported where an event is read (issue 42: making a key starts fast)
    from dp_accounting import dp_event

CHUNK = 1 << 22  # registry indices per step of a pass: bounded memory at any dataset size
ROW_READS = 8  # reads of a dataset row the anchor does not admit before it is refused (check_anchor)


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
    rdp: np.ndarray | None  # int64 (classes, len(rdp_orders()))
    registry_size: int
    mapped: MappedArray | None = None
    classes_sha256: str | None = None  # the class file's entries' SHA-256, as its chain records and it was checked

    def forget(self) -> None:
        """Drop the class file's pages read so far from the resident set (passes stay bounded in memory)."""
        if self.mapped is not None:
            self.mapped.forget()

    @property
    def fresh(self) -> int:
        return self.units.size

    def with_fresh(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(units, sizes, rdp) per class with the fresh class last; rdp as zeros when the account has none."""
        rdp = self.rdp if self.rdp is not None else np.zeros((self.units.size, len(rdp_orders())), np.int64)
        return (np.append(self.units, 0), np.append(self.sizes, self.registry_size - self.classes.size),
                np.vstack([rdp, np.zeros((1, len(rdp_orders())), np.int64)]))

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

    code = ErrorCode.BUDGET_EXCEEDED

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

    code = ErrorCode.LEDGER_ROLLBACK


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


ANCHOR_BYTES = 4096  # an anchor file is ~300 bytes of JSON: anything larger is not one
ARRAY_HEADER_BYTES = 4096  # an .npy header (numpy writes 128 bytes, up to a few KB for wide shapes)


@dataclass
class Ledger:
    """Budgets, charges, records and anchors of every dataset in one :class:`DataStore`; ``signer``: the audit key
    that signs and exports chain heads after each commit (:mod:`.signing`; None: heads are not signed)."""

    store: DataStore
    signer: HeadSigner | None = None
    # Each dataset's chain as last replayed by this process (:meth:`facts`): read again only from where it stopped.
    _replayed: dict[str, chain.Replayed] = field(default_factory=dict, repr=False)
    _replaying: threading.Lock = field(default_factory=threading.Lock, repr=False)
    revocations: revocations.RevocationList = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.revocations = revocations.RevocationList(self.store)

    # -- the chain's facts ------------------------------------------------------------------------------------------
    def facts(self, session: Session, dataset: db.Dataset) -> chain.Replayed:
        """What ``dataset``'s chain says now stands, up to the head on its row — which the caller checked against
        the anchor (:meth:`check_anchor`) — its links checked from where this process last read it
        (:class:`agreement.LedgerTampered` if they do not join up). Entries this transaction appended itself are
        replayed but not remembered (it may roll back)."""
        with self._replaying:
            known = self._replayed.get(dataset.id)
        if known is None or known.seq > dataset.ledger_seq:
            known = chain.Replayed()
        if (known.seq, known.head) == (dataset.ledger_seq, dataset.ledger_head):
            return known
        new = entries(session, dataset.id, after=known.seq, through=dataset.ledger_seq)  # not those committed since
        # the row was read (a reader without its lock)
        previous, seq = known.head, known.seq
        for entry in new:
            if entry.seq != seq + 1 or entry.prev_hash != previous or chain_hash(previous, entry.record_json) != \
                    entry.hash:
                raise agreement.tampered(dataset.id, [f"the hash chain is broken at seq {entry.seq}"])
            previous, seq = entry.hash, entry.seq
        if (seq, previous) != (dataset.ledger_seq, dataset.ledger_head):
            raise agreement.tampered(dataset.id, ["the chain does not end at the dataset's head"])
        replayed = chain.replay(new, start=known)
        if replayed.problems:  # a release charged or made available twice, a second owner…: nothing is honoured
            raise agreement.tampered(dataset.id, replayed.problems)
        if not chain.moving(session, dataset.id):
            with self._replaying:
                self._replayed[dataset.id] = replayed
        return replayed

    # -- reading ------------------------------------------------------------------------------------------------
    def state(self, account: db.BudgetAccount, registry_size: int, recorded: dict[str, Any] | None = None, *,
              private: bool = False) -> AccountState:
        """The account's state as its files hold it; ``recorded``: its last charge's :class:`~.records.SpentState`
        — its class file is then read only if it holds the entries that charge recorded (``OSError`` else);
        ``private``: the class file read from a copy no writer can change (a charge's, :meth:`DataStore.
        checked_array`)."""
        if account.spent_file is None or account.classes_file is None:  # written together: never charged
            empty = np.zeros(0, np.int64)
            return AccountState(np.zeros(0, np.int32), empty, empty, empty, None, registry_size)
        # at most a class per example and the one of examples never charged: a file larger than the registry allows
        # is refused unread (the thirty-eighth review's 1.5 GiB spent table took a request to 3.4 GB)
        classes_at_most = registry_size + 2
        table = self.store.read_array(account.spent_file, ARRAY_HEADER_BYTES + 24 * classes_at_most)
        recorded = recorded or {}
        sha256 = recorded.get("classes_sha256")  # (None: a state from before its class file was hashed)
        entries = int(recorded["classes_entries"]) if sha256 is not None else \
            self.store.npy_entries(account.classes_file, registry_size)
        if entries > registry_size:
            raise ValueError("the class file spans more examples than the registry holds")
        classes = self.store.checked_array(account.classes_file, np.int32, entries, sha256, private=private)
        rdp = self.store.read_array(account.rdp_file, ARRAY_HEADER_BYTES + 8 * len(rdp_orders()) * classes_at_most) \
            if account.rdp_file else None
        return AccountState(classes.array, table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy(), rdp,
                            registry_size, classes, sha256)

    def checked_state(self, session: Session, dataset: db.Dataset, account: db.BudgetAccount) -> AccountState:
        """The account's state as its chain's last charge left it (:class:`agreement.LedgerTampered` otherwise: a
        state row, a registry size or the totals edited outside the service) — what any decision on it reads."""
        self.check_anchor(session, dataset)
        org = session.get(db.Organization, account.org_id)
        state, problems = self._state_problems(self.facts(session, dataset), dataset, account, org.name if org else "?")
        if problems:
            raise agreement.tampered(dataset.id, problems)
        assert state is not None
        return state

    def _state_problems(self, replayed: chain.Replayed, dataset: db.Dataset, account: db.BudgetAccount,
                        org: str, *, private: bool = False) -> tuple[AccountState | None, list[str]]:
        try:  # read only on the chain's registry size (it bounds what the state's files may hold)
            state: AccountState | None = None if agreement.registry_problems(replayed, dataset) else \
                self.state(account, dataset.registry_size, replayed.spent_states.get(org), private=private)
        except (OSError, ValueError, IndexError):  # a state file missing, not an array or not a table: not what any
            # charge left
            state = None
        problems = agreement.state_problems(replayed, dataset, org, account,
                                            spent_digest(state) if state is not None else None)
        if state is None and not problems:
            problems.append(f"{org}'s spent state cannot be read")
        return state, problems

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

    def spent_by_example(self, accounts: Sequence[db.BudgetAccount], registry_size: int,
                         opened: Sequence[AccountState] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(total spent units over all accounts, number of examples) per distinct total: the per-example
        distribution, one pass block by block (the owner's console and summaries). ``opened``: the accounts'
        states, already opened (verify-audit opens them once, at the start of its snapshot)."""
        opened = opened if opened is not None else [self.state(a, registry_size) for a in accounts]
        states = [(state, a.delta) for state, a in zip(opened, accounts, strict=True)]
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
        from shared.mechanisms import events

        cost = Charge.of(event, epsilon_requested)
        recorded_event = events.to_dict(event)
        _check_recomputable(recorded_event, cost)  # before anything is read or written
        state = self._agreed_state(session, dataset, account, fields)
        # a request's is still pending; a version's is read only as its chain records it (the thirty-ninth review)
        covered = read_coverage(self.store, coverage.readable, coverage.sha256, coverage.size, private=True)
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
        values, new_sizes, new_spent, (classes_file, classes_entries, classes_sha256) = self._classes_after(
            directory, generation, dataset.registry_size, account, state, covered, touched, rows, spent_after)
        spent_file = self._write_table(directory, generation, values[:, 0], new_sizes, new_spent)
        rdp_file = (self.store.write_array(f"{directory}/rdp_{generation:08d}.npy", values[:, 1:].copy())
                    if has_rdp else None)
        account.spent_max_units = int(new_spent[new_sizes > 0].max()) if np.any(new_sizes > 0) else 0
        account.spent_file, account.classes_file, account.rdp_file = spent_file, classes_file, rdp_file
        account.generation = generation
        dataset.epsilon_spent_units = _spent_with(session, dataset, account)
        spent_state = SpentState(classes_file=classes_file, rdp_file=rdp_file,
                                 digest=_digest(values[:, 0], new_sizes, values[:, 1:] if has_rdp else None),
                                 classes_entries=classes_entries, classes_sha256=classes_sha256)
        record = self._append(session, dataset, account, coverage, cost, {
            **fields.model_dump(), "epsilon_requested": epsilon_requested, "dp_event": recorded_event,
            "spent_state": spent_state})
        return Charged(record, needed, self._superseded(directory, {spent_file, classes_file, rdp_file, *old_files}))

    def _superseded(self, directory: str, keep: set[str | None]) -> tuple[str, ...]:
        """The account's budget files in ``directory`` but those to ``keep`` (the new state's and the one it
        replaces, until the commit): removed once the charge commits."""
        return tuple(f"{directory}/{p.name}" for p in self.store.path(directory).glob("*.npy")
                     if f"{directory}/{p.name}" not in keep)

    def _agreed_state(self, session: Session, dataset: db.Dataset, account: db.BudgetAccount,
                      fields: RecordFields) -> AccountState:
        """The account's budget state, once the anchor, the chain's facts, the account and the charging key all
        agree with the tables (else :func:`agreement.tampered`: nothing is charged)."""
        self.check_anchor(session, dataset)
        org = session.get(db.Organization, account.org_id)
        replayed = self.facts(session, dataset)
        state, problems = self._state_problems(replayed, dataset, account, org.name if org else "?", private=True)
        problems += agreement.charge_problems(replayed, dataset, org.name if org else "?", account)
        if state is not None and not problems and account.classes_file is not None and state.classes_sha256 is None:
            # a class file from before its hash was recorded: what the records imply, example by example (the
            # fortieth review emptied one, and the account's next charge found every example fresh)
            records, orgs = records_by_org(session, entries(session, dataset.id))
            problems += self.differences(dataset, account, [r for r, o in zip(records, orgs, strict=True)
                                                             if o == account.org_id], state)
        if fields.actor.key_id is not None:
            problems += agreement.key_problems(replayed, fields.actor.key_id,
                                               session.get(db.ApiKey, fields.actor.key_id), fields.actor.org,
                                               fields.actor.role, datetime.now(timezone.utc))
        if problems:
            raise agreement.tampered(dataset.id, problems)
        assert state is not None
        return state

    def _classes_after(self, directory: str, generation: int, registry_size: int, account: db.BudgetAccount,
                       state: AccountState, covered, touched: np.ndarray, rows: np.ndarray, spent_after: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, int, str]]:
        """The classes after a charge: their rows, sizes and spent units, and the class file (name, entries,
        SHA-256). Classes covered in part (or the fresh class) split; classes that end up equal merge: one class per
        distinct (units, curve), so the number of classes never exceeds the number of distinct histories. A class
        file whose entries no charge recorded (from before the thirty-ninth review) is written again."""
        _units, sizes, _rdp = state.with_fresh()
        hit = touched > 0
        if account.classes_file is None or state.classes_sha256 is None or bool(np.any(hit & (touched < sizes))) \
                or touched[-1] > 0:
            values, new_sizes, new_spent, file, sha256 = self._split(directory, generation, registry_size, state,
                                                                     covered, touched, rows, spent_after)
            return values, new_sizes, new_spent, (file, registry_size, sha256)
        # every touched class is covered whole: only their values move
        return rows[:-1], sizes[:-1], spent_after[:-1], (account.classes_file, state.classes.size,
                                                         state.classes_sha256)

    def _split(self, directory: str, generation: int, registry_size: int, state: AccountState, covered,
               touched: np.ndarray, rows: np.ndarray, spent_after: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, str]:
        """Rewrite the class file: one class per distinct row (so classes merge as well as split); the new classes'
        rows, sizes and spent units, the file and its entries' SHA-256."""
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
                new = new.astype(np.int32)
                digest.update(new.tobytes())
                yield new

        digest = hashlib.sha256()
        classes_file = self.store.write_with(f"{directory}/classes_{generation:08d}.npy",
                                             lambda path: write_npy(path, np.int32, registry_size, blocks()))
        return values, new_sizes, new_spent, classes_file, digest.hexdigest()

    def _append(self, session: Session, dataset: db.Dataset, account: db.BudgetAccount, coverage: CoverageSet,
                charge: Charge, fields: dict[str, Any]) -> LedgerRecord:
        """The charge's record, appended to the dataset's chain."""
        owner = session.get(db.Organization, account.org_id)
        org = owner.name if owner is not None else "?"
        record = LedgerRecord(
            **fields, seq=dataset.ledger_seq + 1, dataset_id=dataset.id,
            account=AccountTerms(org=org, epsilon_units=account.epsilon_units, delta=account.delta),
            charge_units=charge.units, charge=units_epsilon(charge.units),
            rdp_units=list(charge.rdp) if charge.rdp is not None else None,
            delta=account.delta if charge.rdp is not None else 0.0, examples_covered=coverage.size,
            coverage=Coverage(file=coverage.file, sha256=coverage.sha256),
            spent_max_after_units=account.spent_max_units, epsilon_total_units=dataset.epsilon_total_units,
            delta_total=dataset.delta_total)
        chain.append(self, session, dataset, record.model_dump(mode="json"), record.release_id)
        return record

    # -- facts (labels_party/ledger/chain.py): one call from the module that owns each, in its transaction --------
    def dataset_budget(self, session: Session, dataset: db.Dataset, change: str = "created") -> None:
        """The dataset's (ε_total, δ_total) as they now stand: at creation, and after any change."""
        chain.budget(self, session, dataset, change)

    def dataset_owner(self, session: Session, dataset: db.Dataset) -> None:
        """The organization that made the dataset owns it, with its label kind and domain (at creation)."""
        chain.owner(self, session, dataset)
        chain.domain(self, session, dataset)

    def grant_made(self, session: Session, dataset: db.Dataset, org: db.Organization) -> None:
        chain.grant(self, session, dataset, org, "created")

    def allocation(self, session: Session, dataset: db.Dataset, account: db.BudgetAccount) -> None:
        """An account's allocation as it now stands (made or changed)."""
        chain.allocation(self, session, dataset, account)

    def release_available(self, session: Session, dataset: db.Dataset, release: db.Release) -> None:
        """A release made available (its file and mechanism document set on its row); the dataset's row locked. A
        release whose document the chain stated before it was computed becomes available only as stated
        (:class:`agreement.LedgerTampered` else: its row edited while its job waited)."""
        replayed = self.facts(session, dataset)
        if release.id in replayed.available:  # (the thirty-sixth review re-drew an available release)
            raise agreement.tampered(dataset.id, [f"release {release.id} is available on the chain already"])
        problems = agreement.document_problems(replayed, release, chain.shown_summary(release))
        if problems:
            raise agreement.tampered(dataset.id, problems)
        chain.release_available(self, session, dataset, release)

    def release_document(self, session: Session, dataset: db.Dataset, release: db.Release,
                         splits: tuple[int, int]) -> None:
        """A source release queued for its job: its document and the job's splits; the dataset's row locked."""
        chain.release_document(self, session, dataset, release, splits)

    def document_of(self, session: Session, dataset: db.Dataset, release_id: str) -> tuple[DocumentFact, int]:
        """What a job computing release ``release_id`` runs, as the chain stated it when the release was queued: the
        document fact (document, splits) and the release's charge (ε units on its own) —
        :class:`agreement.LedgerTampered` if the chain states none (a row or job that names a release it did not),
        or made the release available already."""
        self.check_anchor(session, dataset)
        replayed = self.facts(session, dataset)
        stated, units = replayed.documents.get(release_id), replayed.releases.get(release_id)
        if stated is None or units is None:
            raise agreement.tampered(dataset.id, [f"release {release_id}'s mechanism document is not on the chain"])
        if release_id in replayed.available:  # drawn once already: never again (a row set back to failed)
            raise agreement.tampered(dataset.id, [f"release {release_id} is available on the chain already"])
        return stated, units

    def account_opened(self, session: Session, dataset: db.Dataset, org_id: int) -> None:
        """An organization's account opened on the dataset (the dataset's row locked): its keys go on the chain."""
        chain.org_keys(self, session, dataset, org_id)

    def check_actor(self, session: Session, dataset: db.Dataset, principal: Principal) -> None:
        """A key acts on the dataset (administers it, uploads to it, downloads from it) only as its chain knows it,
        on a dataset whose owner is the chain's (:func:`agreement.key_problems`, :func:`agreement.creation_problems`;
        :class:`agreement.LedgerTampered` else: a key or dataset row written or edited outside the service)."""
        self.check_anchor(session, dataset)
        replayed = self.facts(session, dataset)
        problems = agreement.key_problems(replayed, principal.key_id, session.get(db.ApiKey, principal.key_id),
                                          principal.org_name, principal.role, datetime.now(timezone.utc))
        problems += agreement.creation_problems(session, dataset, replayed)
        if problems:
            raise agreement.tampered(dataset.id, problems)

    def check_shown(self, session: Session, dataset: db.Dataset, releases: Sequence[db.Release]) -> None:
        """``releases`` (of ``dataset``) are shown only as their chain says (:func:`agreement.shown_problems`:
        :class:`agreement.LedgerTampered` else — a row's ε, summary or metric edited while the service runs)."""
        if not releases:
            return
        self.check_anchor(session, dataset)
        names = {org.id: org.name for org in session.scalars(select(db.Organization).where(
            db.Organization.id.in_({release.requester_org_id for release in releases})))}
        problems = agreement.shown_problems(self.facts(session, dataset), releases, names)
        if problems:
            raise agreement.tampered(dataset.id, problems)

    def labels_read(self, session: Session, dataset: db.Dataset, version: db.LabelVersion) -> tuple[str, CoverageSet]:
        """The file and coverage a release of label version ``version`` reads, as the chain's
        :class:`~.records.LabelsFact` says — the coverage at its content address, the file the row names only if it
        is the dataset's and its bytes are the ones chained — so that no row edit makes a release read another
        dataset's labels or charge fewer examples than it reads (:class:`agreement.LedgerTampered` else)."""
        self.check_anchor(session, dataset)
        replayed = self.facts(session, dataset)
        problems = agreement.creation_problems(session, dataset, replayed)
        if replayed.labels and max(replayed.labels) != dataset.label_version:  # a row set back to an older version
            problems.append(f"the dataset's label version {dataset.label_version} is not the chain's latest "
                            f"({max(replayed.labels)})")
        if problems:
            raise agreement.tampered(dataset.id, problems)
        fact = replayed.labels.get(version.version)
        if fact is None:  # (every version is chained since migration 0022)
            raise agreement.tampered(dataset.id, [f"label version {version.version} is not in the chain"])
        problems = [] if self._chained_file(dataset, version, fact) else [
            f"label version {version.version}'s file is not the one its chain records"]
        if (version.num_examples, version.coverage_sha256) != (fact.num_examples, fact.coverage_sha256) or \
                fact.id_bytes not in (None, version.id_bytes):  # (its ids' bytes: what the release is estimated on)
            problems.append(f"label version {version.version} differs from the chain's")
        if problems:
            raise agreement.tampered(dataset.id, problems)
        return version.file, CoverageSet(f"datasets/{dataset.id}/coverage/{fact.coverage_sha256}.npy",
                                         fact.coverage_sha256, fact.num_examples)

    def registry(self, session: Session, dataset: db.Dataset) -> list[RegistryPart]:
        """Where the dataset's example ids live (which are registered already, at which index: what an upload
        numbers its new ids against), as its chain records it: each label version that registered ids, from where
        the one before ended to its own end, read from the file its upload chained — the dataset's own, of the
        chained bytes — and no such version missing (:class:`agreement.LedgerTampered` else: the thirty-eighth
        review pointed a version's row at another file, the thirty-ninth hid one from the registry by emptying its
        range or deleting its row; each time the owner's next upload registered the same ids again with fresh
        budgets, and releases of them charged twice the total)."""
        self.check_anchor(session, dataset)
        replayed = self.facts(session, dataset)
        problems = agreement.creation_problems(session, dataset, replayed) + \
            agreement.registry_problems(replayed, dataset)
        rows = {v.version: v for v in session.scalars(select(db.LabelVersion).where(
            db.LabelVersion.dataset_id == dataset.id))}
        parts, start = [], 0
        for number, fact in sorted(replayed.labels.items()):  # (every version is chained since migration 0022)
            version = rows.get(number)
            if fact.registry_end <= start:
                continue  # (no new ids)
            try:  # its status before its bytes are checked: a change after the check shows when the upload commits
                stamp = self.store.stamp(version.file) if version is not None else ()
            except OSError:
                stamp = ()
            if version is None or (version.registry_start, version.registry_end) != (start, fact.registry_end) \
                    or not stamp or not self._chained_file(dataset, version, fact):
                problems.append(f"label version {number}'s file or registry range is not the one its chain records")
            else:
                parts.append(RegistryPart(version.file, start, fact.registry_end, stamp))
            start = fact.registry_end
        if not problems and sum(part.end - part.start for part in parts) != dataset.registry_size:
            problems.append("the label versions do not register the dataset's registry")
        if problems:
            raise agreement.tampered(dataset.id, problems)
        return parts

    def _chained_file(self, dataset: db.Dataset, version: db.LabelVersion, fact: LabelsFact) -> bool:
        """Whether ``version``'s file is the one its upload chained: the dataset's own, of the chained bytes (not
        read at another size) and SHA-256."""
        try:
            found = self.store.checked_digest(version.file, fact.file_bytes) \
                if version.file.startswith(f"datasets/{dataset.id}/") else None
        except OSError:
            found = None
        return found == (fact.file_bytes, fact.file_sha256)

    def registration(self, session: Session, dataset: db.Dataset) -> OwnerFact:
        """What a source dataset's registration copies, and under whose prefixes: its chain's owner fact, which the
        row must agree with (:class:`agreement.LedgerTampered` else — a row edited while the job was queued)."""
        self.check_anchor(session, dataset)
        replayed = self.facts(session, dataset)
        fact = replayed.owner
        problems = ["its chain records no owner and source"] if fact is None or fact.source is None else \
            agreement.creation_problems(session, dataset, replayed)
        if problems:
            raise agreement.tampered(dataset.id, problems)
        assert fact is not None
        return fact

    def source_read(self, session: Session, dataset: db.Dataset) -> SourceFact:
        """What a release of source dataset ``dataset`` reads, as the chain's :class:`~.records.SourceFact` says:
        the row's snapshot, fingerprint, counts file and rows must be the registered ones and the counts file's
        bytes the chained ones (:class:`agreement.LedgerTampered` else — a row edit that points a release at
        another dataset's copy, other counts or fewer rows)."""
        self.check_anchor(session, dataset)
        replayed = self.facts(session, dataset)
        fact = replayed.source
        problems = agreement.source_problems(fact, dataset) + agreement.creation_problems(session, dataset, replayed)
        if not problems and fact is not None:
            try:
                found = self.store.checked_digest(fact.counts_file, fact.counts_bytes)
            except OSError:
                found = None
            if found != (fact.counts_bytes, fact.counts_sha256):
                problems.append("the source's counts file is not the one its chain records")
        if problems:
            raise agreement.tampered(dataset.id, problems)
        assert fact is not None
        return fact

    def source_registered(self, session: Session, dataset: db.Dataset, counts: tuple[int, str]) -> None:
        """A source dataset's registration (``counts``: its counts file's bytes and SHA-256); its row locked."""
        chain.source(self, session, dataset, counts)

    def labels_uploaded(self, session: Session, dataset: db.Dataset, version: db.LabelVersion,
                        file: tuple[int, str]) -> None:
        """A label version (``file``: its bytes and SHA-256, read before the lock); the dataset's row locked."""
        chain.labels(self, session, dataset, version, file)

    def key_changed(self, session: Session, key: ApiKeyColumns, change: Literal["created", "revoked"]) -> int:
        """A key made or revoked (:attr:`shared.service.keys.KeyRing.audit`): on the chain of every dataset its
        organization holds an account on, with the revocation's time and who (returns how many chains)."""
        assert isinstance(key, db.ApiKey)  # the labels party's key ring holds only its own keys
        org = session.get(db.Organization, key.org_id)
        stated = self._own_certificate(key)
        if change == "revoked" and stated is not None:  # to the organization its certificate names, if it exists
            org = session.scalar(select(db.Organization).where(db.Organization.name == stated["org"])) or org
        assert org is not None  # the key's foreign key
        if change == "revoked":  # outside the database first, by every identity the key has: no row edit undoes it
            assert key.revoked_at is not None and key.revoked_by is not None
            named = [(key.id, key.prefix, secret_digest(key.key_hash))]
            if stated is not None:
                named.append((int(stated["key_id"]), str(stated["prefix"]), str(stated["secret_digest"])))
            self.revocations.add(revocations.Revocation(
                frozenset(i for i, _, _ in named), frozenset(p for _, p, _ in named), frozenset(d for _, _, d in named),
                key.revoked_at.replace(tzinfo=timezone.utc) if key.revoked_at.tzinfo is None else key.revoked_at,
                key.revoked_by))
        if self.signer is not None and (change == "created" or key_certificates.agreed_before_revocation(
                stated, key, org.name)):  # an edited row is revoked, never certified as it stands
            key.certificate = key_certificates.issue(self.signer.key, key, org.name)
        return chain.key(self, session, key, change, org)

    def _own_certificate(self, key: db.ApiKey) -> dict | None:
        """What ``key``'s certificate states, if the audit key signed it *for this key* (its id): a certificate a
        database writer copied from another key (issue 40's sixth review: the owner's admin certificate on a key
        about to be revoked) names that key's identities, and revoking this one must not revoke that one."""
        stated = key_certificates.statement(self.signer.public, key) if self.signer is not None else None
        return stated if stated is not None and stated.get("key_id") == key.id else None

    def revocation_confirmed(self, session: Session, key: ApiKeyColumns) -> bool:
        """Whether a row that says "revoked" was revoked by the service (:attr:`~shared.service.keys.KeyRing.
        revocation_confirmed`): the data directory refuses it, or its certificate states the row as it is."""
        assert isinstance(key, db.ApiKey)
        org = session.get(db.Organization, key.org_id)
        return self.key_revoked(key) or (self.signer is not None and org is not None
                                         and key_certificates.agrees(self.signer.public, key, org.name))

    def check_key_row(self, session: Session, key: ApiKeyColumns) -> None:
        """Refuses (``ledger_tampered``) a key row that is not as the service issued it — before a rotation, whose
        new key takes the row's organization, role and lifetime (issue 40's review: a row edited into another
        organization's admin, rotated, gave that organization a certified admin key)."""
        assert isinstance(key, db.ApiKey)
        org = session.get(db.Organization, key.org_id)
        if org is None or not self.key_honoured(key, org.name):
            raise agreement.LedgerTampered(
                f"key {key.prefix}'s row is not as the service issued it (its certificate differs, or the data "
                "directory revoked it) — the database was changed outside the service; revoke the key (labeldp labels "
                "revoke-key) and make a new one")

    def key_honoured(self, key: db.ApiKey, org: str) -> bool:
        """Whether the service issued ``key`` (of ``org``) as its row now stands (:mod:`.key_certificates`; a
        ledger without an audit key — tests of the ledger alone — certifies nothing and checks nothing) and the data
        directory has not revoked it (:mod:`.revocations`)."""
        if self.key_revoked(key):
            return False
        return self.signer is None or key_certificates.agrees(self.signer.public, key, org)

    def key_revoked(self, key: db.ApiKey) -> bool:
        """Whether the data directory's revocations (:mod:`.revocations`) refuse ``key`` now, whatever its row says."""
        return self.revocations.refuses(key.id, key.prefix, secret_digest(key.key_hash), db.utcnow()) is not None

    # -- the anchor ---------------------------------------------------------------------------------------------
    def read_anchor(self, dataset_id: str) -> Anchor | None:
        try:
            data = json.loads(self.store.read_small(f"anchors/{dataset_id}.json", ANCHOR_BYTES))
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
        """After a transaction that moved the chain committed, with ``dataset``'s row locked and fresh: its head
        alone is admitted from now on (the lock keeps a later charge's pending anchor from being overwritten with
        this older head)."""
        anchor = self.read_anchor(dataset.id)
        if anchor is not None and (anchor.seq, anchor.head) == (dataset.ledger_seq, dataset.ledger_head):
            self.anchor(dataset)

    def check_anchor(self, session: Session, dataset: db.Dataset) -> None:
        """Refuse a dataset whose database chain is not where the data directory saw it last: behind it (a
        database restored from an older backup), beside it, or a dataset with records and no anchor (a data
        directory that is not this database's, or whose anchors were removed).

        A transaction that read the row without its lock (a release's first one, a download) may hold a head that
        other charges have since moved past, anchors included (two replicas on PostgreSQL, READ COMMITTED): the row
        is read again (``ROW_READS`` times in all) and only a row the anchor still does not admit is refused — a
        restored database stays behind however often it is read. A row this transaction changed is never read
        again (its changes would be lost)."""
        for attempt in range(ROW_READS):
            anchor = self.read_anchor(dataset.id)
            if anchor is None and dataset.ledger_seq == 0:
                return
            if anchor is not None and anchor.admits(dataset.ledger_seq, dataset.ledger_head):
                return
            if attempt + 1 == ROW_READS or session.is_modified(dataset):
                break
            session.refresh(dataset)
        raise LedgerRollback(rollback_message(dataset.id))

    def uncommitted_creation(self, dataset_id: str) -> bool:
        """An anchor still pending from the transaction that made its dataset (a commit that failed): no dataset
        row is expected for it. (A database restored from before that dataset, with the anchor unconfirmed, is
        not told apart — the same instant as for a charge.)"""
        anchor = self.read_anchor(dataset_id)
        return anchor is not None and anchor.previous_seq == 0 and anchor.seq != 0

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

    def differences(self, dataset: db.Dataset, account: db.BudgetAccount, records: Sequence[dict],
                    state: AccountState | None = None) -> list[str]:
        """Where ``account``'s stored state (``state``, if already opened) differs from the one its records imply
        (empty: none), compared exactly, example by example, in blocks."""
        recomputed = _Recomputed(self.store, records, dataset.registry_size)
        try:
            state = state if state is not None else self.state(account, dataset.registry_size)
            if not np.array_equal(state.spent_with_fresh(), state.spent_at(account.delta)):
                return ["a class's spent epsilon is not its units and curve at the account's delta"]
            return self._compare(state, recomputed)
        except (OSError, ValueError, EOFError):  # a coverage or budget file is gone or cut short (the records
            # name the coverage files that are)
            return ["its budget cannot be recomputed: a file it depends on is missing or damaged"]

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


def spent_digest(state: AccountState) -> str:
    """What a :class:`~.records.SpentState` records of an account's state: its classes' pure units, sizes and RDP
    curves (not their ε at the account's δ)."""
    return _digest(state.units, state.sizes, state.rdp)


def _digest(units: np.ndarray, sizes: np.ndarray, rdp: np.ndarray | None) -> str:
    digest = hashlib.sha256()
    for part in (units, sizes, rdp if rdp is not None else np.zeros((0,), np.int64)):
        digest.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _spent_with(session: Session, dataset: db.Dataset, account: db.BudgetAccount) -> int:
    """The dataset's spent units (the sum of its accounts' maxima) with ``account`` as it now stands."""
    others = session.scalar(select(func.coalesce(func.sum(db.BudgetAccount.spent_max_units), 0)).where(
        db.BudgetAccount.dataset_id == dataset.id, db.BudgetAccount.id != account.id))
    return int(others or 0) + account.spent_max_units


def _check_recomputable(recorded_event: dict[str, Any], cost: Charge) -> None:
    """The charge as the record will state it must be recomputable from the record's own event: the same RDP
    curve, or for a pure event an ε within the units charged (a kind that priced itself wrong is refused here,
    before anything is written)."""
    from shared.mechanisms import events

    event = events.from_dict(recorded_event)
    fits = (tuple(int(v) for v in rdp_curve(event)) == cost.rdp if cost.rdp is not None
            else within_charge(events.epsilon_of(event), cost.units))
    if not fits:
        raise LabelDPError("the release's privacy event does not fit its charge; nothing was charged",
                           code=ErrorCode.CERTIFICATION_FAILED)


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
        coverages = [recorded_coverage(self.store, record, self.registry_size) for record, _, _ in self.charges]
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
        rows = np.zeros((len(keys), 1 + len(rdp_orders())), dtype=np.int64)
        for i, (units, sig) in enumerate(keys):
            rows[i, 0] = units
            rows[i, 1:] = self.curve_of(sig, representative[(units, sig)])
        return keys, rows

    def curve_of(self, signature: int, example: int) -> np.ndarray:
        curve = np.zeros(len(rdp_orders()), dtype=np.int64)
        if signature == 0:
            return curve
        for record, charge, _tag_value in self.charges:
            if charge.rdp is None:
                continue
            coverage = recorded_coverage(self.store, record, self.registry_size)
            at = int(coverage.position([example])[0])
            if at < coverage.size and int(coverage.slice(at, at + 1)[0]) == example:
                curve = np.minimum(curve + charge.rdp_array, RDP_CAP)
        return curve


def recorded_coverage(store: DataStore, record: dict, registry_size: int) -> MappedArray | RangeCoverage:
    """The coverage set a charge's record names, read only as it records it (a record from before records counted
    its examples: at most ``registry_size`` of them)."""
    covered = record.get("examples_covered")
    return read_coverage(store, record["coverage"]["file"], record["coverage"]["sha256"],
                         None if covered is None else int(covered), at_most=registry_size)


def _tag(record: dict) -> int:
    return int.from_bytes(hashlib.sha256(canonical(record).encode()).digest()[:8], "little") | 1
