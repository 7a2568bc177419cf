"""``GET /readyz`` of both services on SQLite and PostgreSQL: ready on a fresh service; 503 not_ready naming the
database when it is gone and the schema when it is behind the migration head (and ready again once it is not) —
never a path or a URL; no key needed, for it or ``/healthz``."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import pytest

from tests.support.readiness import (
    assert_not_ready,
    assert_ready,
    database_url_in_a_directory,
    previous_revision,
    stamp,
    take_the_database_away,
)


def _labels_party(database_url: str, tmp_path):
    from labels_party.http.api import create_app
    from labels_party.runtime.context import make_context
    from labels_party.store.migrations import MIGRATIONS

    return create_app, make_context(database_url, tmp_path / "data"), MIGRATIONS


def _trainer(database_url: str, tmp_path):
    from features_party.api import create_app
    from features_party.migrations import MIGRATIONS
    from features_party.process import make_context
    from features_party.settings import TrainerSettings

    return create_app, make_context(TrainerSettings(database_url=database_url, data_dir=tmp_path / "trainer")), \
        MIGRATIONS


@pytest.fixture(params=[_labels_party, _trainer], ids=["labels", "trainer"])
def service(request, database_url, tmp_path):
    """(context, client, the party's migrations) of a service whose SQLite file has a directory of its own."""
    create_app, ctx, migrations = request.param(database_url_in_a_directory(database_url, tmp_path), tmp_path)
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        yield ctx, client, migrations
    ctx.close()


def test_a_fresh_service_is_ready_without_a_key(service):
    _, client, _ = service
    assert_ready(client)
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_service_whose_database_is_gone_is_not_ready(service, tmp_path):
    ctx, client, _ = service
    engine = ctx.sessions.kw["bind"]
    url = engine.url.render_as_string(hide_password=False)
    take_the_database_away(engine, tmp_path)
    assert_not_ready(client, ("database", "schema"), secrets=(str(tmp_path), url, "sqlite", "postgres"))
    assert client.get("/healthz").status_code == 200  # the process is up: healthz asks nothing else


def test_a_schema_behind_the_migration_head_is_not_ready_until_it_is_at_the_head(service):
    ctx, client, migrations = service
    engine = ctx.sessions.kw["bind"]
    stamp(engine, migrations, previous_revision(migrations))
    assert_not_ready(client, ("schema",))
    stamp(engine, migrations, migrations.head())
    assert_ready(client)
