"""API tests for the labels-party HTTP service (issue 4), with FastAPI's TestClient.

Every refused request is checked for its status, its exact error code, the JSON error shape (no stack trace),
and that nothing changed: label version, number of examples, spent budget and the number of audit events.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import warnings
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from labeldp import cli
from labels_party import service
from labels_party.api import create_app
from labels_party.auth import create_key
from labels_party.service import make_context

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

NUM_LABELS = 2000
MISSING_DATASET = "0" * 32
NOT_FOUND_BODY = {"error": {"code": "not_found", "message": "no such dataset for this key"}}


# -- fixtures ---------------------------------------------------------------------------------------------------

@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path}/db.sqlite"


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def ctx(db_url, data_dir):
    return make_context(db_url, data_dir)


@pytest.fixture
def keys(ctx):
    with ctx.sessions() as s, s.begin():
        return {
            "admin": create_key(s, "hospital", "admin"),
            "consumer": create_key(s, "publisher", "consumer"),
            "stranger": create_key(s, "adnet", "consumer"),  # a consumer that is never granted anything
            "other_admin": create_key(s, "clinic", "admin"),  # the admin of another organization
        }


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def admin(keys):
    return _bearer(keys["admin"])


@pytest.fixture
def consumer(keys):
    return _bearer(keys["consumer"])


@pytest.fixture
def stranger(keys):
    return _bearer(keys["stranger"])


@pytest.fixture
def other_admin(keys):
    return _bearer(keys["other_admin"])


@pytest.fixture
def client(ctx):
    # raise_server_exceptions=False: a bug must show up as the 500 JSON answer a real client would get.
    with TestClient(create_app(ctx), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def labels():
    """The true labels of the main dataset: example id -> integer label in 1..52."""
    values = np.random.default_rng(20240601).integers(1, 53, size=NUM_LABELS)
    return {f"e{i}": int(v) for i, v in enumerate(values)}


def labels_csv(mapping: dict) -> str:
    return "example_id,label\n" + "".join(f"{k},{v}\n" for k, v in mapping.items())


def new_dataset(client, admin, **body) -> str:
    r = client.post("/v1/datasets", json=body, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def upload(client, admin, dataset_id, content, content_type="text/csv"):
    return client.put(f"/v1/datasets/{dataset_id}/labels", content=content,
                      headers={**admin, "Content-Type": content_type})


@pytest.fixture
def dataset(client, admin, labels):
    """Integer labels 1..52, ε_total = 3, 2000 uploaded labels, granted to the consumer's org."""
    dataset_id = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=3)
    r = upload(client, admin, dataset_id, labels_csv(labels))
    assert r.status_code == 200, r.text
    assert r.json()["num_examples"] == NUM_LABELS
    r = client.post(f"/v1/datasets/{dataset_id}/grants", json={"org": "publisher"}, headers=admin)
    assert r.status_code == 201, r.text
    return dataset_id


@pytest.fixture
def dataset_small(client, admin, labels):
    """ε_total = 1, 300 integer labels, no grant."""
    dataset_id = new_dataset(client, admin, name="small", label_kind="integer", min=1, max=52, epsilon_total=1)
    r = upload(client, admin, dataset_id, labels_csv(dict(list(labels.items())[:300])))
    assert r.status_code == 200, r.text
    return dataset_id


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


def budget(client, headers, dataset_id) -> dict:
    r = client.get(f"/v1/datasets/{dataset_id}/budget", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


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


# -- 1. authentication and authorization -------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer ldp_00000000_not-a-real-key"},
                                     {"Authorization": "Basic aGVsbG86d29ybGQ="}, {"Authorization": "Bearer "}],
                         ids=["missing", "wrong-key", "not-bearer", "empty-bearer"])
def test_missing_or_wrong_key_is_401(client, admin, dataset, headers):
    before = state(client, admin, dataset)
    expect_error(client.get("/v1/datasets", headers=headers), 401, "unauthorized")
    expect_error(client.get(f"/v1/datasets/{dataset}/budget", headers=headers), 401, "unauthorized")
    expect_error(release(client, headers, dataset, "k", mechanism="laplace", epsilon=1), 401, "unauthorized")
    expect_error(upload(client, headers, dataset, "example_id,label\nz,1\n"), 401, "unauthorized")
    r = client.get("/v1/datasets", headers=headers)
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert state(client, admin, dataset) == before


def test_consumer_without_grant_is_404_and_charges_nothing(client, admin, stranger, dataset):
    before = state(client, admin, dataset)
    expect_error(client.get(f"/v1/datasets/{dataset}", headers=stranger), 404, "not_found")
    expect_error(client.get(f"/v1/datasets/{dataset}/budget", headers=stranger), 404, "not_found")
    expect_error(release(client, stranger, dataset, "k1", mechanism="laplace", epsilon=1), 404, "not_found")
    r = client.get("/v1/datasets", headers=stranger)
    assert r.status_code == 200 and r.json() == []
    assert state(client, admin, dataset) == before


