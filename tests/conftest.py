"""Fixtures for every test: ``database_url``, a fresh database per test (SQLite always; PostgreSQL when
LABELDP_TEST_POSTGRES_URL is set). Plain helpers live in importable modules: tests/support/ (databases),
labeldp.local_services (a free port, uvicorn in a thread, a ``serve`` process), tests/labels_party/api/helpers.py
(driving the labels-party HTTP API)."""

from __future__ import annotations

import warnings

import pytest

from tests.support.databases import DATABASES, fresh_database

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)


@pytest.fixture(params=DATABASES)
def database_url(request, tmp_path):
    with fresh_database(request.param, tmp_path) as url:
        yield url
