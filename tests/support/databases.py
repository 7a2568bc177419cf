"""Fresh databases for the tests: SQLite always; PostgreSQL when LABELDP_TEST_POSTGRES_URL is set (CI sets it).
The ``database_url`` fixture (tests/conftest.py) runs a test once per database in ``DATABASES``."""

from __future__ import annotations

import contextlib
import os
import uuid

import pytest

POSTGRES_URL = os.environ.get("LABELDP_TEST_POSTGRES_URL")
DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not POSTGRES_URL, reason="set LABELDP_TEST_POSTGRES_URL (CI does) to run against PostgreSQL"))]


@contextlib.contextmanager
def fresh_database(kind: str, tmp_path, server_url: str | None = None):
    """Yield a SQLAlchemy URL to an empty database; PostgreSQL databases (on ``server_url``, by default the tests'
    server) are created and dropped per use."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/labels.db"
        return
    from sqlalchemy import create_engine, text

    server = server_url or POSTGRES_URL
    assert server is not None
    name = f"labeldp_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
