"""Who may spend how much of each example's budget: the owner divides a dataset's per-example budget (ε, δ) into
per-organization *accounts* (:class:`labels_party.store.db.BudgetAccount`), and budgets are shown per account.

* The owner's account is opened with the dataset and holds all of it; a grant moves an allocation from the owner's
  account to the granted organization's (``POST …/grants {"org", "epsilon", "delta"}``), and moving it back is
  the same call with a smaller number. Allocations always sum to the dataset's budget and never go below what
  their organization has spent, so the ledger admits each organization against its own account alone
  (:mod:`labels_party.ledger`): a refusal, and a budget response, say nothing about another organization's use.
* A consumer's budget is its account; the owner's admins see the dataset and every account.
"""

from __future__ import annotations

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party.ledger import (
    Charge,
    Ledger,
    budget_units,
    entries,
    records_by_org,
    replay,
    tampered,
    units_epsilon,
)
from labels_party.store import db
from shared.errors import ErrorCode, LabelDPError


def open_owner_account(session: Session, dataset: db.Dataset) -> db.BudgetAccount:
    account = db.BudgetAccount(dataset_id=dataset.id, org_id=dataset.owner_org_id,
                               epsilon_units=dataset.epsilon_total_units, delta=dataset.delta_total, generation=0,
                               spent_max_units=0)
    session.add(account)
    return account


def account_of(session: Session, dataset: db.Dataset, org_id: int, *, lock: bool = False) -> db.BudgetAccount | None:
    query = select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id,
                                           db.BudgetAccount.org_id == org_id)
    return session.scalar(query.with_for_update() if lock else query)


def allocate(ctx_ledger: Ledger, session: Session, dataset: db.Dataset, org: db.Organization, epsilon: float,
             delta: float) -> db.BudgetAccount:
    """Set ``org``'s allocation to (``epsilon``, ``delta``) per example, taken from (or given back to) the owner's
    account; refused if either account would fall below what it has spent. The caller holds the dataset lock."""
    if org.id == dataset.owner_org_id:
        raise LabelDPError("the owner's account holds what no grant does; allocate to other organizations",
                           code=ErrorCode.INVALID_INPUT)
    owner = account_of(session, dataset, dataset.owner_org_id, lock=True)
    if owner is None:  # opened with the dataset (create_dataset, or the accounts migration)
        raise LabelDPError("the dataset has no owner's account", code=ErrorCode.STORAGE_INCONSISTENT)
    account = account_of(session, dataset, org.id, lock=True)
    if account is None:
        account = db.BudgetAccount(dataset_id=dataset.id, org_id=org.id, epsilon_units=0, delta=0.0, generation=0,
                                   spent_max_units=0)
        session.add(account)
        session.flush()
        ctx_ledger.account_opened(session, dataset, org.id)
    units = budget_units(epsilon)
    moved_units, moved_delta = units - account.epsilon_units, delta - account.delta
    owner_units, owner_delta = owner.epsilon_units - moved_units, owner.delta - moved_delta
    if owner_units < 0 or owner_delta < -1e-18:
        raise LabelDPError(f"the owner's account has {units_epsilon(owner.epsilon_units):g} epsilon and "
                           f"{owner.delta:g} delta to allocate per example; this needs "
                           f"{units_epsilon(max(0, moved_units)):g} and {max(0.0, moved_delta):g}",
                           code=ErrorCode.ALLOCATION_EXCEEDED)
    for held, new_units, new_delta, who in ((account, units, delta, org.name),
                                            (owner, owner_units, max(0.0, owner_delta), "the owner")):
        if _spent_at(ctx_ledger, session, dataset, held, new_delta) > new_units:
            raise LabelDPError(f"{who} has already spent more than this allocation leaves it",
                               code=ErrorCode.ALLOCATION_EXCEEDED)
    account.epsilon_units, owner.epsilon_units = units, owner_units
    for held, new_delta in ((account, delta), (owner, max(0.0, owner_delta))):
        if held.delta != new_delta:  # its curves now convert at another δ: its spent ε moves
            ctx_ledger.reprice(dataset, held, new_delta)
    session.flush()
    for held in (owner, account):  # the chain says what each allocation is from now on
        ctx_ledger.allocation(session, dataset, held)
    dataset.epsilon_spent_units = sum(a.spent_max_units for a in session.scalars(
        select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id)))
    return account


