"""What the labels party's routers share: the admissions their guards declare (:mod:`labels_party.http.access`, decided
by the gatekeeper before any body is read), the context, the Idempotency-Key header, and the answer to a request
that creates a release (201, or 200 when an earlier request with its key is replayed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from labels_party.http import access
from labels_party.http.access import Admission
from labels_party.releases.lifecycle import Outcome
from labels_party.runtime.context import ServiceContext
from labels_party.store.uploads import upload_format
from shared import schemas
from shared.service import dependencies, spool
from shared.service.budgets import Reservation, release_freed_memory
from shared.service.spool import SpooledBody

AnyKey = Annotated[Admission, Depends(access.ANY_KEY)]
AdminKey = Annotated[Admission, Depends(access.ADMIN_KEY)]
SeesDataset = Annotated[Admission, Depends(access.SEE_DATASET)]
SeesDatasetColumnar = Annotated[Admission, Depends(access.SEE_DATASET_COLUMNAR)]
AdministersDataset = Annotated[Admission, Depends(access.ADMINISTER_DATASET)]
UploadsLabels = Annotated[Admission, Depends(access.UPLOAD_LABELS)]
Context = Annotated[ServiceContext, Depends(dependencies.context)]
IdempotencyKey = Annotated[str, Header(min_length=1, max_length=200, description=(
    "required: one key per logical release, reused on every retry (per organization): a retry returns the stored "
    "release, never a second draw or charge"))]

# ``responses=`` of a route that creates a release: the replay of an earlier request is a 200.
REPLAYABLE: dict[int | str, dict[str, Any]] = {200: {"model": schemas.Release,
                    "description": "an earlier request with this Idempotency-Key and body: the stored release"}}


def answer(outcome: Outcome) -> JSONResponse:
    """A release request's answer: 201 created, 200 a replay, 202 a job running (with its Location)."""
    headers = {"Location": outcome.location} if outcome.location else None
    return JSONResponse(outcome.release.model_dump(mode="json"), status_code=outcome.status, headers=headers)


async def with_columnar_body(request: Request, ctx: ServiceContext, admission: Admission,
                             run: Callable[[SpooledBody, Reservation], Outcome]) -> JSONResponse:
    """Spool a CSV/NDJSON/Parquet body (415 before a byte is read) and create a release from it, ``run(body,
    memory)``: what the body decodes to is held in ``memory``, the request's share of the process's budget for such
    bodies (its organization's at most three quarters of it), until the release is done."""
    upload_format(request.headers.get("content-type"))
    async with spool.spooled(request, admission.body_limit, ctx.scratch) as body:
        with ctx.columnar_memory.reservation(admission.principal.org_id) as memory:
            try:
                return answer(await run_in_threadpool(run, body, memory))
            finally:  # its ids and priors are gone: what held them goes back to the system, whatever the outcome
                await run_in_threadpool(release_freed_memory)
