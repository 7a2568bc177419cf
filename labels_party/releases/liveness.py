"""An uploaded dataset's release is computed inside its request (:data:`.transaction.IN_PROCESS`); its liveness is a
lease, so that a replica fails it when the process computing it is gone — without waiting for a process to start
alone on the data directory (:func:`labels_party.runtime.recovery.fail_interrupted`, the fallback).

* **Lease.** The transaction that charges the release and inserts it ``running`` also inserts its
  ``compute_release`` job (:mod:`labels_party.runtime.jobs`), already claimed by this process: attempt 1, the process's
  job runner as ``lease_owner``, expiring ``job_lease_seconds`` later (:func:`lease`).
* **Renew.** From the commit until the request has recorded its outcome, the runner's heartbeat renews the lease
  with the jobs its workers hold (:func:`computing`) — from the commit, not from the adoption: the lease's expiry
  is set again as the charge commits and the heartbeat holds it until the request adopts it, since what runs in
  between (the ledger's confirmation, under the dataset's lock) may wait longer than a lease under load (issue
  40). A process whose workers were not started (tests, commands) renews it all the same: its runner starts the
  heartbeat on demand while it holds such a lease (:meth:`shared.service.leases.JobRunner.lease_new`,
  :meth:`~shared.service.leases.JobRunner.adopted`). So the lease is valid exactly while the process lives and
  reaches the database, however long the release computes, and no longer.
* **Settle.** The transaction that records the outcome — the release ``available`` (:func:`.lifecycle.finish`) or
  ``failed`` (:func:`.lifecycle.fail`) — locks the release's row, then the job's, and finishes the job only if this
  process still holds the lease (:func:`settle`, fenced like :meth:`~shared.service.leases.LeaseTable.held`). A
  request that lost it records nothing, delivers nothing and removes the file it wrote: its client gets the same
  503 ``release_failed`` as for any failure after the charge, nothing in it about the data.
* **Take over.** A process killed (``kill -9``, OOM, a lost machine) stops renewing; once the lease has expired any
  replica's worker claims the job (the next poll after the expiry) and runs :func:`run_abandoned`: the release, if
  still ``running``, becomes ``failed`` — charged, error ``release_failed`` with the message a lone start's sweep
  gives it — its file (if the dead process wrote one) is removed and the job is ``failed``. A client's re-send with
  the Idempotency-Key then gets ``release_failed`` instead of ``release_in_progress``: never a new draw or charge.

A release fails once: every path that fails it (this request, the worker, a lone start's sweep) changes it only
while it is ``running``, under its row's lock. Source releases are not leased here: their Spark job is a durable
job of its own once planned (:mod:`.source`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from sqlalchemy.orm import Session

from labels_party.runtime import jobs
from labels_party.runtime.jobs import INTERRUPTED, Claimed, Failure, JobContext
from labels_party.store import db
from shared.service.leases import JobRunner, Lease
from shared.service.scratch import remove

log = logging.getLogger(__name__)


def lease(runner: JobRunner, session: Session, release: db.Release) -> Lease:
    """The release's ``compute_release`` job, leased by this process, in the transaction that charges it."""
    return jobs.lease_request(runner, session, org_id=release.requester_org_id, kind=jobs.COMPUTE_RELEASE,
                              subject_id=release.id)


@contextlib.contextmanager
def computing(runner: JobRunner, held: Lease | None) -> Iterator[None]:
    """The lease renewed while the block computes the release (None: a release without one)."""
    if held is None:
        yield
        return
    with runner.adopted(held):
        yield


def settle(runner: JobRunner, session: Session, release_id: str, state: str) -> bool:
    """In the transaction that records the release's outcome, its row locked: the release's ``compute_release``
    job finished ``state`` if this process still holds its lease. False if it does not — another replica took the
    release over (it is, or is about to be, ``failed``), and the caller records nothing. A release without such a
    job (a source release's, or one charged by an earlier version) has nothing to fence: True."""
    job = jobs.job_of(session, jobs.COMPUTE_RELEASE, release_id, lock=True)
    if job is None:
        return True
    row = runner.table.held(session, Lease(job.id, runner.owner, 1))  # the lease the charge took: attempt 1
    if row is None:
        return False
    runner.table.finish(row, state)
    return True


def run_abandoned(ctx: JobContext, claimed: Claimed) -> None:
    """The ``compute_release`` job, claimed: the request's lease expired (its process died, or was cut off past
    it), so the release, if still ``running``, is failed — charged, nothing about the data — and its file removed."""
    with jobs.holding(ctx, claimed) as held:
        if held is None:
            return
        _session, job, release = held
        if release is not None and release.state == "running":
            release.state, release.error_json = "failed", INTERRUPTED.as_json()
            job.error_code, job.error_message = INTERRUPTED.code, INTERRUPTED.message
            log.warning("release %s: the process computing it is gone (its lease expired); failed, stays charged",
                        claimed.subject_id)
        available = release is not None and release.state == "available"
        ctx.jobs.table.finish(job, "succeeded" if available else "failed")
        file = release.own_file() if release is not None and release.state == "failed" else None
    if file is not None:
        remove(ctx.store.path(file))


def classify(_err: Exception) -> tuple[Failure, bool]:
    """A failure to record it (the database away): retried; once attempts run out the release fails all the same."""
    return INTERRUPTED, False
