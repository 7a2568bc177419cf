"""What the readiness tests of both parties share: what ``/readyz`` answers, and ways to make a service's database
really fail under it (gone, or its schema behind the migration head)."""

from __future__ import annotations

import shutil
from pathlib import Path

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from shared.service.database import Migrations
from tests.support.databases import POSTGRES_URL


def database_url_in_a_directory(database_url: str, tmp_path: Path) -> str:
    """The fixture's database, but a SQLite file in a directory of its own (so that it can be taken away)."""
    if not database_url.startswith("sqlite"):
        return database_url
    (tmp_path / "db").mkdir()
    return f"sqlite:///{tmp_path}/db/service.sqlite"


def take_the_database_away(engine: Engine, tmp_path: Path) -> None:
    """After this, connecting fails: a SQLite file's directory is moved away (SQLite cannot open or create the
    file: no directory), a PostgreSQL database is dropped (its connections ended); the pool is emptied."""
    if engine.dialect.name == "sqlite":
        engine.dispose()  # open connections would still read the moved file
        shutil.move(tmp_path / "db", tmp_path / "moved")
        return
    assert POSTGRES_URL is not None
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{engine.url.database}" WITH (FORCE)'))
    admin.dispose()
    engine.dispose()


def stamp(engine: Engine, migrations: Migrations, revision: str) -> None:
    """Alembic's version table says ``revision`` (nothing else changes)."""
    with engine.begin() as connection:
        command.stamp(migrations.config(connection), revision, purge=True)


def previous_revision(migrations: Migrations) -> str:
    down = ScriptDirectory.from_config(migrations.config(None)).get_revision(migrations.head()).down_revision
    assert isinstance(down, str)  # one line of revisions
    return down


def assert_ready(client, checks: tuple[str, ...] = ("database", "schema")) -> None:
    answer = client.get("/readyz")  # no key
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "ready", "checks": dict.fromkeys(checks, "ok")}


def assert_not_ready(client, failed: tuple[str, ...], *, secrets: tuple[str, ...] = ()) -> str:
    """503 not_ready naming exactly the ``failed`` checks, and none of ``secrets`` (paths, URLs); the message."""
    answer = client.get("/readyz")
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert set(body) == {"error"} and body["error"]["code"] == "not_ready", body
    message = body["error"]["message"]
    assert message == f"not ready: failed check(s): {', '.join(failed)}", message
    for secret in secrets:
        assert secret not in answer.text
    assert answer.headers["content-type"] == "application/json"
    return message
