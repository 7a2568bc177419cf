"""Registering a source dataset, and what its releases read: the snapshot and the counts taken when it was registered.

When its owner's admin creates it (``POST /v1/datasets`` with ``source``), everything public in the request is
checked at once (the name, the domain, the prefix the operator allowed the organization, the location's syntax:
:func:`labels_party.releases.datasets.check_source`); the dataset is created ``registering`` with a ``register_source``
job (:mod:`labels_party.runtime.jobs`) in one transaction, and the answer is 202. The job — on any replica — copies the
source (:mod:`labels_party.spark.snapshot`: by file descriptors, no link followed) into a fresh temporary directory and
has Spark count the copy exactly; then, in one transaction that checks its lease is still held, the copy is renamed to
``sources/<id>/``, the counts written, and the dataset becomes ``ready`` with the copy's location, fingerprint and
rows. The refusals of the copy and the count (a location missing or unreadable, a link, missing ids or labels,
labels outside the domain, repeated ids, no rows) make the dataset ``failed`` with that refusal, which its owner's
admins read (they own the labels); nothing else is created and the copy is removed. A registration taken over (its
worker died) copies again from scratch. A release plans from the stored counts and its Spark job reads the copy:
what was checked is what is read, and neither can change after registration.

A source dataset registered before snapshots existed has none; its releases are refused until its owner registers
the source again (as a new dataset).
"""

from __future__ import annotations

import json

import numpy as np
from sqlalchemy.orm import Session

from labels_party.ledger.agreement import LedgerTampered
from labels_party.runtime import jobs
from labels_party.runtime.jobs import Claimed, Failure, JobContext
from labels_party.spark import snapshot
from labels_party.store import db
from labels_party.store.usage import stored_bytes
from shared.domains import domain_from_spec
from shared.errors import ErrorCode, LabelDPError, resource_error
from shared.service.storage_quota import KEPT_FOR_THE_AUDIT, check_room, tree_bytes

# The refusals of a source by its copy and count: the owner's own data, final (running again changes nothing).
REFUSALS = frozenset({"source_not_allowed", "source_not_found", "malformed_file", "label_out_of_domain",
                      "duplicate_example_id", "empty_labels", "invalid_domain", "storage_quota_exceeded"})


def run_registration(ctx: JobContext, claimed: Claimed) -> None:
    """The ``register_source`` job: copy and count the dataset's source; recorded only while the lease is held."""
    with ctx.sessions() as session, session.begin():
        dataset = session.get(db.Dataset, claimed.subject_id)
        state = dataset.state
        domain = domain_from_spec(json.loads(dataset.domain_json))
        # the source and the owner whose prefixes allow it as the chain recorded them when the admin asked
        owner = ctx.ledger.registration(session, dataset) if state == "registering" else None
        room = _room(ctx, session, dataset)
    if owner is None or owner.source is None:  # nothing to do (cannot happen: a job per registration)
        with jobs.holding(ctx, claimed) as held:
            if held is not None:
                ctx.jobs.table.finish(held[1], "succeeded" if state == "ready" else "failed")
        return
    source = owner.source
    copied = snapshot.copy(source, ctx.settings.spark_sources.get(owner.org, []), ctx.store.root, dataset.id,
                           ctx.checkpoint, into=ctx.store.path(jobs.ATTEMPTS), room=room)
    try:
        histogram, ran = _count(ctx, copied.location, source, domain.support().values)
        with jobs.holding(ctx, claimed) as held:
            if held is None:  # taken over: the other attempt records its own copy
                return
            _session, job, dataset = held
            _check_stored(ctx, _session, dataset, tree_bytes(copied.temporary))
            counts = ctx.store.write_array(f"datasets/{dataset.id}/source_counts.npy", histogram.counts)
            taken = snapshot.place(ctx.store.root, copied)
            dataset.source_snapshot, dataset.source_sha256, dataset.source_counts_file = \
                taken.location, taken.sha256, counts
            dataset.num_examples = dataset.registry_size = histogram.num_examples
            dataset.source_id_bytes = histogram.id_bytes
            dataset.state, dataset.error_json = "ready", None
            ctx.ledger.source_registered(_session, dataset, ctx.store.checked_digest(counts))  # what releases read
            job.result_json = json.dumps(ran)
            ctx.jobs.table.finish(job, "succeeded")
    finally:
        snapshot.discard(copied)  # gone already once placed


def _stored_besides(ctx: JobContext, session: Session, dataset: db.Dataset) -> int:
    """What the dataset's organization stores besides this registration's copy (counted at its request's size until
    placed)."""
    return stored_bytes(session, ctx.store, dataset.owner_org_id) - int(dataset.source_bytes or 0)


SLACK_BYTES = 1 << 20  # what a copy may take beyond its request's count (a file's blocks, a directory's)


def _room(ctx: JobContext, session: Session, dataset: db.Dataset) -> int:
    """What the registration's copy may take: what its request counted (with a little slack), and never more than
    its organization has left — a copy bounded by the room alone took all of it, each of four running at once (the
    34th review: 2.06 times the quota in flight). A source that grew since its request fails to register; the
    request sent again counts it anew."""
    room = ctx.storage_quota - _stored_besides(ctx, session, dataset)
    return room if dataset.source_bytes is None else min(room, int(dataset.source_bytes) + SLACK_BYTES)


