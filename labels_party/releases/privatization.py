"""The ``privatize_source`` job of a source release (:mod:`labels_party.releases.source` queues it; any replica's
worker runs it, :mod:`labels_party.runtime.workers`): the sampler rebuilt from the release's stored mechanism document,
the release's secret opened from its seal, the Spark job run over the registration's copy into this attempt's own
directory, and — only while the attempt still holds its lease — that directory made the release's files, their
digest sealed and the release ``available``. Every attempt with the same secret writes the same bytes
(:mod:`labels_party.spark.jobs`), so a takeover or a retry repeats the work, never a draw.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid

from sqlalchemy.orm import Session

from labels_party.core.pipeline import PLAN_FIELDS
from labels_party.ledger import Ledger, documents, tampered, within_charge
from labels_party.releases.source_datasets import snapshot_uri
from labels_party.runtime import jobs
from labels_party.runtime.jobs import Claimed, Failure, JobContext
from labels_party.store import db
from labels_party.store.usage import file_bytes, stored_bytes
from shared import schemas
from shared.domains import domain_from_spec
from shared.errors import ErrorCode, LabelDPError
from shared.service.storage_quota import KEPT_FOR_THE_AUDIT, check_room

log = logging.getLogger(__name__)

# A job's failures that running it again cannot cure: the release fails at once, with this code and message (about
# the deployment's key or the public document, nothing about the labels).
FINAL = frozenset({"secret_key_missing", "sealed_secret_damaged", "invalid_mechanism_document",
                   "mechanism_not_supported_on_spark", "job_format_retired", "storage_quota_exceeded"})
RETRIED = ("the release's Spark job failed; it is retried (the same charge and noise) a few times, then the release "
           "is failed: send the request again with its Idempotency-Key to run it again")


def secret_context(release_id: str) -> str:
    """What a release's sealed secret is bound to (:meth:`shared.service.sealing.Sealer.seal`)."""
    return f"release-secret:{release_id}"


def seal(ledger: Ledger, session: Session, release: db.Release, sealed: tuple[int, str]) -> None:
    """Make a release available with the size and SHA-256 of its file (read before the transaction: a large file
    is not hashed under the row lock) — on its row and, as a fact, on its dataset's chain (the caller locked the
    dataset's row, then the release's): what is served, and what verify-audit checks, must be that file."""
    release.state = "available"
    release.file_size, release.file_sha256 = sealed
    dataset = session.get(db.Dataset, release.dataset_id)  # locked by the caller, before the release
    assert dataset is not None  # a release's dataset is never deleted
    ledger.release_available(session, dataset, release)


def run_privatization(ctx: JobContext, claimed: Claimed) -> None:
    """The ``privatize_source`` job: the release's dataset's snapshot (the files counted at registration), sampled
    with the rebuilt mechanism and the release's secret, written to this attempt's directory, and made the
    release's files only while the lease is held."""
    from labels_party.spark.jobs import privatize

    spec, release_id = claimed.spec, claimed.subject_id
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id)
        state, expected, mechanism_hash = release.state, release.num_examples, release.mechanism_hash
        dataset = session.get(db.Dataset, release.dataset_id)
        source, source_sha256 = snapshot_uri(ctx, session, dataset), dataset.source_sha256
        # the document the chain stated when the release was charged and queued, never the row's or the job's alone
        # (the thirty-fifth review pointed both at an ε=8 document for an ε=1 charge)
        stated, charged_units = ctx.ledger.document_of(session, dataset, release_id) if state == "running" else \
            (None, 0)
        support = domain_from_spec(json.loads(dataset.domain_json)).support().values  # (checked: snapshot_uri)
        if state == "running" and release.own_file() != f"releases/{release_id}":  # its files go there only
            raise tampered(dataset.id, [f"release {release_id}'s file is not its own"])
        document = documents.unpack(documents.stored(session, stated.mechanism_hash),
                                     ctx.settings.max_document_bytes) \
            if stated is not None and mechanism_hash == spec["mechanism_hash"] == stated.mechanism_hash else None
    if state != "running":  # nothing to do (cannot happen: a job is queued only with its release running)
        with jobs.holding(ctx, claimed) as held:
            if held is not None:
                ctx.jobs.table.finish(held[1], "succeeded" if state == "available" else "failed")
        return
    sampler = _charged_sampler(document, spec["mechanism_hash"], charged_units)
    if claimed.sealed_secret is None:
        raise LabelDPError("this release's secret is gone; it cannot run again", code=ErrorCode.JOB_FORMAT_RETIRED)
    secret = ctx.sealer.open(claimed.sealed_secret, secret_context(release_id))
    if source_sha256 != spec["source_sha256"]:  # a job planned for other files (cannot happen: checked anyway)
        raise LabelDPError("the release was planned for other source files", code=ErrorCode.SOURCE_DATASET)
    assert stated is not None  # (a running release's)
    attempt = f"{jobs.ATTEMPTS}/{release_id}.{uuid.uuid4().hex}"  # this attempt's own output
    ctx.store.path(jobs.ATTEMPTS).mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        # the support is the chained domain's and the splits the chain's: what decides a failure and each
        # partition's noise stream is never a row's (the thirty-sixth review: a job's support made a release fail
        # on one label, and its splits drew an available release again)
        result = privatize(ctx.spark_jobs.session(), source, ctx.store.path(attempt).resolve().as_uri(), sampler,
                           secret, support_values=support, max_partition_bytes=stated.max_partition_bytes,
                           min_partitions=stated.min_partitions)
        ctx.checkpoint("spark_job_written")  # tests fail a job here, after its files were written
        if result.rows_written != expected:
            raise LabelDPError(f"{result.rows_written:,} rows released, {expected:,} charged",
                               code=ErrorCode.SOURCE_DATASET)
        _keep(ctx, claimed, attempt, result)
    finally:
        shutil.rmtree(ctx.store.path(attempt), ignore_errors=True)  # gone already once in place


