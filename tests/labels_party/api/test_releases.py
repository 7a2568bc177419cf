"""Releases: idempotency, refused requests that charge nothing, budgets and composition, each mechanism's output."""

from __future__ import annotations

import json
import math

import pytest

from tests.labels_party.api.helpers import (
    NUM_LABELS,
    assert_same_release,
    audit_events,
    budget,
    created,
    download_rows,
    expect_error,
    labels_csv,
    new_dataset,
    release,
    state,
    upload,
)

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


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
    owned = client.get(f"/v1/releases/{body['id']}", headers=admin).json()
    assert owned["execution"] is None  # its owner's admin: no Spark job ran


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
    assert set(error) == {"code", "message"} and "3.5" in error["message"]  # no figures of the account's use
    assert state(client, admin, dataset) == before

    created(release(client, consumer, dataset, "one", mechanism="laplace", epsilon=1))
    before = state(client, admin, dataset)
    error = expect_error(release(client, consumer, dataset, "too-much", mechanism="rr", epsilon=2.5), 409,
                         "budget_exceeded")
    assert set(error) == {"code", "message"}
    assert budget(client, consumer, dataset)["epsilon_remaining"] == pytest.approx(2.0)  # its own figures are here
    assert state(client, admin, dataset) == before
    assert (before["epsilon_spent"], before["audit_events"]) == (1.0, 1)
    # Exactly what remains is still allowed.
    created(release(client, consumer, dataset, "rest", mechanism="rr", epsilon=2))
    assert budget(client, consumer, dataset) == {"dataset_id": dataset, "epsilon_total": 3.0,
                                                 "epsilon_spent": 3.0, "epsilon_remaining": 0.0}


def test_subset_release_with_unknown_or_duplicate_ids_is_400(client, admin, consumer, dataset):
    before = state(client, admin, dataset)
    unknown = expect_error(release(client, consumer, dataset, "u", mechanism="laplace", epsilon=1,
                                   example_ids=["e0", "e1", "nope"]), 400, "unknown_example_ids")
    assert "nope" not in unknown["message"] and "1 of the 3" in unknown["message"]  # counted, never named
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
        assert "at most 0 left" in error["message"]  # the owner's admins are told the figures
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
    assert "at most 0.1 left" in error["message"]  # the owner's admins are told the figures
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
