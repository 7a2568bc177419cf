"""Features tables: upload (admin keys), list, read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool

from features_party import schemas, service
from features_party.routers.deps import CSV_BODY, AnyKey, Context, UploadsFeatures, require_csv
from shared.service import spool
from shared.service.gate import GuardedRoute

router = APIRouter(prefix="/v1/features", tags=["features"], route_class=GuardedRoute)
TableName = Annotated[str, Path(pattern=schemas.NAME_PATTERN, description="letters, digits, '-' and '_'")]


@router.put("/{name}", response_model=schemas.FeatureTableView, openapi_extra=CSV_BODY)
async def upload_features(name: TableName, request: Request, who: UploadsFeatures, ctx: Context):
    """A features table: CSV with an ``example_id`` column and unique ids (replaces a table of that name;
    admin keys)."""
    require_csv(request, "features")
    async with spool.spooled(request, who.body_limit, ctx.scratch) as body:
        return await run_in_threadpool(service.upload_features, ctx, who.principal, name, body.path)


@router.get("", response_model=list[schemas.FeatureTableView])
def list_features(who: AnyKey, ctx: Context):
    return service.list_features(ctx, who.principal)


@router.get("/{name}", response_model=schemas.FeatureTableView)
def get_features(name: TableName, who: AnyKey, ctx: Context):
    return service.get_features(ctx, who.principal, name)
