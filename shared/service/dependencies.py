"""FastAPI dependencies every router uses: the principal the gatekeeper authenticated and the service's context
(settings, database sessions, storage), which ``create_app`` puts on ``app.state``. Routers are module-level and
reach both through these, so nothing is a module global.

Database sessions are not a route dependency on purpose: a release spans two transactions with a solver run
between them (reserve, solve outside any transaction, charge and publish in one), so the service functions own
their transactions (``ctx.sessions()``)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from shared.errors import LabelDPError


def principal(request: Request) -> Any:
    """The principal the gatekeeper authenticated."""
    found = request.scope.get("state", {}).get("principal")
    if found is None:  # only routes outside /v1 are unguarded, and none of them asks for a principal
        raise LabelDPError("missing bearer API key", code="unauthorized")
    return found


def context(request: Request) -> Any:
    """The service context ``create_app`` was given."""
    return request.app.state.ctx
