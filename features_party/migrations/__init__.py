"""Schema migrations of the trainer's database (Alembic; this folder is its script location), run by
:class:`shared.service.database.Migrations`: ``labeldp features upgrade-db`` or ``serve --upgrade-db``. The
trainer kept no database before revision 0001, so there is nothing older to stamp."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from features_party.db import Base
from shared.service.database import Migrations

HEAD = "0007"  # the newest script in versions/ (tests/features_party/test_migrations.py checks it against Alembic)
MIGRATIONS = Migrations(Path(__file__).parent, Base.metadata, None, HEAD, "labeldp features upgrade-db")


def make_sessionmaker(engine: Engine, *, upgrade: bool = False) -> sessionmaker:
    """Sessions on a database at the current schema: created and stamped when empty, else migrated or refused."""
    MIGRATIONS.prepare(engine, upgrade=upgrade)
    return sessionmaker(engine, expire_on_commit=False)
