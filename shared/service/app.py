"""A party's FastAPI application on the skeleton: the gatekeeper in front of every route, the JSON error envelope,
``/healthz``, the party's routers and an OpenAPI that documents the API key. Each party supplies only what is its
own: how a key is authorized for a path, body limits per endpoint, routers, and any OpenAPI adjustment."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from fastapi import APIRouter, FastAPI

from shared.service import gate, openapi
from shared.service.errors import install_error_handlers


def service_app(title: str, ctx, *, authorize: Callable, limit: Callable[[str, str], int],
                routers: Iterable[APIRouter], log: logging.Logger, lifespan=None,
                adjust_openapi: Callable[[dict], None] | None = None,
                private_dirs: Iterable[str | Path] = ()) -> FastAPI:
    """``authorize(method, path, authorization)`` returns the principal or raises (before any body is read);
    ``limit(method, path)`` is the body limit in bytes; ``ctx`` is the party's context (``app.state.ctx``);
    no error message names a path under ``private_dirs`` (the data directory) or the temporary directory."""
    app = FastAPI(title=title, version="1", lifespan=lifespan, responses=openapi.error_responses())
    app.state.ctx = ctx
    app.add_middleware(gate.Gatekeeper, authorize=authorize, limit=limit)
    install_error_handlers(app, log, private_dirs)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    for router in routers:
        app.include_router(router)
    openapi.install(app, gate.PUBLIC_PATHS, adjust_openapi)
    return app
