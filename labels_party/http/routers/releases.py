"""Releases: request one (labels, per-example priors, groups, central training, evaluation, quantiles), list a
dataset's, read one and download its privatized labels."""

from __future__ import annotations

from typing import Annotated

import pyarrow as pa
from fastapi import APIRouter, Query, Request

from labels_party.http.routers.deps import (
    REPLAYABLE,
    AnyKey,
    Context,
    IdempotencyKey,
    SeesDataset,
    SeesDatasetColumnar,
    answer,
    with_columnar_body,
)
from labels_party.releases import kinds, queries, transaction
from shared import schemas
from shared.service import openapi, tables
from shared.service.gate import GuardedRoute

router = APIRouter(tags=["releases"], route_class=GuardedRoute)


@router.post("/v1/datasets/{dataset_id}/releases", status_code=201, response_model=schemas.Release,
             responses={**REPLAYABLE, 202: {"model": schemas.Release, "description": (
                 "a source dataset's release: charged, its Spark job running (or re-run after a failure, same "
                 "charge and noise); poll the Location until state is available")}})
def create_release(dataset_id: str, body: schemas.ReleaseRequest, who: SeesDataset, ctx: Context,
                   idempotency_key: IdempotencyKey):
    """Privatize the dataset's labels (or ``example_ids`` of them) with one mechanism; ε is charged to every
    covered example before the release is visible. For a source dataset the release is a Spark job: 202."""
    return answer(transaction.run(ctx, who, idempotency_key, kinds.LabelRelease(body)))


@router.post("/v1/datasets/{dataset_id}/release-checks", response_model=schemas.ReleaseChecked)
def check_releases(dataset_id: str, body: schemas.ReleaseChecks, who: SeesDataset, ctx: Context):
    """Check releases meant to be asked for together — label releases and evaluations as their routes take them, and
    the shape of per-example prior releases to come: each one's refusal (the code and message its request would get
    now, from public inputs) or the examples it would cover. Nothing is drawn, charged or stored. A client asking
    for several releases (the trainer's auto and lp-mst jobs) checks them all first, so none is refused after
    another was charged. Budgets are not checked."""
    limit = ctx.settings.max_columnar_decoded_bytes
    checked = iter(transaction.check(ctx, who, [
        *map(kinds.LabelRelease, body.releases), *map(kinds.Evaluation, body.evaluations),
        *(kinds.ExamplePriorShape(shape, max_decoded_bytes=limit) for shape in body.prior_releases)]))
    return schemas.ReleaseChecked(releases=[next(checked) for _ in body.releases],
                                  evaluations=[next(checked) for _ in body.evaluations],
                                  prior_releases=[next(checked) for _ in body.prior_releases])


@router.get("/v1/datasets/{dataset_id}/releases", response_model=list[schemas.Release])
def list_releases(dataset_id: str, who: SeesDataset, ctx: Context):
    """A consumer's own organization's releases of the dataset; the owner's admins see all of them."""
    return queries.list_releases(ctx, who)


@router.post("/v1/datasets/{dataset_id}/prior-releases", status_code=201, response_model=schemas.Release,
             responses=REPLAYABLE, openapi_extra=openapi.columnar_body())
async def create_prior_release(dataset_id: str, request: Request, who: SeesDatasetColumnar, ctx: Context,
                               epsilon: Annotated[schemas.QueryEpsilon, Query()], idempotency_key: IdempotencyKey):
    """RRWithPrior with one prior per example, sent as a columnar body (Parquet; CSV or NDJSON also work):
    example_id, p_0..p_{K-1}. The priors must come from features only (e.g. a model trained on earlier,
    already-private stages). Examples whose prior gives k = 1 are neither charged nor released (the description's
    ``uninformative_examples`` counts them)."""
    return await with_columnar_body(request, ctx, who, lambda body, memory: (
        transaction.run(ctx, who, idempotency_key, kinds.ExamplePriorRelease(epsilon, body, memory))))


@router.post("/v1/datasets/{dataset_id}/group-releases", status_code=201, response_model=schemas.Release,
             responses=REPLAYABLE, openapi_extra=openapi.columnar_body())
async def create_group_release(dataset_id: str, request: Request, who: SeesDatasetColumnar, ctx: Context,
                               mechanism: Annotated[schemas.GroupMechanism, Query()],
                               epsilon: Annotated[schemas.QueryEpsilon, Query()],
                               prior_epsilon: Annotated[schemas.QueryEpsilon, Query()],
                               idempotency_key: IdempotencyKey):
    """One private prior and one randomizer per group; the body (Parquet, CSV or NDJSON) has example_id and
    group, computed from features only (e.g. k-means clusters)."""
    return await with_columnar_body(request, ctx, who, lambda body, memory: (
        transaction.run(ctx, who, idempotency_key,
                        kinds.GroupRelease(mechanism, epsilon, prior_epsilon, body, memory))))


