"""Trainer service functions: the context, features tables and jobs, each belonging to one organization.

A job is planned completely before anything is asked of the labels party — its features table and columns, its
example ids, its training options, the labels party (a configured one) and the dataset's label kind against the
loss, the mechanism and the protocol — so a job that cannot run is a 4xx and spends nothing. Then the release is
requested (synchronously: its refusals are 4xx too) and the rest runs in the background (:mod:`.jobs`).
"""

from __future__ import annotations

import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from features_party import db, schemas
from features_party.auth import Principal
from features_party.client import LabelsPartyClient, LabelsPartyError
from features_party.features import Preprocessor, read_features
from features_party.settings import TrainerSettings
from features_party.train import TrainConfig
from shared import schemas as shared_schemas
from shared.errors import LabelDPError
from shared.service.database import make_engine
from shared.service.scratch import Scratch

log = logging.getLogger("labeldp.features")


@dataclass(frozen=True)
class TrainerContext:
    settings: TrainerSettings
    sessions: sessionmaker
    executor: ThreadPoolExecutor
    scratch: Scratch = field(kw_only=True)  # this process's spool directory under the data directory

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir)

    def org_dir(self, org_id: int) -> Path:
        return self.data_dir / "orgs" / str(int(org_id))


def make_context(settings: TrainerSettings | None = None, *, upgrade: bool = False) -> TrainerContext:
    settings = settings or TrainerSettings()
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    ctx = TrainerContext(settings, db.make_sessionmaker(make_engine(settings.database_url), upgrade=upgrade),
                         ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="train"),
                         scratch=Scratch(settings.data_dir))
    mark_interrupted(ctx)
    collect_leftovers(ctx)
    return ctx


def collect_leftovers(ctx: TrainerContext) -> int:
    """What a crashed process left: spooled bodies of dead processes (removed by :class:`Scratch` itself) and,
    when no other process uses the data directory, its ``.tmp`` temporaries (features tables being written)."""
    with ctx.scratch.alone() as alone:
        removed = ctx.scratch.remove_leftovers() if alone else 0
    if removed:
        log.info("removed %d leftover file(s) of earlier processes from the data directory", removed)
    return removed


def mark_interrupted(ctx: TrainerContext) -> int:
    """Jobs a previous process left queued or running cannot continue on their own: the labels-party key they
    ran with was never stored. They become ``interrupted``; ``POST /v1/jobs/{id}/resume`` with the key continues
    them, reusing their releases (same Idempotency-Keys: no second draw, no second charge)."""
    with ctx.sessions() as session, session.begin():
        jobs = list(session.scalars(select(db.Job).where(db.Job.status.in_(("queued", "running")))))
        for job in jobs:
            job.status, job.updated_at = "interrupted", db.utcnow()
            job.error = "interrupted by a restart of the trainer: resume it with the labels-party api_key"
        return len(jobs)


def _not_found(what: str) -> LabelDPError:
    return LabelDPError(f"no such {what} for this key", code="not_found")


# -- features tables ---------------------------------------------------------------------------------------------

def _table_view(row: db.FeatureTable) -> schemas.FeatureTableView:
    return schemas.FeatureTableView(name=row.name, num_examples=row.num_examples,
                                    columns=json.loads(row.columns_json), updated_at=row.updated_at)


def upload_features(ctx: TrainerContext, principal: Principal, name: str, path: Path) -> schemas.FeatureTableView:
    if principal.role != "admin":
        raise LabelDPError("creating or replacing a features table needs an admin key", code="forbidden")
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


def _feature_row(session: Session, principal: Principal, name: str) -> db.FeatureTable:
    row = session.scalar(select(db.FeatureTable).where(db.FeatureTable.org_id == principal.org_id,
                                                       db.FeatureTable.name == name))
    if row is None:
        raise _not_found("features table")
    return row


def get_features(ctx: TrainerContext, principal: Principal, name: str) -> schemas.FeatureTableView:
    with ctx.sessions() as session, session.begin():
        return _table_view(_feature_row(session, principal, name))


def load_frame(file: str) -> pd.DataFrame:
    frame = pd.read_parquet(file)
    return frame.set_index("example_id", drop=False)


