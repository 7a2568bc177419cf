"""The features-party trainer service (FastAPI), on the service skeleton of :mod:`shared.service`: routers per
resource (features tables, jobs) over :mod:`features_party.service`.

Every route under ``/v1`` needs a trainer API key, checked before any body is read; features tables, jobs, models
and predictions belong to the key's organization (others get 404). The labels parties a job may use are the
trainer's configuration (``--labels-party NAME=URL``); a job names one, never a URL.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from features_party import schemas, service
from features_party.auth import Principal, authenticate
from features_party.service import TrainerContext
from shared.errors import LabelDPError
from shared.service import gate, openapi, tables
from shared.service.errors import install_error_handlers

log = logging.getLogger("labeldp.features")

Auth = Annotated[Principal, Depends(gate.principal)]
TableName = Annotated[str, Path(pattern=schemas.NAME_PATTERN, description="letters, digits, '-' and '_'")]
JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


def features_router(ctx: TrainerContext) -> APIRouter:
    router = APIRouter(prefix="/v1/features", tags=["features"])

    @router.put("/{name}", response_model=schemas.FeatureTableView,
                openapi_extra={"requestBody": {"required": True, "content": {"text/csv": {
                    "schema": {"type": "string", "format": "binary"}}}}})
    async def upload_features(name: TableName, request: Request, who: Auth):
        """A features table: CSV with an ``example_id`` column and unique ids (replaces a table of that name;
        admin keys)."""
        media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if media != "text/csv":
            raise LabelDPError(f"features are uploaded as text/csv, not {media or '(none)'!r}",
                               code="unsupported_media_type")
        directory, body = await gate.spool(request, ctx.settings.max_features_bytes)
        with directory:
            return await run_in_threadpool(service.upload_features, ctx, who, name, body.path)

    @router.get("", response_model=list[schemas.FeatureTableView])
    def list_features(who: Auth):
        return service.list_features(ctx, who)

    @router.get("/{name}", response_model=schemas.FeatureTableView)
    def get_features(name: TableName, who: Auth):
        return service.get_features(ctx, who, name)

    return router


def jobs_router(ctx: TrainerContext) -> APIRouter:
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

    @router.post("", status_code=202, response_model=schemas.JobView)
    def create_job(body: schemas.JobRequest, who: Auth):
        """Plan the job completely (features, columns, options, the labels party's dataset against the loss, the
        mechanism and the protocol), request the release, then train in the background. A job that cannot run is
        a 4xx before any ε is spent; a refused release is a 4xx too."""
        return service.create_job(ctx, who, body)

    @router.get("", response_model=list[schemas.JobView])
    def list_jobs(who: Auth):
        return service.list_jobs(ctx, who)

    @router.get("/{job_id}", response_model=schemas.JobView)
    def get_job(job_id: JobId, who: Auth):
        return service.get_job(ctx, who, job_id)

    @router.post("/{job_id}/resume", status_code=202, response_model=schemas.JobView)
    def resume_job(job_id: JobId, body: schemas.ResumeRequest, who: Auth):
        """Continue a job a restart interrupted, with the labels-party api_key (never stored); its releases are
        reused (same Idempotency-Keys), not drawn or charged again."""
        return service.resume_job(ctx, who, job_id, body.api_key)

    @router.get("/{job_id}/model", responses={200: {"content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"}}}, "description": "the model (.npz)"}})
    def get_model(job_id: JobId, who: Auth):
        path = service.job_file(ctx, who, job_id, "model")
        return FileResponse(path, media_type="application/octet-stream", filename=f"{job_id}.npz")

    @router.get("/{job_id}/predictions", responses=openapi.table_download())
    def predictions(job_id: JobId, who: Auth, accept: Annotated[str | None, Header()] = None,
                    offset: Annotated[int, Query(ge=0)] = 0,
                    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000):
        """Predictions for every row of the job's features table: ``example_id, prediction[, p_class_k…]``."""
        path = service.job_file(ctx, who, job_id, "predictions")
        return tables.table_response(path, accept, offset, limit, f"{job_id}-predictions")

    return router


def _authorizer(ctx: TrainerContext):
    def authorize(_method: str, _path: str, authorization: str) -> Principal:
        with ctx.sessions() as session, session.begin():
            return authenticate(session, authorization or None)

    return authorize


def _body_limit(ctx: TrainerContext):
    def limit(method: str, path: str) -> int:
        if method == "PUT" and path.startswith("/v1/features/"):
            return ctx.settings.max_features_bytes
        return ctx.settings.max_json_bytes

    return limit


def create_app(ctx: TrainerContext) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        ctx.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="labeldp features party (trainer)", version="1", lifespan=lifespan,
                  responses=openapi.error_responses())
    app.state.ctx = ctx
    app.add_middleware(gate.Gatekeeper, authorize=_authorizer(ctx), limit=_body_limit(ctx))
    install_error_handlers(app, log)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    app.include_router(features_router(ctx))
    app.include_router(jobs_router(ctx))
    return app