@router.post("/v1/datasets/{dataset_id}/central-trainings", status_code=201, response_model=schemas.Release,
             responses=REPLAYABLE)
def create_central_training(dataset_id: str, body: schemas.CentralTrainingRequest, who: SeesDataset,
                            ctx: Context,
                            idempotency_key: IdempotencyKey):
    """LabelDP-Pro at the labels party on the caller's features; only the trained parameters come back (in
    the mechanism document, ``description.parameters``). Refused unless the dataset owner enabled central
    training."""
    return answer(transaction.run(ctx, who, idempotency_key, kinds.CentralTraining(body)))


@router.post("/v1/datasets/{dataset_id}/pate-releases", status_code=201, response_model=schemas.Release,
             responses=REPLAYABLE)
def create_pate_release(dataset_id: str, body: schemas.PateRequest, who: SeesDataset, ctx: Context,
                        idempotency_key: IdempotencyKey):
    """PATE (``pate-fm``) at the labels party: teachers fitted on disjoint parts of the labelled examples whose
    features the body carries, and their noisy arg-max votes (GNMax, discrete Gaussian) as one label per query row,
    downloaded like any release's labels. Charged to the labelled examples; refused unless the dataset owner
    enabled central training."""
    return answer(transaction.run(ctx, who, idempotency_key, kinds.PateRelease(body)))


@router.post("/v1/datasets/{dataset_id}/evaluations", status_code=201, response_model=schemas.Release,
             responses=REPLAYABLE)
def create_evaluation(dataset_id: str, body: schemas.EvaluationRequest, who: SeesDataset, ctx: Context,
                      idempotency_key: IdempotencyKey):
    """Test loss of the caller's predictions on true labels, discrete-Laplace-noised and charged to those
    examples; the result is in ``description.value`` (with ``noise_scale``, ``ci95_low`` and ``ci95_high``)."""
    return answer(transaction.run(ctx, who, idempotency_key, kinds.Evaluation(body)))


@router.post("/v1/datasets/{dataset_id}/quantiles", status_code=201, response_model=schemas.Release,
             responses=REPLAYABLE)
def create_quantiles(dataset_id: str, body: schemas.QuantilesRequest, who: SeesDataset, ctx: Context,
                     idempotency_key: IdempotencyKey):
    """DP quantiles of the dataset's labels (or ``example_ids``' labels), to choose clip bounds privately: one
    exponential-mechanism draw per quantile among the declared domain's support (integers, listed values or the
    continuous grid), sampled exactly, ε split evenly across the quantiles and charged to every covered example.
    The values are in ``description.values`` (quantile → value); class labels are refused."""
    return answer(transaction.run(ctx, who, idempotency_key, kinds.Quantiles(body)))


@router.get("/v1/releases/{release_id}", response_model=schemas.Release)
def get_release(release_id: str, who: AnyKey, ctx: Context):
    """A release the key sees. ``execution`` — where a source release's Spark job ran (master, application id,
    executors) — is shown to the dataset owner's admins only; others, its requester included, get null."""
    return queries.get_release(ctx, who.principal, release_id)[0]


@router.get("/v1/releases/{release_id}/labels", responses=openapi.table_download())
def download(release_id: str, request: Request, who: AnyKey, ctx: Context,
             offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000):
    """The privatized labels (``example_id, label``, or ``example_id`` and ``in_class_k`` columns: booleans for
    label sets, which JSON and NDJSON show as ``label_set``, integers for ALIBI's noisy vectors, shown as
    ``noisy_vector``), in the media type ``Accept`` asks for. A file that is not
    the one recorded when the release became available (size and SHA-256) is never served: 503
    ``release_file_damaged``."""
    accept = request.headers.get("accept")
    table = queries.opened_labels(ctx, who.principal, release_id)  # a 406 comes after the release's own checks
    try:  # a JSON page is read before it is answered: a file damaged inside is a 503 too, never a 500
        return tables.table_response(table, accept, offset, limit, release_id, _rows)
    except (OSError, pa.ArrowException):
        raise queries.damaged(release_id) from None


def _rows(batch) -> list[dict]:
    names = batch.schema.names
    if "label" in names:
        return batch.to_pylist()
    ids = batch.column("example_id").to_pylist()
    columns = [n for n in names if n.startswith("in_class_")]
    values = [batch.column(n).to_pylist() for n in columns]
    if columns and not pa.types.is_boolean(batch.schema.field(columns[0]).type):  # ALIBI: one integer per class
        return [{"example_id": ids[i], "noisy_vector": [col[i] for col in values]} for i in range(len(ids))]
    return [{"example_id": ids[i], "label_set": [k for k, col in enumerate(values) if col[i]]}
            for i in range(len(ids))]
