"""The labels-party HTTP API (FastAPI): the routers of :mod:`labels_party.routers` (thin, over
:mod:`labels_party.service` and :mod:`labels_party.releases`) behind the gatekeeper.

Every route under ``/v1`` is guarded *before any body is read*: :class:`Gatekeeper` authenticates the key (401),
checks that it may see the dataset a path names (404, the same as for a dataset that does not exist) and that it
may administer it where the route needs that (403), and only then lets the route read a body — limited per
endpoint (413) and, for columnar bodies, streamed to disk and hashed on the way. Errors are always JSON
``{"error": {"code", "message"}}`` with a 4xx status documented in the OpenAPI; unexpected failures answer 500
with no stack trace.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI

from labels_party import access
from labels_party.auth import Principal, authenticate
from labels_party.console.app import create_console
from labels_party.context import ServiceContext
from labels_party.routers import audit, datasets, mechanisms, releases
from shared.service.app import service_app

log = logging.getLogger("labeldp.labels")

_DATASET_PATH = re.compile(r"^/v1/datasets/([^/]+)(/[^/]+)?$")
_ADMIN_ONLY = {("PUT", "/labels"), ("POST", "/grants")}
_COLUMNAR = ("/prior-releases", "/group-releases")


def _authorizer(ctx: ServiceContext):
    """The gatekeeper's check: the key (401), the dataset a path names is visible to it (404), and it may
    administer it where the route needs that (403) — before any body is read."""

    def authorize(method: str, path: str, authorization: str) -> Principal:
        with ctx.sessions() as session, session.begin():
            principal = authenticate(session, authorization or None)
            match = _DATASET_PATH.match(path)
            if match:
                access.accessible_dataset(session, principal, match.group(1),
                                          admin=(method, match.group(2) or "") in _ADMIN_ONLY)
            return principal

    return authorize


def _body_limit(ctx: ServiceContext):
    def limit(method: str, path: str) -> int:
        settings = ctx.settings
        if method == "PUT" and path.endswith("/labels"):
            return settings.max_upload_bytes
        if path.endswith(_COLUMNAR):
            return settings.max_columnar_bytes
        return settings.max_json_bytes

    return limit


def create_app(ctx: ServiceContext) -> FastAPI:
    app = service_app("labeldp labels party", ctx, authorize=_authorizer(ctx), limit=_body_limit(ctx),
                      routers=(datasets.router, releases.router, mechanisms.router, audit.router), log=log,
                      adjust_openapi=lambda spec: _epsilon_range(spec, ctx.settings),
                      private_dirs=(ctx.settings.data_dir,))
    # The owner's console (HTML for admin keys, its own gate and session cookies; not part of the OpenAPI).
    app.mount("/console", create_console(ctx))
    return app


def _epsilon_range(spec: dict, settings) -> None:
    """This deployment's ε range on every ε a request carries (schemas and query parameters), so generated
    clients and fuzzers know it."""
    low, high = settings.epsilon_min, settings.epsilon_max
    for model in ("ReleaseRequest", "EvaluationRequest", "CentralTrainingRequest"):
        for name, prop in spec["components"]["schemas"][model]["properties"].items():
            if name in ("epsilon", "prior_epsilon"):
                for option in prop.get("anyOf", [prop]):
                    if option.get("type") == "number":
                        option.update(minimum=low, maximum=high)
    for path in spec["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] in ("epsilon", "prior_epsilon"):
                    parameter["schema"].update(minimum=low, maximum=high)
