"""Features tables: upload (admin keys), list, read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool

from features_party import schemas, service
from features_party.routers.deps import AnyKey, Context, UploadsFeatures
from shared.errors import LabelDPError
from shared.service import gate
from shared.service.gate import GuardedRoute

router = APIRouter(prefix="/v1/features", tags=["features"], route_class=GuardedRoute)
TableName = Annotated[str, Path(pattern=schemas.NAME_PATTERN, description="letters, digits, '-' and '_'")]
_CSV_BODY = {"requestBody": {"required": True, "content": {"text/csv": {"schema": {"type": "string",
                                                                                  "format": "binary"}}}}}


@router.put("/{name}", response_model=schemas.FeatureTableView, openapi_extra=_CSV_BODY)
async def upload_features(name: TableName, request: Request, who: UploadsFeatures, ctx: Context):
    """A features table: CSV with an ``example_id`` column and unique ids (replaces a table of that name;
    admin keys)."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media != "text/csv":
        raise LabelDPError(f"features are uploaded as text/csv, not {media or '(none)'!r}",
                           code="unsupported_media_type")
    directory, body = await gate.spool(request, who.body_limit, ctx.scratch.spools)
    with directory:
        return await run_in_threadpool(service.upload_features, ctx, who.principal, name, body.path)


@router.get("", response_model=list[schemas.FeatureTableView])
def list_features(who: AnyKey, ctx: Context):
    return service.list_features(ctx, who.principal)


@router.get("/{name}", response_model=schemas.FeatureTableView)
def get_features(name: TableName, who: AnyKey, ctx: Context):
    return service.get_features(ctx, who.principal, name)
