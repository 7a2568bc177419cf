"""Helpers for the API tests of the labels-party HTTP service (issue 4), which drive it with FastAPI's TestClient.

Every refused request is checked for its status, its exact error code, the JSON error shape (no stack trace)
(``expect_error``), and that nothing changed: label version, number of examples, spent budget and the number of
audit events (``state``). The fixtures (keys, a client, datasets) are in conftest.py next to this file.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

NUM_LABELS = 2000
MISSING_DATASET = "0" * 32
NOT_FOUND_BODY = {"error": {"code": "not_found", "message": "no such dataset for this key"}}


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def labels_csv(mapping: dict) -> str:
    return "example_id,label\n" + "".join(f"{k},{v}\n" for k, v in mapping.items())


def new_dataset(client, admin, **body) -> str:
    r = client.post("/v1/datasets", json=body, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def upload(client, admin, dataset_id, content, content_type="text/csv"):
    return client.put(f"/v1/datasets/{dataset_id}/labels", content=content,
                      headers={**admin, "Content-Type": content_type})


def release(client, headers, dataset_id, key, **body):
    return client.post(f"/v1/datasets/{dataset_id}/releases", json=body,
                       headers={**headers, "Idempotency-Key": key})


def created(response) -> dict:
    assert response.status_code == 201, response.text
    body = response.json()
    assert isinstance(body["id"], str) and body["id"]
    assert body["certified_epsilon"] <= body["epsilon"] + 1e-12
    return body


def _instant(stamp: str) -> datetime:
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def assert_same_release(got: dict, expected: dict) -> None:
    """Equal in every field; created_at compared as an instant (see test_timestamps_are_consistent)."""
    assert {k: v for k, v in got.items() if k != "created_at"} == \
        {k: v for k, v in expected.items() if k != "created_at"}
    assert _instant(got["created_at"]) == _instant(expected["created_at"])


def expect_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    return error


def state(client, admin, dataset_id) -> dict:
    """Everything a refused request must leave untouched."""
    r = client.get(f"/v1/datasets/{dataset_id}", headers=admin)
    assert r.status_code == 200, r.text
    d = r.json()
    audit = client.get("/v1/audit", params={"dataset": dataset_id}, headers=admin)
    assert audit.status_code == 200, audit.text
    return {"label_version": d["label_version"], "num_examples": d["num_examples"],
            "epsilon_spent": d["epsilon_spent"], "epsilon_remaining": d["epsilon_remaining"],
            "audit_events": len(audit.json()["events"])}


FIGURES = ("dataset_id", "epsilon_total", "epsilon_spent", "epsilon_remaining")


def budget(client, headers, dataset_id) -> dict:
    """The budget's ε figures as this key sees them: a consumer its organization's account, the owner's admins
    the dataset (the accounts themselves: ``budget_accounts``)."""
    r = client.get(f"/v1/datasets/{dataset_id}/budget", headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scope"] == ("dataset" if body["organizations"] is not None else "organization")
    return {key: body[key] for key in FIGURES}


def budget_accounts(client, admin, dataset_id) -> dict[str, dict]:
    """Every organization's account of a dataset, by organization (the owner's admins only)."""
    r = client.get(f"/v1/datasets/{dataset_id}/budget", headers=admin)
    assert r.status_code == 200, r.text
    return {account.pop("org"): account for account in r.json()["organizations"]}


def download_rows(client, headers, release_id) -> list[tuple[str, float]]:
    r = client.get(f"/v1/releases/{release_id}/labels", headers=headers)
    assert r.status_code == 200, r.text
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["example_id", "label"]
    return [(example_id, float(label)) for example_id, label in rows[1:]]


def audit_events(client, admin, dataset_id) -> list[dict]:
    r = client.get("/v1/audit", params={"dataset": dataset_id}, headers=admin)
    assert r.status_code == 200, r.text
    return r.json()["events"]


def admin_client(tmp_path, org: str = "owner"):
    """A labels-party app on a fresh SQLite database and a TestClient carrying a new admin key of ``org``;
    returns (context, client)."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.runtime.context import make_context

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, org, "admin")
    return ctx, TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})


def digits_datasets(tmp_path, epsilon_total: float):
    """scikit-learn's digits as two classes datasets of one owner (hospital), central training enabled on one
    (``datasets[True]``) and not on the other, δ_total 10⁻⁶: (context, the owner's client, datasets, example ids,
    features scaled to [0, 1], labels)."""
    from sklearn.datasets import load_digits

    ctx, client = admin_client(tmp_path, "hospital")
    digits = load_digits()
    ids = [f"p{i}" for i in range(len(digits.target))]
    body = "example_id,label\n" + "\n".join(f"{i},{v}" for i, v in zip(ids, digits.target, strict=True))
    datasets = {}
    for allowed in (True, False):
        datasets[allowed] = client.post("/v1/datasets", json={
            "name": f"d{allowed}", "label_kind": "classes", "num_classes": 10, "epsilon_total": epsilon_total,
            "delta_total": 1e-6, "allow_central_training": allowed}).json()["id"]
        client.put(f"/v1/datasets/{datasets[allowed]}/labels", content=body, headers={"Content-Type": "text/csv"})
    return ctx, client, datasets, ids, digits.data / 16.0, digits.target