@pytest.mark.parametrize("who", ["stranger", "other_admin"])
def test_missing_dataset_is_indistinguishable_from_an_inaccessible_one(client, admin, keys, dataset, who):
    headers = _bearer(keys[who])
    before = state(client, admin, dataset)
    requests = [
        lambda ds: client.get(f"/v1/datasets/{ds}", headers=headers),
        lambda ds: client.get(f"/v1/datasets/{ds}/budget", headers=headers),
        lambda ds: release(client, headers, ds, "probe", mechanism="laplace", epsilon=1),
    ]
    if who == "other_admin":
        requests += [
            lambda ds: client.post(f"/v1/datasets/{ds}/grants", json={"org": "adnet"}, headers=headers),
            lambda ds: upload(client, headers, ds, "example_id,label\nz,1\n"),
            lambda ds: client.get("/v1/audit", params={"dataset": ds}, headers=headers),
        ]
    for send in requests:
        existing, missing = send(dataset), send(MISSING_DATASET)
        expect_error(existing, 404, "not_found")
        assert existing.status_code == missing.status_code
        assert existing.json() == missing.json() == NOT_FOUND_BODY
    assert state(client, admin, dataset) == before


def test_consumer_cannot_administer(client, admin, consumer, dataset):
    before = state(client, admin, dataset)
    r = client.post("/v1/datasets", json={"name": "mine", "label_kind": "integer", "min": 0, "max": 3,
                                          "epsilon_total": 1}, headers=consumer)
    expect_error(r, 403, "forbidden")
    expect_error(upload(client, consumer, dataset, "example_id,label\ne0,1\n"), 403, "forbidden")
    expect_error(client.post(f"/v1/datasets/{dataset}/grants", json={"org": "adnet"}, headers=consumer),
                 403, "forbidden")
    expect_error(client.get("/v1/audit", params={"dataset": dataset}, headers=consumer), 403, "forbidden")
    expect_error(client.get("/v1/audit", headers=consumer), 403, "forbidden")
    assert state(client, admin, dataset) == before
    # The admin still owns exactly one dataset and the consumer still sees it only through its grant.
    assert [d["id"] for d in client.get("/v1/datasets", headers=admin).json()] == [dataset]
    assert [d["id"] for d in client.get("/v1/datasets", headers=consumer).json()] == [dataset]


def test_admin_of_another_org_cannot_see_dataset(client, admin, other_admin, dataset):
    before = state(client, admin, dataset)
    expect_error(client.get(f"/v1/datasets/{dataset}", headers=other_admin), 404, "not_found")
    expect_error(client.get(f"/v1/datasets/{dataset}/budget", headers=other_admin), 404, "not_found")
    assert client.get("/v1/datasets", headers=other_admin).json() == []
    r = client.get("/v1/audit", headers=other_admin)
    assert r.status_code == 200
    assert r.json()["events"] == [] and r.json()["budgets"] == []
    assert state(client, admin, dataset) == before


# -- 2. dataset creation -----------------------------------------------------------------------------------------

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


# -- 3. uploads --------------------------------------------------------------------------------------------------

def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@pytest.mark.parametrize("fmt", ["csv", "ndjson", "parquet"])
def test_upload_formats(client, admin, labels, fmt):
    dataset_id = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=1)
    subset = dict(list(labels.items())[:300])
    if fmt == "csv":
        content, content_type = labels_csv(subset), "text/csv; charset=utf-8"
    elif fmt == "ndjson":
        content = "".join(json.dumps({"example_id": k, "label": v}) + "\n" for k, v in subset.items())
        content_type = "application/x-ndjson"
    else:
        content = _parquet_bytes(pa.table({"example_id": list(subset), "label": list(subset.values())}))
        content_type = "application/vnd.apache.parquet"
    r = upload(client, admin, dataset_id, content, content_type)
    assert r.status_code == 200, r.text
    assert r.json() == {"dataset_id": dataset_id, "label_version": 1, "num_examples": 300, "new_examples": 300}
    d = client.get(f"/v1/datasets/{dataset_id}", headers=admin).json()
    assert (d["label_version"], d["num_examples"]) == (1, 300)


