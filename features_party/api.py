"""The features-party trainer service (FastAPI), on the service skeleton of :mod:`shared.service`: the routers of
:mod:`features_party.routers` (features tables, id lists, jobs) over :mod:`features_party.service`.

Every route under ``/v1`` needs a trainer API key, checked before any body is read; features tables, id lists, jobs,
models and predictions belong to the key's organization (others get 404). The labels parties a job may use are the
trainer's configuration (``--labels-party NAME=URL``); a job names one, never a URL.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from features_party import access
from features_party.context import TrainerContext
from features_party.migrations import MIGRATIONS
from features_party.routers import features, id_lists, jobs
from features_party.settings import TrainerSettings
from shared.service.app import service_app
from shared.service.health import readiness_checks
from shared.service.leases import serving

log = logging.getLogger("labeldp.features")


def create_app(ctx: TrainerContext, *, run_jobs: bool = False) -> FastAPI:
    """The HTTP API on ``ctx``; with ``run_jobs`` (``serve``) it runs this process's job workers (``ctx.jobs``) while
    it serves, and ``/readyz`` checks they are alive (tests run jobs with ``ctx.jobs.run_pending()``)."""
    extra = {"job_workers": ctx.jobs.alive} if run_jobs else {}
    lifespan = serving(ctx.jobs if run_jobs else None)
    return service_app("labeldp features party (trainer)", ctx, admit=access.admitter(ctx.sessions, ctx.settings),
                       guard_type=access.Access,
                       routers=(features.router, id_lists.router, jobs.router), log=log, lifespan=lifespan,
                       readiness=readiness_checks(ctx.sessions.kw["bind"], MIGRATIONS.head(), extra_checks=extra),
                       adjust_openapi=lambda spec: _job_limits(spec, ctx.settings),
                       private_dirs=(ctx.settings.data_dir,))


def _job_limits(spec: dict, settings: TrainerSettings) -> None:
    """This deployment's job limits in the description of ``POST /v1/jobs``, and its labels parties' names as the
    values ``labels_party`` may take, so a client knows them up front."""
    party = spec["components"]["schemas"]["JobRequest"]["properties"]["labels_party"]
    for option in party.get("anyOf", [party]):
        if option.get("type") == "string" and settings.labels_parties:
            option["enum"] = sorted(settings.labels_parties)
    operation = spec["paths"]["/v1/jobs"]["post"]
    operation["description"] = operation.get("description", "") + (
        f"\n\nThis trainer's limits: a job's size (parameters × epochs × stages × rows) at most "
        f"{settings.max_job_size:.3g}, its predictions (features-table rows × model outputs) at most "
        f"{settings.max_prediction_cells:.3g} and a tree job's memory (model, histograms, matrices) at most "
        f"{settings.max_tree_bytes:.3g} bytes, an MLP job's memory (parameters' copies, a batch's activations, "
        f"matrices) at most {settings.max_mlp_bytes:.3g} bytes (else 400 "
        f"job_too_large); at least {settings.min_train_examples} examples to "
        f"train on (else 400 too_few_examples); {settings.max_job_seconds:g} s of wall time per running job (then it "
        f"stops and fails with error_code job_time_limit); {settings.max_jobs_per_org} jobs queued or running per "
        "organization (else 429 too_many_jobs, with Retry-After); organizations' queued jobs take turns; a job whose "
        f"labels party did not answer asks again after {settings.upstream_retry_seconds:g} s; a job starts at most "
        f"{settings.job_max_attempts} times (then it fails with error_code job_attempts_exhausted).")
