"""What a job worker runs (:class:`shared.service.leases.JobRunner`'s callable, built by
:func:`labels_party.runtime.context.make_context`): one attempt at a job of :mod:`labels_party.runtime.jobs`, by its
kind, and the attempt's failure classified — final at once (a refusal running again cannot cure), or retried until
``job_max_attempts`` — and recorded while the lease is held."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from labels_party.releases import liveness, privatization, source_datasets
from labels_party.runtime import jobs
from labels_party.runtime.jobs import Claimed, Failure, JobContext
from labels_party.store import db
from shared.errors import LabelDPError
from shared.service.leases import Lease

log = logging.getLogger("labeldp.jobs")


@dataclass(frozen=True)
class Kind:
    run: Callable[[JobContext, Claimed], None]
    classify: Callable[[Exception], tuple[Failure, bool]]  # (what the subject shows, whether it is final at once)


KINDS = {jobs.REGISTER_SOURCE: Kind(source_datasets.run_registration, source_datasets.classify),
         jobs.PRIVATIZE_SOURCE: Kind(privatization.run_privatization, privatization.classify),
         jobs.COMPUTE_RELEASE: Kind(liveness.run_abandoned, liveness.classify)}


def run(ctx: JobContext, lease: Lease, lost: threading.Event) -> None:
    """One attempt at the job ``lease`` holds, its outcome recorded while the lease is."""
    with ctx.sessions() as session, session.begin():
        job = session.get(db.Job, lease.job_id)
        claimed = Claimed(lease, job.kind, job.subject_id, job.org_id, json.loads(job.spec_json), job.sealed_secret,
                          lost)
    kind = KINDS[claimed.kind]
    try:
        kind.run(ctx, claimed)
    except Exception as err:
        failure, final = kind.classify(err)
        final = final or claimed.attempt >= ctx.settings.job_max_attempts
        what = (lease.job_id, claimed.kind, claimed.subject_id, claimed.attempt, "final" if final else "retried")
        if isinstance(err, LabelDPError):
            log.warning("job %s (%s of %s), attempt %d: %s (%s)", *what[:4], err.code, what[4])
        else:  # the stack is the operator's (never a secret: jobs log no secret, and hold it only as bytes)
            log.exception("job %s (%s of %s), attempt %d failed (%s)", *what)
        jobs.settle_failure(ctx, claimed, failure, final)
