"""Oversized bodies are refused with 413 even when streamed without a Content-Length, and change nothing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import labels_party.http.api as api
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings


@pytest.fixture()
def setup(tmp_path):
    settings = LabelsSettings(max_json_bytes=200, max_upload_bytes=300)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=settings)
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(api.create_app(ctx))
    headers = {"Authorization": f"Bearer {key}"}
    dataset = client.post("/v1/datasets", headers=headers, json={
        "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 1}).json()["id"]
    return client, headers, dataset


def test_streamed_upload_over_the_limit(setup):
    client, headers, dataset = setup

    def body():
        yield b"example_id,label\n"
        for i in range(100):
            yield f"e{i},{i % 10}\n".encode()

    response = client.put(f"/v1/datasets/{dataset}/labels", content=body(),
                          headers={**headers, "Content-Type": "text/csv"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert client.get(f"/v1/datasets/{dataset}", headers=headers).json()["label_version"] == 0


def test_streamed_json_over_the_limit(setup):
    client, headers, _ = setup

    def body():
        yield b'{"name": "' + b"n" * 300 + b'", '
        yield b'"label_kind": "classes", "num_classes": 3, "epsilon_total": 1}'

    response = client.post("/v1/datasets", content=body(), headers={**headers, "Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert len(client.get("/v1/datasets", headers=headers).json()) == 1


def test_declared_length_over_the_limit(setup):
    client, headers, dataset = setup
    response = client.post(f"/v1/datasets/{dataset}/releases", content=b"{" + b" " * 400 + b"}",
                           headers={**headers, "Content-Type": "application/json", "Idempotency-Key": "a"})
    assert response.status_code == 413
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=headers).json()["epsilon_spent"] == 0.0
