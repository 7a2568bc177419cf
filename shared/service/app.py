"""A party's FastAPI application on the skeleton: the gatekeeper in front of every route, the JSON error envelope,
``/healthz`` and ``/readyz``, the party's routers, an OpenAPI that documents the API key and the pages that show it
(:mod:`shared.service.docs`, whole without internet access). Each party supplies only what is its own: how a key is
authorized for a path, body limits per endpoint, routers, its readiness checks (:mod:`shared.service.health`), and
any OpenAPI adjustment."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI

from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.service import docs, gate, health, limits, openapi
from shared.service.errors import install_error_handlers

_NOT_READY = ("not_ready: a check failed (its name in the message): database, the database did not answer in time; "
              "schema, the database is not at this version's migration head (upgrade-db); any other, the party's "
              "own (its background workers)")


def service_app(title: str, ctx: Any, *, admit: gate.Admit, guard_type: type[gate.Guard],
                routers: Iterable[APIRouter], log: logging.Logger, readiness: Mapping[str, health.Check],
                lifespan: Any = None,
                adjust_openapi: Callable[[dict], None] | None = None,
                private_dirs: Iterable[str | Path] = ()) -> FastAPI:
    """``admit(guard, path_params, authorization)`` decides a request by the guard its route declares, before any
    body is read (:mod:`shared.service.gate`; every route of ``routers`` is a ``GuardedRoute`` whose guard is a
    ``guard_type``, the party's own, so ``admit`` never sees another); ``ctx`` is the
    party's context (``app.state.ctx``); ``readiness``: the named checks ``/readyz`` runs
    (:func:`shared.service.health.readiness_checks`); no error message names a path under ``private_dirs`` (the
    data directory) or the temporary directory."""
    app = FastAPI(title=title, version="1", lifespan=lifespan, responses=openapi.error_responses(),
                  docs_url=None, redoc_url=None)  # FastAPI's pages load from a CDN: ours are served whole
    app.state.ctx, app.state.admit, app.state.routers = ctx, admit, tuple(routers)
    settings = getattr(ctx, "settings", None)
    if isinstance(settings, limits.HttpSettings):  # what JSON bodies may decode to (the gate reads them)
        app.state.decode_budget = limits.json_budget(settings)
    install_error_handlers(app, log, private_dirs)

    checks = dict(readiness)

    @app.get("/healthz", summary="The process answers (no other check: see /readyz)")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=schemas.ReadyBody, summary="Ready to serve requests",
             description=f"Checks, in order: {', '.join(checks) or 'none'}. 200 when every check passes; 503 "
                         "not_ready naming those that failed.",
             responses={503: {"model": schemas.ErrorBody, "description": _NOT_READY}})
    def readyz() -> dict:  # a plain function: FastAPI runs it in a worker thread (the checks block)
        failed = health.failed_checks(checks)
        if failed:
            raise LabelDPError(f"not ready: failed check(s): {', '.join(failed)}", code=ErrorCode.NOT_READY)
        return {"status": "ready", "checks": dict.fromkeys(checks, "ok")}

    for router in app.state.routers:
        unguarded = [getattr(r, "path", repr(r)) for r in router.routes
                     if not (isinstance(r, gate.GuardedRoute) and isinstance(r.guard, guard_type))]
        if unguarded:
            raise TypeError(f"routes without a guard: {unguarded}")
        app.include_router(router)

    def adjust(spec: dict) -> None:
        if isinstance(settings, limits.HttpSettings):  # this deployment's HTTP limits, where clients look
            spec["info"]["description"] = limits.describe(settings)
        if adjust_openapi is not None:
            adjust_openapi(spec)

    openapi.install(app, gate.PUBLIC_PATHS, adjust)
    docs.install(app)
    return app
