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

import hashlib
import json
import logging
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import anyio
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from labels_party import documents, releases, service
from labels_party.auth import Principal, authenticate
from labels_party.service import ServiceContext
from labels_party.uploads import SpooledBody, upload_format
from shared import schemas
from shared.errors import LabelDPError
from shared.http_errors import error_response, install_error_handlers

log = logging.getLogger("labeldp.labels")

STATUS = {"dataset_exists": 409, "no_labels": 409, "central_training_disabled": 403, "solver_timeout": 503}
PUBLIC_PATHS = ("/healthz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")
_DATASET_PATH = re.compile(r"^/v1/datasets/([^/]+)(/[^/]+)?$")
_ADMIN_ONLY = {("PUT", "/labels"), ("POST", "/grants")}
_COLUMNAR = ("/prior-releases", "/group-releases")
ERRORS = {status: {"model": schemas.ErrorBody, "description": description} for status, description in (
    (400, "bad input (code names the problem, e.g. epsilon_out_of_range)"), (401, "missing or invalid API key"),
    (403, "the key may see the dataset but not do this"), (404, "no such object for this key"),
    (409, "budget exceeded, idempotency conflict, no labels yet"), (413, "body over this endpoint's limit"),
    (415, "unsupported content type"), (422, "body does not match the schema"),
    (503, "the solver ran out of time (nothing charged)"))}


