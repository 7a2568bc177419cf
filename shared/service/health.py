"""Readiness of both services: the named checks ``GET /readyz`` runs (:func:`shared.service.app.service_app` takes
them); ``GET /healthz`` only says the process answers.

A service is ready when its database answers ``SELECT 1`` within ``timeout_seconds``, its schema is at this
version's migration head, and every check the party adds (``extra_checks``: say, its background workers are alive)
returns True. A check that raises counts as failed; what it raised goes to the log as its type only, never to the
client (a driver's message may name a host, a file or a user).

The database is asked in a thread of its own, waited for at most ``timeout_seconds``: a connection attempt to a
host that does not answer can block far longer than a probe may take. While an earlier probe is still blocked, the
next one fails at once instead of starting another, so an unreachable database holds at most one thread per
process. The probe goes through the service's own connection pool (a pool exhausted for longer than the timeout
is not ready either), on the driver's connection: SQLAlchemy's SQLite transactions take the write lock
(:func:`shared.service.database.make_engine`), which a probe must not wait for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from sqlalchemy.engine import Engine

Check = Callable[[], bool]

log = logging.getLogger("labeldp.health")

DATABASE, SCHEMA = "database", "schema"


class DatabaseProbe:
    """Questions to the database, each answered within ``timeout_seconds`` or counted as failed."""

    def __init__(self, engine: Engine, timeout_seconds: float) -> None:
        self.engine, self.timeout_seconds = engine, timeout_seconds
        self._lock = threading.Lock()
        self._pending: threading.Thread | None = None

    def answers(self) -> bool:
        """The database answers ``SELECT 1``."""
        return self.ask(lambda cursor: _rows(cursor, "SELECT 1") == [(1,)])

    def at_revision(self, revision: str) -> bool:
        """The schema is stamped at ``revision`` (a database without Alembic's table is not)."""
        return self.ask(lambda cursor: _rows(cursor, "SELECT version_num FROM alembic_version") == [(revision,)])

    def ask(self, question: Callable[[object], bool]) -> bool:
        deadline = time.monotonic() + self.timeout_seconds
        if not self._lock.acquire(timeout=self.timeout_seconds):
            return False
        try:
            if self._pending is not None and self._pending.is_alive():
                return False  # an earlier probe still waits for the database: it does not answer
            answer: list[bool] = []
            self._pending = threading.Thread(target=self._ask, args=(question, answer), name="readiness-probe",
                                             daemon=True)
            self._pending.start()
            self._pending.join(max(0.0, deadline - time.monotonic()))
            return answer == [True]
        finally:
            self._lock.release()

    def _ask(self, question: Callable[[object], bool], answer: list[bool]) -> None:
        try:
            with self.engine.connect() as connection:
                driver = connection.connection.dbapi_connection
                assert driver is not None  # a connection just checked out of the pool
                cursor = driver.cursor()
                try:
                    if self.engine.dialect.name == "postgresql":  # this transaction only; the pool rolls it back
                        cursor.execute(f"SET LOCAL statement_timeout = {max(1, int(self.timeout_seconds * 1000))}")
                    answer.append(bool(question(cursor)))
                finally:
                    cursor.close()
        except Exception as err:  # the database's or the driver's: not ready, whatever it was
            log.warning("readiness: the database probe failed (%s)", type(err).__name__)
            answer.append(False)


def _rows(cursor, query: str) -> list[tuple]:
    cursor.execute(query)
    return [tuple(row) for row in cursor.fetchall()]


def readiness_checks(engine: Engine, head: str, extra_checks: Mapping[str, Check], *,
                     timeout_seconds: float = 2.0) -> dict[str, Check]:
    """The checks of a service on ``engine`` whose schema must be at ``head`` (its Alembic head), in the order
    ``/readyz`` runs them: ``database``, ``schema``, then ``extra_checks`` (a party's own, e.g. ``{"workers":
    runner.alive}``; a name may not repeat one of the first two)."""
    clashes = {DATABASE, SCHEMA} & set(extra_checks)
    if clashes:
        raise ValueError(f"readiness checks named {sorted(clashes)} already exist")
    probe = DatabaseProbe(engine, timeout_seconds)
    return {DATABASE: probe.answers, SCHEMA: lambda: probe.at_revision(head), **extra_checks}


def failed_checks(checks: Mapping[str, Check]) -> list[str]:
    """The names of the checks that return a false value (or raise), each check run once, in order."""
    failed = []
    for name, check in checks.items():
        try:
            passed = bool(check())
        except Exception as err:
            log.warning("readiness: check %r raised %s", name, type(err).__name__)
            passed = False
        if not passed:
            failed.append(name)
    return failed
