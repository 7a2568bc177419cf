"""Crash safety: kill the real server process in the middle of a release, restart it, and check that the release
either exists and is charged, or neither — and that a retry never re-noises or double-charges."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from labeldp.local_services import free_port
from labels_party.http.audit import verify_audit
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context

# The labels-party server with a checkpoint hook that kills the process at the named point of the release
# transaction (the hook is injected into the context; production code reads no test switch).
_SERVER = """
import os, sys, uvicorn
from labels_party.http.api import create_app
from labels_party.runtime.context import make_context
database_url, data_dir, port, crash_at = sys.argv[1:]
def checkpoint(name):
    if name == crash_at:
        os._exit(70)
uvicorn.run(create_app(make_context(database_url, data_dir, checkpoint=checkpoint)), host="127.0.0.1",
            port=int(port), log_level="warning")
"""


def _start(database_url: str, data_dir, port: int, crash_at: str | None) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", _SERVER, database_url, str(data_dir), str(port), crash_at or ""],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("server did not start: " + process.stderr.read().decode()[-2000:])


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


# Where the process dies: before the charge commits (nothing happened), after it (the release is charged, nothing
# private published), before the finishing commit (labels written, not visible), after it (available).
CRASH_POINTS = ["before_charge_commit", "after_charge_commit", "before_finish_commit", "after_finish_commit"]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_release_survives_a_crash_all_or_nothing(database_url, tmp_path, crash_at):
    """Charged before anything private is drawn: a crash after the charge leaves the release charged and failed
    (never free), and a retry with its key gets that outcome — never a fresh draw, never a second charge."""
    data_dir = tmp_path / "data"
    ctx = make_context(database_url, data_dir)
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
    ctx.close()  # the servers below are then the only processes on the data directory (they recover alone)
    headers = {"Authorization": f"Bearer {admin}"}
    port = free_port()
    server = _start(database_url, data_dir, port, crash_at)
    base = f"http://127.0.0.1:{port}"
    try:
        dataset = httpx.post(f"{base}/v1/datasets", headers=headers, json={
            "name": "visits", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 2.0}).json()["id"]
        body = "example_id,label\n" + "\n".join(f"p{i},{i % 10}" for i in range(300))
        assert httpx.put(f"{base}/v1/datasets/{dataset}/labels", content=body,
                         headers={**headers, "Content-Type": "text/csv"}).status_code == 200
        release = {"mechanism": "opt-unbiased", "epsilon": 1.0, "mesh": 20}
        with pytest.raises(httpx.TransportError):  # the server dies mid-request
            httpx.post(f"{base}/v1/datasets/{dataset}/releases", json=release,
                       headers={**headers, "Idempotency-Key": "retry-me"}, timeout=60)
        assert server.wait(timeout=30) == 70
    finally:
        _stop(server)

    server = _start(database_url, data_dir, port, None)
    try:
        budget = httpx.get(f"{base}/v1/datasets/{dataset}/budget", headers=headers).json()
        events = httpx.get(f"{base}/v1/audit", params={"dataset": dataset}, headers=headers).json()["events"]
        listed = httpx.get(f"{base}/v1/datasets/{dataset}/releases", headers=headers).json()
        retry = httpx.post(f"{base}/v1/datasets/{dataset}/releases", json=release,
                           headers={**headers, "Idempotency-Key": "retry-me"}, timeout=60)
        if crash_at == "before_charge_commit":
            assert budget["epsilon_spent"] == 0.0 and events == [] and listed == []
            assert retry.status_code == 201
        elif crash_at == "after_finish_commit":
            assert budget["epsilon_spent"] == 1.0 and len(events) == 1
            assert [r["state"] for r in listed] == ["available"]
            assert retry.status_code == 200 and retry.json()["id"] == events[0]["record"]["release_id"]
        else:  # charged, then the process died: failed and charged; the key's outcome is that failure
            assert budget["epsilon_spent"] == 1.0 and len(events) == 1
            assert [(r["state"], r["error"]["code"]) for r in listed] == [("failed", "release_failed")]
            assert retry.status_code == 503 and retry.json()["error"]["code"] == "release_failed"
            assert not list((data_dir / "releases").glob("*.parquet"))  # nothing of it is left to read
            return
        first = httpx.get(f"{base}/v1/releases/{retry.json()['id']}/labels", headers=headers).text
        again = httpx.post(f"{base}/v1/datasets/{dataset}/releases", json=release,
                           headers={**headers, "Idempotency-Key": "retry-me"}, timeout=60)
        assert again.status_code == 200 and again.json()["id"] == retry.json()["id"]
        assert httpx.get(f"{base}/v1/releases/{again.json()['id']}/labels", headers=headers).text == first
        assert httpx.get(f"{base}/v1/datasets/{dataset}/budget", headers=headers).json()["epsilon_spent"] == 1.0
    finally:
        _stop(server)
        assert verify_audit(make_context(database_url, data_dir))["valid"]
