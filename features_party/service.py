"""Trainer service functions: features tables and jobs, each belonging to one organization.

A job first takes one of its organization's job slots (``max_jobs_per_org`` queued + running; beyond, 429 with
Retry-After). It is then planned completely before anything is asked of the labels party — its features table and
columns, its example ids, its training options and size, the labels party (a configured one) and the dataset's label
kind against the loss, the mechanism and the protocol — so a job that cannot run is a 4xx and spends nothing. Then
the release is requested (synchronously: its refusals are 4xx too) and the rest runs in the background
(:mod:`.jobs`). The planning is :mod:`.planning`, the context :mod:`.context`.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from features_party import db, jobs, schemas
from features_party.auth import Principal
from features_party.context import TrainerContext
from features_party.features import read_features
from features_party.planning import feature_row, not_found, plan_job
from shared.errors import LabelDPError, RetryLater

# -- features tables ---------------------------------------------------------------------------------------------

def _table_view(row: db.FeatureTable) -> schemas.FeatureTableView:
    return schemas.FeatureTableView(name=row.name, num_examples=row.num_examples,
                                    columns=json.loads(row.columns_json), updated_at=row.updated_at)


def upload_features(ctx: TrainerContext, principal: Principal, name: str, path: Path) -> schemas.FeatureTableView:
    frame = read_features(path)  # 400 on a malformed file, before anything is stored
    directory = ctx.org_dir(principal.org_id) / "features"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.parquet"
    staged = directory / f".{name}.{uuid.uuid4().hex}.tmp"  # collected at startup if a crash leaves it
    frame.reset_index(drop=True).to_parquet(staged, index=False)
    staged.replace(target)
    with ctx.sessions() as session, session.begin():
        row = session.scalar(select(db.FeatureTable).where(db.FeatureTable.org_id == principal.org_id,
                                                           db.FeatureTable.name == name))
        if row is None:
            row = db.FeatureTable(org_id=principal.org_id, name=name, file=str(target))
            session.add(row)
        row.num_examples, row.columns_json, row.updated_at = len(frame), json.dumps(list(frame.columns)), db.utcnow()
        session.flush()
        return _table_view(row)


def list_features(ctx: TrainerContext, principal: Principal) -> list[schemas.FeatureTableView]:
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(db.FeatureTable).where(db.FeatureTable.org_id == principal.org_id)
                               .order_by(db.FeatureTable.name))
        return [_table_view(r) for r in rows]


def get_features(ctx: TrainerContext, principal: Principal, name: str) -> schemas.FeatureTableView:
    with ctx.sessions() as session, session.begin():
        return _table_view(feature_row(session, principal, name))


# -- jobs ----------------------------------------------------------------------------------------------------

def job_view(row: db.Job) -> schemas.JobView:
    request = json.loads(row.request_json)
    if request.get("release") is not None:
        ids = request["release"].pop("example_ids", None)  # kept for a resume, not shown: views stay small
        request["release"]["num_example_ids"] = None if ids is None else len(ids)
    return schemas.JobView(
        id=row.id, status=row.status, protocol=request.get("protocol", "single"), labels_party=row.labels_party,
        dataset_id=row.dataset_id, progress=schemas.JobProgress(epoch=row.epoch, epochs=row.epochs),
        metrics=json.loads(row.metrics_json), release=json.loads(row.release_json) if row.release_json else None,
        error=row.error, error_code=row.error_code, num_train_examples=row.num_train_examples, seconds=row.seconds,
        device=row.device, created_at=row.created_at, request=request)


def stored_request(request: schemas.JobRequest) -> dict:
    """What a job record keeps of its request: everything but the api key (a resume rebuilds the request)."""
    return request.model_dump(mode="json", exclude={"api_key"})


def _job_row(session: Session, principal: Principal, job_id: str, *, lock: bool = False) -> db.Job:
    row = session.get(db.Job, job_id, with_for_update=lock)
    if row is None or row.org_id != principal.org_id:
        raise not_found("job")
    return row


# How long a client refused for its organization's job count is told to wait: jobs take seconds to minutes.
RETRY_AFTER_SECONDS = 30


def _take_slot(session: Session, ctx: TrainerContext, principal: Principal) -> None:
    """Refuses a job beyond ``max_jobs_per_org`` queued + running jobs of this organization. The organization's row
    is locked first, so concurrent requests of one organization count one after the other (PostgreSQL; SQLite
    serializes writers anyway)."""
    session.get(db.Organization, principal.org_id, with_for_update=True)
    active = session.execute(select(func.count()).select_from(db.Job).where(
        db.Job.org_id == principal.org_id, db.Job.status.in_(("queued", "running")))).scalar_one()
    limit = ctx.settings.max_jobs_per_org
    if active >= limit:
        raise RetryLater(f"this organization has {limit} jobs queued or running, this trainer's limit "
                         "(max_jobs_per_org): retry when one has finished", code="too_many_jobs",
                         retry_after=RETRY_AFTER_SECONDS)


def create_job(ctx: TrainerContext, principal: Principal, request: schemas.JobRequest) -> schemas.JobView:
    with ctx.sessions() as session, session.begin():
        _take_slot(session, ctx, principal)
        row = db.Job(org_id=principal.org_id, status="queued", labels_party=request.labels_party or "",
                     dataset_id=request.dataset_id, request_json=json.dumps(stored_request(request)))
        session.add(row)
        session.flush()
        job_id = row.id
    try:
        plan = plan_job(ctx, principal, request)
        with ctx.sessions() as session, session.begin():  # what the job asks for: a resume asks for the same
            row = session.get(db.Job, job_id)
            row.labels_party, row.request_json = plan.labels_party, json.dumps(stored_request(plan.request))
        jobs.start(ctx, job_id, principal.org_id, plan)
    except LabelDPError:
        with ctx.sessions() as session, session.begin():  # refused: nothing was spent, nothing is kept
            session.delete(session.get(db.Job, job_id))
        raise
    except BaseException:
        jobs.fail_unexpectedly(ctx, job_id)
        raise
    return get_job(ctx, principal, job_id)


def resume_job(ctx: TrainerContext, principal: Principal, job_id: str, api_key: str) -> schemas.JobView:
    with ctx.sessions() as session, session.begin():
        row = _job_row(session, principal, job_id, lock=True)
        if row.status != "interrupted":
            raise LabelDPError(f"job is {row.status}; only interrupted jobs resume", code="job_not_resumable")
        _take_slot(session, ctx, principal)
        stored = json.loads(row.request_json)
        row.status, row.error, row.error_code, row.updated_at = "queued", None, None, db.utcnow()
    request = schemas.JobRequest(**stored, api_key=api_key)
    try:
        jobs.start(ctx, job_id, principal.org_id, plan_job(ctx, principal, request), resume=True)
    except LabelDPError:
        with ctx.sessions() as session, session.begin():
            session.get(db.Job, job_id).status = "interrupted"
        raise
    except BaseException:  # as for a new job: never queued for ever, holding the slot
        jobs.fail_unexpectedly(ctx, job_id)
        raise
    return get_job(ctx, principal, job_id)


def get_job(ctx: TrainerContext, principal: Principal, job_id: str) -> schemas.JobView:
    with ctx.sessions() as session, session.begin():
        return job_view(_job_row(session, principal, job_id))


def list_jobs(ctx: TrainerContext, principal: Principal) -> list[schemas.JobView]:
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(db.Job).where(db.Job.org_id == principal.org_id).order_by(db.Job.created_at))
        return [job_view(r) for r in rows]


def job_file(ctx: TrainerContext, principal: Principal, job_id: str, kind: str) -> Path:
    """The model or the predictions of a succeeded job of this organization."""
    with ctx.sessions() as session, session.begin():
        row = _job_row(session, principal, job_id)
        if row.status != "succeeded":
            raise LabelDPError(f"job is {row.status}: no {kind} yet", code="job_not_ready")
        file = row.model_file if kind == "model" else row.predictions_file
        assert file is not None  # a job succeeds with its model and predictions written (jobs._finish)
        return Path(file)

