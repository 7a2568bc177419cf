"""Labels-party service functions: the context, access rules, datasets, uploads, grants, budget and audit.

Routers call these; these call storage and the mechanism library. Privacy events (releases, evaluations, central
training) live in :mod:`labels_party.releases`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from labels_party import db
from labels_party.auth import Principal
from labels_party.ledger import (
    BudgetLedger,
    verify_chain,
)
from labels_party.storage import DataStore
from labels_party.uploads import parse_labels
from shared import schemas
from shared.domains import domain_from_spec, domain_spec
from shared.errors import LabelDPError


@dataclass(frozen=True)
class ServiceContext:
    sessions: sessionmaker
    store: DataStore
    ledger: BudgetLedger


def make_context(database_url: str, data_dir: str | Path) -> ServiceContext:
    store = DataStore(data_dir)
    return ServiceContext(db.make_sessionmaker(db.make_engine(database_url)), store, BudgetLedger(store))


def _forbidden() -> LabelDPError:
    # Same answer whether or not the dataset exists: a key must not reveal other organizations' datasets.
    return LabelDPError("this key has no access to that dataset", code="forbidden")


def accessible_dataset(session: Session, principal: Principal, dataset_id: str, *, admin: bool = False,
             lock: bool = False) -> db.Dataset:
    dataset = session.get(db.Dataset, dataset_id, with_for_update=lock)
    if dataset is None:
        raise _forbidden()
    if principal.role == "admin" and dataset.owner_org_id == principal.org_id:
        return dataset
    if not admin and principal.role == "consumer" and session.scalar(
            select(db.Grant).where(db.Grant.dataset_id == dataset_id, db.Grant.org_id == principal.org_id)):
        return dataset
    raise _forbidden()


def _require_admin(principal: Principal) -> None:
    if principal.role != "admin":
        raise LabelDPError("this operation needs an admin key", code="forbidden")


def dataset_view(dataset: db.Dataset) -> schemas.Dataset:
    return schemas.Dataset(
        id=dataset.id, name=dataset.name, label_kind=dataset.label_kind, domain=json.loads(dataset.domain_json),
        epsilon_total=dataset.epsilon_total, epsilon_spent=dataset.epsilon_spent,
        epsilon_remaining=max(0.0, dataset.epsilon_total - dataset.epsilon_spent),
        num_examples=dataset.num_examples, label_version=dataset.label_version,
        created_at=db.as_utc(dataset.created_at))


# -- datasets ---------------------------------------------------------------------------------------------------

def create_dataset(ctx: ServiceContext, principal: Principal, body: schemas.DatasetCreate) -> schemas.Dataset:
    _require_admin(principal)
    spec = domain_spec(body.label_kind, values=body.values, low=body.min, high=body.max,
                       num_classes=body.num_classes, grid_size=body.grid_size)
    with ctx.sessions() as session, session.begin():
        if session.scalar(select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id,
                                                   db.Dataset.name == body.name)):
            raise LabelDPError(f"a dataset named {body.name!r} already exists", code="dataset_exists")
        dataset = db.Dataset(owner_org_id=principal.org_id, name=body.name, label_kind=body.label_kind,
                             domain_json=json.dumps(spec), epsilon_total=body.epsilon_total,
                             allow_central_training=body.allow_central_training)
        session.add(dataset)
        session.flush()
        return dataset_view(dataset)


def get_dataset(ctx: ServiceContext, principal: Principal, dataset_id: str) -> schemas.Dataset:
    with ctx.sessions() as session, session.begin():
        return dataset_view(accessible_dataset(session, principal, dataset_id))


def list_datasets(ctx: ServiceContext, principal: Principal) -> list[schemas.Dataset]:
    with ctx.sessions() as session, session.begin():
        if principal.role == "admin":
            rows = session.scalars(select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id))
        else:
            rows = session.scalars(select(db.Dataset).join(db.Grant, db.Grant.dataset_id == db.Dataset.id)
                                   .where(db.Grant.org_id == principal.org_id))
        return [dataset_view(d) for d in rows]


def grant_access(ctx: ServiceContext, principal: Principal, dataset_id: str, org_name: str) -> schemas.Grant:
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id, admin=True)
        org = session.scalar(select(db.Organization).where(db.Organization.name == org_name))
        if org is None:
            org = db.Organization(name=org_name)
            session.add(org)
            session.flush()
        if not session.scalar(select(db.Grant).where(db.Grant.dataset_id == dataset.id,
                                                     db.Grant.org_id == org.id)):
            session.add(db.Grant(dataset_id=dataset.id, org_id=org.id))
        return schemas.Grant(dataset_id=dataset.id, org=org_name)


def budget(ctx: ServiceContext, principal: Principal, dataset_id: str) -> schemas.Budget:
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id)
        return _budget_view(dataset)


def _budget_view(dataset: db.Dataset) -> schemas.Budget:
    return schemas.Budget(dataset_id=dataset.id, epsilon_total=dataset.epsilon_total,
                          epsilon_spent=dataset.epsilon_spent,
                          epsilon_remaining=max(0.0, dataset.epsilon_total - dataset.epsilon_spent))


# -- uploads ----------------------------------------------------------------------------------------------------

def upload_labels(ctx: ServiceContext, principal: Principal, dataset_id: str, path: Path,
                  fmt: str) -> schemas.UploadResult:
    """A new label version. Earlier versions and every release stay untouched; budgets follow example ids."""
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id, admin=True)
        domain = domain_from_spec(json.loads(dataset.domain_json))
    ids, labels = parse_labels(path, fmt, domain)
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id, admin=True, lock=True)
        registry = registry_ids(ctx, dataset)
        index = pc.index_in(ids, value_set=registry).to_numpy(zero_copy_only=False)
        is_new = np.isnan(index) if index.dtype.kind == "f" else np.zeros(index.size, dtype=bool)
        new_ids = pc.filter(ids, pa.array(is_new))
        registry_index = np.where(is_new, 0, np.nan_to_num(index)).astype(np.int64)
        registry_index[is_new] = len(registry) + np.arange(int(is_new.sum()))
        if len(new_ids):
            registry = pa.concat_arrays([registry, new_ids.combine_chunks()])
            dataset.registry_file = ctx.store.write_table(
                f"datasets/{dataset.id}/examples_{len(registry):010d}.parquet",
                pa.table({"example_id": registry}))
            dataset.registry_size = len(registry)
        order = np.argsort(registry_index)
        version = dataset.label_version + 1
        file = ctx.store.write_table(f"datasets/{dataset.id}/labels_v{version:06d}.parquet",
                                     pa.table({"registry_index": registry_index[order], "label": labels[order]}))
        session.add(db.LabelVersion(dataset_id=dataset.id, version=version, file=file, num_examples=labels.size))
        dataset.label_version = version
        dataset.num_examples = int(labels.size)
        return schemas.UploadResult(dataset_id=dataset.id, label_version=version, num_examples=int(labels.size),
                                    new_examples=int(is_new.sum()))


def registry_ids(ctx: ServiceContext, dataset: db.Dataset) -> pa.Array:
    if not dataset.registry_file:
        return pa.array([], type=pa.string())
    return ctx.store.read_table(dataset.registry_file).column("example_id").combine_chunks()


# -- audit ------------------------------------------------------------------------------------------------------

def audit(ctx: ServiceContext, principal: Principal, dataset_id: str | None) -> schemas.Audit:
    _require_admin(principal)
    with ctx.sessions() as session, session.begin():
        if dataset_id is not None:
            datasets = [accessible_dataset(session, principal, dataset_id, admin=True)]
        else:
            datasets = list(session.scalars(select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id)
                                            .order_by(db.Dataset.created_at)))
        events, valid = [], True
        for dataset in datasets:
            entries = list(session.scalars(select(db.LedgerEntry).where(db.LedgerEntry.dataset_id == dataset.id)
                                           .order_by(db.LedgerEntry.seq)))
            valid &= verify_chain([(e.seq, e.record, e.prev_hash, e.hash) for e in entries], dataset.ledger_head)
            events += [schemas.AuditEvent(seq=e.seq, dataset_id=e.dataset_id, record=json.loads(e.record),
                                          prev_hash=e.prev_hash, hash=e.hash) for e in entries]
        return schemas.Audit(events=events, chain_valid=valid, budgets=[_budget_view(d) for d in datasets])


def verify_audit(ctx: ServiceContext) -> dict:
    """Recompute everything from the stored log: the hash chain of every dataset, each record's ε from its
    dp_event, and the per-example budget vector from the records' coverage files. Any mismatch is reported."""
    from labels_party.ledger import event_epsilon, event_from_dict

    report = {"datasets": [], "valid": True}
    with ctx.sessions() as session, session.begin():
        for dataset in session.scalars(select(db.Dataset).order_by(db.Dataset.created_at)):
            entries = list(session.scalars(select(db.LedgerEntry).where(db.LedgerEntry.dataset_id == dataset.id)
                                           .order_by(db.LedgerEntry.seq)))
            problems = []
            if not verify_chain([(e.seq, e.record, e.prev_hash, e.hash) for e in entries], dataset.ledger_head):
                problems.append("hash chain broken")
            spent = np.zeros(dataset.registry_size)
            for entry in entries:
                record = json.loads(entry.record)
                epsilon = event_epsilon(event_from_dict(record["dp_event"]), record.get("delta", 0.0))
                if epsilon > record["charge"] * (1 + 1e-9):
                    problems.append(f"seq {entry.seq}: dp_event epsilon {epsilon} exceeds the charge")
                coverage = ctx.store.read_array(record["coverage"]["file"])
                if hashlib.sha256(coverage.tobytes()).hexdigest() != record["coverage"]["sha256"]:
                    problems.append(f"seq {entry.seq}: coverage file does not match its hash")
                spent[coverage] += record["charge"]
                if session.get(db.Release, record["release_id"]) is None:
                    problems.append(f"seq {entry.seq}: release {record['release_id']} missing")
            stored = ctx.ledger.spent_vector(dataset)
            if not np.allclose(spent, stored, rtol=0, atol=1e-12):
                problems.append("per-example budget vector differs from the ledger")
            if spent.size and spent.max() > dataset.epsilon_total + 1e-9:
                problems.append("an example exceeds the dataset's total budget")
            releases = session.scalar(select(func.count()).select_from(db.Release)
                                      .where(db.Release.dataset_id == dataset.id))
            if releases != len(entries):
                problems.append(f"{releases} releases but {len(entries)} ledger entries")
            report["datasets"].append({"dataset_id": dataset.id, "name": dataset.name, "entries": len(entries),
                                       "epsilon_spent": float(spent.max()) if spent.size else 0.0,
                                       "problems": problems})
            report["valid"] &= not problems
    return report