BAD_UPLOADS = {
    "out-of-domain": ("example_id,label\na,1\nb,53\n", "text/csv", 400, "label_out_of_domain"),
    "fractional": ("example_id,label\na,1\nb,2.5\n", "text/csv", 400, "label_out_of_domain"),
    "zero": ("example_id,label\na,0\n", "text/csv", 400, "label_out_of_domain"),
    "nan-csv": ("example_id,label\na,1\nb,NaN\n", "text/csv", 400, "malformed_file"),  # Arrow reads NaN as null
    "nan-ndjson": ('{"example_id":"a","label":1}\n{"example_id":"b","label":NaN}\n', "application/x-ndjson",
                   400, "label_out_of_domain"),
    "inf-csv": ("example_id,label\na,1\nb,inf\n", "text/csv", 400, "label_out_of_domain"),
    "minus-inf-csv": ("example_id,label\na,-inf\n", "text/csv", 400, "label_out_of_domain"),
    "inf-ndjson": ('{"example_id":"a","label":"inf"}\n', "application/x-ndjson", 400, "label_out_of_domain"),
    "duplicate-ids": ("example_id,label\na,1\nb,2\na,3\n", "text/csv", 400, "duplicate_example_id"),
    "duplicate-ids-ndjson": ('{"example_id":"a","label":1}\n{"example_id":"a","label":1}\n',
                             "application/x-ndjson", 400, "duplicate_example_id"),
    "missing-label-ndjson": ('{"example_id":"a"}\n', "application/x-ndjson", 400, "malformed_file"),
    "missing-label-parquet": (_parquet_bytes(pa.table({"example_id": ["a"], "lbl": [1]})),
                              "application/vnd.apache.parquet", 400, "malformed_file"),
    "ragged-csv": ("example_id,label\na,1,7\nb,2\n", "text/csv", 400, "malformed_file"),
    "non-numeric-csv": ("example_id,label\na,one\n", "text/csv", 400, "malformed_file"),
    "empty-label-csv": ("example_id,label\na,\n", "text/csv", 400, "malformed_file"),
    "empty-id-csv": ("example_id,label\n,1\n", "text/csv", 400, "malformed_file"),
    "garbage-parquet": (b"PAR1 this is not parquet", "application/vnd.apache.parquet", 400, "malformed_file"),
    "not-json-ndjson": ("{example_id: a}\n", "application/x-ndjson", 400, "malformed_file"),
    "empty-csv": ("", "text/csv", 400, "malformed_file"),
    "empty-ndjson": ("", "application/x-ndjson", 400, "malformed_file"),
    "empty-parquet": (b"", "application/vnd.apache.parquet", 400, "malformed_file"),
    "header-only-csv": ("example_id,label\n", "text/csv", 400, "empty_labels"),
    "unsupported-type": ("example_id,label\na,1\n", "image/png", 415, "unsupported_media_type"),
    "no-content-type": ("example_id,label\na,1\n", "", 415, "unsupported_media_type"),
}
BAD_UPLOAD_PARAMS = [pytest.param(*v, id=k) for k, v in BAD_UPLOADS.items()] + [
    pytest.param("example_id,lab\na,1\n", "text/csv", 400, "malformed_file", id="missing-label-csv"),
    pytest.param("example_id\na\n", "text/csv", 400, "malformed_file", id="id-column-only-csv"),
]


@pytest.mark.parametrize("content, content_type, status, code", BAD_UPLOAD_PARAMS)
def test_bad_upload_is_refused_and_changes_nothing(client, admin, dataset, content, content_type, status, code):
    before = state(client, admin, dataset)
    assert before["label_version"] == 1
    r = upload(client, admin, dataset, content, content_type)
    assert state(client, admin, dataset) == before
    expect_error(r, status, code)


def test_upload_over_the_limit_is_413(ctx, admin, dataset, labels):
    limited = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"max_upload_bytes": 1000}))
    small = TestClient(create_app(limited), raise_server_exceptions=False)
    before = state(small, admin, dataset)
    body = labels_csv(labels)
    assert len(body) > 1000
    expect_error(upload(small, admin, dataset, body), 413, "body_too_large")

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for start in range(0, len(body), 256):
            yield body[start:start + 256].encode()
    expect_error(upload(small, admin, dataset, chunks()), 413, "body_too_large")
    assert state(small, admin, dataset) == before
    r = upload(small, admin, dataset, "example_id,label\ne0,7\ne1,8\n")  # under the limit: accepted
    assert r.status_code == 200 and r.json()["label_version"] == 2 and r.json()["num_examples"] == 2


def test_reupload_creates_new_version_and_leaves_releases_untouched(client, admin, consumer, dataset, labels):
    first = created(release(client, consumer, dataset, "before", mechanism="laplace", epsilon=0.5))
    assert first["label_version"] == 1
    before_bytes = client.get(f"/v1/releases/{first['id']}/labels", headers=consumer).content
    before_parquet = client.get(f"/v1/releases/{first['id']}/labels",
                                headers={**consumer, "Accept": "application/vnd.apache.parquet"}).content

    changed = {k: (v % 52) + 1 for k, v in labels.items()}
    r = upload(client, admin, dataset, labels_csv(changed))
    assert r.status_code == 200, r.text
    assert r.json() == {"dataset_id": dataset, "label_version": 2, "num_examples": NUM_LABELS, "new_examples": 0}
    d = client.get(f"/v1/datasets/{dataset}", headers=admin).json()
    assert (d["label_version"], d["num_examples"]) == (2, NUM_LABELS)
    assert budget(client, admin, dataset)["epsilon_spent"] == 0.5  # re-uploading charges and refunds nothing

    assert client.get(f"/v1/releases/{first['id']}/labels", headers=consumer).content == before_bytes
    assert client.get(f"/v1/releases/{first['id']}/labels",
                      headers={**consumer, "Accept": "application/vnd.apache.parquet"}).content == before_parquet
    assert client.get(f"/v1/releases/{first['id']}", headers=consumer).json()["label_version"] == 1
    second = created(release(client, consumer, dataset, "after", mechanism="laplace", epsilon=0.5))
    assert second["label_version"] == 2
    assert budget(client, admin, dataset)["epsilon_spent"] == 1.0


# -- 4. releases -------------------------------------------------------------------------------------------------

