"""Releases of source datasets: labels that stay in a Parquet dataset and are released by Spark jobs.

The control plane is here, in the service and its database; the data plane is :mod:`labels_party.spark`.

1. **histogram** — the exact counts Spark took when the source was registered, from the copy of its files the
   service took then (:mod:`labels_party.source_datasets`; its refusals went to the owner's admin registering it);
2. **plan** — the noisy prior, the solve and the certificate on the driver, with the same mechanism objects and
   registry as an uploaded dataset's release (:func:`labels_party.pipeline.plan_privatization`);
3. **charge** — one transaction: the exact charge to every row of the source (coverage ``range:0:n`` — a source's
   release covers all its rows), the ledger record, the mechanism document and the release, ``running``. The POST
   answers 202 with a Location;
4. **privatize** — a Spark job on this service's thread reads that same copy and writes ``releases/{id}/``
   (Parquet part files); the release becomes ``available``, or ``failed`` with its error. Nothing is readable
   before ``available``.

A failed (or orphaned ``running``) release runs again when its request is sent again with its Idempotency-Key: the
same charge (no second ledger record) and the same noise — the job file keeps the planned sampler and the
release's secret, from which every partition derives its stream (:mod:`labels_party.spark.jobs`). The job file is
as sensitive as the labels (with it and the output the noise can be recomputed); it lives in the data directory
beside the labels of uploaded datasets and is deleted once the release is available.
"""

from __future__ import annotations

import hashlib
import json
import pickle

from labels_party import db, labelstore
from labels_party.auth import Principal
from labels_party.ledger import canonical, charge_units, units_epsilon
from labels_party.pipeline import plan_privatization
from labels_party.releases import transaction
from labels_party.releases.kinds import LabelRelease
from labels_party.service import ServiceContext, accessible_dataset, check_epsilon_range
from labels_party.solvers.deadline import Deadline
from labels_party.source_datasets import snapshot_uri, stored_histogram
from shared import schemas
from shared.domains import domain_from_spec
from shared.errors import LabelDPError
from shared.randomness import new_release_secret


def release(ctx: ServiceContext, principal: Principal, dataset_id: str, idempotency_key: str | None,
            request: schemas.ReleaseRequest) -> schemas.Release:
    """Plan and charge a release of the whole source, then start its Spark job (or restart a failed one)."""
    kind = LabelRelease(request)
    for name, epsilon in kind.epsilons().items():
        check_epsilon_range(ctx, epsilon, name)
    if request.example_ids is not None:
        raise LabelDPError("a source dataset's release covers all its rows; leave out example_ids",
                           code="source_dataset")
    body_hash = hashlib.sha256(canonical(kind.identity()).encode()).hexdigest()
    if not idempotency_key or len(idempotency_key) > 200:
        raise LabelDPError("an Idempotency-Key header (1-200 characters) is required for releases",
                           code="idempotency_key_required")
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id)
        existing = transaction.existing_release(session, principal, dataset_id, idempotency_key, body_hash)
        if existing is not None:  # its row locked: a job finishing now cannot interleave with the restart
            session.refresh(existing, with_for_update=True)
        restart = existing is not None and (existing.state == "failed" or (
            existing.state == "running" and not ctx.spark_jobs.running(existing.id)))
        if restart:  # the same charge and job file: the job redraws the same noise
            existing.state, existing.error_json = "running", None
        view = transaction.release_view(existing) if existing is not None else None
    if view is not None:
        if restart:
            _start(ctx, view.id)
        return view
    remaining = dataset.epsilon_total_units - dataset.epsilon_spent_units  # a release covers every row: the max
    if charge_units(request.epsilon) > remaining:  # refused before a Spark job starts; exact again at the charge
        raise LabelDPError(f"budget exceeded: this release needs epsilon {request.epsilon:g}, the source's rows "
                           f"have {units_epsilon(max(0, remaining)):.9g} left", code="budget_exceeded")
    domain = domain_from_spec(json.loads(dataset.domain_json))
    source, histogram, plan = _count_and_plan(ctx, dataset, domain, kind)
    from pyspark import cloudpickle  # what Spark ships the sampler to executors with (it also pickles views)

    release_id = db.new_id()
    job_file = ctx.store.write_with(f"jobs/{release_id}.pickle", lambda path: path.write_bytes(cloudpickle.dumps(
        {"sampler": plan.sampler, "secret": new_release_secret(), "support": histogram.support_values,
         "source": source})))
    snapshot = transaction.Snapshot(dataset, domain, 0, dataset.source_uri, histogram.num_examples,
                                    labelstore.range_coverage(0, histogram.num_examples))
    try:
        draft = kind.draft(plan, {})  # not the snapshot's fingerprint: a hash of the labels' bytes is not private
        view = _charge(ctx, principal, snapshot, kind, draft, idempotency_key, body_hash, release_id)
    except BaseException:
        ctx.store.remove(job_file)
        raise
    if view.id == release_id:
        _start(ctx, release_id)
    else:
        ctx.store.remove(job_file)  # a concurrent request with the same key won
    return view


