"""Shared fixtures: fresh databases (SQLite always; PostgreSQL when LABELDP_TEST_POSTGRES_URL is set), a
labels-party app with an admin client, and a real uvicorn server on a loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)

POSTGRES_URL = os.environ.get("LABELDP_TEST_POSTGRES_URL")
DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not POSTGRES_URL, reason="set LABELDP_TEST_POSTGRES_URL (CI does) to run against PostgreSQL"))]


@contextlib.contextmanager
def fresh_database(kind: str, tmp_path):
    """Yield a SQLAlchemy URL to an empty database; PostgreSQL databases are created and dropped per test."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/labels.db"
        return
    from sqlalchemy import create_engine, text

    name = f"labeldp_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=DATABASES)
def database_url(request, tmp_path):
    with fresh_database(request.param, tmp_path) as url:
        yield url


def admin_client(tmp_path, org: str = "owner"):
    """A labels-party app on a fresh SQLite database and a TestClient carrying a new admin key of ``org``;
    returns (context, client)."""
    from fastapi.testclient import TestClient

    from labels_party.api import create_app
    from labels_party.auth import create_key
    from labels_party.service import make_context

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(session, org, "admin")
    return ctx, TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def service_process(command: list[str], env: dict, base_url: str, *, verify=True, seconds: float = 120):
    """Run a ``serve`` command as its own process until its /healthz answers; yields the process."""
    import subprocess

    import httpx

    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + seconds
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base_url}/healthz", verify=verify).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(command[:5])} did not start")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextlib.contextmanager
def running_server(app):
    """Serve ``app`` with uvicorn in a background thread on a free loopback port; yields the base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
