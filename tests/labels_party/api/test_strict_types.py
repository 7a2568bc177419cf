"""Request bodies are typed strictly (issue 26): a boolean or a string where a number is expected (and a number
where a boolean is) is a 422 ``invalid_request`` in the error envelope, and nothing is charged, created or
audited; an integer where a float is expected is still a number. Query parameters are strings by nature and still
parse."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.labels_party.api.helpers import (
    budget,
    created,
    expect_error,
    labels_csv,
    new_dataset,
    release,
    state,
    upload,
)

WRONG_TYPES = [True, False, "1", "1.0", None, [1], {"value": 1}]


@pytest.mark.parametrize("epsilon", WRONG_TYPES, ids=repr)
def test_epsilon_of_another_type_is_422_and_charges_nothing(client, admin, consumer, dataset, epsilon):
    before = state(client, admin, dataset)
    r = release(client, consumer, dataset, f"k{epsilon!r}", mechanism="rr-on-bins", epsilon=epsilon)
    error = expect_error(r, 422, "invalid_request")
    assert error["message"].startswith("epsilon:"), error
    assert state(client, admin, dataset) == before
    assert client.get(f"/v1/datasets/{dataset}/releases", headers=admin).json() == []


@pytest.mark.parametrize("field, value", [
    ("prior_epsilon", "0.5"), ("prior_epsilon", True), ("mesh", "20"), ("mesh", True), ("mesh", 20.5),
    ("clip", 1), ("clip", "true"), ("example_ids", [1, 2]), ("mechanism", 3)])
def test_other_release_fields_of_another_type_are_422(client, admin, consumer, dataset, field, value):
    before = state(client, admin, dataset)
    body = {"mechanism": "opt-unbiased", "epsilon": 1, field: value}
    r = release(client, consumer, dataset, f"{field}{value!r}", **body)
    error = expect_error(r, 422, "invalid_request")
    assert error["message"].startswith(f"{field}"), error
    assert state(client, admin, dataset) == before


def test_an_integer_epsilon_is_a_number(client, admin, consumer, dataset):
    r = release(client, consumer, dataset, "int", mechanism="rr", epsilon=1)
    body = created(r)
    assert body["epsilon"] == 1.0 and body["charged_epsilon"] == 1.0
    assert budget(client, admin, dataset)["epsilon_spent"] == 1.0
    assert state(client, admin, dataset)["audit_events"] == 1


@pytest.mark.parametrize("path, body", [
    ("/evaluations", {"metric": "mse", "epsilon": True, "example_ids": ["e1"], "predictions": [1.0]}),
    ("/evaluations", {"metric": "mse", "epsilon": "1", "example_ids": ["e1"], "predictions": [1.0]}),
    ("/evaluations", {"metric": "mse", "epsilon": 1, "example_ids": ["e1"], "predictions": ["1"]}),
    ("/evaluations", {"metric": "mse", "epsilon": 1, "clip": "10", "example_ids": ["e1"], "predictions": [1]}),
    ("/central-trainings", {"epsilon": "1", "example_ids": ["e1", "e2"], "features": [[0.0], [1.0]]}),
    ("/central-trainings", {"epsilon": 1, "steps": "3", "example_ids": ["e1", "e2"], "features": [[0.0], [1.0]]}),
    ("/central-trainings", {"epsilon": 1, "example_ids": ["e1", "e2"], "features": [[0.0], [True]]}),
    ("/quantiles", {"quantiles": [0.5], "epsilon": True}),
    ("/quantiles", {"quantiles": [True], "epsilon": 1}),
    ("/quantiles", {"quantiles": 0.5, "epsilon": 1}),
    ("/quantiles", {"quantiles": [0.5], "epsilon": 1, "example_ids": "e1"}),
    ("/quantiles", {"quantiles": [0.5], "epsilon": 1, "clip": 3}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_evaluation_and_training_bodies_are_strict(client, admin, dataset, path, body):
    before = state(client, admin, dataset)
    r = client.post(f"/v1/datasets/{dataset}{path}", json=body, headers={**admin, "Idempotency-Key": "x"})
    expect_error(r, 422, "invalid_request")
    assert state(client, admin, dataset) == before


def test_an_integer_is_a_number_in_an_evaluation(client, admin, consumer, dataset):
    body = {"metric": "mse", "epsilon": 1, "clip": 100, "example_ids": ["e1", "e2"], "predictions": [3, 4]}
    r = client.post(f"/v1/datasets/{dataset}/evaluations", json=body, headers={**consumer, "Idempotency-Key": "i"})
    assert created(r)["charged_epsilon"] == 1.0
    assert state(client, admin, dataset)["audit_events"] == 1


@pytest.mark.parametrize("change", [
    {"epsilon_total": True}, {"epsilon_total": "3"}, {"min": "1"}, {"max": True}, {"grid_size": "10"},
    {"allow_central_training": 1}, {"allow_central_training": "true"}, {"name": 7}, {"min": None, "max": None,
                                                                                    "clip": {"low": "1", "high": 52}}])
def test_dataset_creation_is_strict(client, admin, change):
    body = {"name": "strict", "label_kind": "integer", "min": 1, "max": 52, "epsilon_total": 3, **change}
    r = client.post("/v1/datasets", json={k: v for k, v in body.items() if v is not None}, headers=admin)
    expect_error(r, 422, "invalid_request")
    assert client.get("/v1/datasets", headers=admin).json() == []


@pytest.mark.parametrize("body", [
    {"name": "c", "label_kind": "classes", "num_classes": "3", "epsilon_total": 1},
    {"name": "c", "label_kind": "classes", "num_classes": 3.5, "epsilon_total": 1},
    {"name": "c", "label_kind": "classes", "num_classes": True, "epsilon_total": 1},
    {"name": "f", "label_kind": "finite", "values": [0, "1"], "epsilon_total": 1}])
def test_other_dataset_kinds_are_strict(client, admin, body):
    expect_error(client.post("/v1/datasets", json=body, headers=admin), 422, "invalid_request")
    assert client.get("/v1/datasets", headers=admin).json() == []


def test_integers_create_a_dataset(client, admin):
    """An integer where a number is expected, and an integral number where an integer is (JSON Schema's
    "integer" includes 10.0): both are the same JSON number."""
    r = client.post("/v1/datasets", json={"name": "ints", "label_kind": "continuous", "clip": {"low": 0, "high": 9},
                                          "grid_size": 10.0, "epsilon_total": 2}, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["epsilon_total"] == 2.0 and r.json()["domain"]["grid_size"] == 10
    r = client.post("/v1/datasets", json={"name": "c", "label_kind": "classes", "num_classes": 3.0,
                                          "epsilon_total": 1}, headers=admin)
    assert r.status_code == 201 and r.json()["domain"]["num_classes"] == 3, r.text


def test_a_grant_names_an_organization_as_a_string(client, admin, dataset):
    expect_error(client.post(f"/v1/datasets/{dataset}/grants", json={"org": 5}, headers=admin), 422,
                 "invalid_request")


def test_query_parameters_still_parse_from_strings(client, admin):
    """ε in the query of a per-example-prior release is a string on the wire, as every query parameter."""
    dataset = new_dataset(client, admin, name="classes", label_kind="classes", num_classes=3, epsilon_total=2)
    ids = [f"c{i}" for i in range(300)]
    assert upload(client, admin, dataset, labels_csv({i: n % 3 for n, i in enumerate(ids)})).status_code == 200
    sink = io.BytesIO()
    pq.write_table(pa.table({"example_id": ids, "p_0": [0.5] * 300, "p_1": [0.3] * 300, "p_2": [0.2] * 300}), sink)
    headers = {**admin, "Content-Type": "application/vnd.apache.parquet"}
    # but only as a plain decimal: Python's float() reads "1_0" as 10 (it was charged 10) and " 1 " as 1
    for number, text in enumerate(("1_0", " 1 ", "0x1", "1e", "infinity", "nan", "1,0")):
        refused = client.post(f"/v1/datasets/{dataset}/prior-releases", params={"epsilon": text},
                              content=sink.getvalue(), headers={**headers, "Idempotency-Key": f"bad{number}"})
        expect_error(refused, 422, "invalid_request")
    assert budget(client, admin, dataset)["epsilon_spent"] == 0.0
    r = client.post(f"/v1/datasets/{dataset}/prior-releases", params={"epsilon": "1"}, content=sink.getvalue(),
                    headers={**headers, "Idempotency-Key": "q"})
    assert created(r)["epsilon"] == 1.0
    assert budget(client, admin, dataset)["epsilon_spent"] == 1.0


def test_the_openapi_documents_the_422_envelope(client):
    spec = client.get("/openapi.json").json()
    for path, method in [("/v1/datasets/{dataset_id}/releases", "post"), ("/v1/datasets", "post"),
                         ("/v1/datasets/{dataset_id}/evaluations", "post")]:
        assert spec["paths"][path][method]["responses"]["422"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}


@pytest.mark.parametrize("body", [
    {"label_kind": "finite", "values": [-1.7e308, 0, 1.7e308]},
    {"label_kind": "integer", "min": 0, "max": 1e16},
    {"label_kind": "continuous", "clip": {"low": -1e300, "high": 1e300}},
])
def test_label_values_beyond_ten_to_the_fifteen_are_refused(client, admin, body):
    """The second review of issue 26: on {-1.7e308, 0, 1.7e308} dbRR's outputs were infinite, the document could
    not be written and every release failed after it was charged (rr-on-bins: depending on the noisy prior). A
    domain is public: it is refused when it is declared."""
    expect_error(client.post("/v1/datasets", json={"name": "wide", "epsilon_total": 1, **body}, headers=admin), 422,
                 "invalid_request")
    assert client.get("/v1/datasets", headers=admin).json() == []