# -- planning a job ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobPlan:
    """Everything a job needs, checked: what runs in the background can only fail for reasons nobody could have
    checked up front (the labels party going away, a training divergence)."""

    request: schemas.JobRequest
    labels_party: str
    url: str
    features_file: str
    config: TrainConfig
    num_classes: int | None
    existing_release: shared_schemas.Release | None = None  # to train on instead of requesting one


def labels_party_client(ctx: TrainerContext, url: str, api_key: str) -> LabelsPartyClient:
    settings = ctx.settings
    return LabelsPartyClient(url, api_key, timeout=settings.upstream_timeout_seconds,
                             retries=settings.upstream_retries, backoff=0.5,
                             verify=settings.upstream_ca_bundle or True)


def upstream_error(err: Exception, party: str) -> LabelDPError:
    """The trainer's own answer for a labels-party failure: never the upstream body, at most its error code (a
    member of the shared code enum)."""
    if isinstance(err, httpx.TransportError):
        return LabelDPError(f"labels party {party!r} is unreachable", code="labels_party_unreachable")
    if not isinstance(err, LabelsPartyError):
        return LabelDPError(f"labels party {party!r} failed", code="labels_party_failed")
    if err.status in (401, 403):
        return LabelDPError(f"labels party {party!r} refused the api_key for this", code="labels_party_forbidden")
    if err.status == 404:
        return LabelDPError(f"labels party {party!r} has no such dataset or release for this api_key",
                            code="labels_party_not_found")
    if err.code == "budget_exceeded":
        return LabelDPError(f"labels party {party!r}: the covered examples' budget is exceeded",
                            code="labels_party_budget_exceeded")
    if 400 <= err.status < 500:
        return LabelDPError(f"labels party {party!r} refused the request ({err.safe_code})",
                            code="labels_party_refused")
    return LabelDPError(f"labels party {party!r} failed ({err.status})", code="labels_party_failed")


def _invalid(message: str) -> LabelDPError:
    return LabelDPError(message, code="invalid_job")


def plan_job(ctx: TrainerContext, principal: Principal, request: schemas.JobRequest) -> JobPlan:
    if (request.release is None) == (request.release_id is None):
        raise _invalid("give either release (to request one) or release_id (to train on an existing one)")
    if request.protocol == "lp-mst" and request.release is None:
        raise _invalid("lp-mst requests its own releases: give release, not release_id")
    party, url = ctx.settings.labels_party_url(request.labels_party)
    with ctx.sessions() as session, session.begin():
        features_file = _feature_row(session, principal, request.features).file
    _check_columns(features_file, request)
    with labels_party_client(ctx, url, request.api_key) as client:
        try:
            dataset = client.get_dataset(request.dataset_id)
            existing = client.get_release(request.release_id) if request.release_id else None
        except (LabelsPartyError, httpx.HTTPError) as err:
            raise upstream_error(err, party) from None
    if existing is not None:
        if existing.dataset_id != request.dataset_id:
            raise _invalid(f"release {existing.id} is not a release of dataset {request.dataset_id}")
        if existing.mechanism in shared_schemas.LABELLESS_RELEASES:
            raise _invalid(f"release {existing.id} ({existing.mechanism}) publishes no labels to train on")
    mechanism = existing.mechanism if existing is not None else request.release.mechanism
    loss, num_classes = _loss_for(request, mechanism, dataset)
    config = TrainConfig.from_dict({**request.train.model_dump(), "loss": loss})
    return JobPlan(request, party, url, features_file, config, num_classes, existing)


def _check_columns(features_file: str, request: schemas.JobRequest) -> None:
    """The columns exist and every requested example has features."""
    frame = load_frame(features_file)
    Preprocessor.check(frame, request.numeric, request.categorical)
    if request.release is not None and request.release.example_ids is not None:
        missing = pd.Index(request.release.example_ids).difference(frame.index)
        if len(missing):
            raise LabelDPError(f"{len(missing)} requested example id(s) have no features, e.g. "
                               f"{list(missing[:3])}", code="unknown_example_ids")


