"""Creating datasets: each label kind, and bodies refused with 422 (outside the schema), 400 (invalid domain), 409."""

from __future__ import annotations

import pytest

from tests.labels_party.api.helpers import budget, expect_error, new_dataset

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


@pytest.mark.parametrize("body, domain", [
    ({"label_kind": "finite", "values": [0, 1, 2.5, 10]}, {"kind": "finite", "values": [0.0, 1.0, 2.5, 10.0]}),
    ({"label_kind": "integer", "min": 1, "max": 52}, {"kind": "integer", "min": 1, "max": 52}),
    ({"label_kind": "continuous", "min": 0, "max": 1}, {"kind": "continuous", "min": 0.0, "max": 1.0,
                                                        "grid_size": 101}),
    ({"label_kind": "continuous", "min": -1, "max": 1, "grid_size": 11},
     {"kind": "continuous", "min": -1.0, "max": 1.0, "grid_size": 11}),
    ({"label_kind": "classes", "num_classes": 4}, {"kind": "classes", "num_classes": 4}),
], ids=["finite", "integer", "continuous", "continuous-grid", "classes"])
def test_create_dataset_each_kind(client, admin, body, domain):
    r = client.post("/v1/datasets", json={"name": "ds", "epsilon_total": 2.5, **body}, headers=admin)
    assert r.status_code == 201, r.text
    d = r.json()
    assert isinstance(d["id"], str) and d["id"]
    assert d["label_kind"] == body["label_kind"]
    assert d["domain"] == domain
    assert (d["epsilon_total"], d["epsilon_spent"], d["epsilon_remaining"]) == (2.5, 0.0, 2.5)
    assert (d["num_examples"], d["label_version"]) == (0, 0)
    got = client.get(f"/v1/datasets/{d['id']}", headers=admin)
    assert got.status_code == 200 and got.json()["domain"] == domain
    assert budget(client, admin, d["id"]) == {"dataset_id": d["id"], "epsilon_total": 2.5, "epsilon_spent": 0.0,
                                              "epsilon_remaining": 2.5}


@pytest.mark.parametrize("body", [
    {"name": "x", "label_kind": "integer", "min": 1, "max": 5},
    {"name": "x", "label_kind": "integer", "min": 1, "max": 5, "epsilon_total": 0},
    {"name": "x", "label_kind": "integer", "min": 1, "max": 5, "epsilon_total": -1},
    {"name": "x", "label_kind": "ordinal", "min": 1, "max": 5, "epsilon_total": 1},
    {"name": "x", "label_kind": "integer", "max": 5, "epsilon_total": 1},
    {"name": "x", "label_kind": "finite", "epsilon_total": 1},
    {"name": "x", "label_kind": "classes", "epsilon_total": 1},
    {"name": "x", "label_kind": "integer", "min": 1, "max": 5, "epsilon_total": 1, "owner": "someone"},
    {"name": "", "label_kind": "integer", "min": 1, "max": 5, "epsilon_total": 1},
    {"name": "x", "label_kind": "integer", "min": 1, "max": 5, "epsilon_total": "lots"},
], ids=["no-epsilon-total", "epsilon-total-0", "epsilon-total-negative", "unknown-kind", "integer-without-min",
        "finite-without-values", "classes-without-num-classes", "extra-field", "empty-name", "epsilon-not-number"])
def test_create_dataset_invalid_body_is_422(client, admin, body):
    error = expect_error(client.post("/v1/datasets", json=body, headers=admin), 422, "invalid_request")
    assert "Traceback" not in error["message"]
    assert client.get("/v1/datasets", headers=admin).json() == []


@pytest.mark.parametrize("raw", ['{"name":"x","label_kind":"integer","min":1,"max":5,"epsilon_total":1e400}',
                                 '{"name":"x","label_kind":"integer","min":1,"max":5,"epsilon_total":NaN}',
                                 'not json'], ids=["epsilon-total-inf", "epsilon-total-nan", "not-json"])
def test_create_dataset_non_finite_or_malformed_json_is_422(client, admin, raw):
    r = client.post("/v1/datasets", content=raw, headers={**admin, "Content-Type": "application/json"})
    expect_error(r, 422, "invalid_request")
    assert client.get("/v1/datasets", headers=admin).json() == []


def test_create_dataset_duplicate_name_is_409(client, admin, other_admin):
    body = {"name": "weeks", "label_kind": "integer", "min": 1, "max": 52, "epsilon_total": 1}
    first = new_dataset(client, admin, **body)
    expect_error(client.post("/v1/datasets", json={"name": "weeks", "label_kind": "classes", "num_classes": 3,
                                                   "epsilon_total": 1}, headers=admin), 409, "dataset_exists")
    assert [d["id"] for d in client.get("/v1/datasets", headers=admin).json()] == [first]
    # Names are scoped to an organization: another org may use the same name.
    r = client.post("/v1/datasets", json=body, headers=other_admin)
    assert r.status_code == 201 and r.json()["id"] != first


@pytest.mark.parametrize("body", [
    {"label_kind": "finite", "values": [2, 1, 3]},
    {"label_kind": "finite", "values": [1, 2, 2, 3]},
    {"label_kind": "integer", "min": 1.5, "max": 3},
    {"label_kind": "integer", "min": 5, "max": 3},
    {"label_kind": "continuous", "min": 1, "max": 1},
], ids=["unsorted", "duplicate", "fractional-integer-bound", "empty-integer-range", "empty-interval"])
def test_create_dataset_invalid_domain_is_400(client, admin, body):
    r = client.post("/v1/datasets", json={"name": "x", "epsilon_total": 1, **body}, headers=admin)
    expect_error(r, 400, "invalid_domain")
    assert client.get("/v1/datasets", headers=admin).json() == []


@pytest.mark.parametrize("raw", [
    '{"name":"x","label_kind":"integer","min":1,"max":1e400,"epsilon_total":1}',
    '{"name":"x","label_kind":"integer","min":1,"epsilon_total":1}',
    '{"name":"x","label_kind":"finite","values":[],"epsilon_total":1}',
    '{"name":"x","label_kind":"classes","num_classes":3,"min":0,"epsilon_total":1}',
    '{"name":"x","label_kind":"classes","num_classes":3,"epsilon_total":1e7}',
], ids=["infinite-bound", "missing-max", "no-values", "field-of-another-kind", "budget-over-1e6"])
def test_create_dataset_outside_the_schema_is_422(client, admin, raw):
    """What the schema states (per label kind: the fields it needs, finite numbers, the budget's range)."""
    r = client.post("/v1/datasets", content=raw, headers={**admin, "Content-Type": "application/json"})
    assert client.get("/v1/datasets", headers=admin).json() == []
    expect_error(r, 422, "invalid_request")
