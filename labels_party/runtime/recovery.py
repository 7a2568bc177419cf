"""What the labels service checks and repairs when it starts, before it answers a request.

1. **The database is not behind the data directory.** Every append to a dataset's chain (a charge or a fact)
   anchors its head in the data directory before it commits (:class:`labels_party.ledger.Anchor`). A database
   restored from a backup older than the data directory has lost ledger records of releases that were delivered;
   answering from it would re-draw them (a retried Idempotency-Key would get fresh noise) and under-count every
   budget. The service refuses to
   start instead (``ledger_rollback``), naming the restore procedure: restore both from the same backup. A dataset
   with records but no anchor (a data directory that is not this database's, or whose anchors were removed) is
   refused the same way; datasets from before anchors get theirs when their accounts are rebuilt (2).
2. **Accounts the migration to per-organization budgets left empty** are rebuilt from the ledger's records
   (:func:`labels_party.ledger.budgets.rebuild_migrated`), once — only right after that migration: a rebuild flag on any
   other chain was set by a database writer and is refused. Then **every table agrees with its chain**
   (:mod:`labels_party.ledger.agreement`), or the service refuses to start (``ledger_tampered``).
3. **Releases a dead process was computing** were charged before they were computed; they become ``failed`` and
   stay charged (their files, if any, go). Beside live replicas, an uploaded dataset's release is failed by
   whichever replica claims its ``compute_release`` job once the dead process's lease expired
   (:mod:`labels_party.releases.liveness`); alone, this start fails it at once and finishes that job, so no worker
   handles it again. A source release is a durable job (:mod:`labels_party.runtime.jobs`) once planned, which any
   replica takes over when its worker's lease expires; one whose process died while planning it (before its job was
   queued) fails here like the others.

The check (1) runs beside other live replicas too: each dataset's row is read locked (PostgreSQL: ``FOR SHARE``) while
its anchor is read, so a charge another replica is committing cannot be seen half done (its anchor written, its
row not yet). 2 takes the datasets' locks; 3 runs only when this process is alone on the data directory.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from labels_party.ledger import Ledger, LedgerRollback, budgets, rollback_message
from labels_party.ledger.agreement import check_tables
from labels_party.runtime.jobs import COMPUTE_RELEASE, INTERRUPTED, PRIVATIZE_SOURCE
from labels_party.store import db
from labels_party.store.storage import DataStore
from shared.service.scratch import TEMPORARY, Scratch, remove

log = logging.getLogger("labeldp.labels")


def recover(store: DataStore, sessions: sessionmaker, ledger: Ledger, scratch: Scratch) -> None:
    """Every start (a server, or a command such as ``create-key``): 1 and 2; 3 only when no other live process
    uses the data directory (a running server's releases in progress look interrupted too)."""
    check_not_rolled_back(sessions, ledger)
    with sessions() as session, session.begin():  # under the datasets' locks: safe beside a running server
        rebuilt = budgets.rebuild_migrated(ledger, session)
    if rebuilt:
        log.info("rebuilt the budget accounts of %d dataset(s) from their ledger records", rebuilt)
    check_agreement(sessions, ledger)
    with scratch.alone() as alone:
        failed = fail_interrupted(store, sessions) if alone else 0
    if failed:
        log.info("%d release(s) interrupted by an earlier process are failed (and stay charged)", failed)


def check_not_rolled_back(sessions: sessionmaker, ledger: Ledger) -> None:
    """Every dataset the data directory anchored must exist, every dataset must be where its anchor says, and
    every release file must have its release row: a release is charged (its row committed) before its file is
    written, so a file the database does not know was delivered by a database this one is older than."""
    with sessions() as session, session.begin():
        for dataset_id in ledger.anchored_datasets():
            if session.get(db.Dataset, dataset_id) is None and not ledger.uncommitted_creation(dataset_id):
                raise LedgerRollback(rollback_message(dataset_id))
        migrating = set(session.scalars(select(db.BudgetAccount.dataset_id).where(db.BudgetAccount.needs_rebuild)))
        # locked while their anchors are read: another replica's charge commits before or after, never between
        for dataset in session.scalars(select(db.Dataset).with_for_update(read=True)):
            if dataset.id not in migrating or ledger.read_anchor(dataset.id) is not None:
                # (a database from before anchors, restored beside a data directory that has them, is checked too)
                ledger.check_anchor(session, dataset)
        if migrating and not ledger.anchored_datasets():
            return  # the first start after the migration to accounts: older versions left unreferenced files
        known = {Path(file).name for file in session.scalars(select(db.Release.file))}
    releases = ledger.store.path("releases")
    unknown = [entry.name for entry in releases.iterdir() if entry.name not in known
               and not TEMPORARY.match(entry.name)] if releases.is_dir() else []
    if unknown:
        raise LedgerRollback(f"{len(unknown)} release file(s) in the data directory (e.g. releases/{unknown[0]}) "
                             "have no release in the database: it is older than the data directory (restored from "
                             "an older backup?). Restore the database and the data directory from the same backup "
                             "(docs/design/exact-ledger.md, 'Restoring')")


def check_agreement(sessions: sessionmaker, ledger: Ledger) -> None:
    """Every dataset's tables against its chain (:func:`labels_party.ledger.agreement.check_tables`): a database
    changed outside the service is refused (``ledger_tampered``), never repaired from its tables."""
    with sessions() as session, session.begin():
        datasets = session.scalars(select(db.Dataset).order_by(db.Dataset.id).with_for_update(read=True)).all()
        check_tables(session, ledger, datasets)


def fail_interrupted(store: DataStore, sessions: sessionmaker) -> int:
    """Releases ``running`` without anything to finish them (only when no other process is live): an uploaded
    dataset's (computed in its request; its ``compute_release`` job is finished with it), or a source release's
    without a job (its process died planning it)."""
    with sessions() as session, session.begin():
        queued = select(db.Job.subject_id).where(db.Job.kind == PRIVATIZE_SOURCE)
        rows = session.scalars(select(db.Release).join(db.Dataset, db.Dataset.id == db.Release.dataset_id).where(
            db.Release.state == "running",
            db.Dataset.source_uri.is_(None) | db.Release.id.not_in(queued))).all()
        for release in rows:
            release.state, release.error_json = "failed", INTERRUPTED.as_json()
        _finish_request_jobs(session, [release.id for release in rows])
        files = [file for file in (release.own_file() for release in rows) if file is not None]
    for file in files:
        remove(store.path(file))  # a file, or a Spark job's directory
    return len(files)


def _finish_request_jobs(session: Session, release_ids: list[str]) -> None:
    """The ``compute_release`` jobs of releases failed here: failed with them, their dead owners' leases cleared
    (a worker claiming one later would find its release failed already, and change nothing but the job)."""
    if not release_ids:
        return
    for job in session.scalars(select(db.Job).where(db.Job.kind == COMPUTE_RELEASE, db.Job.state == "running",
                                                    db.Job.subject_id.in_(release_ids))):
        job.state, job.error_code, job.error_message = "failed", INTERRUPTED.code, INTERRUPTED.message
        job.lease_owner = job.lease_expires_at = None