class Gatekeeper:
    """ASGI middleware: authentication, dataset authorization and body limits, all before a route reads a byte."""

    def __init__(self, app, *, ctx: ServiceContext):
        self.app, self.ctx = app, ctx

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            principal = await anyio.to_thread.run_sync(self._authorize, scope["method"], scope["path"],
                                                       headers.get(b"authorization", b"").decode("latin-1"))
        except LabelDPError as err:
            status = {"unauthorized": 401, "forbidden": 403, "not_found": 404}[err.code]
            return await error_response(status, err.code, str(err))(scope, receive, send)
        scope.setdefault("state", {})["principal"] = principal
        limit = self._limit(scope["method"], scope["path"])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await error_response(413, "body_too_large", f"request body over {limit} bytes")(
                scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Routes that parse JSON wrap this in a generic 400; the flag lets the handler say 413.
                    scope["state"]["body_too_large"] = True
                    raise LabelDPError(f"request body over {limit} bytes", code="body_too_large")
            return message

        return await self.app(scope, limited_receive, send)

    def _authorize(self, method: str, path: str, authorization: str) -> Principal:
        with self.ctx.sessions() as session, session.begin():
            principal = authenticate(session, authorization or None)
            match = _DATASET_PATH.match(path)
            if match:
                service.accessible_dataset(session, principal, match.group(1),
                                           admin=(method, match.group(2) or "") in _ADMIN_ONLY)
            return principal

    def _limit(self, method: str, path: str) -> int:
        settings = self.ctx.settings
        if method == "PUT" and path.endswith("/labels"):
            return settings.max_upload_bytes
        if path.endswith(_COLUMNAR):
            return settings.max_columnar_bytes
        return settings.max_json_bytes


def _principal(request: Request) -> Principal:
    principal = request.scope.get("state", {}).get("principal")
    if principal is None:  # only routes outside /v1 reach here unguarded, and none of them asks for a principal
        raise LabelDPError("missing bearer API key", code="unauthorized")
    return principal


Auth = Annotated[Principal, Depends(_principal)]


async def spool(request: Request, limit: int) -> tuple[tempfile.TemporaryDirectory, SpooledBody]:
    """Stream the body to a temporary file, hashing it on the way (bounded memory whatever its size)."""
    fmt = upload_format(request.headers.get("content-type"))
    directory = tempfile.TemporaryDirectory(prefix="labeldp-body-")
    path = Path(directory.name) / "body"
    digest, size = hashlib.sha256(), 0
    try:
        with open(path, "wb") as handle:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise LabelDPError(f"request body over {limit} bytes", code="body_too_large")
                digest.update(chunk)
                handle.write(chunk)
    except BaseException:
        directory.cleanup()
        raise
    return directory, SpooledBody(path, fmt, digest.hexdigest(), size)


def create_app(ctx: ServiceContext) -> FastAPI:
    app = FastAPI(title="labeldp labels party", version="1", docs_url="/docs", openapi_url="/openapi.json",
                  responses=ERRORS)
    app.state.ctx = ctx
    app.add_middleware(Gatekeeper, ctx=ctx)
    install_error_handlers(app, STATUS, log)
    settings = ctx.settings

    def created(result: tuple[schemas.Release, bool]) -> JSONResponse:
        release, is_new = result
        return JSONResponse(release.model_dump(mode="json"), status_code=201 if is_new else 200)

    async def with_body(request: Request, limit: int, run) -> JSONResponse:
        directory, body = await spool(request, limit)
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

    @app.put("/v1/datasets/{dataset_id}/labels", response_model=schemas.UploadResult)
    async def upload_labels(dataset_id: str, request: Request, who: Auth):
        directory, body = await spool(request, settings.max_upload_bytes)
        with directory:
            return await run_in_threadpool(service.upload_labels, ctx, who, dataset_id, body.path, body.format)

    @app.post("/v1/datasets/{dataset_id}/grants", status_code=201, response_model=schemas.Grant)
    def grant(dataset_id: str, body: schemas.GrantCreate, who: Auth):
        return service.grant_access(ctx, who, dataset_id, body.org)

    @app.get("/v1/datasets/{dataset_id}/budget", response_model=schemas.Budget)
    def budget(dataset_id: str, who: Auth):
        return service.budget(ctx, who, dataset_id)

    @app.post("/v1/datasets/{dataset_id}/releases", status_code=201, response_model=schemas.Release)
    def create_release(dataset_id: str, body: schemas.ReleaseRequest, who: Auth,
                       idempotency_key: Annotated[str | None, Header()] = None):
        return created(releases.release_labels(ctx, who, dataset_id, body, idempotency_key))

    @app.get("/v1/datasets/{dataset_id}/releases", response_model=list[schemas.Release])
    def list_releases(dataset_id: str, who: Auth):
        """A consumer's own organization's releases of the dataset; the owner's admins see all of them."""
        return releases.list_releases(ctx, who, dataset_id)

    @app.post("/v1/datasets/{dataset_id}/prior-releases", status_code=201, response_model=schemas.Release)
    async def create_prior_release(dataset_id: str, request: Request, who: Auth,
                                   epsilon: Annotated[schemas.Epsilon, Query()],
                                   idempotency_key: Annotated[str | None, Header()] = None):
        """RRWithPrior with one prior per example, sent as a columnar body (Parquet; CSV or NDJSON also work):
        example_id, p_0..p_{K-1}. The priors must come from features only (e.g. a model trained on earlier,
        already-private stages)."""
        return await with_body(request, settings.max_columnar_bytes, lambda body: releases.release_with_example_priors(
            ctx, who, dataset_id, epsilon, body, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/group-releases", status_code=201, response_model=schemas.Release)
    async def create_group_release(dataset_id: str, request: Request, who: Auth,
                                   mechanism: Annotated[str, Query()],
                                   epsilon: Annotated[schemas.Epsilon, Query()],
                                   prior_epsilon: Annotated[schemas.Epsilon, Query()],
                                   idempotency_key: Annotated[str | None, Header()] = None):
        """One private prior and one randomizer per group; the body (Parquet, CSV or NDJSON) has example_id and
        group, computed from features only (e.g. k-means clusters)."""
        return await with_body(request, settings.max_columnar_bytes, lambda body: releases.release_by_group(
            ctx, who, dataset_id, mechanism, epsilon, prior_epsilon, body, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/central-trainings", status_code=201, response_model=schemas.Release)
    def create_central_training(dataset_id: str, body: schemas.CentralTrainingRequest, who: Auth,
                                idempotency_key: Annotated[str | None, Header()] = None):
        """LabelDP-Pro at the labels party on the caller's features; only the trained parameters come back (in
        the mechanism document, ``description.parameters``). Refused unless the dataset owner enabled central
        training."""
        return created(releases.central_training(ctx, who, dataset_id, body, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/evaluations", status_code=201, response_model=schemas.Release)
    def create_evaluation(dataset_id: str, body: schemas.EvaluationRequest, who: Auth,
                          idempotency_key: Annotated[str | None, Header()] = None):
        """Test loss of the caller's predictions on true labels, discrete-Laplace-noised and charged to those
        examples; the result is in ``description.value`` (with ``noise_scale``, ``ci95_low`` and ``ci95_high``)."""
        return created(releases.evaluate_predictions(ctx, who, dataset_id, body, idempotency_key))

    @app.get("/v1/releases/{release_id}", response_model=schemas.Release)
    def get_release(release_id: str, who: Auth):
        return releases.get_release(ctx, who, release_id)[0]

    @app.get("/v1/releases/{release_id}/labels")
    def download(release_id: str, who: Auth, accept: Annotated[str | None, Header()] = None,
                 offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000):
        _, file = releases.get_release(ctx, who, release_id)
        path = ctx.store.path(file)
        media = _negotiate(accept)
        if media == "application/json":
            return _json_page(path, offset, limit)
        stream = {"text/csv": _csv_stream, "application/x-ndjson": _ndjson_stream,
                  "application/vnd.apache.parquet": _parquet_stream}[media](path)
        return StreamingResponse(stream, media_type=media,
                                 headers={"Content-Disposition": f'attachment; filename="{release_id}"'})

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


def _negotiate(accept: str | None) -> str:
    offered = ["text/csv", "application/x-ndjson", "application/vnd.apache.parquet", "application/json"]
    if not accept or "*/*" in accept:
        return "text/csv"
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        media = {"application/parquet": "application/vnd.apache.parquet", "application/ndjson":
                 "application/x-ndjson", "application/jsonl": "application/x-ndjson", "text/*": "text/csv"}.get(
            media, media)
        if media in offered:
            return media
    raise LabelDPError(f"cannot produce {accept!r}; offered: {', '.join(offered)}", code="not_acceptable")


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    yield from pq.ParquetFile(path).iter_batches(batch_size=1 << 16)


def _csv_stream(path: Path) -> Iterator[bytes]:
    first = True
    for batch in _batches(path):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.Table.from_batches([batch]), sink,
                        write_options=pacsv.WriteOptions(include_header=first, quoting_style="needed"))
        first = False
        yield sink.getvalue().to_pybytes()


def _ndjson_stream(path: Path) -> Iterator[bytes]:
    for batch in _batches(path):
        yield ("\n".join(json.dumps(row) for row in _rows(batch)) + "\n").encode()


def _rows(batch: pa.RecordBatch) -> list[dict]:
    names = batch.schema.names
    if "label" in names:
        return batch.to_pylist()
    ids = batch.column("example_id").to_pylist()
    sets = [batch.column(n).to_pylist() for n in names if n.startswith("in_class_")]
    return [{"example_id": ids[i], "label_set": [k for k, col in enumerate(sets) if col[i]]}
            for i in range(len(ids))]


def _parquet_stream(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            yield chunk


def _json_page(path: Path, offset: int, limit: int) -> JSONResponse:
    parquet = pq.ParquetFile(path)
    total = parquet.metadata.num_rows
    table = parquet.read().slice(offset, limit)
    items = _rows(table.combine_chunks().to_batches()[0]) if table.num_rows else []
    next_offset = offset + len(items) if offset + len(items) < total else None
    return JSONResponse({"items": items, "offset": offset, "total": total, "next_offset": next_offset})