def _count_and_plan(ctx: ServiceContext, dataset: db.Dataset, domain, kind: LabelRelease):
    """(the snapshot's fingerprint, its histogram, plan): the counts taken at registration, no Spark job."""
    from labels_party.spark.jobs import check_one_output_per_label

    with ctx.sessions() as session, session.begin():
        histogram = stored_histogram(ctx, session, dataset, domain)
    request = kind.request
    run = transaction.Computation(ctx.random_source(), Deadline(ctx.settings.solver_seconds))
    plan = plan_privatization(domain, histogram.counts, histogram.num_examples, request.mechanism, request.epsilon,
                              run.rng, prior_epsilon=request.prior_epsilon, options=kind.options(run))
    check_one_output_per_label(plan.sampler, histogram.support_values)  # before anything is charged
    return dataset.source_sha256, histogram, plan


def _charge(ctx: ServiceContext, principal: Principal, snapshot, kind, draft, key: str, body_hash: str,
            release_id: str) -> schemas.Release:
    superseded: list[str] = []
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, snapshot.dataset.id, lock=True)
        existing = transaction.existing_release(session, principal, dataset.id, key, body_hash)
        if existing is not None:
            return transaction.release_view(existing)
        dataset.registry_size = max(dataset.registry_size, snapshot.num_examples)
        dataset.num_examples = snapshot.num_examples
        row = transaction.charge_and_insert(
            ctx, session, principal, dataset, snapshot, kind, snapshot.coverage, draft,
            db.Release(id=release_id, idempotency_key=key, body_hash=body_hash, file=f"releases/{release_id}",
                       state="running"), superseded)
        view = transaction.release_view(row)
    for old in superseded:
        ctx.store.remove(old)
    return view


def _start(ctx: ServiceContext, release_id: str) -> None:
    ctx.spark_jobs.submit(release_id, lambda: _privatize(ctx, release_id))


def _privatize(ctx: ServiceContext, release_id: str) -> None:
    """The job: the release's dataset's snapshot (the files counted at registration), sampled and written."""
    from labels_party.spark.jobs import privatize

    try:
        job = pickle.loads(ctx.store.path(f"jobs/{release_id}.pickle").read_bytes())
        with ctx.sessions() as session, session.begin():
            row = session.get(db.Release, release_id)
            expected, dataset = row.num_examples, session.get(db.Dataset, row.dataset_id)
            source = snapshot_uri(ctx, dataset)
        if dataset.source_sha256 != job["source"]:  # a job planned for other files (cannot happen: checked anyway)
            raise LabelDPError("the release was planned for other source files", code="source_dataset")
        output = ctx.store.path(f"releases/{release_id}").resolve().as_uri()  # this file system, not fs.defaultFS
        result = privatize(ctx.spark_jobs.session(), source, output,
                           job["sampler"], job["secret"], support_values=job["support"])
        ctx.checkpoint("spark_job_written")  # tests fail a job here, after its files were written
        if result.rows_written != expected:
            raise LabelDPError(f"the source changed after it was counted: {result.rows_written:,} rows released, "
                               f"{expected:,} charged; register a new dataset for new labels",
                               code="source_dataset")
    except Exception as err:  # the job's outcome is the release's state, not an exception in a thread
        error = {"code": getattr(err, "code", "internal_error"), "message": str(err).splitlines()[0][:500]
                 if isinstance(err, LabelDPError) else "the Spark job failed; send the request again to retry"}
        _finish(ctx, release_id, "failed", error)
        return
    _finish(ctx, release_id, "available", None)
    ctx.store.remove(f"jobs/{release_id}.pickle")


def _finish(ctx: ServiceContext, release_id: str, state: str, error: dict | None) -> None:
    """Only a running release finishes (a job that lost a race with a finished one changes nothing)."""
    with ctx.sessions() as session, session.begin():
        row = session.get(db.Release, release_id, with_for_update=True)
        if row.state == "running":
            row.state, row.error_json = state, json.dumps(error) if error else None


def is_source(ctx: ServiceContext, principal: Principal, dataset_id: str) -> bool:
    with ctx.sessions() as session, session.begin():
        return accessible_dataset(session, principal, dataset_id).source_uri is not None