def test_release_created(client, admin, consumer, dataset):
    r = release(client, consumer, dataset, "k1", mechanism="laplace", epsilon=1)
    body = created(r)
    assert body["dataset_id"] == dataset and body["mechanism"] == "laplace"
    assert body["epsilon"] == 1.0 and 0.99 < body["certified_epsilon"] <= 1.0
    assert body["num_examples"] == NUM_LABELS and body["idempotency_key"] == "k1"
    assert (body["prior_epsilon"], body["randomizer_epsilon"], body["noisy_prior"]) == (0.0, 1.0, None)
    assert isinstance(body["description"], dict) and body["description"]
    assert budget(client, consumer, dataset) == {"dataset_id": dataset, "epsilon_total": 3.0,
                                                 "epsilon_spent": 1.0, "epsilon_remaining": 2.0}
    got = client.get(f"/v1/releases/{body['id']}", headers=consumer)
    assert got.status_code == 200
    assert_same_release(got.json(), body)


def test_idempotent_retry_returns_same_release_and_charges_once(client, admin, consumer, dataset):
    first = created(release(client, consumer, dataset, "retry-me", mechanism="dbrr", epsilon=1))
    first_labels = client.get(f"/v1/releases/{first['id']}/labels", headers=consumer).content
    for _ in range(2):
        again = release(client, consumer, dataset, "retry-me", mechanism="dbrr", epsilon=1)
        assert again.status_code == 200, again.text
        assert_same_release(again.json(), first)
        assert client.get(f"/v1/releases/{first['id']}/labels", headers=consumer).content == first_labels
    assert budget(client, admin, dataset)["epsilon_spent"] == 1.0
    assert [e["record"]["release_id"] for e in audit_events(client, admin, dataset)] == [first["id"]]


def test_timestamps_are_consistent(client, admin, consumer, dataset):
    first = created(release(client, consumer, dataset, "ts", mechanism="laplace", epsilon=1))
    again = release(client, consumer, dataset, "ts", mechanism="laplace", epsilon=1)
    assert again.status_code == 200
    fetched = client.get(f"/v1/datasets/{dataset}", headers=admin).json()
    assert fetched["created_at"].endswith(("Z", "+00:00"))
    assert again.json() == first


def test_idempotency_key_reused_with_different_body_is_409(client, admin, consumer, dataset):
    first = created(release(client, consumer, dataset, "k", mechanism="laplace", epsilon=1))
    before = state(client, admin, dataset)
    expect_error(release(client, consumer, dataset, "k", mechanism="laplace", epsilon=0.5), 409,
                 "idempotency_conflict")
    expect_error(release(client, consumer, dataset, "k", mechanism="rr", epsilon=1), 409, "idempotency_conflict")
    expect_error(release(client, consumer, dataset, "k", mechanism="laplace", epsilon=1, clip=True), 409,
                 "idempotency_conflict")
    assert state(client, admin, dataset) == before
    assert before["epsilon_spent"] == 1.0 and before["audit_events"] == 1
    assert_same_release(client.get(f"/v1/releases/{first['id']}", headers=consumer).json(), first)


def test_release_without_idempotency_key_is_422(client, admin, consumer, dataset):
    before = state(client, admin, dataset)
    r = client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "laplace", "epsilon": 1},
                    headers=consumer)
    expect_error(r, 422, "invalid_request")
    r = client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "laplace", "epsilon": 1},
                    headers={**consumer, "Idempotency-Key": "x" * 201})
    expect_error(r, 422, "invalid_request")
    assert state(client, admin, dataset) == before


@pytest.mark.parametrize("body, code", [
    ({"mechanism": "gaussian", "epsilon": 1}, "invalid_request"),
    ({"mechanism": "", "epsilon": 1}, "invalid_request"),
    ({"mechanism": "subset", "epsilon": 1}, "mechanism_domain_mismatch"),
    ({"mechanism": "rr-with-prior", "epsilon": 1}, "mechanism_domain_mismatch"),
], ids=["gaussian", "empty-name", "subset-on-integer", "rr-with-prior-on-integer"])
def test_release_bad_mechanism_is_4xx(client, admin, consumer, dataset, body, code):
    """An unknown name is outside the schema (422, its enum lists them); a known one that does not fit the
    dataset's labels is refused (400)."""
    before = state(client, admin, dataset)
    expect_error(release(client, consumer, dataset, "k", **body), 422 if code == "invalid_request" else 400, code)
    assert state(client, admin, dataset) == before
    # The key was not consumed by the refused request.
    created(release(client, consumer, dataset, "k", mechanism="laplace", epsilon=1))


@pytest.mark.parametrize("raw", [
    '{"mechanism":"rr","epsilon":0}',
    '{"mechanism":"rr","epsilon":-1}',
    '{"mechanism":"rr","epsilon":1e-17}',
    '{"mechanism":"rr","epsilon":1e-300}',
    '{"mechanism":"rr","epsilon":50.000001}',
    '{"mechanism":"rr-on-bins","epsilon":1,"prior_epsilon":0}',
], ids=["zero", "negative", "1e-17", "1e-300", "over-50", "prior-epsilon-zero"])
def test_release_epsilon_outside_the_range_is_400(client, admin, consumer, dataset, raw):
    before = state(client, admin, dataset)
    r = client.post(f"/v1/datasets/{dataset}/releases", content=raw,
                    headers={**consumer, "Content-Type": "application/json", "Idempotency-Key": "k"})
    error = expect_error(r, 400, "epsilon_out_of_range")
    assert "[0.001, 50]" in error["message"]
    assert state(client, admin, dataset) == before