def spent_by_example(ledger: Ledger, session: Session, dataset: db.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct total spent over the dataset's accounts (units) and how many examples have it."""
    accounts = session.scalars(select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id)).all()
    return ledger.spent_by_example(accounts, dataset.registry_size)


def _spent_at(ledger: Ledger, session: Session, dataset: db.Dataset, account: db.BudgetAccount, delta: float) -> int:
    """The account's largest per-example spent units if its δ were ``delta`` (its curves convert at δ), from its
    state as the chain's last charge left it — never from the row's ``spent_max_units``, which a database writer
    could zero to allocate what was spent again."""
    state = ledger.checked_state(session, dataset, account)
    spent, sizes = state.spent_at(delta), state.with_fresh()[1]
    return int(spent[sizes > 0].max()) if np.any(sizes > 0) else 0


# -- the migration to accounts (once) -----------------------------------------------------------------------------

def rebuild_migrated(ledger: Ledger, session: Session) -> int:
    """Rebuild the state of accounts the migration to per-organization accounts left empty, from the ledger's
    records alone, and set their allocations: a granted organization keeps what it has spent (and may spend more
    when the owner allocates it), the owner the rest. Events with δ > 0 recorded before δ was budgeted convert at
    the δ they were recorded with. Returns the number of datasets rebuilt."""
    pending = session.scalars(select(db.BudgetAccount).where(db.BudgetAccount.needs_rebuild)).all()
    rebuilt = 0
    for dataset_id in sorted({a.dataset_id for a in pending}):
        dataset = session.get(db.Dataset, dataset_id, with_for_update=True)
        if dataset is None:  # an account's foreign key names it
            continue
        chain = entries(session, dataset_id)
        replayed = replay(chain)
        if not replayed.rebuild_pending:  # a flag a database writer set: rebuilding would sign what the tables say
            raise tampered(dataset_id, ["its accounts are marked for a rebuild, but its chain records budgets set "
                                        "since the migration to accounts"])
        if replayed.totals != (dataset.epsilon_total_units, dataset.delta_total):
            raise tampered(dataset_id, ["the dataset's totals differ from the chain's"])
        by_org: dict[int, list[dict]] = {}
        for record, org_id in zip(*records_by_org(session, chain), strict=True):
            by_org.setdefault(org_id, []).append(record)
        if -1 in by_org:
            raise tampered(dataset_id, ["a record names an organization that does not exist"])
        accounts = {a.org_id: a for a in session.scalars(select(db.BudgetAccount).where(
            db.BudgetAccount.dataset_id == dataset_id))}
        for org_id in by_org.keys() - accounts.keys():
            accounts[org_id] = db.BudgetAccount(dataset_id=dataset_id, org_id=org_id, epsilon_units=0, delta=0.0,
                                                generation=0, spent_max_units=0)
            session.add(accounts[org_id])
        for org_id, account in accounts.items():
            own = by_org.get(org_id, [])
            account.delta = max([float(r.get("delta") or 0.0) for r in own if _gaussian(r)], default=0.0)
            ledger.rebuild(dataset, account, own)
            account.needs_rebuild = False
        granted = [a for org_id, a in accounts.items() if org_id != dataset.owner_org_id]
        for account in granted:
            account.epsilon_units = account.spent_max_units
        owner = accounts[dataset.owner_org_id]
        owner.epsilon_units = max(owner.spent_max_units,
                                  dataset.epsilon_total_units - sum(a.epsilon_units for a in granted))
        dataset.delta_total = sum(a.delta for a in accounts.values())
        dataset.epsilon_spent_units = sum(a.spent_max_units for a in accounts.values())
        session.flush()
        ledger.dataset_budget(session, dataset, "changed")  # the allocations (and δ_total) this rebuild set
        for org_id in sorted(accounts):
            ledger.allocation(session, dataset, accounts[org_id])
        # the per-dataset layouts: budget/{spent,classes}_*.npy, and older per-example vectors beside the dataset
        root = ledger.store.path(f"datasets/{dataset_id}")
        for old in [*root.glob("budget/*.npy"), *root.glob("spent_*.npy")]:
            old.unlink()
        rebuilt += 1
    return rebuilt


def _gaussian(record: dict) -> bool:
    return Charge.of_record(record).rdp is not None

