"""The labels-party HTTP API (FastAPI): thin routers over :mod:`labels_party.service`.

Errors are always JSON ``{"error": {"code", "message"}}`` with a 4xx status for bad input; unexpected failures
answer 500 with no stack trace.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from labels_party import releases, service
from labels_party.auth import Principal, authenticate
from labels_party.service import ServiceContext
from labels_party.uploads import upload_format
from shared import schemas
from shared.errors import LabelDPError
from shared.http_errors import error_response, install_error_handlers
from shared.privacy import EPSILON_MAX, EPSILON_MIN

log = logging.getLogger("labeldp.labels")

STATUS = {"dataset_exists": 409, "no_labels": 409, "central_training_disabled": 403}
MAX_JSON_BYTES = 64 << 20


class BodyLimit:
    """Refuse bodies over the limit (413) whether or not they declare a Content-Length. Label uploads get the
    large limit; every other request is JSON and gets a small one."""

    def __init__(self, app, *, json_limit: int, upload_limit: int):
        self.app, self.json_limit, self.upload_limit = app, json_limit, upload_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = (scope["method"] == "PUT" and scope["path"].endswith("/labels")) or \
            scope["path"].endswith(("/prior-releases", "/group-releases"))
        limit = self.upload_limit if upload else self.json_limit
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            response = error_response(413, "body_too_large", f"request body over {limit} bytes")
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Routes that parse JSON wrap this in a generic 400; the flag lets the handler say 413.
                    scope.setdefault("state", {})["body_too_large"] = True
                    raise LabelDPError(f"request body over {limit} bytes", code="body_too_large")
            return message

        return await self.app(scope, limited_receive, send)


def _principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    with request.app.state.ctx.sessions() as session, session.begin():
        return authenticate(session, authorization)


Auth = Annotated[Principal, Depends(_principal)]


def create_app(ctx: ServiceContext, *, max_upload_bytes: int = 4 << 30) -> FastAPI:
    app = FastAPI(title="labeldp labels party", version="1", docs_url="/docs", openapi_url="/openapi.json")
    app.state.ctx = ctx
    app.add_middleware(BodyLimit, json_limit=MAX_JSON_BYTES, upload_limit=max_upload_bytes)

    install_error_handlers(app, STATUS, log)

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
        fmt = upload_format(request.headers.get("content-type"))
        with tempfile.TemporaryDirectory(prefix="labeldp-upload-") as tmp:
            path = Path(tmp) / "body"
            size = 0
            with open(path, "wb") as handle:  # spool to disk: memory stays bounded whatever the body size
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > max_upload_bytes:
                        raise LabelDPError(f"upload over {max_upload_bytes} bytes", code="body_too_large")
                    handle.write(chunk)
            return await run_in_threadpool(service.upload_labels, ctx, who, dataset_id, path, fmt)

    @app.post("/v1/datasets/{dataset_id}/grants", status_code=201, response_model=schemas.Grant)
    def grant(dataset_id: str, body: schemas.GrantCreate, who: Auth):
        return service.grant_access(ctx, who, dataset_id, body.org)

    @app.get("/v1/datasets/{dataset_id}/budget", response_model=schemas.Budget)
    def budget(dataset_id: str, who: Auth):
        return service.budget(ctx, who, dataset_id)

    @app.post("/v1/datasets/{dataset_id}/releases", status_code=201, response_model=schemas.Release)
    def create_release(dataset_id: str, body: schemas.ReleaseRequest, who: Auth,
                       idempotency_key: Annotated[str | None, Header()] = None):
        release, created = releases.release_labels(ctx, who, dataset_id, body, idempotency_key)
        return JSONResponse(release.model_dump(mode="json"), status_code=201 if created else 200)

    @app.post("/v1/datasets/{dataset_id}/prior-releases", status_code=201, response_model=schemas.Release)
    async def create_prior_release(dataset_id: str, request: Request, who: Auth,
                                   epsilon: Annotated[float, Query(ge=EPSILON_MIN, le=EPSILON_MAX)],
                                   idempotency_key: Annotated[str | None, Header()] = None):
        """RRWithPrior with one prior per example, sent as a columnar body (Parquet; CSV or NDJSON also work):
        example_id, p_0..p_{K-1}. The priors must come from features only (e.g. a model trained on earlier,
        already-private stages)."""
        return await _with_spooled_body(request, lambda path, fmt: releases.release_with_example_priors(
            ctx, who, dataset_id, epsilon, path, fmt, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/group-releases", status_code=201, response_model=schemas.Release)
    async def create_group_release(dataset_id: str, request: Request, who: Auth,
                                   mechanism: Annotated[str, Query()],
                                   epsilon: Annotated[float, Query(ge=EPSILON_MIN, le=EPSILON_MAX)],
                                   prior_epsilon: Annotated[float, Query(ge=EPSILON_MIN, le=EPSILON_MAX)],
                                   idempotency_key: Annotated[str | None, Header()] = None):
        """One private prior and one randomizer per group; the body (Parquet, CSV or NDJSON) has example_id and
        group, computed from features only (e.g. k-means clusters)."""
        return await _with_spooled_body(request, lambda path, fmt: releases.release_by_group(
            ctx, who, dataset_id, mechanism, epsilon, prior_epsilon, path, fmt, idempotency_key))

    @app.post("/v1/datasets/{dataset_id}/central-trainings", status_code=201, response_model=schemas.Release)
    def create_central_training(dataset_id: str, body: schemas.CentralTrainingRequest, who: Auth,
                                idempotency_key: Annotated[str | None, Header()] = None):
        """LabelDP-Pro at the labels party on the caller's features; only the trained parameters come back
        (``description.parameters``). Refused unless the dataset owner enabled central training."""
        release, created = releases.central_training(ctx, who, dataset_id, body, idempotency_key)
        return JSONResponse(release.model_dump(mode="json"), status_code=201 if created else 200)

    @app.post("/v1/datasets/{dataset_id}/evaluations", status_code=201, response_model=schemas.Release)
    def create_evaluation(dataset_id: str, body: schemas.EvaluationRequest, who: Auth,
                          idempotency_key: Annotated[str | None, Header()] = None):
        """Test loss of the caller's predictions on true labels, discrete-Laplace-noised and charged to those examples;
        the result is in ``description.value`` (with ``noise_scale`` and ``ci95``)."""
        release, created = releases.evaluate_predictions(ctx, who, dataset_id, body, idempotency_key)
        return JSONResponse(release.model_dump(mode="json"), status_code=201 if created else 200)

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

    @app.get("/v1/audit", response_model=schemas.Audit)
    def audit(who: Auth, dataset: str | None = None):
        return service.audit(ctx, who, dataset)

    return app


async def _with_spooled_body(request: Request, release) -> JSONResponse:
    """Stream a columnar body to a temporary file (bounded memory), then run ``release(path, fmt)`` off the event
    loop; 201 for a new release, 200 for an idempotent retry."""
    fmt = upload_format(request.headers.get("content-type"))
    with tempfile.TemporaryDirectory(prefix="labeldp-body-") as tmp:
        path = Path(tmp) / "body"
        with open(path, "wb") as handle:
            async for chunk in request.stream():
                handle.write(chunk)
        created_release, created = await run_in_threadpool(release, path, fmt)
    return JSONResponse(created_release.model_dump(mode="json"), status_code=201 if created else 200)


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
