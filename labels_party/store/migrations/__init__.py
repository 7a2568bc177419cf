"""Schema migrations of the labels-party database (Alembic; this folder is its script location), run by
:class:`shared.service.database.Migrations`: ``labeldp labels upgrade-db`` or ``serve --upgrade-db``."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from labels_party.store.db import Base
from shared.service.database import Migrations

BASELINE = "0001"  # the schema built before migrations existed
HEAD = "0022"  # the newest script in versions/ (tests/labels_party/test_migrations.py checks it against Alembic)
MIGRATIONS = Migrations(Path(__file__).parent, Base.metadata, BASELINE, HEAD, "labeldp labels upgrade-db")


def make_sessionmaker(engine: Engine, *, upgrade: bool = False, data_dir: str | Path | None = None) -> sessionmaker:
    """Sessions on a database at the current schema: an empty database is created (and stamped), an older one is
    migrated when ``upgrade`` is set and refused otherwise (``labeldp labels upgrade-db``)."""
    MIGRATIONS.prepare(engine, upgrade=upgrade, data_dir=data_dir)
    return sessionmaker(engine, expire_on_commit=False)