@pytest.mark.parametrize("raw", [
    '{"mechanism":"rr","epsilon":1e400}',
    '{"mechanism":"rr","epsilon":-1e400}',
    '{"mechanism":"rr","epsilon":NaN}',
    '{"mechanism":"rr","epsilon":"one"}',
    '{"mechanism":"rr"}',
    '{"epsilon":1}',
    '{"mechanism":"rr","epsilon":1,"sneaky":true}',
    '{"mechanism":"rr","epsilon":1,"example_ids":[]}',
    '{"mechanism":"opt-unbiased","epsilon":1,"mesh":1}',
    '{"mechanism":"rr","epsilon":1',
], ids=["inf", "minus-inf", "nan", "string", "no-epsilon", "no-mechanism", "extra-field", "empty-subset", "mesh-1",
        "truncated-json"])
def test_release_invalid_request_is_422(client, admin, consumer, dataset, raw):
    before = state(client, admin, dataset)
    r = client.post(f"/v1/datasets/{dataset}/releases", content=raw,
                    headers={**consumer, "Content-Type": "application/json", "Idempotency-Key": "k"})
    expect_error(r, 422, "invalid_request")
    assert state(client, admin, dataset) == before


def test_release_over_budget_is_409_and_charges_nothing(client, admin, consumer, dataset):
    before = state(client, admin, dataset)
    error = expect_error(release(client, consumer, dataset, "big", mechanism="laplace", epsilon=3.5), 409,
                         "budget_exceeded")
    assert error["epsilon_remaining"] == pytest.approx(3.0)
    assert state(client, admin, dataset) == before

    created(release(client, consumer, dataset, "one", mechanism="laplace", epsilon=1))
    before = state(client, admin, dataset)
    error = expect_error(release(client, consumer, dataset, "too-much", mechanism="rr", epsilon=2.5), 409,
                         "budget_exceeded")
    assert error["epsilon_remaining"] == pytest.approx(2.0)
    assert error["epsilon_remaining"] == pytest.approx(budget(client, consumer, dataset)["epsilon_remaining"])
    assert state(client, admin, dataset) == before
    assert (before["epsilon_spent"], before["audit_events"]) == (1.0, 1)
    # Exactly what remains is still allowed.
    created(release(client, consumer, dataset, "rest", mechanism="rr", epsilon=2))
    assert budget(client, consumer, dataset) == {"dataset_id": dataset, "epsilon_total": 3.0,
                                                 "epsilon_spent": 3.0, "epsilon_remaining": 0.0}


def test_subset_release_with_unknown_or_duplicate_ids_is_400(client, admin, consumer, dataset):
    before = state(client, admin, dataset)
    expect_error(release(client, consumer, dataset, "u", mechanism="laplace", epsilon=1,
                         example_ids=["e0", "e1", "nope"]), 400, "unknown_example_ids")
    expect_error(release(client, consumer, dataset, "u2", mechanism="laplace", epsilon=1,
                         example_ids=["ghost"]), 400, "unknown_example_ids")
    expect_error(release(client, consumer, dataset, "d", mechanism="laplace", epsilon=1,
                         example_ids=["e0", "e1", "e0"]), 400, "duplicate_example_id")
    assert state(client, admin, dataset) == before
    ok = created(release(client, consumer, dataset, "ok", mechanism="laplace", epsilon=1,
                         example_ids=["e5", "e3", "e1999"]))
    assert ok["num_examples"] == 3
    assert sorted(i for i, _ in download_rows(client, consumer, ok["id"])) == ["e1999", "e3", "e5"]


def test_parallel_composition_on_disjoint_subsets(client, admin, consumer, labels):
    dataset_id = new_dataset(client, admin, name="parallel", label_kind="integer", min=1, max=52,
                             epsilon_total=1)
    ids = [f"e{i}" for i in range(400)]
    assert upload(client, admin, dataset_id, labels_csv({k: labels[k] for k in ids})).status_code == 200
    first = created(release(client, admin, dataset_id, "h1", mechanism="laplace", epsilon=1, example_ids=ids[:200]))
    second = created(release(client, admin, dataset_id, "h2", mechanism="rr", epsilon=1, example_ids=ids[200:]))
    assert first["num_examples"] == second["num_examples"] == 200
    assert budget(client, admin, dataset_id) == {"dataset_id": dataset_id, "epsilon_total": 1.0,
                                                 "epsilon_spent": 1.0, "epsilon_remaining": 0.0}
    before = state(client, admin, dataset_id)
    for key, body in [("all", {}), ("one", {"example_ids": ["e7"]}), ("two", {"example_ids": ["e399"]})]:
        error = expect_error(release(client, admin, dataset_id, key, mechanism="laplace", epsilon=0.01, **body),
                             409, "budget_exceeded")
        assert error["epsilon_remaining"] == 0.0
    assert state(client, admin, dataset_id) == before
    assert [e["record"]["examples_covered"] for e in audit_events(client, admin, dataset_id)] == [200, 200]


