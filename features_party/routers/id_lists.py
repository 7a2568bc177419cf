"""Id lists: upload and delete (any key of the organization), list, read — never their ids."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from features_party import id_lists, schemas
from features_party.routers.deps import CSV_BODY, AnyKey, Context, UploadsIdList, require_csv
from shared.service import spool
from shared.service.gate import GuardedRoute

router = APIRouter(prefix="/v1/id-lists", tags=["id lists"], route_class=GuardedRoute)
ListName = Annotated[str, Path(pattern=schemas.NAME_PATTERN, description="letters, digits, '-' and '_'")]


@router.put("/{name}", response_model=schemas.IdListView, openapi_extra=CSV_BODY)
async def upload_id_list(name: ListName, request: Request, who: UploadsIdList, ctx: Context):
    """An id list: CSV with one column, ``example_id``, and unique ids (replaces a list of that name), at most
    ``max_id_list_bytes`` (413) and ``max_id_lists_per_org`` lists (a new one beyond: 409 too_many_id_lists). Jobs
    name it as ``split: {"holdout_ids": name}`` to hold those rows out of training; a job pins the version it was
    created with (``sha256``), so replacing a list makes its jobs that run again fail with id_list_changed."""
    require_csv(request, "id lists")
    async with spool.spooled(request, who.body_limit, ctx.scratch) as body:
        return await run_in_threadpool(id_lists.upload, ctx, who.principal, name, body.path)


@router.get("", response_model=list[schemas.IdListView])
def list_id_lists(who: AnyKey, ctx: Context):
    return id_lists.list_all(ctx, who.principal)


@router.get("/{name}", response_model=schemas.IdListView)
def get_id_list(name: ListName, who: AnyKey, ctx: Context):
    """The list's name, size and time of upload (never its ids)."""
    return id_lists.get(ctx, who.principal, name)


@router.delete("/{name}", status_code=204, response_class=Response)
def delete_id_list(name: ListName, who: AnyKey, ctx: Context):
    """Removes the list (404 for none of that name in this organization); jobs created with it that run again fail
    with id_list_changed."""
    id_lists.delete(ctx, who.principal, name)
    return Response(status_code=204)
