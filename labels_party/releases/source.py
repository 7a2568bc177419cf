"""Releases of source datasets: labels in a Parquet dataset, copied and counted when their owner registered them
(:mod:`labels_party.releases.source_datasets`), released by Spark jobs. The control plane is here; the data plane is
:mod:`labels_party.spark`. The same release transaction as any other release (:mod:`.transaction`):

1. **price** — from public inputs only: the mechanism, the domain, the ε split (refusals here cost nothing). A
   deployment that cannot seal the release's secret now (its configured secret key file is missing) refuses here
   too: 503 ``secret_key_missing``, nothing charged;
2. **charge** — :func:`.transaction.charge`: the key reserved, the exact charge to every row of the source
   (coverage ``range:0:n``), the ledger record and the release ``running``, in one transaction;
3. **plan** — after the commit: the noisy prior from the counts taken at registration, the solve (falling back
   deterministically if it cannot certify), the mechanism document, and — in the transaction that stores the
   document — a ``privatize_source`` job (:mod:`labels_party.runtime.jobs`): a row whose spec is public JSON (the
   release, the document's address, the support, the source's fingerprint, the partitioning) and whose only secret, the
   release's 32 bytes (:func:`shared.randomness.new_release_secret`), is stored sealed under the deployment's key
   (:mod:`shared.service.sealing`, context ``release-secret:<release id>``) — never in plain text, on disk or in a
   log. The POST answers 202 with a Location;
4. **privatize** — any replica's worker claims the job (:mod:`.privatization`): it rebuilds the sampler from
   the stored document (:func:`shared.mechanisms.documents.sampler_from_description`, checked against the
   document's address), opens the secret, and runs the Spark job over the registration's copy into a directory of
   its own attempt; then, in one transaction that checks its lease is still held, that directory becomes
   ``releases/{id}/`` (Parquet part files), their digest is sealed and the release is ``available`` — and the
   sealed secret is dropped. Nothing is readable before ``available``.

The noise is the secret's: every partition derives its stream from it (:mod:`labels_party.spark.jobs`), so an
attempt taken over after its worker died, a retry after a failure, and a run queued again by re-sending the request
with its Idempotency-Key after the release ``failed`` (the same charge, no second ledger record) all write the same
bytes. Failures: a missing or wrong secret key fails the job and the release at once with ``secret_key_missing``
(no retry: the key has to come back first; re-sending the request then runs it), as does a document that does not
rebuild (``invalid_mechanism_document``); anything else (Spark's failures, a full disk) is retried up to
``job_max_attempts`` claims, then the release is ``failed`` (``release_failed``), re-sendable while its sealed
secret is kept. A release that failed without a job (its process died while planning it) stays failed (charged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from labels_party.core.pipeline import Prepared, plan
from labels_party.core.solvers.deadline import Deadline
from labels_party.ledger import tampered
from labels_party.releases.kinds import LabelRelease
from labels_party.releases.lifecycle import Covered, Outcome, Priced, ReleaseKind, Snapshot, finish, release_failed
from labels_party.releases.privatization import secret_context
from labels_party.releases.source_datasets import stored_histogram
from labels_party.runtime import jobs
from labels_party.runtime.context import ServiceContext
from labels_party.runtime.jobs import Failure
from labels_party.store import db
from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.randomness import new_release_secret

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SparkJob:
    """The completion of a source dataset's release (:class:`~.lifecycle.Completion`)."""

    suffix: str = ""  # releases/{id}/: the job's Parquet part files

    def cover(self, ctx: ServiceContext, snapshot: Snapshot, kind: ReleaseKind[Any]) -> Covered:
        if not isinstance(kind, LabelRelease):
            raise LabelDPError("a source dataset takes label releases of all its rows (POST .../releases) only",
                               code=ErrorCode.SOURCE_DATASET)
        if kind.request.example_ids is not None:
            raise LabelDPError("a source dataset's release covers all its rows; leave out example_ids",
                               code=ErrorCode.SOURCE_DATASET)
        # Refusals about the source (no copy, a prefix the operator withdrew, counts that do not fit the domain)
        # come before the charge; reading the counts draws nothing.
        with ctx.sessions() as session, session.begin():
            histogram = stored_histogram(ctx, session, session.get(db.Dataset, snapshot.dataset.id),
                                         snapshot.domain)
        ctx.sealer.seal(bytes(32), "probe")  # the release's secret can be sealed (secret_key_missing, 503)
        return Covered(snapshot.coverage, counts=histogram)

    def check(self, snapshot: Snapshot, priced: Priced) -> None:
        assert isinstance(priced, Prepared)  # a LabelRelease's (cover refused every other kind)
        if priced.built is not None:  # a label-set mechanism cannot be written as one number per row
            from labels_party.spark.jobs import check_one_output_per_label

            check_one_output_per_label(priced.built.mechanism, snapshot.domain.support().values)

    def complete(self, ctx: ServiceContext, release_id: str, snapshot: Snapshot, kind: ReleaseKind[Any],
                 covered: Covered, priced: Priced) -> schemas.Release:
        assert isinstance(kind, LabelRelease) and isinstance(priced, Prepared)  # cover refused every other kind
        from labels_party.spark.jobs import DEFAULT_MAX_PARTITION_BYTES, DEFAULT_MIN_PARTITIONS

        histogram = covered.counts
        planned = plan(priced.with_deadline(Deadline(ctx.settings.solver_seconds)), histogram.counts,
                       ctx.random_source())
        try:
            sealed = ctx.sealer.seal(new_release_secret(), secret_context(release_id))  # the only copy: sealed
        except LabelDPError as err:  # the key file went since the check before the charge: failed, and why
            _fail(ctx, release_id, Failure(err.code, str(err)))
            raise

        def queue(session: Session, release: db.Release) -> None:
            """The job, and on the chain what it runs: the document and the splits (the dataset's row is locked)."""
            dataset = session.get(db.Dataset, release.dataset_id)
            assert dataset is not None  # (a release's dataset is never deleted)
            ctx.ledger.release_document(session, dataset, release, (DEFAULT_MAX_PARTITION_BYTES,
                                                                    DEFAULT_MIN_PARTITIONS))
            jobs.queue(session, org_id=release.requester_org_id, kind=jobs.PRIVATIZE_SOURCE, subject_id=release_id,
                       sealed_secret=sealed, spec={
                           "release_id": release_id, "dataset_id": release.dataset_id,
                           "mechanism_hash": release.mechanism_hash,
                           "source_sha256": snapshot.dataset.source_sha256})

        view = finish(ctx, release_id, kind.draft(planned, {}), also=queue)  # running: its job makes it available
        ctx.jobs.wake()
        return view

    def abandon(self, ctx: ServiceContext, release_id: str) -> None:
        pass  # the job is queued with the document, in one transaction: nothing else was written

    def replayed(self, ctx: ServiceContext, session: Session, release: db.Release) -> bool:
        """A failed release whose job still holds its sealed secret runs again: its job queued again (attempts
        reset), the same charge and the same noise. A running one is its job's (a dead worker's lease expires)."""
        session.refresh(release, with_for_update=True)  # locked: a job finishing now cannot interleave
        if release.state != "failed":
            return False
        dataset = session.get(db.Dataset, release.dataset_id)
        assert dataset is not None  # (a release's dataset is never deleted)
        if release.id in ctx.ledger.facts(session, dataset).available:
            # drawn once and made available: a row set back to failed (and a secret put back) never draws again
            raise tampered(release.dataset_id, [f"release {release.id} is failed but the chain says it is available"])
        job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release.id, lock=True)
        if job is None or job.sealed_secret is None:
            return False
        jobs.requeue(job)
        release.state, release.error_json = "running", None
        return True

    def restart(self, ctx: ServiceContext, release_id: str) -> None:
        ctx.jobs.wake()

    @property
    def waits(self) -> bool:
        return False

    @property
    def computed_in_request(self) -> bool:
        return False  # planned in the request (seconds), then computed by its job under the job's own lease

    def answer(self, release: schemas.Release, created: bool) -> Outcome:
        if release.state == "failed":  # and not run again: it has no job, or its secret is gone
            if release.error and release.error.get("code") == "job_format_retired":
                raise LabelDPError(release.error["message"], code=ErrorCode.JOB_FORMAT_RETIRED)
            raise release_failed(release.id)
        return Outcome(release, 202 if release.state != "available" else 200, f"/v1/releases/{release.id}")


SPARK_JOB = SparkJob()


def _fail(ctx: ServiceContext, release_id: str, failure: Failure) -> None:
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id, with_for_update=True)
        if release.state == "running":
            release.state, release.error_json = "failed", failure.as_json()
