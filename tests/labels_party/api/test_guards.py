"""Access is declared on the routes and decided before any body is read.

Every ``/v1`` route of both services declares exactly one guard; for every route, each key that must be refused
(no key: 401; a consumer never granted the dataset: 404; a granted consumer on an owner's route: 403) is refused
by the gatekeeper with an ASGI ``receive`` that fails the test if the body is ever asked for."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fastapi import APIRouter, Depends, FastAPI

from features_party.api import create_app as trainer_app
from features_party.auth import create_key as trainer_key
from features_party.process import make_context as trainer_context
from features_party.settings import TrainerSettings
from labels_party.http import access
from labels_party.http.api import create_app
from shared.service import gate
from shared.service.app import service_app

PLACEHOLDERS = {"release_id": "r-none", "mechanism_hash": "0" * 64, "job_id": "j-none", "name": "t"}


def call_unread(app: FastAPI, method: str, path: str, authorization: str | None) -> int:
    """The status an app answers with, sending a body it must never read."""
    read = []
    sent: list[dict] = []

    async def receive():
        read.append(True)
        return {"type": "http.request", "body": json.dumps({"epsilon": 1}).encode(), "more_body": False}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", b"14")]
    if authorization:
        headers.append((b"authorization", authorization.encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"epsilon=1", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80), "app": app}
    asyncio.run(app(scope, receive, send))
    assert not read, f"{method} {path} read the body before refusing"
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def guarded_routes(app: FastAPI) -> list[tuple[str, str, gate.Guard]]:
    """Every route of the app's routers under /v1, with its guard."""
    routes = [(method, route.path, route.guard) for router in app.state.routers for route in router.routes
              for method in sorted(route.methods)]
    assert {path for _, path, _ in routes} == {p for p in app.openapi()["paths"] if p.startswith("/v1/")}
    return routes


def test_every_route_declares_one_guard():
    router = APIRouter(route_class=gate.GuardedRoute)
    with pytest.raises(TypeError, match="declares 0 guards"):
        router.add_api_route("/v1/unguarded", lambda: {})
    with pytest.raises(TypeError, match="declares 2 guards"):
        router.add_api_route("/v1/twice", lambda a=Depends(access.ANY_KEY), b=Depends(access.ADMIN_KEY): {})  # noqa: B008
    plain = APIRouter()
    plain.add_api_route("/v1/plain", lambda: {})
    with pytest.raises(TypeError, match="without a guard"):
        service_app("t", None, admit=lambda *_: None, guard_type=access.Access, routers=[plain],
                    log=logging.getLogger("t"), readiness={})


def test_labels_routes_refuse_before_reading_the_body(ctx, client, keys, dataset):
    app = create_app(ctx)
    routes = guarded_routes(app)
    assert len(routes) >= 14
    refused = {"unauthorized": 0, "not_found": 0, "forbidden": 0}
    for method, template, guard in routes:
        path = template.format(dataset_id=dataset, **PLACEHOLDERS)
        assert call_unread(app, method, path, None) == 401
        assert call_unread(app, method, path, "Bearer ldp_not-a-key") == 401
        refused["unauthorized"] += 1
        if guard.dataset != "none":
            assert call_unread(app, method, path, f"Bearer {keys['stranger']}") == 404, path
            assert call_unread(app, method, path, f"Bearer {keys['other_admin']}") == 404, path
            refused["not_found"] += 1
        if guard.dataset == "administer" or guard.admin_key:
            assert call_unread(app, method, path, f"Bearer {keys['consumer']}") == 403, path
            refused["forbidden"] += 1
    # the routes that name a dataset, and those for owners only (uploads, grants, creating datasets, the audit)
    assert refused["not_found"] >= 9 and refused["forbidden"] >= 4, refused


def test_trainer_routes_refuse_before_reading_the_body(tmp_path):
    ctx = trainer_context(TrainerSettings(database_url=f"sqlite:///{tmp_path}/t.sqlite", data_dir=tmp_path / "t"))
    with ctx.sessions() as session, session.begin():
        member = trainer_key(session, "publisher", "member")
    app = trainer_app(ctx)
    routes = guarded_routes(app)
    assert len(routes) >= 8
    for method, template, guard in routes:
        path = template.format(**PLACEHOLDERS)
        assert call_unread(app, method, path, None) == 401
        if guard.admin_key:
            assert call_unread(app, method, path, f"Bearer {member}") == 403


def test_a_guard_is_checked_against_its_route_when_defined():
    """A dataset guard on a path that names no dataset, or a plain route on a router of the service, is refused
    when the route is defined, not when a request arrives."""
    router = APIRouter(route_class=gate.GuardedRoute)
    with pytest.raises(TypeError, match="names none"):
        router.add_api_route("/v1/things", lambda who=Depends(access.SEE_DATASET): {})  # noqa: B008
    plain = APIRouter(route_class=gate.GuardedRoute)
    plain.add_route("/v1/raw", lambda request: None)
    with pytest.raises(TypeError, match="without a guard"):
        service_app("t", None, admit=lambda *_: None, guard_type=access.Access, routers=[plain],
                    log=logging.getLogger("t"), readiness={})


def test_a_route_guarded_by_another_partys_guard_is_refused_when_the_app_is_built():
    from features_party import access as trainer_access

    router = APIRouter(route_class=gate.GuardedRoute)
    router.add_api_route("/v1/theirs", lambda who=Depends(trainer_access.ANY_KEY): {})  # noqa: B008
    with pytest.raises(TypeError, match="without a guard"):
        service_app("t", None, admit=lambda *_: None, guard_type=access.Access, routers=[router],
                    log=logging.getLogger("t"), readiness={})
