"""Fixtures for every test: ``database_url``, a fresh database per test (SQLite always; PostgreSQL when
LABELDP_TEST_POSTGRES_URL is set). Plain helpers live in importable modules: tests/support/ (databases),
labeldp.local_services (a free port, uvicorn in a thread, a ``serve`` process), tests/labels_party/api/helpers.py
(driving the labels-party HTTP API)."""

from __future__ import annotations

import sys
import warnings

import absl.logging
import pytest

from tests.support.databases import DATABASES, fresh_database

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)

# absl (imported by dp-accounting and JAX) logs to whatever sys.stderr was when it was imported — under pytest, the
# session's capture file — and uvicorn's logging setup, run by every service started in a thread, closes every live
# handler's stream except the current sys.stderr: a capsys test that starts a service then closed pytest's capture
# file ("I/O operation on closed file" at teardown). The handler writes to the process's own stderr instead.
absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


@pytest.fixture(params=DATABASES)
def database_url(request, tmp_path):
    with fresh_database(request.param, tmp_path) as url:
        yield url
