"""A client that disconnects before its body is complete is one line in the log, not an internal error (the
twenty-sixth review of issue 40: each disconnect mid-upload of a spooled label body logged ~120 lines of two
tracebacks as "internal error", so any organization could flood the log)."""

from __future__ import annotations

import logging

import anyio
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context


def test_a_disconnect_mid_upload_is_one_line_not_an_internal_error(tmp_path, caplog):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "owner", "admin")
    app = create_app(ctx)
    dataset = TestClient(app).post("/v1/datasets", headers={"Authorization": f"Bearer {key}"}, json={
        "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 1}).json()["id"]
    path = f"/v1/datasets/{dataset}/labels"
    messages = [{"type": "http.request", "body": b"example_id,label\ne1,1\n", "more_body": True},
                {"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "PUT", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"text/csv")]}
    with caplog.at_level(logging.INFO, logger="labeldp.labels"):
        anyio.run(app, scope, receive, send)
    ctx.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 400  # nobody reads it; never a 500
