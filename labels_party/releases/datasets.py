"""Datasets: create (with their per-example budget; a source dataset is registered by a job that copies and counts
it: :mod:`labels_party.releases.source_datasets`), list, read, upload label versions, grant organizations an allocation,
and the budget view."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from labels_party.http.access import Admission, admitted_dataset, is_owner, owned_datasets
from labels_party.http.auth import Principal
from labels_party.ledger import budget_figures, budget_units, budgets, units_epsilon
from labels_party.runtime import jobs
from labels_party.runtime.context import ServiceContext
from labels_party.spark import snapshot
from labels_party.store import db, labelstore
from labels_party.store.storage import OutsideDataDirectory
from labels_party.store.usage import ROW_BYTES, file_bytes, stored_bytes
from shared import schemas
from shared.domains import domain_from_spec
from shared.errors import ErrorCode, LabelDPError
from shared.service.storage_quota import KEPT_FOR_THE_AUDIT, check_room


def dataset_view(session: Session, principal: Principal, dataset: db.Dataset) -> schemas.Dataset:
    """The budget figures are the dataset's for its owner's admins, the key's organization's for anyone else."""
    return schemas.Dataset(
        id=dataset.id, name=dataset.name, label_kind=dataset.label_kind, domain=json.loads(dataset.domain_json),
        **figures_for(session, principal, dataset),
        num_examples=dataset.num_examples, label_version=dataset.label_version,
        created_at=dataset.created_at, labels_at="source" if dataset.source_uri else "service",
        state=dataset.state, error=json.loads(dataset.error_json) if dataset.error_json and is_owner(principal, dataset)
        else None)


def budget_view(session: Session, principal: Principal, dataset: db.Dataset) -> schemas.Budget:
    """What a key sees of a dataset's budget. A consumer's: its own account. The owner's admins': the dataset and
    every account."""
    if is_owner(principal, dataset):
        accounts = session.scalars(select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id)
                                   .order_by(db.BudgetAccount.id)).all()
        names = {o.id: o.name for o in session.scalars(select(db.Organization).where(
            db.Organization.id.in_([a.org_id for a in accounts])))}
        return schemas.Budget(dataset_id=dataset.id, scope="dataset", **dataset_figures(dataset),
                              organizations=[schemas.AccountBudget(org=names[a.org_id], **_figures(a))
                                             for a in accounts])
    account = budgets.account_of(session, dataset, principal.org_id)
    return schemas.Budget(dataset_id=dataset.id, scope="organization", **_figures(account))


def dataset_figures(dataset: db.Dataset) -> dict:
    return budget_figures(dataset.epsilon_total_units, dataset.epsilon_spent_units, dataset.delta_total)


def _figures(account: db.BudgetAccount | None) -> dict:
    if account is None:  # an organization without an allocation
        return budget_figures(0, 0, 0.0)
    return budget_figures(account.epsilon_units, account.spent_max_units, account.delta)


def figures_for(session: Session, principal: Principal, dataset: db.Dataset) -> dict:
    """The budget figures a dataset view shows this key: the dataset's to its owner's admins, else its own."""
    if is_owner(principal, dataset):
        return dataset_figures(dataset)
    return _figures(budgets.account_of(session, dataset, principal.org_id))


def create_dataset(ctx: ServiceContext, principal: Principal, body: schemas.DatasetCreate) -> schemas.Dataset:
    """A dataset owned by the key's organization (its route admits admin keys only). A source dataset is created
    ``registering`` with the job that copies and counts it, in one transaction (its route answers 202); sent again
    after its registration failed — the same name, source, domain and budget — its job is queued again."""
    spec = body.domain_spec()
    source_bytes = 0
    if body.source is not None:
        check_source(ctx, principal, body)
        domain_from_spec(spec)  # what the count will use: refused now, not by the job
        source_bytes = snapshot.expected_size(body.source)  # walked before any lock (bounded in entries)
    total = budget_units(body.epsilon_total)
    if total < budget_units(ctx.settings.epsilon_min):
        raise LabelDPError(f"epsilon_total must be at least the smallest release, {ctx.settings.epsilon_min:g}",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    if body.delta_total > ctx.settings.delta_max:
        raise LabelDPError(f"delta_total must be at most this service's ceiling, {ctx.settings.delta_max:g} per "
                           "example", code=ErrorCode.EPSILON_OUT_OF_RANGE)
    try:
        with ctx.sessions() as session, session.begin():
            again = _failed_registration(session, principal, body, spec, total)
            if again is not None:  # its copy counted anew, at the source as it is now (refused: nothing re-queued)
                session.get(db.Organization, principal.org_id, with_for_update=True)
                besides = stored_bytes(session, ctx.store, principal.org_id) - int(again.source_bytes or 0)
                check_room(besides, source_bytes, ctx.storage_quota, "registering the dataset's source again (its "
                           "copy)", KEPT_FOR_THE_AUDIT)
                again.source_bytes = source_bytes
                view = dataset_view(session, principal, again)
            else:
                _refuse_taken_name(session, principal, body.name)
                # its row and domain (up to 100,000 listed values: the twenty-ninth review's 130 datasets took
                # SQLite from 0.16 to 273 MB in 45 s), against its organization's quota
                session.get(db.Organization, principal.org_id, with_for_update=True)
                check_room(stored_bytes(session, ctx.store, principal.org_id),
                           ROW_BYTES + len(json.dumps(spec)) + source_bytes, ctx.storage_quota,
                           "a new dataset (its row, domain and the copy of its source)", KEPT_FOR_THE_AUDIT)
                dataset = db.Dataset(id=db.new_id(), owner_org_id=principal.org_id, name=body.name,
                                     label_kind=body.label_kind, domain_json=json.dumps(spec),
                                     epsilon_total_units=total, epsilon_spent_units=0, delta_total=body.delta_total,
                                     allow_central_training=body.allow_central_training, source_uri=body.source,
                                     state="ready" if body.source is None else "registering",
                                     num_examples=0, registry_size=0,
                                     source_bytes=source_bytes if body.source is not None else None)
                session.add(dataset)
                session.flush()
                ctx.ledger.dataset_budget(session, dataset)
                ctx.ledger.dataset_owner(session, dataset)
                ctx.ledger.allocation(session, dataset, budgets.open_owner_account(session, dataset))
                ctx.ledger.account_opened(session, dataset, dataset.owner_org_id)
                if body.source is not None:
                    jobs.queue(session, org_id=principal.org_id, kind=jobs.REGISTER_SOURCE, subject_id=dataset.id,
                               spec={"dataset_id": dataset.id, "source": body.source})
                view = dataset_view(session, principal, dataset)
    except IntegrityError:  # the same name committed meanwhile
        raise LabelDPError(f"a dataset named {body.name!r} already exists", code=ErrorCode.DATASET_EXISTS) from None
    if body.source is not None:
        ctx.jobs.wake()  # this process's workers claim it now (another replica's at its next poll)
    return view


def _failed_registration(session: Session, principal: Principal, body, spec: dict, total: int) -> db.Dataset | None:
    """The organization's source dataset of this name whose registration failed, if the request is the same one
    (source, domain, budget): its job queued again, the dataset ``registering`` (locked: one re-queue at a time)."""
    if body.source is None:
        return None
    dataset = session.scalar(select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id,
                                                      db.Dataset.name == body.name).with_for_update())
    if dataset is None or dataset.state != "failed" or (
            dataset.source_uri, dataset.label_kind, json.loads(dataset.domain_json), dataset.epsilon_total_units,
            dataset.delta_total, dataset.allow_central_training) != (
            body.source, body.label_kind, spec, total, body.delta_total, body.allow_central_training):
        return None
    job = jobs.job_of(session, jobs.REGISTER_SOURCE, dataset.id, lock=True)
    if job is None:
        return None
    jobs.requeue(job)
    dataset.state, dataset.error_json = "registering", None
    return dataset


def _refuse_taken_name(session: Session, principal: Principal, name: str) -> None:
    if session.scalar(select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id,
                                               db.Dataset.name == name)):
        raise LabelDPError(f"a dataset named {name!r} already exists", code=ErrorCode.DATASET_EXISTS)


def check_source(ctx: ServiceContext, principal: Principal, body) -> None:
    """A source location must lie under a prefix the operator allowed this organization (no request may make the
    service read a location of the caller's choosing), with labels Spark can count exactly."""
    uri = body.source
    allowed = ctx.settings.spark_sources.get(principal.org_name, [])
    if not allowed:
        raise LabelDPError("source datasets are not enabled for this organization on this service",
                           code=ErrorCode.SOURCE_NOT_ALLOWED)
    if importlib.util.find_spec("pyspark") is None or not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise LabelDPError("this deployment has no Spark (the spark extra and a Java runtime)",
                           code=ErrorCode.SOURCE_NOT_ALLOWED)
    if snapshot.local_path(uri) is None:  # copied when registered, by file descriptors (labels_party.spark.snapshot)
        raise LabelDPError("only local sources (a path or a file: URI) can be registered on this service; object "
                           "stores (s3a://) and HDFS are not supported", code=ErrorCode.SOURCE_NOT_ALLOWED)
    if not _under_allowed_prefix(uri, allowed):
        raise LabelDPError("this source location is not one this organization may register",
                           code=ErrorCode.SOURCE_NOT_ALLOWED)
    snapshot.locate(uri, allowed)  # what the copy refuses before it opens anything
    if body.label_kind not in ("integer", "classes") or getattr(body, "clip", None) is not None or \
            getattr(body, "grid_size", None) is not None:
        raise LabelDPError("source datasets take integer (min, max) or classes labels",
                           code=ErrorCode.SOURCE_NOT_ALLOWED)


_SOURCE_REFUSED = set("*?[]{}\\%") | {chr(c) for c in range(33)}  # globs, escapes, blanks and controls


def _under_allowed_prefix(uri: str, allowed: list[str]) -> bool:
    """Inside one of the directories the operator allowed: no parent segments, no globs (Spark expands them), no
    percent-escapes (a file system may decode them), and a prefix counts as a directory (``s3a://b/hospital``
    does not allow ``s3a://b/hospital-other``)."""
    if _SOURCE_REFUSED & set(uri) or ".." in uri.split("/"):
        return False
    return any(uri == prefix.rstrip("/") or uri.startswith(prefix.rstrip("/") + "/") for prefix in allowed)


def get_dataset(ctx: ServiceContext, admission: Admission) -> schemas.Dataset:
    with ctx.sessions() as session, session.begin():
        return dataset_view(session, admission.principal, admitted_dataset(session, admission))


def list_datasets(ctx: ServiceContext, principal: Principal) -> list[schemas.Dataset]:
    with ctx.sessions() as session, session.begin():
        return [dataset_view(session, principal, d) for d in session.scalars(owned_datasets(principal))]


def grant_access(ctx: ServiceContext, admission: Admission, body: schemas.GrantCreate) -> schemas.Grant:
    """Grant (or re-allocate): the organization's consumer keys may release, within its allocation."""
    if body.delta > 0 and body.delta > ctx.settings.delta_max:
        raise LabelDPError(f"delta must be at most this service's ceiling, {ctx.settings.delta_max:g} per example",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    with ctx.sessions() as session, session.begin():
        dataset = admitted_dataset(session, admission, lock=True)
        ctx.ledger.check_actor(session, dataset, admission.principal)
        # its facts, rows and heads-log lines count to the owner (the thirtieth review: 291 grants at the quota)
        check_room(stored_bytes(session, ctx.store, admission.principal.org_id), ROW_BYTES, ctx.storage_quota,
                   "a grant (its facts and rows)", KEPT_FOR_THE_AUDIT)
        org = session.scalar(select(db.Organization).where(db.Organization.name == body.org))
        if org is None:
            org = db.Organization(name=body.org)
            session.add(org)
            session.flush()
        account = budgets.allocate(ctx.ledger, session, dataset, org, body.epsilon, body.delta)
        if not session.scalar(select(db.Grant).where(db.Grant.dataset_id == dataset.id,
                                                     db.Grant.org_id == org.id)):
            session.add(db.Grant(dataset_id=dataset.id, org_id=org.id))
            ctx.ledger.grant_made(session, dataset, org)
        return schemas.Grant(dataset_id=dataset.id, org=body.org, epsilon=units_epsilon(account.epsilon_units),
                             delta=account.delta)


def budget(ctx: ServiceContext, admission: Admission) -> schemas.Budget:
    with ctx.sessions() as session, session.begin():
        return budget_view(session, admission.principal, admitted_dataset(session, admission))


# -- uploads ----------------------------------------------------------------------------------------------------

def upload_labels(ctx: ServiceContext, admission: Admission, path: Path, fmt: str) -> schemas.UploadResult:
    """A new label version. Earlier versions and every release stay untouched; budgets follow example ids.

    The upload is parsed, checked and joined against the registry outside any lock (minutes at 10⁸ labels); it
    commits only if no other upload committed meanwhile, else it is redone on the new registry."""
    for _attempt in range(3):
        with ctx.sessions() as session, session.begin():
            dataset = admitted_dataset(session, admission)
            if dataset.source_uri is not None:
                raise LabelDPError("this dataset's labels stay at their source; nothing is uploaded",
                                   code=ErrorCode.SOURCE_DATASET)
            # (the domain too: the one the upload checks against must be the one the chain holds at its commit)
            spec, seen = json.loads(dataset.domain_json), (dataset.label_version, dataset.registry_size,
                                                           dataset.domain_json)
            parts = ctx.ledger.registry(session, dataset)
            used = stored_bytes(session, ctx.store, admission.principal.org_id)
        check_room(used, path.stat().st_size, ctx.storage_quota, "storing this label version",
                   KEPT_FOR_THE_AUDIT)  # early, on the body
        ingested = labelstore.ingest(ctx.store, dataset.id, seen[0] + 1, path, fmt, domain_from_spec(spec),
                                     spec.get("clip"), parts, seen[1], ctx.settings.upload_memory_mb)
        digest = ctx.store.digest(ingested.file)  # hashed before the lock, chained with the version
        with ctx.sessions() as session, session.begin():
            dataset = admitted_dataset(session, admission, lock=True)
            ctx.ledger.check_actor(session, dataset, admission.principal)  # the key and owner as the chain says
            if (dataset.label_version, dataset.registry_size, dataset.domain_json) != seen:
                ctx.store.remove(ingested.file)
                labelstore.discard(ctx.store, ingested.coverage)
                continue
            if ctx.ledger.registry(session, dataset) != parts:  # a registry file changed while it was read (the
                # forty-first review's renames: ids it held would be registered again, with fresh budgets)
                ctx.store.remove(ingested.file)
                labelstore.discard(ctx.store, ingested.coverage)
                raise OutsideDataDirectory(f"dataset {dataset.id}: a label version's file changed while the upload "
                                           "read it")
            _check_stored(ctx, session, admission.principal.org_id, ingested, digest[0])
            labelstore.keep(ctx.store, ingested.coverage)  # committed below (a crash leaves an unreferenced file)
            version = seen[0] + 1
            row = db.LabelVersion(
                dataset_id=dataset.id, version=version, file=ingested.file, num_examples=ingested.num_examples,
                clipped_below=ingested.clipped_below, clipped_above=ingested.clipped_above,
                registry_start=ingested.registry_start, registry_end=ingested.registry_end,
                coverage_file=ingested.coverage.file, coverage_sha256=ingested.coverage.sha256,
                id_bytes=ingested.id_bytes)
            session.add(row)
            ctx.ledger.labels_uploaded(session, dataset, row, digest)
            dataset.label_version, dataset.num_examples = version, ingested.num_examples
            dataset.registry_size = ingested.registry_end
            warning = range_warning(domain_from_spec(spec), ingested.bulk)
            return schemas.UploadResult(dataset_id=dataset.id, label_version=version,
                                        num_examples=ingested.num_examples, new_examples=ingested.new_examples,
                                        clipped_below=ingested.clipped_below,
                                        clipped_above=ingested.clipped_above,
                                        warnings=[warning] if warning else [])
    raise LabelDPError("other uploads to this dataset kept committing first; retry", code=ErrorCode.UPLOAD_CONFLICT)


def _check_stored(ctx: ServiceContext, session: Session, org_id: int, ingested: labelstore.Ingested,
                  version_bytes: int) -> None:
    """The version as written (a Parquet body may store more than it weighs) and its coverage, against the
    organization's quota as its committed data stands — read in the transaction that commits the version, which
    SQLite's BEGIN IMMEDIATE and PostgreSQL's lock of the organization's row serialize: concurrent uploads to an
    organization's datasets cannot each pass on what the others have not committed yet (the 28th review: eight at
    once took 3.67 times the quota). Refused, the version's files go."""
    session.get(db.Organization, org_id, with_for_update=True)
    coverage = file_bytes(ctx.store, ingested.coverage.pending or ingested.coverage.file)
    try:
        check_room(stored_bytes(session, ctx.store, org_id), version_bytes + coverage, ctx.storage_quota,
                   "storing this label version", KEPT_FOR_THE_AUDIT)
    except LabelDPError:
        ctx.store.remove(ingested.file)
        labelstore.discard(ctx.store, ingested.coverage)
        raise


WIDE_RANGE = 10  # a declared range this many times the labels' middle 90 % is warned about


def range_warning(domain, bulk: tuple[float, float] | None) -> str | None:
    """The owner's warning when the declared range is far wider than the labels' bulk (their 5th to 95th
    percentile): every mechanism's noise is calibrated to the range, so on heavy-tailed labels it swamps them. Only
    the uploading owner sees it (the labels are theirs); nothing is released."""
    if bulk is None:
        return None
    values = domain.support().values
    low, high = float(values.min()), float(values.max())
    span, middle = high - low, bulk[1] - bulk[0]
    if span <= 0 or span <= WIDE_RANGE * middle:
        return None
    ratio = f"{span / middle:,.0f} times" if middle > 0 else "infinitely"
    return (f"the declared range [{low:g}, {high:g}] is {ratio} wider than the middle 90 % of these labels "
            f"([{bulk[0]:.4g}, {bulk[1]:.4g}]): the noise of every mechanism is calibrated to the range, and on "
            "labels this concentrated it swamps them. Declare a clip: DP quantiles (POST "
            "/v1/datasets/{id}/quantiles with candidates 'log' and method 'above-threshold') choose one privately")


