"""Databases for both services: SQLAlchemy engines (SQLite by default, PostgreSQL in production) that serialize
writers the same way on both, and schema migrations with Alembic."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import DateTime, MetaData, create_engine, event, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.types import TypeDecorator

from shared.errors import ErrorCode, LabelDPError

if TYPE_CHECKING:
    from alembic.config import Config

NAMING_CONVENTION = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
                     "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s", "pk": "pk_%(table_name)s"}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id() -> str:
    return uuid.uuid4().hex


class UtcDateTime(TypeDecorator):
    """A timestamp stored with its time zone and always read back as an aware UTC time (SQLite keeps no offset;
    every stored time is UTC), so API responses are RFC 3339 date-times on both databases."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, _dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def make_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """The engine of a service's database; ``pool_size`` bounds its pool (default: SQLAlchemy's for SQLite, 10 plus
    40 overflow for PostgreSQL) — a lease heartbeat's own engine keeps one connection (:mod:`.leases`)."""
    pool = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": 0}
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60}, **pool)

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection, _record):
            dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection):
            # Every transaction takes the write lock up front: SQLite's equivalent of SELECT ... FOR UPDATE, so
            # budget checks and charges serialize exactly as on PostgreSQL.
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return create_engine(url, pool_pre_ping=True, **(pool or {"pool_size": 10, "max_overflow": 40}))


class Migrations:
    """One service's Alembic scripts (``script_location``) and the metadata they build.

    An empty database is created from the metadata and stamped at head (what ``upgrade head`` builds; the
    migration tests compare both). A database at an older revision — or one with tables but no
    ``alembic_version``, from before migrations existed (stamped ``baseline``) — is upgraded when asked and refused
    otherwise, with a message naming the command."""

    def __init__(self, script_location: Path, metadata: MetaData, baseline: str | None, head: str,
                 command_name: str):
        self.script_location, self.metadata = Path(script_location), metadata
        self.baseline, self._head, self.command_name = baseline, head, command_name

    def config(self, connection: Connection | None, data_dir: str | Path | None = None) -> Config:
        """``data_dir``: the service's data directory, for data migrations that rewrite its files."""
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(self.script_location))
        config.attributes["connection"] = connection
        config.attributes["metadata"] = self.metadata
        config.attributes["data_dir"] = data_dir
        return config

    def head(self) -> str:
        """The newest revision of the scripts, as the service's migrations package states it (a test checks it
        against Alembic's own reading): a database already there is opened without importing Alembic, whose
        scripts and runtime took a fifth of a command's start (issue 42: ``create-key`` in at most 1 s)."""
        return self._head

    def scripts_head(self) -> str:
        """The newest revision as Alembic reads the scripts."""
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(self.config(None)).get_current_head()
        assert head is not None  # every service's scripts hold at least their first revision
        return head

    def current(self, connection: Connection) -> str | None:
        revision = _stamped(connection)
        if revision is None and self.baseline and inspect(connection).get_table_names():
            return self.baseline
        return revision

    def prepare(self, engine: Engine, *, upgrade: bool, data_dir: str | Path | None = None) -> None:
        with engine.connect() as connection:
            stamped = _stamped(connection)
            revision = self.current(connection) if stamped is None else stamped
        if revision == self.head():
            return
        from alembic import command

        if revision is None:
            with engine.begin() as connection:
                self.metadata.create_all(connection)
                command.stamp(self.config(connection), "head")
            return
        if not upgrade:
            raise LabelDPError(f"the database schema is at revision {revision}, this version needs {self.head()}: "
                               f"run `{self.command_name}` (nothing is reset)", code=ErrorCode.DATABASE_OUTDATED)
        sqlite = engine.dialect.name == "sqlite"
        with engine.connect() as connection:
            if sqlite:  # SQLite's batch migrations copy tables; foreign keys are checked once, afterwards
                _driver_connection(connection).execute("PRAGMA foreign_keys=OFF")
            try:
                with connection.begin():
                    if stamped is None:
                        # current() answered the baseline (tables, no alembic_version): it is set
                        assert self.baseline is not None
                        command.stamp(self.config(connection), self.baseline)
                    command.upgrade(self.config(connection, data_dir), "head")
                if sqlite and _driver_connection(connection).execute("PRAGMA foreign_key_check").fetchall():
                    raise LabelDPError("the migrated database has broken foreign keys",
                                       code=ErrorCode.DATABASE_OUTDATED)
            finally:
                if sqlite:
                    _driver_connection(connection).execute("PRAGMA foreign_keys=ON")

    def upgrade(self, engine: Engine, data_dir: str | Path | None = None) -> tuple[str | None, str]:
        """(revision before, revision after)."""
        with engine.connect() as connection:
            before = self.current(connection)
        self.prepare(engine, upgrade=True, data_dir=data_dir)
        return before, self.head()


def _stamped(connection: Connection) -> str | None:
    """The revision Alembic stamped the database at (its ``alembic_version`` table), or None."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    revisions = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(revisions) > 1:  # these scripts are linear: one head, one row
        raise LabelDPError(f"the database is stamped at several revisions ({', '.join(revisions)})",
                           code=ErrorCode.DATABASE_OUTDATED)
    return revisions[0] if revisions else None


def _driver_connection(connection: Connection) -> DBAPIConnection:
    """The DBAPI connection under an open one (outside SQLAlchemy's transactions: SQLite ignores PRAGMA
    foreign_keys inside a transaction)."""
    dbapi_connection = connection.connection.dbapi_connection
    assert dbapi_connection is not None  # None only once the pool has closed or invalidated it
    return dbapi_connection


def run_migrations(context) -> None:
    """The body of every service's Alembic ``env.py``: migrate on the connection the caller passed."""
    config = context.config
    context.configure(connection=config.attributes["connection"], target_metadata=config.attributes["metadata"],
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
