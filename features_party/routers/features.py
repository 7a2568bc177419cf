"""Features tables: upload (admin keys), list, read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool

from features_party import schemas, service
from features_party.routers.deps import Auth, Context
from shared.errors import LabelDPError
from shared.service import gate

router = APIRouter(prefix="/v1/features", tags=["features"])
TableName = Annotated[str, Path(pattern=schemas.NAME_PATTERN, description="letters, digits, '-' and '_'")]
_CSV_BODY = {"requestBody": {"required": True, "content": {"text/csv": {"schema": {"type": "string",
                                                                                  "format": "binary"}}}}}


@router.put("/{name}", response_model=schemas.FeatureTableView, openapi_extra=_CSV_BODY)
async def upload_features(name: TableName, request: Request, who: Auth, ctx: Context):
    """A features table: CSV with an ``example_id`` column and unique ids (replaces a table of that name;
    admin keys)."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media != "text/csv":
        raise LabelDPError(f"features are uploaded as text/csv, not {media or '(none)'!r}",
                           code="unsupported_media_type")
    directory, body = await gate.spool(request, ctx.settings.max_features_bytes, ctx.scratch.spools)
    with directory:
        return await run_in_threadpool(service.upload_features, ctx, who, name, body.path)


@router.get("", response_model=list[schemas.FeatureTableView])
def list_features(who: Auth, ctx: Context):
    return service.list_features(ctx, who)


@router.get("/{name}", response_model=schemas.FeatureTableView)
def get_features(name: TableName, who: Auth, ctx: Context):
    return service.get_features(ctx, who, name)
