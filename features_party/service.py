"""Trainer service functions: features tables and jobs, each belonging to one organization.

``POST /v1/jobs`` with an ``Idempotency-Key`` already used by the organization answers that job (200) if the
request (without its api_key) is the same, else 409 ``idempotency_key_reused``; nothing else happens. A new job first
takes one of its organization's job slots (``max_jobs_per_org`` queued, running or interrupted waiting to be retried;
beyond, 429 with Retry-After) and is stored with its labels-party API key sealed. It is then planned completely
before anything is asked of the labels party — its features table and columns, its example ids, its training
options and size, the labels party (a configured one) and the dataset's label kind against the loss, the mechanism
and the protocol — so a job that cannot run is a 4xx, spends nothing and is not kept. Then the release is requested
(synchronously, its Idempotency-Key the job id): a refusal (4xx) is answered and the job not kept (nothing was
charged); an answer that does not come (unreachable, a 5xx, lost on the way) leaves the job ``interrupted``, to ask
again later with the same key (202). The rest runs on any replica's workers (:mod:`.jobs`). The planning is
:mod:`.planning`, the context :mod:`.context`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta
from pathlib import Path

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from features_party import attempt, db, jobs, schemas
from features_party.auth import Principal
from features_party.client import LabelsPartyError
from features_party.context import TrainerContext
from features_party.features import CsvLimits, store_features, table_bytes
from features_party.planning import (
    feature_row,
    labels_party_client,
    load_frame,
    not_found,
    plan_job,
    upstream_error,
)
from shared.errors import ErrorCode, LabelDPError, RetryLater

log = logging.getLogger("labeldp.features")

# -- features tables ---------------------------------------------------------------------------------------------

def _table_view(row: db.FeatureTable) -> schemas.FeatureTableView:
    return schemas.FeatureTableView(name=row.name, num_examples=row.num_examples,
                                    columns=json.loads(row.columns_json), updated_at=row.updated_at)


def upload_features(ctx: TrainerContext, principal: Principal, name: str, path: Path) -> schemas.FeatureTableView:
    # 400 on a malformed file, before anything is stored; read and written in bounded memory (issue 40)
    with ctx.storing(principal.org_id, path.stat().st_size, "storing this features table"):
        stored = store_features(path, ctx.org_dir(principal.org_id) / "features", name, CsvLimits.of(ctx.settings))
    with ctx.sessions() as session, session.begin():
        row = session.scalar(select(db.FeatureTable).where(db.FeatureTable.org_id == principal.org_id,
                                                           db.FeatureTable.name == name))
        if row is None:
            row = db.FeatureTable(org_id=principal.org_id, name=name, file=str(stored.file))
            session.add(row)
        row.num_examples, row.columns_json = stored.num_examples, json.dumps(stored.columns)
        row.updated_at = db.utcnow()
        session.flush()
        return _table_view(row)


def list_features(ctx: TrainerContext, principal: Principal) -> list[schemas.FeatureTableView]:
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(db.FeatureTable).where(db.FeatureTable.org_id == principal.org_id)
                               .order_by(db.FeatureTable.name))
        return [_table_view(r) for r in rows]


def get_features(ctx: TrainerContext, principal: Principal, name: str) -> schemas.FeatureTableView:
    with ctx.sessions() as session, session.begin():
        return _table_view(feature_row(session, principal.org_id, name))


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
        error=row.error, error_code=row.error_code, num_train_examples=row.num_train_examples,
        num_holdout_examples=row.num_holdout_examples, seconds=row.seconds, device=row.device,
        created_at=row.created_at, request=request, **(json.loads(row.report_json) if row.report_json else {}))


def stored_request(request: schemas.JobRequest) -> dict:
    """What a job record keeps of its request: everything but the api key (sealed apart, until the job ends) — in
    the shape a request had before issue 39's fields, when it uses their defaults, so that its digest (a resent
    request's Idempotency-Key check) is the one it always had: a fixed job's learner stated (``mlp``, the default
    then and now), ``estimate_fraction`` only when not the default, an auto release's ``validation`` only when
    set, ``engine`` (issue 43) only when not ``local``. Jobs stored before then hold
    ``estimate_fraction: 0`` (migration 0006): they were planned without estimate rows, and replan so."""
    stored = request.model_dump(mode="json", exclude={"api_key"})
    for name in ("estimate_fraction", "engine"):
        if stored[name] == schemas.JobRequest.model_fields[name].default:
            del stored[name]
    if stored["train"]["model"] is None and not isinstance(request.release, schemas.AutoRelease):
        stored["train"]["model"] = "mlp"
    if isinstance(request.release, schemas.AutoRelease) and request.release.validation is None:
        del stored["release"]["validation"]  # filled in when the job is created (planning._checked_auto)
    return stored


def request_digest(request: schemas.JobRequest) -> str:
    """SHA-256 of the request without its api key (canonical JSON): what makes a resent request the same job."""
    text = json.dumps(stored_request(request), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _job_row(session: Session, principal: Principal, job_id: str, *, lock: bool = False) -> db.Job:
    row = session.get(db.Job, job_id, with_for_update=lock)
    if row is None or row.org_id != principal.org_id:
        raise not_found("job")
    return row


# How long a client refused for its organization's job count is told to wait: jobs take seconds to minutes.
RETRY_AFTER_SECONDS = 30


def _take_slot(session: Session, ctx: TrainerContext, principal: Principal) -> None:
    """Refuses a job beyond ``max_jobs_per_org`` jobs of this organization that will run without anyone's action:
    queued, running, or interrupted holding their sealed key (to be retried). The organization's row is locked
    (:func:`_lock_organization`) by the caller first, so concurrent requests of one organization count one after
    the other."""
    will_run = or_(db.Job.status.in_(("queued", "running")),
                   and_(db.Job.status == "interrupted", db.Job.sealed_api_key.is_not(None)))
    active = session.execute(select(func.count()).select_from(db.Job).where(
        db.Job.org_id == principal.org_id, will_run)).scalar_one()
    limit = ctx.settings.max_jobs_per_org
    if active >= limit:
        raise RetryLater(f"this organization has {limit} jobs queued or running, this trainer's limit "
                         "(max_jobs_per_org): retry when one has finished", code=ErrorCode.TOO_MANY_JOBS,
                         retry_after=RETRY_AFTER_SECONDS)


def _lock_organization(session: Session, principal: Principal) -> None:
    """PostgreSQL: one request of an organization at a time counts its jobs and uses its keys (SQLite serializes
    writers anyway)."""
    session.get(db.Organization, principal.org_id, with_for_update=True)


def _replay(session: Session, principal: Principal, key: str, digest: str) -> schemas.JobView | None:
    """The job an earlier request with this Idempotency-Key created (None: no such job)."""
    row = session.scalar(select(db.Job).where(db.Job.org_id == principal.org_id, db.Job.idempotency_key == key))
    if row is None:
        return None
    if row.request_sha256 != digest:
        raise LabelDPError("this Idempotency-Key was already used by this organization for another job request",
                           code=ErrorCode.IDEMPOTENCY_KEY_REUSED)
    if _still_being_created(row):
        # Its request is still asking for the release, which may be refused — and then the job is not kept: a 200
        # now would answer a job that later reads 404. The outcome is that request's: ask again.
        raise LabelDPError("a request with this Idempotency-Key is still creating its job; send it again shortly",
                           code=ErrorCode.RELEASE_IN_PROGRESS)
    return job_view(row)


def _still_being_created(row: db.Job) -> bool:
    """Held by the request that inserted it (queued, attempt 0, a live lease), not yet by a worker."""
    return (row.status == "queued" and row.attempts == 0 and row.lease_owner is not None
            and row.lease_expires_at is not None and row.lease_expires_at > db.utcnow())


def create_job(ctx: TrainerContext, principal: Principal, request: schemas.JobRequest,
               idempotency_key: str | None = None) -> tuple[schemas.JobView, bool]:
    """The job and whether this request created it (False: the replay of an earlier request with its key)."""
    digest, job_id = request_digest(request), db.new_id()
    sealed = jobs.seal_api_key(ctx, job_id, request.api_key)  # 503 secret_key_missing: nothing stored
    settings = ctx.settings
    try:
        with ctx.sessions() as session, session.begin():
            _lock_organization(session, principal)
            if idempotency_key is not None and (replay := _replay(session, principal, idempotency_key, digest)):
                return replay, False
            _take_slot(session, ctx, principal)
            # leased to this process while it plans and asks for the release (jobs.creating)
            session.add(db.Job(
                id=job_id, org_id=principal.org_id, status="queued", labels_party=request.labels_party or "",
                dataset_id=request.dataset_id, request_json=json.dumps(stored_request(request)),
                idempotency_key=idempotency_key, request_sha256=digest, sealed_api_key=sealed, attempts=0,
                lease_owner=ctx.jobs.owner,
                lease_expires_at=db.utcnow() + timedelta(seconds=settings.job_lease_seconds)))
    except IntegrityError:  # a concurrent request with this key created it first (SQLite)
        if idempotency_key is None:
            raise
        with ctx.sessions() as session, session.begin():
            replay = _replay(session, principal, idempotency_key, digest)
        if replay is None:  # created, then refused and not kept, in the meantime: this request tries for itself
            return create_job(ctx, principal, request, idempotency_key)
        return replay, False
    with jobs.creating(ctx, job_id):
        _start(ctx, principal, request, job_id)
    ctx.jobs.wake()
    return get_job(ctx, principal, job_id), True


def _start(ctx: TrainerContext, principal: Principal, request: schemas.JobRequest, job_id: str) -> None:
    """Plan the new job and request its release; then it is queued for the workers (or, with the labels party's
    answer missing, interrupted to ask again). A refusal deletes it and is raised."""
    try:
        plan = plan_job(ctx, principal.org_id, request)
        # its models and predictions will be stored: refused at its organization's quota, before anything is spent
        ctx.reserve_output(principal.org_id, job_id, plan.output_bytes, "a new job (its model and a prediction for "
                           "each row of its features table)")
    except Exception:  # refused (a 4xx), or failed: nothing was asked of the labels party but reads
        _discard(ctx, job_id)
        raise
    release = plan.existing_release
    with jobs.created_row(ctx, job_id) as row:  # what the job asks for: every attempt asks for the same
        if row is None:
            return
        row.labels_party, row.request_json = plan.labels_party, json.dumps(stored_request(plan.request))
    if plan.auto is not None or (plan.request.protocol == "single" and plan.releases()):  # lp-mst: as it trains
        charged: list = []  # the releases answered: a refusal after one of them keeps the job (failed), never hides it
        try:
            with labels_party_client(ctx, plan.url, request.api_key) as client:
                if plan.auto is not None:
                    _auto_releases(ctx, plan, client, job_id, charged)
                else:
                    release = jobs.request_releases(plan, client, job_id, jobs.JobReport()).get("", release)
        except Exception as err:
            outcome = jobs.upstream_outcome(err)
            if outcome == "refused" and not charged:  # nothing was charged: nothing is kept
                _discard(ctx, job_id)
                raise (err if isinstance(err, LabelDPError) else upstream_error(err, plan.labels_party)) from None
            if outcome == "refused":
                outcome = "failed"  # some parts were charged: the job stays, failed, with the refusal
            log.warning("job %s: no answer to its release request (%s): %s", job_id, type(err).__name__,
                        "it failed" if outcome == "failed" else "it will ask again")
            error = (upstream_error(err, plan.labels_party) if outcome == "failed"
                     else jobs.retry_error(err, plan.labels_party))
            with jobs.created_row(ctx, job_id) as row:
                if row is not None:
                    row.error, row.error_code = str(error), error.code
                    row.lease_owner = row.lease_expires_at = None
                    if outcome == "failed":
                        row.status, row.sealed_api_key = "failed", None
                    else:
                        row.status = "interrupted"
                        row.run_after = db.utcnow() + timedelta(seconds=ctx.settings.upstream_retry_seconds)
            return
    with jobs.created_row(ctx, job_id) as row:
        if row is not None:  # queued: the workers take it from here
            if release is not None:
                row.release_json = json.dumps(attempt.release_summary(release))
            row.lease_owner = row.lease_expires_at = None


def _auto_releases(ctx: TrainerContext, plan, client, job_id: str, charged: list) -> None:
    """An auto job's releases at its creation, once its organization's budget is known to cover ε on every training
    example (each is charged ε in all: a budget short of it would refuse a part after others were charged)."""
    from features_party.auto import request_auto_releases

    assert plan.auto is not None
    try:
        budget = client.budget(plan.request.dataset_id)
    except LabelsPartyError as err:
        raise upstream_error(err, plan.labels_party) from None
    if budget.epsilon_remaining < plan.auto.epsilon:
        raise LabelDPError(f"labels party {plan.labels_party!r}: an auto job spends epsilon {plan.auto.epsilon:g} on "
                           f"every training example, and this organization's most spent example has "
                           f"{budget.epsilon_remaining:g} left; nothing was spent",
                           code=ErrorCode.LABELS_PARTY_BUDGET_EXCEEDED)
    # the table's ids only, within the process's budget for table reads (as planning read them)
    with ctx.table_reads.held(table_bytes(plan.features_file, []), "reading the ids of the job's features table",
                              ErrorCode.JOB_TOO_LARGE):
        ids = plan.training_ids(load_frame(plan.features_file, [])).astype(str)
    request_auto_releases(plan, client, job_id, ids, charged)


def _discard(ctx: TrainerContext, job_id: str) -> None:
    """A refused job is not kept (unless a worker has it already: then its outcome is the job's)."""
    with ctx.sessions() as session, session.begin():
        session.execute(delete(db.Job).where(*jobs.created_by(ctx.jobs.owner, job_id)))


def resume_job(ctx: TrainerContext, principal: Principal, job_id: str, api_key: str) -> schemas.JobView:
    """An interrupted job queued again with the labels-party API key (sealed again: a job whose sealed key could
    not be opened, or one waiting to ask its labels party again, now). The key is checked by planning the job
    again (reads only); its release is asked for with the same Idempotency-Key, so nothing is charged again."""
    with ctx.sessions() as session, session.begin():
        row = _job_row(session, principal, job_id)
        if row.status != "interrupted":
            raise _not_resumable(row)
        stored = json.loads(row.request_json)
    sealed = jobs.seal_api_key(ctx, job_id, api_key)  # 503 secret_key_missing while there is no secret key
    plan = plan_job(ctx, principal.org_id, schemas.JobRequest(**stored, api_key=api_key), stored=True)  # 4xx: as is
    ctx.reserve_output(principal.org_id, job_id, plan.output_bytes, "resuming the job (its model and predictions)")
    with ctx.sessions() as session, session.begin():
        _lock_organization(session, principal)
        row = _job_row(session, principal, job_id, lock=True)
        if row.status != "interrupted" or row.lease_owner is not None:  # resumed or claimed meanwhile
            raise _not_resumable(row)
        if row.sealed_api_key is None:  # not counted among the organization's jobs that will run
            _take_slot(session, ctx, principal)
        row.status, row.sealed_api_key, row.run_after, row.attempts = "queued", sealed, None, 0
        row.error = row.error_code = None
        row.updated_at = db.utcnow()
    ctx.jobs.wake()
    return get_job(ctx, principal, job_id)


def _not_resumable(row: db.Job) -> LabelDPError:
    return LabelDPError(f"job is {row.status}; only interrupted jobs resume", code=ErrorCode.JOB_NOT_RESUMABLE)


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
            raise LabelDPError(f"job is {row.status}: no {kind} yet", code=ErrorCode.JOB_NOT_READY)
        file = row.model_file if kind == "model" else row.predictions_file
        assert file is not None  # a job succeeds with its model and predictions written (jobs._finish)
        return Path(file)
