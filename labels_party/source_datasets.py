"""Registering a source dataset, and what its releases read: the snapshot and the counts taken when it was registered.

When its owner's admin creates it, the source is copied (:mod:`labels_party.spark.snapshot`: by file descriptors,
no link followed) and Spark counts the copy exactly. The refusals of that count (missing ids or labels, labels
outside the domain, repeated ids, no rows) go to the admin, who owns the labels; then nothing is created and the
copy is removed. The dataset row keeps the copy's location and fingerprint and the counts file; its rows are the
copy's. A release plans from the stored counts and its Spark job reads the copy: what was checked is what is read,
and neither can change after registration.

A source dataset registered before snapshots existed has none; its releases are refused until its owner registers
the source again (as a new dataset).
"""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from labels_party import db
from labels_party.context import ServiceContext
from labels_party.spark import snapshot
from shared.errors import LabelDPError, resource_error


def register(ctx: ServiceContext, org_name: str, dataset_id: str, source: str, domain) -> dict:
    """Snapshot and count ``source`` for a new dataset: the dataset row's source columns. Undo with
    :func:`discard` if the row is not written."""
    taken = snapshot.take(source, ctx.settings.spark_sources.get(org_name, []), ctx.store.root, dataset_id,
                          ctx.checkpoint)
    try:
        histogram = _count(ctx, taken.location, source, domain.support().values)
        counts = ctx.store.write_array(f"datasets/{dataset_id}/source_counts.npy", histogram.counts)
    except BaseException:
        snapshot.remove(ctx.store.root, taken.location)
        raise
    return {"source_snapshot": taken.location, "source_sha256": taken.sha256, "source_counts_file": counts,
            "num_examples": histogram.num_examples, "registry_size": histogram.num_examples}


def discard(ctx: ServiceContext, columns: dict) -> None:
    if columns.get("source_snapshot"):
        snapshot.remove(ctx.store.root, columns["source_snapshot"])
    if columns.get("source_counts_file"):
        ctx.store.remove(columns["source_counts_file"])


def _count(ctx: ServiceContext, location: str, source: str, support_values: np.ndarray):
    """The exact histogram of the snapshot; its refusals name the admin's source, never the data directory."""
    from labels_party.spark.jobs import label_histogram  # PySpark only where source datasets are used

    path = str(ctx.store.path(location).resolve())
    uri = ctx.store.path(location).resolve().as_uri()
    try:
        return label_histogram(ctx.spark_jobs.session(), uri, support_values)
    except LabelDPError as err:
        raise LabelDPError(str(err).replace(uri, source).replace(path, source), code=err.code) from None
    except Exception as err:  # Spark's own failures (an unreadable Parquet file) carry the snapshot's paths: not echoed
        raise resource_error(err) or LabelDPError(
            "Spark could not read the source's files as Parquet; nothing was registered",
            code="malformed_file") from None


def stored_histogram(ctx: ServiceContext, session: Session, dataset: db.Dataset, domain):
    """The exact counts taken at registration (a :class:`~labels_party.spark.jobs.HistogramResult`), after
    checking the source is still where the operator allows its owner to register labels."""
    from labels_party.spark.jobs import HistogramResult

    if dataset.source_snapshot is None:
        raise LabelDPError("this source dataset was registered before sources were copied at registration; its "
                           "owner must register the source again (as a new dataset) before it is released",
                           code="source_dataset")
    owner = session.get(db.Organization, dataset.owner_org_id)
    if owner is None or dataset.source_uri is None or dataset.source_counts_file is None:  # set at registration
        raise LabelDPError("this source dataset's registration is incomplete", code="storage_inconsistent")
    snapshot.locate(dataset.source_uri, ctx.settings.spark_sources.get(owner.name, []))  # also if withdrawn
    values = domain.support().values
    counts = ctx.store.read_array(dataset.source_counts_file)
    if counts.shape != values.shape or int(counts.sum()) != dataset.num_examples:
        raise LabelDPError("this source dataset's stored counts do not match its domain and rows; its owner must "
                           "register the source again", code="source_dataset")
    return HistogramResult(values, counts.astype(np.int64), int(dataset.num_examples))


def snapshot_uri(ctx: ServiceContext, dataset: db.Dataset) -> str:
    """The ``file:`` URI Spark reads the dataset's labels from: its snapshot, on this file system."""
    if dataset.source_snapshot is None:
        raise LabelDPError("this source dataset was registered before sources were copied at registration; its "
                           "owner must register the source again (as a new dataset)", code="source_dataset")
    return ctx.store.path(dataset.source_snapshot).resolve().as_uri()

