"""Training jobs: create, list, read, resume, and their model and predictions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import FileResponse

from features_party import schemas, service
from features_party.routers.deps import AnyKey, Context
from shared.service import openapi, tables
from shared.service.gate import GuardedRoute

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=GuardedRoute)
JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
IdempotencyKey = Annotated[str | None, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$", description=(
    "optional, 1-200 printable ASCII characters without spaces: one key per logical job, sent again with every "
    "retry of the request (keys are per organization). The same key with the same request (its api_key aside) "
    "answers the job it created (200), never a second job or a second charge; with another request, 409 "
    "idempotency_key_reused"))]


@router.post("", status_code=202, response_model=schemas.JobView, responses={
    202: {"description": "the job, accepted: `queued` (its release granted; the training runs on the trainer's "
                         "workers), or `interrupted` when the labels party's answer to the release request did not "
                         "come (unreachable, a 5xx, lost on the way): the job asks again by itself after a while "
                         "with the same release Idempotency-Key, so it is charged at most once"},
    200: {"model": schemas.JobView, "description": "an earlier request with this Idempotency-Key and the same "
                                                   "request: its job as it is now"}})
def create_job(body: schemas.JobRequest, who: AnyKey, ctx: Context, response: Response,
               idempotency_key: IdempotencyKey = None):
    """Plan the job completely (features, columns, options, its size and rows to train on, the labels party's
    dataset against the loss, the mechanism and the protocol), request the release (its Idempotency-Key is the job
    id), then train on the trainer's workers. A job that cannot run is a 4xx before any ε is spent, and is not kept;
    a refused release is a 4xx too. A job without ``release.example_ids`` asks for the ids of its features table
    (ids the dataset lacks: refused by count, nothing spent), less those its ``split`` holds out: either
    ``{"holdout_fraction": f, "seed": s}``, the rows whose SHA-256 of ``"{s}:{example_id}"`` (first 8 bytes,
    big-endian, top 53 bits / 2⁵³) is below f — a public rule anyone can compute (``shared.splits.holdout_mask``) —
    or ``{"holdout_ids": name}``, the ids of an id list uploaded once (``PUT /v1/id-lists/{name}``), pinned to the
    version read (the job's ``split.sha256``: a list replaced since makes its attempts and resumes 409
    id_list_changed). A split with ``release.example_ids`` or a split that leaves too few rows to train on is a 400,
    an unknown id list a 404, a ``split.sha256`` that is not the list's a 409, before anything is asked of the
    labels party. Send an ``Idempotency-Key`` to be able to resend the request when its
    answer is lost."""
    view, created = service.create_job(ctx, who.principal, body, idempotency_key)
    if not created:
        response.status_code = 200
    return view


@router.get("", response_model=list[schemas.JobView])
def list_jobs(who: AnyKey, ctx: Context):
    return service.list_jobs(ctx, who.principal)


@router.get("/{job_id}", response_model=schemas.JobView)
def get_job(job_id: JobId, who: AnyKey, ctx: Context):
    return service.get_job(ctx, who.principal, job_id)


@router.post("/{job_id}/resume", status_code=202, response_model=schemas.JobView)
def resume_job(job_id: JobId, body: schemas.ResumeRequest, who: AnyKey, ctx: Context):
    """Queue an interrupted job again with the labels-party api_key (sealed again until the job ends): one whose
    sealed key could not be opened (error_code secret_key_missing), or one waiting to ask its labels party again.
    Its releases are reused (same Idempotency-Keys), not drawn or charged again."""
    return service.resume_job(ctx, who.principal, job_id, body.api_key)


@router.get("/{job_id}/model", responses={200: {"content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "application/json": {"schema": {"type": "object"}}}, "description": (
        "the model: the MLP's .npz (`application/octet-stream`), or for `train.model` gbdt XGBoost's JSON model "
        "(`application/json`; `xgboost.Booster(model_file=...)` loads it, its `labeldp` attribute holds the "
        "preprocessing, loss and history). `labeldp predict --model` takes either")}})
def get_model(job_id: JobId, who: AnyKey, ctx: Context):
    path = service.job_file(ctx, who.principal, job_id, "model")
    media_type = "application/json" if path.suffix == ".json" else "application/octet-stream"
    return FileResponse(path, media_type=media_type, filename=f"{job_id}{path.suffix}")


@router.get("/{job_id}/predictions", responses=openapi.table_download())
def predictions(job_id: JobId, request: Request, who: AnyKey, ctx: Context,
                offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000):
    """Predictions for every row of the job's features table: ``example_id, prediction[, p_class_k…], holdout``
    (``holdout``: true for the rows the job's split held out of training, its test rows; false everywhere for a job
    without a split), in the media type ``Accept`` asks for."""
    path = service.job_file(ctx, who.principal, job_id, "predictions")
    return tables.table_response(tables.PlainTable(path), request.headers.get("accept"), offset, limit,
                                 f"{job_id}-predictions")
