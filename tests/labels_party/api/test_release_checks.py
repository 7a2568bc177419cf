"""``POST /v1/datasets/{id}/release-checks``: releases a client means to ask for together, each checked as its own
request would be — its refusal on public inputs, or the examples it would cover — with nothing drawn, charged or
stored. The trainer's auto jobs check every part first, so none is refused after another was charged."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.labels_party.api.helpers import audit_events, expect_error, labels_csv, new_dataset, state, upload


def _checks(client, headers, dataset_id, **body):
    return client.post(f"/v1/datasets/{dataset_id}/release-checks", json=body, headers=headers)


def _files(directory) -> set[str]:
    return {str(path) for path in Path(directory).rglob("*") if path.is_file()}


def test_each_release_gets_the_refusal_its_own_request_would_and_nothing_changes(client, admin, consumer, dataset,
                                                                                  data_dir):
    before, events = state(client, admin, dataset), len(audit_events(client, admin, dataset))
    files = _files(data_dir)
    ids = [f"e{i}" for i in range(100)]
    answer = _checks(client, consumer, dataset, releases=[
        {"mechanism": "opt-unbiased", "epsilon": 0.5, "example_ids": ids},
        {"mechanism": "rr-with-prior", "epsilon": 0.5, "example_ids": ids},  # classes only
        {"mechanism": "opt-unbiased", "epsilon": 0.001, "example_ids": ids},  # under the continuous solver's floor
        {"mechanism": "rr-on-bins", "epsilon": 1, "example_ids": ["e1", "nope"]},  # an unknown id
        {"mechanism": "laplace", "epsilon": 1},  # every example
    ], evaluations=[{"metric": "mean", "epsilon": 0.1, "example_ids": ids},
                    {"metric": "mse", "epsilon": 0.1, "example_ids": ids, "predictions": [1.0]}])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    codes = [(c["num_examples"], (c["error"] or {}).get("code")) for c in body["releases"]]
    assert codes == [(100, None), (None, "mechanism_domain_mismatch"), (None, "epsilon_out_of_range"),
                     (None, "unknown_example_ids"), (2000, None)]
    assert [(c["num_examples"], (c["error"] or {}).get("code")) for c in body["evaluations"]] == \
        [(100, None), (None, "invalid_input")]
    # each refusal is the one its own request gets (and that request charges nothing either)
    refused = client.post(f"/v1/datasets/{dataset}/releases", headers={**consumer, "Idempotency-Key": "k"},
                          json={"mechanism": "rr-with-prior", "epsilon": 0.5, "example_ids": ids})
    assert refused.json()["error"] == body["releases"][1]["error"]
    assert state(client, admin, dataset) == before
    assert len(audit_events(client, admin, dataset)) == events
    assert _files(data_dir) == files


def test_a_wide_class_domain_refuses_the_families_with_a_limit(client, admin, consumer):
    dataset = new_dataset(client, admin, name="wide", label_kind="classes", num_classes=300, epsilon_total=2)
    assert upload(client, admin, dataset, labels_csv({f"c{i}": i % 300 for i in range(3000)})).status_code == 200
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2},
                       headers=admin).status_code == 201
    ids = [f"c{i}" for i in range(500)]
    mechanisms = ("rr", "rr-with-prior", "block-rr", "alibi")
    body = _checks(client, consumer, dataset, releases=[
        {"mechanism": m, "epsilon": 1, "example_ids": ids} for m in mechanisms]).json()
    assert [(c["error"] or {}).get("code") for c in body["releases"]] == \
        [None, None, "domain_too_large", "domain_too_large"]
    assert "256" in body["releases"][2]["error"]["message"]


def test_the_check_is_the_datasets_like_any_release(client, admin, consumer, stranger, dataset, dataset_small):
    expect_error(_checks(client, stranger, dataset, releases=[{"mechanism": "rr", "epsilon": 1}]), 404, "not_found")
    expect_error(_checks(client, consumer, dataset_small, releases=[]), 404, "not_found")  # not granted to it
    expect_error(_checks(client, consumer, dataset, releases=[{"mechanism": "rr", "epsilon": 1}] * 17), 422,
                 "invalid_request")
    expect_error(client.post(f"/v1/datasets/{dataset}/release-checks", json={"releases": []}), 401,
                 "unauthorized")


@pytest.mark.parametrize("epsilon", [1e-9, 1e9])
def test_epsilon_outside_the_deployment_range_is_that_releases_refusal(client, consumer, dataset, epsilon):
    body = _checks(client, consumer, dataset, releases=[{"mechanism": "rr", "epsilon": epsilon}]).json()
    assert body["releases"][0]["error"]["code"] == "epsilon_out_of_range"
