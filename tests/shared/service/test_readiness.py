"""The readiness checks every service's ``/readyz`` runs (shared/service/health.py, shared/service/app.py): a
party's extra checks (say, "its workers are alive") make it not ready when they fail or raise, named in the 503; a
database that refuses connections or never answers is not ready within the probe's timeout, holding one thread at
most; both routes are public and documented, the 503 among the answers."""

from __future__ import annotations

import logging
import socket
import threading
import time
import warnings

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import pytest

from features_party.migrations import MIGRATIONS
from labeldp.local_services import free_port
from shared.service import gate
from shared.service.app import service_app
from shared.service.database import make_engine
from shared.service.health import DatabaseProbe, readiness_checks
from tests.support.readiness import assert_not_ready, assert_ready


def _app(readiness) -> TestClient:
    """The skeleton with no routers of its own: only what every service has."""
    app = service_app("t", None, admit=lambda *_: None, guard_type=gate.Guard, routers=(),
                      log=logging.getLogger("t"), readiness=readiness)
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def engine(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/t.sqlite")
    MIGRATIONS.prepare(engine, upgrade=False)  # a database at the trainer's head
    yield engine
    engine.dispose()


def test_extra_checks_are_run_and_a_false_one_is_named(engine):
    alive = {"workers": True}
    client = _app(readiness_checks(engine, MIGRATIONS.head(), {"workers": lambda: alive["workers"],
                                                               "queue": lambda: True}))
    assert_ready(client, ("database", "schema", "workers", "queue"))
    alive["workers"] = False
    assert_not_ready(client, ("workers",))
    alive["workers"] = True  # asked again at each request: nothing cached
    assert_ready(client, ("database", "schema", "workers", "queue"))


def test_an_extra_check_that_raises_counts_as_failed_and_says_nothing_of_why(engine):
    def broken() -> bool:
        raise RuntimeError("/srv/secret/path postgresql://user:password@host/db")

    client = _app(readiness_checks(engine, MIGRATIONS.head(), {"workers": lambda: False, "spark": broken}))
    assert_not_ready(client, ("workers", "spark"), secrets=("/srv/secret", "password", "RuntimeError"))


def test_extra_checks_cannot_replace_the_database_ones(engine):
    with pytest.raises(ValueError, match="already exist"):
        readiness_checks(engine, MIGRATIONS.head(), {"schema": lambda: True})


def test_a_closed_postgresql_port_is_not_ready():
    url = f"postgresql://labeldp:hunter2@127.0.0.1:{free_port()}/labeldp"  # nothing listens there
    engine = make_engine(url)
    client = _app(readiness_checks(engine, MIGRATIONS.head(), {}))
    assert_not_ready(client, ("database", "schema"), secrets=("hunter2", "127.0.0.1", "labeldp:", "Operational"))
    engine.dispose()


def test_a_database_that_never_answers_is_not_ready_within_the_timeout():
    """A server that accepts the connection and never says a word (a hung PostgreSQL, a black hole): the probe
    gives up after its timeout, and while it still waits the next one fails at once instead of piling threads."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes the handshakes; nothing ever reads or answers
        engine = make_engine(f"postgresql://labeldp@127.0.0.1:{silent.getsockname()[1]}/labeldp")
        probe = DatabaseProbe(engine, timeout_seconds=1.0)
        started = time.monotonic()
        assert probe.answers() is False
        assert time.monotonic() - started >= 0.9  # it waited its timeout...
        pending = probe._pending
        assert pending is not None and pending.is_alive()  # ...and gave up: the question is still unanswered
        # (not stopwatches, which a loaded machine breaks: that the probe returned while its question still waits
        # is what shows it did not wait for the database)
        # (probe threads only, by name: other tests' threads come and go in the same process)
        threads = _probe_threads()
        assert probe.at_revision(MIGRATIONS.head()) is False
        assert probe._pending is pending and pending.is_alive()  # the first probe still waits: no second one asked
        assert _probe_threads() == threads
        client = _app(readiness_checks(engine, MIGRATIONS.head(), {}, timeout_seconds=1.0))
        assert_not_ready(client, ("database", "schema"))
        # its own probe asked once (one thread, still waiting for the silent server), the schema check not at all
        assert len(_probe_threads() - threads) == 1


def _probe_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "readiness-probe"}


def test_both_routes_are_public_and_documented(engine):
    client = _app(readiness_checks(engine, MIGRATIONS.head(), {"workers": lambda: True}))
    spec = client.get("/openapi.json").json()
    for path in ("/healthz", "/readyz"):
        assert path in gate.PUBLIC_PATHS
        assert spec["paths"][path]["get"]["security"] == []  # no key, and the OpenAPI says so
    readyz = spec["paths"]["/readyz"]["get"]
    assert readyz["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ReadyBody")
    assert readyz["responses"]["503"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "not_ready" in readyz["responses"]["503"]["description"]
    assert "database, schema, workers" in readyz["description"]
    for path in ("/healthz", "/readyz"):  # and with a bad key they answer the same
        assert client.get(path, headers={"Authorization": "Bearer ldp_nonsense"}).status_code == 200