def _check_stored(ctx: JobContext, session: Session, dataset: db.Dataset, copied: int) -> None:
    """The copy as taken, against its organization's quota, before it is placed (the organization's row locked
    after the dataset's, the order of every writer): its source may have grown since the request, and the
    organization's other data with it (the 33rd review: one request's copy stored 3.08 times the quota)."""
    session.get(db.Organization, dataset.owner_org_id, with_for_update=True)
    check_room(_stored_besides(ctx, session, dataset), copied, ctx.storage_quota,
               "keeping the copy of this dataset's source", KEPT_FOR_THE_AUDIT)


def classify(err: Exception) -> tuple[Failure, bool]:
    """A registration's failure as its dataset shows it, and whether it is final at once: the source's refusals
    are (with their texts: the owner's own data); the service's conditions are retried."""
    if isinstance(err, LabelDPError) and (err.code in REFUSALS or isinstance(err, LedgerTampered)):
        return Failure(err.code, str(err)), True  # a table edited outside the service: final too
    failure = jobs.resource_failure(err) or jobs.unexpected(code=ErrorCode.REGISTRATION_FAILED,
                                                            what="copying and counting the source")
    return failure, False


def _count(ctx: JobContext, location: str, source: str, support_values: np.ndarray):
    """The exact histogram of the copy and where Spark counted it (:func:`shared.spark.session.execution`);
    its refusals name the admin's source, never the data directory."""
    from labels_party.spark.jobs import label_histogram  # PySpark only where source datasets are used
    from shared.spark.session import collect_scratch, execution

    path = str(ctx.store.path(location).resolve())
    uri = ctx.store.path(location).resolve().as_uri()
    spark = ctx.spark_jobs.session()  # a Spark that does not start is the service's condition (retried)
    try:
        histogram = label_histogram(spark, uri, support_values)
    except LabelDPError as err:
        raise LabelDPError(str(err).replace(uri, source).replace(path, source), code=err.code) from None
    except Exception as err:  # Spark's own failures (an unreadable Parquet file) carry the copy's paths: not echoed
        if spark_unavailable(err):
            raise  # the service's condition (retried), not the source's
        raise resource_error(err) or LabelDPError(
            "Spark could not read the source's files as Parquet; nothing was registered",
            code=ErrorCode.MALFORMED_FILE) from None
    finally:
        collect_scratch(spark)  # its shuffle (every id, for count_distinct) is not kept for the next
    return histogram, execution(spark)


_SPARK_GONE = ("SparkContext was shut down", "stopped SparkContext", "Connection refused", "Master removed our "
               "application", "All masters are unresponsive", "Py4JNetworkError", "Answer from Java side is empty")


def spark_unavailable(err: BaseException) -> bool:
    """A failure of Spark itself (its master or driver gone), not of the files it read."""
    return isinstance(err, ConnectionError) or type(err).__name__ == "Py4JNetworkError" or any(
        marker in str(err)[:4000] for marker in _SPARK_GONE)


def stored_histogram(ctx: JobContext, session: Session, dataset: db.Dataset, domain):
    """The exact counts taken at registration (a :class:`~labels_party.spark.jobs.HistogramResult`), as the
    dataset's chain records them (:meth:`~labels_party.ledger.Ledger.source_read`), after checking the source is
    still where the operator allows its owner to register labels."""
    from labels_party.spark.jobs import HistogramResult

    if dataset.source_snapshot is None:
        raise LabelDPError("this source dataset was registered before sources were copied at registration; its "
                           "owner must register the source again (as a new dataset) before it is released",
                           code=ErrorCode.SOURCE_DATASET)
    owner = session.get(db.Organization, dataset.owner_org_id)
    if owner is None or dataset.source_uri is None or dataset.source_counts_file is None:  # set at registration
        raise LabelDPError("this source dataset's registration is incomplete", code=ErrorCode.STORAGE_INCONSISTENT)
    snapshot.locate(dataset.source_uri, ctx.settings.spark_sources.get(owner.name, []))  # also if withdrawn
    registered = ctx.ledger.source_read(session, dataset)
    values = domain.support().values
    counts = ctx.store.read_array(registered.counts_file)
    if counts.shape != values.shape or int(counts.sum()) != registered.num_examples:
        raise LabelDPError("this source dataset's stored counts do not match its domain and rows; its owner must "
                           "register the source again", code=ErrorCode.SOURCE_DATASET)
    return HistogramResult(values, counts.astype(np.int64), int(dataset.num_examples))


def snapshot_uri(ctx: JobContext, session: Session, dataset: db.Dataset) -> str:
    """The ``file:`` URI Spark reads the dataset's labels from: its snapshot as its chain registered it, on this
    file system."""
    if dataset.source_snapshot is None:
        raise LabelDPError("this source dataset was registered before sources were copied at registration; its "
                           "owner must register the source again (as a new dataset)", code=ErrorCode.SOURCE_DATASET)
    return ctx.store.path(ctx.ledger.source_read(session, dataset).snapshot).resolve().as_uri()

