"""``labeldp labels verify-audit``: everything the ledger claims, recomputed from its records alone.

Per dataset: the hash chain and its anchor in the data directory; per record, its (ε, δ) from its ``dp_event``
(a pure event's ε at most its exact charge; an event with δ > 0 charged exactly the RDP curve the accountant gives
it), its coverage file against its hash and the registry, and its release (an available release's mechanism
document exists and certifies at most what was charged); per organization's account, every example's spent state
recomputed from that organization's records and compared exactly with the stored classes, and its use within its
allocation; per example, the total over the accounts within the dataset's (ε_total, δ_total).
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from labels_party import budgets, db, labelstore
from labels_party.ledger import (
    CHUNK,
    Charge,
    Ledger,
    LedgerRollback,
    chain_intact,
    entries,
    rdp_curve,
    units_epsilon,
    within_charge,
)
from shared.mechanisms import events


def verify(sessions: sessionmaker, ledger: Ledger, dataset_id: str | None = None) -> dict:
    """Every dataset's (or only ``dataset_id``'s) chain, records, coverage and accounts, recomputed."""
    datasets: list[dict[str, Any]] = []
    valid = True
    hashes: dict[str, str] = {}
    with sessions() as session, session.begin():
        names = {o.id: o.name for o in session.scalars(select(db.Organization))}
        query = select(db.Dataset).order_by(db.Dataset.created_at)
        if dataset_id is not None:
            query = query.where(db.Dataset.id == dataset_id)
        for dataset in session.scalars(query):
            chain = entries(session, dataset.id)
            problems = []
            if not chain_intact(chain, dataset.ledger_head):
                problems.append("hash chain broken")
            try:
                ledger.check_anchor(dataset)
            except LedgerRollback:
                problems.append("the database is behind the data directory's anchor (restored from an older backup)")
            try:
                records, orgs = budgets.records_by_org(session, chain)
            except KeyError:  # a record whose release is gone: reported per record below
                records, orgs = [e.record for e in chain], [-1] * len(chain)  # no organization's
            for entry, record in zip(chain, records, strict=True):
                problems += _record_problems(ledger, session, dataset, entry.seq, record, hashes)
            accounts = session.scalars(select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id)
                                       .order_by(db.BudgetAccount.id)).all()
            for account in accounts:
                own = [r for r, org in zip(records, orgs, strict=True) if org == account.org_id]
                problems += [f"{names[account.org_id]}: {p}" for p in ledger.differences(dataset, account, own)]
                if account.spent_max_units > account.epsilon_units:
                    problems.append(f"{names[account.org_id]} spent more than its allocation")
            totals, _counts = ledger.spent_by_example(accounts, dataset.registry_size)
            worst = int(totals.max()) if totals.size else 0
            if worst > dataset.epsilon_total_units:
                problems.append("an example exceeds the dataset's total budget")
            if sum(a.delta for a in accounts if a.rdp_file) > dataset.delta_total * (1 + 1e-12):
                problems.append("the organizations' delta exceeds the dataset's")
            if dataset.epsilon_spent_units != sum(a.spent_max_units for a in accounts):
                problems.append("the dataset's spent epsilon differs from its accounts'")
            releases = session.scalar(select(func.count()).select_from(db.Release)
                                      .where(db.Release.dataset_id == dataset.id))
            if releases != len(chain):
                problems.append(f"{releases} releases but {len(chain)} ledger entries")
            datasets.append({"dataset_id": dataset.id, "name": dataset.name, "entries": len(chain),
                                       "epsilon_spent": units_epsilon(worst),
                                       "epsilon_total": units_epsilon(dataset.epsilon_total_units),
                                       "delta_total": dataset.delta_total, "problems": problems})
            valid &= not problems
    return {"datasets": datasets, "valid": valid}


def _record_problems(ledger: Ledger, session, dataset: db.Dataset, seq: int, record: dict, hashes: dict) -> list[str]:
    problems = []
    charge = Charge.of_record(record)
    event = events.from_dict(record["dp_event"])
    if charge.rdp is None:
        epsilon = events.epsilon_of(event)
        if not within_charge(epsilon, charge.units):
            problems.append(f"seq {seq}: dp_event epsilon {epsilon} exceeds the charge")
    elif record.get("rdp_units") is not None and list(rdp_curve(event)) != list(record["rdp_units"]):
        problems.append(f"seq {seq}: the charged RDP curve is not the dp_event's")
    try:
        coverage = labelstore.read_coverage(ledger.store, record["coverage"]["file"])
    except OSError:
        return problems + [f"seq {seq}: coverage file {record['coverage']['file']} missing"]
    if _sha256_of(record["coverage"]["file"], coverage, hashes) != record["coverage"]["sha256"]:
        problems.append(f"seq {seq}: coverage file does not match its hash")
    if coverage.size != record.get("examples_covered", coverage.size) or (
            coverage.size and int(coverage.slice(coverage.size - 1, coverage.size)[0]) >= dataset.registry_size):
        problems.append(f"seq {seq}: coverage disagrees with the examples covered or the registry")
    release = session.get(db.Release, record["release_id"])
    if release is None:
        return problems + [f"seq {seq}: release {record['release_id']} missing"]
    if "mechanism_hash" in record and release.mechanism_hash != record["mechanism_hash"]:
        problems.append(f"seq {seq}: the release's mechanism document is not the one recorded")
    if release.state == "available":
        if release.mechanism_hash is None or session.get(db.MechanismDocument, release.mechanism_hash) is None:
            problems.append(f"seq {seq}: mechanism document of release {release.id} missing")
        elif charge.rdp is None and not within_charge(release.certified_epsilon or 0.0, charge.units):
            problems.append(f"seq {seq}: the release's mechanism certifies more than was charged")
    return problems


def _sha256_of(file: str, coverage, cache: dict) -> str:
    """SHA-256 of a coverage file's entries, once per file, reading it in blocks."""
    if file not in cache:
        digest = hashlib.sha256()
        for start in range(0, coverage.size, CHUNK):
            digest.update(coverage.slice(start, start + CHUNK).tobytes())
            coverage.forget()
        cache[file] = digest.hexdigest()
    return cache[file]