def test_sequential_composition_adds(client, admin, dataset_small):
    created(release(client, admin, dataset_small, "a", mechanism="laplace", epsilon=0.4))
    created(release(client, admin, dataset_small, "b", mechanism="dbrr", epsilon=0.5))
    b = budget(client, admin, dataset_small)
    assert b["epsilon_total"] == 1.0
    assert b["epsilon_spent"] == pytest.approx(0.9)
    assert b["epsilon_remaining"] == pytest.approx(0.1)
    error = expect_error(release(client, admin, dataset_small, "c", mechanism="laplace", epsilon=0.2), 409,
                         "budget_exceeded")
    assert error["epsilon_remaining"] == pytest.approx(0.1)
    created(release(client, admin, dataset_small, "d", mechanism="laplace", epsilon=0.1))
    assert budget(client, admin, dataset_small)["epsilon_spent"] == pytest.approx(1.0)


def test_rr_on_bins_publishes_noisy_prior(client, admin, consumer, dataset):
    body = created(release(client, consumer, dataset, "bins", mechanism="rr-on-bins", epsilon=1))
    assert body["noisy_prior"]["epsilon"] == body["prior_epsilon"]
    assert "weights" not in body["noisy_prior"]  # arrays live in the mechanism document
    assert body["prior_epsilon"] == pytest.approx(math.sqrt(52 / NUM_LABELS))  # default rule sqrt(k/n)
    assert body["prior_epsilon"] + body["randomizer_epsilon"] == pytest.approx(body["epsilon"])
    assert body["prior_epsilon"] > 0 and body["randomizer_epsilon"] > 0
    prior = client.get(f"/v1/mechanisms/{body['mechanism_hash']}", headers=consumer).json()["noisy_prior"]
    assert len(prior["weights"]) == len(prior["noisy_counts"]) == 52
    assert all(float(c).is_integer() for c in prior["noisy_counts"])
    assert sum(prior["weights"]) == pytest.approx(1.0)
    assert prior["scale"] == pytest.approx(2.0 / body["prior_epsilon"])
    record = audit_events(client, admin, dataset)[-1]["record"]
    prior_event, randomizer_event = record["dp_event"]["events"]
    assert prior_event["type"] == "DiscreteLaplaceDpEvent" and prior_event["sensitivity"] == 2
    assert prior_event["noise_parameter"] == pytest.approx(body["prior_epsilon"] / 2, rel=1e-9)
    assert randomizer_event["epsilon"] == body["certified_epsilon"] - prior["certified_epsilon"] or \
        randomizer_event["epsilon"] <= body["randomizer_epsilon"]
    assert budget(client, consumer, dataset)["epsilon_spent"] == 1.0


def test_prior_epsilon_override(client, consumer, dataset):
    body = created(release(client, consumer, dataset, "ov", mechanism="opt-unbiased", epsilon=1, mesh=20,
                           prior_epsilon=0.25))
    assert body["prior_epsilon"] == 0.25 and body["noisy_prior"]["epsilon"] == 0.25
    assert body["randomizer_epsilon"] == pytest.approx(0.75)
    assert budget(client, consumer, dataset)["epsilon_spent"] == 1.0


