"""Authentication and authorization: 401 without a valid key, 403 for a consumer, 404 for what another org owns."""

from __future__ import annotations

import pytest

from tests.labels_party.api.helpers import (
    MISSING_DATASET,
    NOT_FOUND_BODY,
    bearer,
    expect_error,
    release,
    state,
    upload,
)

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


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
    headers = bearer(keys[who])
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
