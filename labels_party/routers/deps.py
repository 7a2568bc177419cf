"""What the labels party's routers share: the principal, the context, the Idempotency-Key header, and the
answer to a request that creates a release (201, or 200 when an earlier request with its key is replayed)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from labels_party.auth import Principal
from labels_party.context import ServiceContext
from labels_party.uploads import upload_format
from shared import schemas
from shared.service import dependencies, gate

Auth = Annotated[Principal, Depends(dependencies.principal)]
Context = Annotated[ServiceContext, Depends(dependencies.context)]
IdempotencyKey = Annotated[str, Header(min_length=1, max_length=200, description=(
    "required: one key per logical release, reused on every retry (per organization): a retry returns the stored "
    "release, never a second draw or charge"))]

# ``responses=`` of a route that creates a release: the replay of an earlier request is a 200.
REPLAYABLE = {200: {"model": schemas.Release,
                    "description": "an earlier request with this Idempotency-Key and body: the stored release"}}


def created(result: tuple[schemas.Release, bool]) -> JSONResponse:
    release, is_new = result
    return JSONResponse(release.model_dump(mode="json"), status_code=201 if is_new else 200)


async def with_columnar_body(request: Request, ctx: ServiceContext, run) -> JSONResponse:
    """Spool a CSV/NDJSON/Parquet body (415 before a byte is read) and create a release from it."""
    upload_format(request.headers.get("content-type"))
    directory, body = await gate.spool(request, ctx.settings.max_columnar_bytes, ctx.scratch.spools)
    with directory:
        return created(await run_in_threadpool(run, body))
