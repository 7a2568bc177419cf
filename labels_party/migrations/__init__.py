"""Schema migrations of the labels-party database (Alembic; this folder is its script location), run by
:class:`shared.service.database.Migrations`: ``labeldp labels upgrade-db`` or ``serve --upgrade-db``."""

from __future__ import annotations

from pathlib import Path

from labels_party.db import Base
from shared.service.database import Migrations

BASELINE = "0001"  # the schema built before migrations existed
MIGRATIONS = Migrations(Path(__file__).parent, Base.metadata, BASELINE, "labeldp labels upgrade-db")
