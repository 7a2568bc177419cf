"""Releases of source datasets: labels in a Parquet dataset, copied and counted when their owner registered them
(:mod:`labels_party.source_datasets`), released by Spark jobs. The control plane is here; the data plane is
:mod:`labels_party.spark`. The same release transaction as any other release (:mod:`.transaction`):

1. **price** — from public inputs only: the mechanism, the domain, the ε split (refusals here cost nothing);
2. **charge** — :func:`.transaction.charge`: the key reserved, the exact charge to every row of the source
   (coverage ``range:0:n``), the ledger record and the release ``running``, in one transaction;
3. **plan** — after the commit: the noisy prior from the counts taken at registration, the solve (falling back
   deterministically if it cannot certify), the mechanism document, and the job file (the sampler and the
   release's secret). The POST answers 202 with a Location;
4. **privatize** — a Spark job on this service's thread reads the registration's copy and writes
   ``releases/{id}/`` (Parquet part files); the release becomes ``available``, or ``failed``. Nothing is
   readable before ``available``.

A failed (or orphaned ``running``) release whose job file was written runs again when its request is sent again
with its Idempotency-Key: the same charge (no second ledger record) and the same noise — every partition derives
its stream from the release's secret (:mod:`labels_party.spark.jobs`). The job file is as sensitive as the labels
(with it and the output the noise can be recomputed); it lives in the data directory beside the labels and is
deleted once the release is available. A release that failed before its job file existed stays failed (charged).
"""

from __future__ import annotations

import json
import logging
import pickle
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from labels_party import db
from labels_party.context import ServiceContext
from labels_party.pipeline import Prepared, plan
from labels_party.recovery import FAILED
from labels_party.releases.kinds import LabelRelease
from labels_party.releases.lifecycle import Covered, Outcome, Priced, ReleaseKind, Snapshot, finish, seal
from labels_party.solvers.deadline import Deadline
from labels_party.source_datasets import snapshot_uri, stored_histogram
from shared import schemas
from shared.errors import LabelDPError
from shared.randomness import new_release_secret

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparkJob:
    """The completion of a source dataset's release (:class:`~.transaction.Completion`)."""

    suffix: str = ""  # releases/{id}/: the job's Parquet part files

    def cover(self, ctx: ServiceContext, snapshot: Snapshot, kind: ReleaseKind[Any]) -> Covered:
        if not isinstance(kind, LabelRelease):
            raise LabelDPError("a source dataset takes label releases of all its rows (POST .../releases) only",
                               code="source_dataset")
        if kind.request.example_ids is not None:
            raise LabelDPError("a source dataset's release covers all its rows; leave out example_ids",
                               code="source_dataset")
        # Refusals about the source (no copy, a prefix the operator withdrew, counts that do not fit the domain)
        # come before the charge; reading the counts draws nothing.
        with ctx.sessions() as session, session.begin():
            histogram = stored_histogram(ctx, session, session.get(db.Dataset, snapshot.dataset.id),
                                         snapshot.domain)
        return Covered(snapshot.coverage, counts=histogram)

    def check(self, snapshot: Snapshot, priced: Priced) -> None:
        assert isinstance(priced, Prepared)  # a LabelRelease's (cover refused every other kind)
        if priced.built is not None:  # a label-set mechanism cannot be written as one number per row
            from labels_party.spark.jobs import check_one_output_per_label

            check_one_output_per_label(priced.built.mechanism, snapshot.domain.support().values)

    def complete(self, ctx: ServiceContext, release_id: str, snapshot: Snapshot, kind: ReleaseKind[Any],
                 covered: Covered, priced: Priced) -> schemas.Release:
        assert isinstance(kind, LabelRelease) and isinstance(priced, Prepared)  # cover refused every other kind
        histogram = covered.counts
        planned = plan(priced.with_deadline(Deadline(ctx.settings.solver_seconds)), histogram.counts,
                       ctx.random_source())
        from pyspark import cloudpickle  # what Spark ships the sampler to executors with (it also pickles views)

        ctx.store.write_with(_job_file(release_id), lambda path: path.write_bytes(cloudpickle.dumps(
            {"sampler": planned.sampler, "secret": new_release_secret(), "support": histogram.support_values,
             "source": snapshot.dataset.source_sha256})))
        view = finish(ctx, release_id, kind.draft(planned, {}))  # running: its job makes it available
        _start(ctx, release_id)
        return view

    def abandon(self, ctx: ServiceContext, release_id: str) -> None:
        ctx.store.remove(_job_file(release_id))

    def replayed(self, ctx: ServiceContext, session: Session, release: db.Release) -> bool:
        """A failed (or orphaned ``running``) release whose job file was written runs again: the same charge and
        job file, so the job redraws the same noise."""
        session.refresh(release, with_for_update=True)  # locked: a job finishing now cannot interleave
        restart = ctx.store.path(_job_file(release.id)).exists() and (release.state == "failed" or (
            release.state == "running" and not ctx.spark_jobs.running(release.id)))
        if restart:
            release.state, release.error_json = "running", None
        return restart

    def restart(self, ctx: ServiceContext, release_id: str) -> None:
        _start(ctx, release_id)

    @property
    def waits(self) -> bool:
        return False

    def answer(self, release: schemas.Release, created: bool) -> Outcome:
        return Outcome(release, 202 if release.state != "available" else 200, f"/v1/releases/{release.id}")


SPARK_JOB = SparkJob()


def _job_file(release_id: str) -> str:
    return f"jobs/{release_id}.pickle"


def _start(ctx: ServiceContext, release_id: str) -> None:
    ctx.spark_jobs.submit(release_id, lambda: _privatize(ctx, release_id))


def _privatize(ctx: ServiceContext, release_id: str) -> None:
    """The job: the release's dataset's snapshot (the files counted at registration), sampled and written."""
    from labels_party.spark.jobs import privatize

    try:
        job = pickle.loads(ctx.store.path(_job_file(release_id)).read_bytes())
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
            raise LabelDPError(f"{result.rows_written:,} rows released, {expected:,} charged", code="source_dataset")
        sealed = ctx.store.digest(f"releases/{release_id}")  # a file it cannot read fails the job, not a hang
    except Exception:  # the job's outcome is the release's state, not an exception in a thread
        log.exception("the Spark job of release %s failed", release_id)
        _finish(ctx, release_id, "failed", {**FAILED, "message": "the Spark job failed; send the request again "
                                                                 "with its Idempotency-Key to run it again (the "
                                                                 "same charge and noise)"})
        return
    _finish(ctx, release_id, "available", None, sealed)
    ctx.store.remove(_job_file(release_id))


def _finish(ctx: ServiceContext, release_id: str, state: str, error: dict | None,
            sealed: tuple[int, str] | None = None) -> None:
    """Only a running release finishes (a job that lost a race with a finished one changes nothing)."""
    with ctx.sessions() as session, session.begin():
        row = session.get(db.Release, release_id, with_for_update=True)
        if row.state == "running":
            row.state, row.error_json = state, json.dumps(error) if error else None
            if sealed is not None:
                seal(row, sealed)
