"""The labels party's durable jobs: rows of ``jobs`` (:class:`labels_party.store.db.Job`) that any replica's workers run
under leases (:mod:`shared.service.leases`), so that a job survives the request that made it and the process that
ran it.

Three kinds:

* ``register_source`` (subject: a dataset ``registering``) — the source is copied and Spark counts the copy
  (:func:`labels_party.releases.source_datasets.run_registration`); the dataset becomes ``ready``, or ``failed`` with
  the refusal its owner's admins see;
* ``privatize_source`` (subject: a source release ``running``) — the Spark job that samples every label
  (:func:`labels_party.releases.privatization.run_privatization`) from the stored mechanism document and the release's
  secret, which the job row holds sealed (:mod:`shared.service.sealing`); the release becomes ``available``;
* ``compute_release`` (subject: an uploaded dataset's release ``running``) — the release is computed by its own
  request, which inserts this job already leased by its process (:func:`lease_request`) and finishes it with the
  release's outcome; a worker claims it only once that lease expired — the process died, or was cut off past it —
  and fails the release (:mod:`labels_party.releases.liveness`).

A job records its outcome only in a transaction that locks its subject's row, then its own, and checks that its
lease is still held (:func:`holding`): a worker that lost its lease (paused past it, cut from the database) and
finishes late changes nothing. Failures: a refusal that cannot change by running again (a source that is not
there, a missing secret key, a document that does not rebuild) fails the job and its subject at once; anything
else is retried by any worker after ``job_retry_seconds``, at most ``job_max_attempts`` claims in all, then the job
and its subject are ``failed``. A worker that dies mid-job leaves its lease to expire: another replica's worker
claims it and runs it again from the start (a registration copies again; a release re-derives the same noise from
the same secret, so its files are the same bytes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, aliased, sessionmaker

from labels_party.ledger import Ledger
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from labels_party.store.storage import DataStore
from shared.errors import ErrorCode, resource_error
from shared.service.leases import JobRunner, Lease, LeaseTable
from shared.service.scratch import remove
from shared.service.sealing import Sealer
from shared.spark.runner import SparkJobs

log = logging.getLogger("labeldp.jobs")

REGISTER_SOURCE, PRIVATIZE_SOURCE, COMPUTE_RELEASE = "register_source", "privatize_source", "compute_release"
ATTEMPTS = "tmp/jobs"  # under the data directory: each attempt's files until it records them (collected when alone)


class JobContext(Protocol):
    """What a job uses of the service's context (:class:`labels_party.runtime.context.ServiceContext` is one): jobs run
    below the context, which builds the workers that run them (:mod:`labels_party.runtime.workers`)."""

    @property
    def sessions(self) -> sessionmaker: ...

    @property
    def store(self) -> DataStore: ...

    @property
    def settings(self) -> LabelsSettings: ...

    @property
    def checkpoint(self) -> Callable[[str], None]: ...

    @property
    def random_source(self) -> Callable[[], np.random.Generator]: ...

    @property
    def spark_jobs(self) -> SparkJobs: ...

    @property
    def sealer(self) -> Sealer: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def jobs(self) -> JobRunner: ...

    @property
    def storage_quota(self) -> int: ...


@dataclass(frozen=True)
class Failure:
    """What a job (and its subject) ended with: a code of :class:`shared.service.errors.ErrorCode` and a message
    its requester may read."""

    code: str
    message: str

    def as_json(self) -> str:
        return json.dumps({"code": self.code, "message": self.message})


@dataclass(frozen=True)
class Claimed:
    """One attempt at a job, as its worker runs it: the lease (its fencing token), the job's public spec, its
    sealed secret, and ``lost`` — set by the heartbeat when another worker took the job over."""

    lease: Lease
    kind: str
    subject_id: str
    org_id: int
    spec: dict
    sealed_secret: bytes | None
    lost: threading.Event

    @property
    def attempt(self) -> int:
        return self.lease.attempt


# What a release shows that was charged and then not completed — its request failed, or its process died: nothing
# about the data (the same for every cause).
INTERRUPTED = Failure("release_failed", "the release could not be completed after it was charged")


def lease_table(settings: LabelsSettings, store: DataStore) -> LeaseTable:
    def exhausted(session: Session, job: db.Job) -> None:
        _exhausted(store, session, job)

    return LeaseTable(db.Job, "state", ("queued",), "running", settings.job_max_attempts, exhausted=exhausted,
                      order_by=_fair_order)


def _fair_order() -> tuple[Any, ...]:
    """Claim order before the oldest job first: the organization with the fewest jobs running now. An outside review
    queued 20 cheap source releases and delayed another organization's next one from 1.7 s to 20.8 s; now that one
    runs as soon as a worker is free."""
    other = aliased(db.Job)
    running = (select(func.count()).select_from(other).where(other.org_id == db.Job.org_id, other.state == "running")
               .correlate(db.Job).scalar_subquery())
    return (running.asc(),)


def make_runner(sessions: sessionmaker, settings: LabelsSettings, store: DataStore,
                run: Callable[[Lease, threading.Event], None]) -> JobRunner:
    """The process's workers (started by ``serve`` only; tests and commands call ``run_pending``)."""
    return JobRunner("labels-jobs", sessions, lease_table(settings, store), run, threads=settings.job_threads,
                     lease_seconds=settings.job_lease_seconds, poll_seconds=settings.job_poll_seconds,
                     retry_seconds=settings.job_retry_seconds)