def _charged_sampler(document: dict | None, mechanism_hash: str, charged_units: int):
    """The sampler of the document the chain stated (None: the row or job named another), refused before anything
    is drawn if it certifies more than the release's charge."""
    if document is None:
        raise LabelDPError("the job names another mechanism document than its release's chain",
                           code=ErrorCode.INVALID_MECHANISM_DOCUMENT)
    sampler = _sampler(document, mechanism_hash)
    if not within_charge(float(sampler.certified_epsilon), charged_units):
        raise LabelDPError("the release's mechanism certifies more than its charge",
                           code=ErrorCode.INVALID_MECHANISM_DOCUMENT)
    return sampler


def _keep(ctx: JobContext, claimed: Claimed, attempt: str, result) -> None:
    """The attempt's files made the release's, sealed and available — only while the job's lease is held, the
    release still running and its row naming its own file (read again: a row edited while Spark ran)."""
    release_id = claimed.subject_id
    sealed = ctx.store.digest(attempt)  # a file it cannot read fails the attempt, not a hang
    with jobs.holding(ctx, claimed) as held:
        if held is None:  # taken over: the attempt holding the lease records its own (identical) files
            log.warning("release %s: the job's lease was lost; this attempt's files are discarded", release_id)
            return
        session, job, release = held
        if release.state != "running":
            ctx.jobs.table.finish(job, "failed")
            return
        if release.own_file() != f"releases/{release_id}":
            raise tampered(release.dataset_id, [f"release {release_id}'s file is not its own"])
        _check_stored(ctx, session, release, file_bytes(ctx.store, attempt))
        _put_in_place(ctx, attempt, release.file)
        seal(ctx.ledger, session, release, sealed)
        release.error_json = None
        job.sealed_secret = None  # available: nothing is run again, the secret is not kept
        job.result_json = json.dumps({**result.execution, "partitions": result.partitions,
                                      "rows": result.rows_written})
        ctx.jobs.table.finish(job, "succeeded")


def recorded_execution(session: Session, release_id: str) -> schemas.ReleaseExecution | None:
    """Where the release's Spark job ran, as it recorded it when the release became available (None for a release
    that had no job, or whose job has not succeeded)."""
    job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release_id)
    if job is None or job.result_json is None:
        return None
    return schemas.ReleaseExecution.model_validate_json(job.result_json)


def classify(err: Exception) -> tuple[Failure, bool]:
    """A privatization's failure as its release shows it (charged: nothing about the labels), and whether it is
    final at once."""
    if isinstance(err, LabelDPError) and err.code in FINAL:
        return Failure(err.code, str(err)), True
    if isinstance(err, LabelDPError) and err.code == "source_dataset":
        return Failure("release_failed", "the release's source files are not the ones it was planned for"), True
    return Failure("release_failed", RETRIED), False


def _sampler(document: dict, mechanism_hash: str):
    """The release's sampler rebuilt from its stored document, which must be exactly what the rebuilt mechanism
    describes (with the plan's own fields): else ``invalid_mechanism_document``."""
    from shared.mechanisms.documents import sampler_from_description

    description = document.get("description")
    if not isinstance(description, dict):
        raise LabelDPError("the release's mechanism document has no description",
                           code=ErrorCode.INVALID_MECHANISM_DOCUMENT)
    sampler = sampler_from_description(description)
    restated = {**sampler.describe(), **{key: description[key] for key in PLAN_FIELDS if key in description}}
    if documents.address({**document, "description": restated}) != mechanism_hash:
        raise LabelDPError("the mechanism rebuilt from the release's document does not describe itself as the "
                           "document does", code=ErrorCode.INVALID_MECHANISM_DOCUMENT)
    return sampler


def _check_stored(ctx: JobContext, session: Session, release: db.Release, written: int) -> None:
    """The release's real output against its organization's quota, before it is kept: its estimate
    (:func:`labels_party.store.usage.release_bytes`) is public arithmetic on what the registration counted, and the
    files Spark writes are what the disk holds (the thirty-second review's releases wrote 24.7 times their estimate;
    17 of them stored 23.56 times the quota). Over it, the release fails — charged, as every release whose labels
    were drawn — and its files go. The organization's row is locked (after the dataset's and the release's, the
    order of every writer): its label uploads' commits and its other releases' checks come one at a time."""
    session.get(db.Organization, release.requester_org_id, with_for_update=True)
    used = stored_bytes(session, ctx.store, release.requester_org_id, {release.file: written})
    check_room(used - written, written, ctx.storage_quota, "keeping this release's files (its ε stays spent)",
               KEPT_FOR_THE_AUDIT)


def _put_in_place(ctx: JobContext, attempt: str, file: str) -> None:
    """This attempt's directory becomes the release's (one left by an attempt that died after its rename and before
    its commit goes first: the caller holds the lease), durably."""
    target = ctx.store.path(file)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    os.rename(ctx.store.path(attempt), target)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
