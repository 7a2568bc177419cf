"""``GET /readyz`` of the trainer on SQLite and PostgreSQL: ready on a fresh service; 503 not_ready naming the
database when it is gone and the schema when it is behind the migration head (and ready again once it is not) —
never a path or a URL; no key needed, for it or ``/healthz``."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import pytest

from features_party.api import create_app
from features_party.migrations import MIGRATIONS
from features_party.process import make_context
from features_party.settings import TrainerSettings
from tests.support.readiness import (
    assert_not_ready,
    assert_ready,
    database_url_in_a_directory,
    previous_revision,
    stamp,
    take_the_database_away,
)


@pytest.fixture
def service(database_url, tmp_path):
    ctx = make_context(TrainerSettings(database_url=database_url_in_a_directory(database_url, tmp_path),
                                       data_dir=tmp_path / "trainer"))
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        yield ctx, client
    ctx.close()


def test_a_fresh_trainer_is_ready_without_a_key(service):
    _, client = service
    assert_ready(client)
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_trainer_whose_database_is_gone_is_not_ready(service, tmp_path):
    ctx, client = service
    engine = ctx.sessions.kw["bind"]
    url = engine.url.render_as_string(hide_password=False)
    take_the_database_away(engine, tmp_path)
    assert_not_ready(client, ("database", "schema"), secrets=(str(tmp_path), url, "sqlite", "postgres"))
    assert client.get("/healthz").status_code == 200


def test_a_schema_behind_the_migration_head_is_not_ready_until_it_is_at_the_head(service):
    ctx, client = service
    engine = ctx.sessions.kw["bind"]
    stamp(engine, MIGRATIONS, previous_revision(MIGRATIONS))
    assert_not_ready(client, ("schema",))
    stamp(engine, MIGRATIONS, MIGRATIONS.head())
    assert_ready(client)