def queue(session: Session, *, org_id: int, kind: str, subject_id: str, spec: dict,
          sealed_secret: bytes | None = None) -> db.Job:
    """A new job, claimable once the caller's transaction commits."""
    job = db.Job(id=db.new_id(), org_id=org_id, kind=kind, subject_id=subject_id, state="queued",
                 spec_json=json.dumps(spec, sort_keys=True), sealed_secret=sealed_secret, attempts=0)
    session.add(job)
    return job


def lease_request(runner: JobRunner, session: Session, *, org_id: int, kind: str, subject_id: str) -> Lease:
    """A new job for work its request does itself, inserted in the caller's transaction already leased by this
    process (:meth:`~shared.service.leases.JobRunner.lease_new`): claimable by any worker once that lease expires."""
    return runner.lease_new(session, id=db.new_id(), org_id=org_id, kind=kind, subject_id=subject_id,
                            spec_json="{}", sealed_secret=None)


def requeue(job: db.Job) -> None:
    """A failed job queued again with its attempts reset (its request was sent again)."""
    job.state, job.attempts, job.error_code, job.error_message = "queued", 0, None, None
    job.lease_owner = job.lease_expires_at = job.run_after = None


def job_of(session: Session, kind: str, subject_id: str, *, lock: bool = False) -> db.Job | None:
    query = select(db.Job).where(db.Job.kind == kind, db.Job.subject_id == subject_id)
    return session.scalar(query.with_for_update() if lock else query)


# -- recording ------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def holding(ctx: JobContext, claimed: Claimed) -> Iterator[tuple[Session, db.Job, Any] | None]:
    """A transaction in which the attempt's lease is still held: its subject's row locked (the order every writer
    of both takes them in), then the job's, checked (:meth:`LeaseTable.held`). Yields (session, job, subject), or
    None if the lease was lost — then the attempt records nothing."""
    with ctx.sessions() as session, session.begin():
        subject = _lock_subject(session, claimed.kind, claimed.subject_id)
        job = ctx.jobs.table.held(session, claimed.lease)
        yield (session, job, subject) if job is not None else None


def settle_failure(ctx: JobContext, claimed: Claimed, failure: Failure, final: bool) -> None:
    """A failed attempt: the job (and its subject) failed with ``failure``, or given back to be retried."""
    with holding(ctx, claimed) as held:
        if held is None:
            log.warning("job %s: the lease was lost; another worker has it", claimed.lease.job_id)
            return
        session, job, subject = held
        job.error_code, job.error_message = failure.code, failure.message
        if final:
            _fail_subject(claimed.kind, subject, failure)
            ctx.jobs.table.finish(job, "failed")
        else:
            ctx.jobs.table.retry_later(job, "queued", ctx.settings.job_retry_seconds)


def unexpected(code: str, what: str) -> Failure:
    return Failure(code, f"{what} failed for a reason of the service's (logged for its operator)")


def resource_failure(err: Exception) -> Failure | None:
    """Running out of disk, memory or descriptors: the service's condition (retried), told as such."""
    resource = resource_error(err)
    return Failure(resource.code, str(resource)) if resource is not None else None


# -- subjects ------------------------------------------------------------------------------------------------------

def _lock_subject(session: Session, kind: str, subject_id: str) -> Any:
    """A registration's dataset; a release, after its dataset (the lock order of every writer: a release made
    available appends to its dataset's chain)."""
    if kind == REGISTER_SOURCE:
        return session.get(db.Dataset, subject_id, with_for_update=True)
    dataset_id = session.scalar(select(db.Release.dataset_id).where(db.Release.id == subject_id))
    if dataset_id is not None:
        session.get(db.Dataset, dataset_id, with_for_update=True)
    return session.get(db.Release, subject_id, with_for_update=True)


def _fail_subject(kind: str, subject: Any, failure: Failure) -> None:
    if subject is None:
        return
    if kind == REGISTER_SOURCE and subject.state == "registering":
        subject.state, subject.error_json = "failed", failure.as_json()
    elif kind in (PRIVATIZE_SOURCE, COMPUTE_RELEASE) and subject.state == "running":
        subject.state, subject.error_json = "failed", failure.as_json()


def _exhausted(store: DataStore, session: Session, job: db.Job) -> None:
    """A job claimed ``job_max_attempts`` times that came back once more (its last worker died): failed, with the
    last attempt's failure if it recorded one (the job row is locked: the claim's transaction). A request's release
    loses its file too, once the release is recorded failed."""
    failure = Failure(job.error_code, job.error_message) if job.error_code and job.error_message \
        else EXHAUSTED[job.kind]
    job.error_code, job.error_message = failure.code, failure.message
    subject = _lock_subject(session, job.kind, job.subject_id)
    _fail_subject(job.kind, subject, failure)
    job.state = "failed"
    if job.kind == COMPUTE_RELEASE and subject is not None and subject.state == "failed" and \
            subject.own_file() is not None:
        path = store.path(subject.file)
        # after the commit: a file removed from a release that then stayed running could be made available
        event.listen(session, "after_commit", lambda _session: remove(path), once=True)


# What a job's subject shows when its attempts ran out with no failure recorded (its workers died).
EXHAUSTED = {
    REGISTER_SOURCE: unexpected(code=ErrorCode.REGISTRATION_FAILED,
                                what="copying and counting the source (its workers stopped, attempts exhausted)"),
    PRIVATIZE_SOURCE: Failure(
        code=ErrorCode.RELEASE_FAILED,
        message="the release's Spark job did not complete (its workers stopped, attempts exhausted); send the request "
                "again with its Idempotency-Key to run it again (the same charge and noise)"),
    COMPUTE_RELEASE: INTERRUPTED,
}