def test_classes_dataset_mechanisms(client, admin):
    dataset_id = new_dataset(client, admin, name="cls", label_kind="classes", num_classes=4, epsilon_total=3)
    truth = {f"c{i}": i % 4 for i in range(400)}
    assert upload(client, admin, dataset_id, labels_csv(truth)).status_code == 200
    before = state(client, admin, dataset_id)
    for mechanism in ("opt-unbiased", "laplace", "rr-on-bins"):
        expect_error(release(client, admin, dataset_id, mechanism, mechanism=mechanism, epsilon=1), 400,
                     "mechanism_domain_mismatch")
    assert state(client, admin, dataset_id) == before

    rr = created(release(client, admin, dataset_id, "rr", mechanism="rr", epsilon=1))
    rrp = created(release(client, admin, dataset_id, "rrp", mechanism="rr-with-prior", epsilon=1))
    assert rrp["noisy_prior"] is not None and rr["noisy_prior"] is None
    for body in (rr, rrp):
        r = client.get(f"/v1/releases/{body['id']}/labels", headers={**admin, "Accept": "application/x-ndjson"})
        rows = [json.loads(line) for line in r.text.splitlines()]
        assert len(rows) == 400 and {row["example_id"] for row in rows} == set(truth)
        assert {row["label"] for row in rows} <= {0.0, 1.0, 2.0, 3.0}

    subset = created(release(client, admin, dataset_id, "subset", mechanism="subset", epsilon=1))
    r = client.get(f"/v1/releases/{subset['id']}/labels", headers={**admin, "Accept": "application/x-ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in r.text.splitlines()]
    assert len(rows) == 400 and {row["example_id"] for row in rows} == set(truth)
    for row in rows:
        assert set(row) == {"example_id", "label_set"}
        assert isinstance(row["label_set"], list)
        assert all(isinstance(k, int) and 0 <= k < 4 for k in row["label_set"])
        assert row["label_set"] == sorted(set(row["label_set"]))
    page = client.get(f"/v1/releases/{subset['id']}/labels", params={"limit": 5},
                      headers={**admin, "Accept": "application/json"}).json()
    assert page["items"] == rows[:5]
    assert budget(client, admin, dataset_id)["epsilon_spent"] == pytest.approx(3.0)


def test_release_on_dataset_without_labels_is_409(client, admin):
    dataset_id = new_dataset(client, admin, name="empty", label_kind="integer", min=0, max=3, epsilon_total=1)
    before = state(client, admin, dataset_id)
    expect_error(release(client, admin, dataset_id, "k", mechanism="laplace", epsilon=1), 409, "no_labels")
    assert state(client, admin, dataset_id) == before


# -- 5. downloads ------------------------------------------------------------------------------------------------

@pytest.fixture
def laplace_release(client, consumer, dataset):
    return created(release(client, consumer, dataset, "dl", mechanism="laplace", epsilon=2))


def test_download_csv(client, consumer, labels, laplace_release):
    r = client.get(f"/v1/releases/{laplace_release['id']}/labels", headers=consumer)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = download_rows(client, consumer, laplace_release["id"])
    assert len(rows) == NUM_LABELS == laplace_release["num_examples"]
    assert [i for i, _ in rows] == list(labels)
    assert all(math.isfinite(v) and v == round(v) for _, v in rows)  # discrete Laplace on integer labels


def test_download_ndjson_and_parquet_match_csv(client, consumer, laplace_release):
    rows = download_rows(client, consumer, laplace_release["id"])
    r = client.get(f"/v1/releases/{laplace_release['id']}/labels",
                   headers={**consumer, "Accept": "application/x-ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = r.text.splitlines()
    assert len(lines) == NUM_LABELS
    objects = [json.loads(line) for line in lines]
    assert all(set(o) == {"example_id", "label"} for o in objects)
    assert [(o["example_id"], o["label"]) for o in objects] == rows

    r = client.get(f"/v1/releases/{laplace_release['id']}/labels",
                   headers={**consumer, "Accept": "application/vnd.apache.parquet"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/vnd.apache.parquet")
    table = pq.read_table(io.BytesIO(r.content))
    assert table.num_rows == NUM_LABELS
    assert list(zip(table.column("example_id").to_pylist(), table.column("label").to_pylist(), strict=True)) == rows


def test_download_json_pages(client, consumer, laplace_release):
    rows = download_rows(client, consumer, laplace_release["id"])
    items, offset, pages = [], 0, 0
    while offset is not None:
        r = client.get(f"/v1/releases/{laplace_release['id']}/labels", params={"limit": 700, "offset": offset},
                       headers={**consumer, "Accept": "application/json"})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["total"] == NUM_LABELS and page["offset"] == offset
        assert len(page["items"]) == min(700, NUM_LABELS - offset)
        items += page["items"]
        offset = page["next_offset"]
        pages += 1
    assert pages == 3
    assert [(i["example_id"], i["label"]) for i in items] == rows
    beyond = client.get(f"/v1/releases/{laplace_release['id']}/labels", params={"offset": 5000},
                        headers={**consumer, "Accept": "application/json"}).json()
    assert beyond == {"items": [], "offset": 5000, "total": NUM_LABELS, "next_offset": None}
    for params in ({"limit": 0}, {"offset": -1}, {"limit": 100_001}):
        expect_error(client.get(f"/v1/releases/{laplace_release['id']}/labels", params=params,
                                headers={**consumer, "Accept": "application/json"}), 422, "invalid_request")


def test_download_unsupported_accept_is_406(client, consumer, laplace_release):
    for accept in ("image/png", "application/xml, text/html"):
        expect_error(client.get(f"/v1/releases/{laplace_release['id']}/labels",
                                headers={**consumer, "Accept": accept}), 406, "not_acceptable")


def test_download_by_other_org_is_404(client, admin, stranger, other_admin, laplace_release):
    release_id = laplace_release["id"]
    missing = expect_error(client.get(f"/v1/releases/{'f' * 32}/labels", headers=stranger), 404, "not_found")
    for headers in (stranger, other_admin):
        error = expect_error(client.get(f"/v1/releases/{release_id}/labels", headers=headers), 404, "not_found")
        assert error == missing  # does not reveal that the release exists
        expect_error(client.get(f"/v1/releases/{release_id}", headers=headers), 404, "not_found")
    # The owning admin can read it.
    assert client.get(f"/v1/releases/{release_id}/labels", headers=admin).status_code == 200


def test_laplace_release_is_unbiased(client, consumer, labels, laplace_release):
    noisy = dict(download_rows(client, consumer, laplace_release["id"]))
    assert noisy.keys() == labels.keys()
    ids = list(labels)
    truth = np.array([labels[i] for i in ids], dtype=float)
    released = np.array([noisy[i] for i in ids])
    standard_error = released.std(ddof=1) / math.sqrt(len(ids))
    assert released.std() > 2 * truth.std()  # it really is noisy (noise std ≈ 36 vs label std ≈ 15)
    assert abs(released.mean() - truth.mean()) < 5 * standard_error


# -- 6. audit ----------------------------------------------------------------------------------------------------

RECORD_FIELDS = {"epsilon_requested", "epsilon_certified", "mechanism", "release_id", "examples_covered",
                 "dp_event", "charge"}


def _tamper(ctx) -> None:
    with ctx.sessions() as s, s.begin():
        result = s.execute(text("UPDATE ledger SET record = replace(record, :old, :new) WHERE record LIKE :match"),
                           {"old": '"charge":1.0', "new": '"charge":0.1', "match": '%"charge":1.0%'})
        assert result.rowcount == 1


def test_audit_events(client, admin, consumer, dataset):
    a = created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    b = created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5, example_ids=["e1", "e2"]))
    # Refused or repeated requests add no event.
    assert release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1).status_code == 200
    expect_error(release(client, consumer, dataset, "c", mechanism="laplace", epsilon=5), 409, "budget_exceeded")
    expect_error(release(client, consumer, dataset, "d", mechanism="nope", epsilon=1), 422, "invalid_request")
    expect_error(release(client, consumer, dataset, "a", mechanism="rr", epsilon=1), 409, "idempotency_conflict")

    r = client.get("/v1/audit", params={"dataset": dataset}, headers=admin)
    assert r.status_code == 200
    audit = r.json()
    assert audit["chain_valid"] is True
    assert audit["budgets"] == [{"dataset_id": dataset, "epsilon_total": 3.0, "epsilon_spent": 1.5,
                                 "epsilon_remaining": 1.5}]
    events = audit["events"]
    assert [e["seq"] for e in events] == [1, 2]
    assert events[0]["prev_hash"] == "0" * 64 and events[1]["prev_hash"] == events[0]["hash"]
    for event, rel, covered in ((events[0], a, NUM_LABELS), (events[1], b, 2)):
        record = event["record"]
        assert RECORD_FIELDS <= set(record)
        assert record["release_id"] == rel["id"] and record["mechanism"] == rel["mechanism"]
        assert record["epsilon_requested"] == rel["epsilon"] == record["charge"]
        assert record["epsilon_certified"] == rel["certified_epsilon"] <= record["epsilon_requested"]
        assert record["examples_covered"] == covered
        assert record["actor"] == {"org": "publisher", "role": "consumer"}
        assert isinstance(record["dp_event"], dict) and record["dp_event"]["type"] == "ComposedDpEvent"
        assert event["dataset_id"] == dataset
    assert events[0]["record"]["dp_event"]["events"][0]["type"] in ("LaplaceDpEvent", "DiscreteLaplaceDpEvent")
    assert events[1]["record"]["dp_event"]["events"][0]["type"] == "RandomizedResponseDpEvent"
    # Without ?dataset the admin sees every dataset it owns.
    everything = client.get("/v1/audit", headers=admin).json()
    assert len(everything["events"]) == 2 and everything["chain_valid"] is True


def test_audit_detects_tampering(ctx, client, admin, consumer, dataset):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))
    assert client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()["chain_valid"] is True
    _tamper(ctx)
    audit = client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()
    assert audit["chain_valid"] is False
    assert audit["events"][0]["record"]["charge"] == 0.1  # the tampered record is what is shown ...
    assert audit["budgets"][0]["epsilon_spent"] == 1.5  # ... but the budget is not refunded


def test_verify_audit_detects_tampering(ctx, client, consumer, dataset):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    report = service.verify_audit(ctx)
    assert report["valid"] is True
    assert [(d["dataset_id"], d["entries"], d["problems"]) for d in report["datasets"]] == [(dataset, 1, [])]
    _tamper(ctx)
    report = service.verify_audit(ctx)
    assert report["valid"] is False
    assert "hash chain broken" in report["datasets"][0]["problems"]


def test_verify_audit_cli(ctx, client, consumer, dataset, db_url, data_dir, capsys):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    argv = ["labels", "verify-audit", "--database-url", db_url, "--data-dir", str(data_dir)]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    _tamper(ctx)
    assert cli.main(argv) == 1
    assert json.loads(capsys.readouterr().out)["valid"] is False


def test_verify_audit_cli_without_datasets(db_url, data_dir, capsys):
    assert cli.main(["labels", "verify-audit", "--database-url", db_url, "--data-dir", str(data_dir)]) == 0
    assert json.loads(capsys.readouterr().out) == {"datasets": [], "valid": True}


# -- 7. documentation --------------------------------------------------------------------------------------------

def test_docs_and_openapi(client):
    assert client.get("/docs").status_code == 200
    r = client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in ("/v1/datasets", "/v1/datasets/{dataset_id}/labels", "/v1/datasets/{dataset_id}/releases",
                 "/v1/datasets/{dataset_id}/budget", "/v1/datasets/{dataset_id}/grants",
                 "/v1/releases/{release_id}/labels", "/v1/audit"):
        assert path in paths


def test_unknown_route_is_json_404(client, admin):
    expect_error(client.get("/v1/nothing-here", headers=admin), 404, "not_found")
