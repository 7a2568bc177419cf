"""The features-party trainer service (FastAPI), on the service skeleton of :mod:`shared.service`: the routers of
:mod:`features_party.routers` (features tables, jobs) over :mod:`features_party.service`.

Every route under ``/v1`` needs a trainer API key, checked before any body is read; features tables, jobs, models
and predictions belong to the key's organization (others get 404). The labels parties a job may use are the
trainer's configuration (``--labels-party NAME=URL``); a job names one, never a URL.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI

from features_party import access
from features_party.context import TrainerContext
from features_party.routers import features, jobs
from shared.service.app import service_app

log = logging.getLogger("labeldp.features")


def create_app(ctx: TrainerContext) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        ctx.executor.shutdown(wait=False, cancel_futures=True)

    return service_app("labeldp features party (trainer)", ctx, admit=access.admitter(ctx.sessions, ctx.settings),
                       guard_type=access.Access,
                       routers=(features.router, jobs.router), log=log, lifespan=lifespan,
                       private_dirs=(ctx.settings.data_dir,))
