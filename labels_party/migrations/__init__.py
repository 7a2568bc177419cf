"""Schema migrations of the labels-party database, with Alembic (this folder is its script location).

* An empty database is created from the models and stamped at the head revision (what ``upgrade head`` would build,
  checked by ``tests/test_migrations.py``).
* A database at an older revision — or created before migrations existed (it has tables but no
  ``alembic_version``; it is stamped ``0001``, the schema those versions built) — is upgraded by
  ``labeldp labels upgrade-db`` or ``serve --upgrade-db``, and otherwise refused with a message naming the command.
  Budgets are converted, never reset.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine

from shared.errors import LabelDPError

BASELINE = "0001"


def _config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    return ScriptDirectory.from_config(_config(None)).get_current_head()


def current(connection: Connection) -> str | None:
    """The database's revision; BASELINE for a database created before migrations existed; None if empty."""
    revision = MigrationContext.configure(connection).get_current_revision()
    if revision is None and inspect(connection).has_table("datasets"):
        return BASELINE
    return revision


def prepare(engine: Engine, *, upgrade: bool) -> None:
    from labels_party.db import Base

    with engine.connect() as connection:
        revision = current(connection)
        stamped = MigrationContext.configure(connection).get_current_revision() is not None
    if revision is None:
        with engine.begin() as connection:
            Base.metadata.create_all(connection)
            command.stamp(_config(connection), "head")
        return
    if revision == head():
        return
    if not upgrade:
        raise LabelDPError(f"the database schema is at revision {revision}, this version needs {head()}: run "
                           "`labeldp labels upgrade-db` (budgets are converted, not reset)", code="database_outdated")
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as connection:
        if sqlite:  # SQLite's batch migrations copy tables; foreign keys are checked once, afterwards
            connection.connection.dbapi_connection.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                if not stamped:
                    command.stamp(_config(connection), BASELINE)
                command.upgrade(_config(connection), "head")
            if sqlite and connection.connection.dbapi_connection.execute("PRAGMA foreign_key_check").fetchall():
                raise LabelDPError("the migrated database has broken foreign keys", code="database_outdated")
        finally:
            if sqlite:
                connection.connection.dbapi_connection.execute("PRAGMA foreign_keys=ON")


def upgrade_database(engine: Engine) -> tuple[str | None, str]:
    """(revision before, revision after)."""
    with engine.connect() as connection:
        before = current(connection)
    prepare(engine, upgrade=True)
    return before, head()
