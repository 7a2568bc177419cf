"""The FastAPI dependency every router uses for the service's context (settings, database sessions, storage), which
``create_app`` puts on ``app.state``: routers are module-level and reach it through this, so nothing is a module
global. What a request is admitted to comes from its route's guard (:mod:`shared.service.gate`).

Database sessions are not a route dependency on purpose: a release spans two transactions with a solver run
between them (charge, compute outside any transaction, publish), so the service functions own
their transactions (``ctx.sessions()``)."""

from __future__ import annotations

from typing import Any

from fastapi import Request


def context(request: Request) -> Any:
    """The service context ``create_app`` was given."""
    return request.app.state.ctx
