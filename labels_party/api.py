"""The labels-party HTTP API (FastAPI): thin routers over :mod:`labels_party.service` and
:mod:`labels_party.releases`.

Every route under ``/v1`` is guarded *before any body is read*: :class:`Gatekeeper` authenticates the key (401),
checks that it may see the dataset a path names (404, the same as for a dataset that does not exist) and that it
may administer it where the route needs that (403), and only then lets the route read a body — limited per
endpoint (413) and, for columnar bodies, streamed to disk and hashed on the way. Errors are always JSON
``{"error": {"code", "message"}}`` with a 4xx status documented in the OpenAPI; unexpected failures answer 500
with no stack trace.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from labels_party import documents, releases, service
from labels_party.auth import Principal, authenticate
from labels_party.service import ServiceContext
from labels_party.uploads import upload_format
from shared import schemas
from shared.service import gate, openapi, tables
from shared.service.errors import install_error_handlers

log = logging.getLogger("labeldp.labels")

_DATASET_PATH = re.compile(r"^/v1/datasets/([^/]+)(/[^/]+)?$")
_ADMIN_ONLY = {("PUT", "/labels"), ("POST", "/grants")}
_COLUMNAR = ("/prior-releases", "/group-releases")

Auth = Annotated[Principal, Depends(gate.principal)]
IdempotencyKey = Annotated[str, Header(min_length=1, max_length=200, description=(
    "required: one key per logical release, reused on every retry (per organization): a retry returns the stored "
    "release, never a second draw or charge"))]


def _authorizer(ctx: ServiceContext):
    """The gatekeeper's check: the key (401), the dataset a path names is visible to it (404), and it may
    administer it where the route needs that (403) — before any body is read."""

    def authorize(method: str, path: str, authorization: str) -> Principal:
        with ctx.sessions() as session, session.begin():
            principal = authenticate(session, authorization or None)
            match = _DATASET_PATH.match(path)
            if match:
                service.accessible_dataset(session, principal, match.group(1),
                                           admin=(method, match.group(2) or "") in _ADMIN_ONLY)
            return principal

    return authorize


def _body_limit(ctx: ServiceContext):
    def limit(method: str, path: str) -> int:
        settings = ctx.settings
        if method == "PUT" and path.endswith("/labels"):
            return settings.max_upload_bytes
        if path.endswith(_COLUMNAR):
            return settings.max_columnar_bytes
        return settings.max_json_bytes

    return limit


def create_app(ctx: ServiceContext) -> FastAPI:
    app = FastAPI(title="labeldp labels party", version="1", docs_url="/docs", openapi_url="/openapi.json",
                  responses=openapi.error_responses())
    app.state.ctx = ctx
    app.add_middleware(gate.Gatekeeper, authorize=_authorizer(ctx), limit=_body_limit(ctx))
    install_error_handlers(app, log)
    settings = ctx.settings

    def created(result: tuple[schemas.Release, bool]) -> JSONResponse:
        release, is_new = result
        return JSONResponse(release.model_dump(mode="json"), status_code=201 if is_new else 200)

    async def with_body(request: Request, limit: int, run) -> JSONResponse:
        upload_format(request.headers.get("content-type"))  # 415 before a byte is read
        directory, body = await gate.spool(request, limit)
        with directory:
            return created(await run_in_threadpool(run, body))

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/v1/datasets", status_code=201, response_model=schemas.Dataset)
    def create_dataset(body: schemas.DatasetCreate, who: Auth):
        return service.create_dataset(ctx, who, body)

    @app.get("/v1/datasets", response_model=list[schemas.Dataset])
    def list_datasets(who: Auth):
        return service.list_datasets(ctx, who)

    @app.get("/v1/datasets/{dataset_id}", response_model=schemas.Dataset)
    def get_dataset(dataset_id: str, who: Auth):
        return service.get_dataset(ctx, who, dataset_id)

    @app.put("/v1/datasets/{dataset_id}/labels", response_model=schemas.UploadResult,
             openapi_extra=openapi.columnar_body())
    async def upload_labels(dataset_id: str, request: Request, who: Auth):
        """A new label version: ``example_id,label`` as CSV, NDJSON or Parquet, streamed."""
        fmt = upload_format(request.headers.get("content-type"))
        directory, body = await gate.spool(request, settings.max_upload_bytes)
        with directory:
            return await run_in_threadpool(service.upload_labels, ctx, who, dataset_id, body.path, fmt)

    @app.post("/v1/datasets/{dataset_id}/grants", status_code=201, response_model=schemas.Grant)
    def grant(dataset_id: str, body: schemas.GrantCreate, who: Auth):
        return service.grant_access(ctx, who, dataset_id, body.org)

    @app.get("/v1/datasets/{dataset_id}/budget", response_model=schemas.Budget)
    def budget(dataset_id: str, who: Auth):
        return service.budget(ctx, who, dataset_id)

    @app.post("/v1/datasets/{dataset_id}/releases", status_code=201, response_model=schemas.Release)
    def create_release(dataset_id: str, body: schemas.ReleaseRequest, who: Auth, idempotency_key: IdempotencyKey):
        return created(releases.release_labels(ctx, who, dataset_id, body, idempotency_key))

    @app.get("/v1/datasets/{dataset_id}/releases", response_model=list[schemas.Release])
    def list_releases(dataset_id: str, who: Auth):
        """A consumer's own organization's releases of the dataset; the owner's admins see all of them."""
        return releases.list_releases(ctx, who, dataset_id)

    @app.post("/v1/datasets/{dataset_id}/prior-releases", status_code=201, response_model=schemas.Release,
              openapi_extra=openapi.columnar_body())
    async def create_prior_release(dataset_id: str, request: Request, who: Auth,
                                   epsilon: Annotated[schemas.Epsilon, Query()], idempotency_key: IdempotencyKey):
        """RRWithPrior with one prior per example, sent as a columnar body (Parquet; CSV or NDJSON also work):
        example_id, p_0..p_{K-1}. The priors must come from features only (e.g. a model trained on earlier,
        already-private stages)."""
        return await with_body(request, settings.max_columnar_bytes, lambda body: releases.release_with_example_priors(
            ctx, who, dataset_id, epsilon, body, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/group-releases", status_code=201, response_model=schemas.Release,
              openapi_extra=openapi.columnar_body())
    async def create_group_release(dataset_id: str, request: Request, who: Auth,
                                   mechanism: Annotated[str, Query()],
                                   epsilon: Annotated[schemas.Epsilon, Query()],
                                   prior_epsilon: Annotated[schemas.Epsilon, Query()],
                                   idempotency_key: IdempotencyKey):
        """One private prior and one randomizer per group; the body (Parquet, CSV or NDJSON) has example_id and
        group, computed from features only (e.g. k-means clusters)."""
        return await with_body(request, settings.max_columnar_bytes, lambda body: releases.release_by_group(
            ctx, who, dataset_id, mechanism, epsilon, prior_epsilon, body, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/central-trainings", status_code=201, response_model=schemas.Release)
    def create_central_training(dataset_id: str, body: schemas.CentralTrainingRequest, who: Auth,
                                idempotency_key: IdempotencyKey):
        """LabelDP-Pro at the labels party on the caller's features; only the trained parameters come back (in
        the mechanism document, ``description.parameters``). Refused unless the dataset owner enabled central
        training."""
        return created(releases.central_training(ctx, who, dataset_id, body, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/evaluations", status_code=201, response_model=schemas.Release)
    def create_evaluation(dataset_id: str, body: schemas.EvaluationRequest, who: Auth,
                          idempotency_key: IdempotencyKey):
        """Test loss of the caller's predictions on true labels, discrete-Laplace-noised and charged to those
        examples; the result is in ``description.value`` (with ``noise_scale``, ``ci95_low`` and ``ci95_high``)."""
        return created(releases.evaluate_predictions(ctx, who, dataset_id, body, idempotency_key))

    @app.get("/v1/releases/{release_id}", response_model=schemas.Release)
    def get_release(release_id: str, who: Auth):
        return releases.get_release(ctx, who, release_id)[0]

    @app.get("/v1/releases/{release_id}/labels", responses=openapi.table_download())
    def download(release_id: str, who: Auth, accept: Annotated[str | None, Header()] = None,
                 offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000):
        """The privatized labels (``example_id, label``, or ``example_id`` and ``in_class_k`` columns for label
        sets, which JSON and NDJSON show as ``label_set``)."""
        _, file = releases.get_release(ctx, who, release_id)
        return tables.table_response(ctx.store.path(file), accept, offset, limit, release_id, _rows)

    @app.get("/v1/mechanisms/{mechanism_hash}", responses={200: {"content": {
        "application/json": {}, documents.BINARY_MEDIA_TYPE: {}}}})
    def mechanism_document(mechanism_hash: str, who: Auth, accept: Annotated[str | None, Header()] = None):
        """The full public description a release references (``mechanism_hash``): output values, exact
        probabilities, the noisy prior, model parameters. JSON, or with ``Accept:
        application/vnd.labeldp.mechanism+npz`` a compact ``.npz`` whose arrays are the document's numeric lists."""
        document = releases.get_mechanism_document(ctx, who, mechanism_hash)
        if accept and documents.BINARY_MEDIA_TYPE in accept:
            return Response(documents.pack(document), media_type=documents.BINARY_MEDIA_TYPE)
        return JSONResponse(document)

    @app.get("/v1/audit", response_model=schemas.Audit)
    def audit(who: Auth, dataset: str | None = None):
        return service.audit(ctx, who, dataset)

    app.openapi = lambda: _openapi_with_epsilon_range(app, settings.epsilon_min, settings.epsilon_max)
    return app


def _openapi_with_epsilon_range(app: FastAPI, low: float, high: float) -> dict:
    """The generated OpenAPI, with this deployment's ε range on every ε a request carries (schemas and query
    parameters), so generated clients and fuzzers know it."""
    if app.openapi_schema is None:
        spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for model in ("ReleaseRequest", "EvaluationRequest", "CentralTrainingRequest"):
            for name, prop in spec["components"]["schemas"][model]["properties"].items():
                if name in ("epsilon", "prior_epsilon"):
                    for option in prop.get("anyOf", [prop]):
                        if option.get("type") == "number":
                            option.update(minimum=low, maximum=high)
        for path in spec["paths"].values():
            for operation in path.values():
                for parameter in operation.get("parameters", []):
                    if parameter["name"] in ("epsilon", "prior_epsilon"):
                        parameter["schema"].update(minimum=low, maximum=high)
        app.openapi_schema = spec
    return app.openapi_schema


def _rows(batch) -> list[dict]:
    names = batch.schema.names
    if "label" in names:
        return batch.to_pylist()
    ids = batch.column("example_id").to_pylist()
    sets = [batch.column(n).to_pylist() for n in names if n.startswith("in_class_")]
    return [{"example_id": ids[i], "label_set": [k for k, col in enumerate(sets) if col[i]]}
            for i in range(len(ids))]
