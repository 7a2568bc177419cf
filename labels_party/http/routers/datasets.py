"""Datasets: create, list, read, upload labels, grant access, budget."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from labels_party.http.routers.deps import AdministersDataset, AdminKey, AnyKey, Context, SeesDataset, UploadsLabels
from labels_party.releases import datasets
from labels_party.store.uploads import upload_format
from shared import schemas
from shared.service import openapi, spool
from shared.service.gate import GuardedRoute

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=GuardedRoute)


@router.post("", status_code=201, response_model=schemas.Dataset, responses={202: {
    "model": schemas.Dataset, "description": (
        "a source dataset (``source``): created ``registering``; a job copies and counts the source. Poll the "
        "Location until ``state`` is ``ready`` (or ``failed``: ``error`` says why, to the owner's admins)")}})
def create_dataset(body: schemas.DatasetCreate, who: AdminKey, ctx: Context):
    """A dataset and its per-example budget (admin keys); the fields its domain needs depend on ``label_kind``.
    With ``source`` (a Parquet location the operator allowed the organization), 202: the source is copied and
    counted by a job, and releases are refused (409 ``dataset_not_ready``) until the dataset is ``ready``; sent
    again after a failed registration, the same request registers it again."""
    view = datasets.create_dataset(ctx, who.principal, body)
    if view.state == "ready":
        return view
    return JSONResponse(view.model_dump(mode="json"), status_code=202,
                        headers={"Location": f"/v1/datasets/{view.id}"})


@router.get("", response_model=list[schemas.Dataset])
def list_datasets(who: AnyKey, ctx: Context):
    return datasets.list_datasets(ctx, who.principal)


@router.get("/{dataset_id}", response_model=schemas.Dataset)
def get_dataset(dataset_id: str, who: SeesDataset, ctx: Context):
    return datasets.get_dataset(ctx, who)


@router.put("/{dataset_id}/labels", response_model=schemas.UploadResult, openapi_extra=openapi.columnar_body())
async def upload_labels(dataset_id: str, request: Request, who: UploadsLabels, ctx: Context):
    """A new label version: ``example_id,label`` as CSV, NDJSON or Parquet, streamed (admin keys)."""
    fmt = upload_format(request.headers.get("content-type"))
    async with spool.spooled(request, who.body_limit, ctx.scratch) as body:
        return await run_in_threadpool(datasets.upload_labels, ctx, who, body.path, fmt)


@router.post("/{dataset_id}/grants", status_code=201, response_model=schemas.Grant)
def grant(dataset_id: str, body: schemas.GrantCreate, who: AdministersDataset, ctx: Context):
    """Let another organization's consumer keys request releases of this dataset, each example's use limited to
    ``epsilon`` (and ``delta``) moved from the owner's account; sent again, it changes the allocation (admin
    keys)."""
    return datasets.grant_access(ctx, who, body)


@router.get("/{dataset_id}/budget", response_model=schemas.Budget)
def budget(dataset_id: str, who: SeesDataset, ctx: Context):
    """A consumer: its organization's allocation and use. The owner's admins: the dataset and every account."""
    return datasets.budget(ctx, who)