def _loss_for(request: schemas.JobRequest, mechanism: str,
              dataset: shared_schemas.Dataset) -> tuple[str, int | None]:
    """The loss and class count a job trains with, checked against the dataset's label kind, the mechanism and
    the protocol."""
    loss = request.train.loss
    if dataset.label_kind == "classes":
        classes = int(dataset.domain["num_classes"])
        if mechanism not in shared_schemas.CLASSIFICATION_MECHANISMS:
            raise _invalid(f"mechanism {mechanism!r} does not fit class labels; use one of "
                           f"{', '.join(shared_schemas.CLASSIFICATION_MECHANISMS)}")
        expected = "subset" if mechanism == "subset" else "cross_entropy"
        if loss not in (None, expected):
            raise _invalid(f"loss {loss!r} does not fit {mechanism} releases of class labels; use {expected!r}")
        if request.num_classes not in (None, classes):
            raise _invalid(f"num_classes {request.num_classes} differs from the dataset's {classes} classes")
        if request.protocol == "lp-mst" and mechanism not in ("rr", "rr-with-prior"):
            raise _invalid("lp-mst releases with randomized response and RRWithPrior (mechanism 'rr')")
        return expected, classes
    if mechanism not in shared_schemas.REGRESSION_MECHANISMS:
        raise _invalid(f"mechanism {mechanism!r} does not fit {dataset.label_kind} labels; use one of "
                       f"{', '.join(shared_schemas.REGRESSION_MECHANISMS)}")
    if request.protocol != "single":
        raise _invalid("lp-mst needs a classes dataset")
    if request.num_classes is not None:
        raise _invalid("num_classes is for classes datasets")
    loss = loss or "squared"
    if loss not in ("squared", "poisson"):
        raise _invalid(f"loss {loss!r} does not fit {dataset.label_kind} labels; use 'squared' or 'poisson'")
    if loss == "poisson" and _lowest(dataset.domain) < 0:
        raise _invalid("the Poisson loss needs non-negative labels; this dataset's domain goes below 0")
    return loss, None


def _lowest(domain: dict) -> float:
    return float(domain["values"][0]) if domain.get("kind") == "finite" else float(domain.get("min", 0.0))


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
        error=row.error, num_train_examples=row.num_train_examples, seconds=row.seconds, device=row.device,
        created_at=row.created_at, request=request)


def stored_request(request: schemas.JobRequest) -> dict:
    """What a job record keeps of its request: everything but the api key (a resume rebuilds the request)."""
    return request.model_dump(mode="json", exclude={"api_key"})


def _job_row(session: Session, principal: Principal, job_id: str, *, lock: bool = False) -> db.Job:
    row = session.get(db.Job, job_id, with_for_update=lock)
    if row is None or row.org_id != principal.org_id:
        raise _not_found("job")
    return row


def create_job(ctx: TrainerContext, principal: Principal, request: schemas.JobRequest) -> schemas.JobView:
    from features_party import jobs

    plan = plan_job(ctx, principal, request)
    with ctx.sessions() as session, session.begin():
        row = db.Job(org_id=principal.org_id, status="queued", labels_party=plan.labels_party,
                     dataset_id=request.dataset_id, request_json=json.dumps(stored_request(request)))
        session.add(row)
        session.flush()
        job_id = row.id
    try:
        jobs.start(ctx, job_id, plan)
    except LabelDPError:
        with ctx.sessions() as session, session.begin():  # refused: nothing was spent, nothing is kept
            session.delete(session.get(db.Job, job_id))
        raise
    return get_job(ctx, principal, job_id)


def resume_job(ctx: TrainerContext, principal: Principal, job_id: str, api_key: str) -> schemas.JobView:
    from features_party import jobs

    with ctx.sessions() as session, session.begin():
        row = _job_row(session, principal, job_id, lock=True)
        if row.status != "interrupted":
            raise LabelDPError(f"job is {row.status}; only interrupted jobs resume", code="job_not_resumable")
        stored = json.loads(row.request_json)
        row.status, row.error, row.updated_at = "queued", None, db.utcnow()
    request = schemas.JobRequest(**stored, api_key=api_key)
    try:
        jobs.start(ctx, job_id, plan_job(ctx, principal, request), resume=True)
    except LabelDPError:
        with ctx.sessions() as session, session.begin():
            session.get(db.Job, job_id).status = "interrupted"
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
        return Path(row.model_file if kind == "model" else row.predictions_file)


def configured_host(url: str) -> str:
    return urlsplit(url).netloc
