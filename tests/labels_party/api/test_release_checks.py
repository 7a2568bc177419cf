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
def test_epsilon_outside_the_deployment_range_refuses_the_check_as_its_schema_says(client, consumer, dataset,
                                                                                     epsilon):
    """The OpenAPI states the deployment's ε range on every release request: a check holding one outside it is a
    schema-invalid body, refused whole (400), as its release would be."""
    answer = _checks(client, consumer, dataset, releases=[{"mechanism": "opt-unbiased", "epsilon": 1}],
                     evaluations=[{"metric": "mean", "epsilon": epsilon, "example_ids": ["e1"]}])
    expect_error(answer, 400, "epsilon_out_of_range")


def test_a_prior_release_to_come_is_checked_on_its_shape(client, admin, consumer, dataset):
    """An LP-MST stage's per-example prior release, its priors not known yet: refused for what its request would be
    without them — a dataset of numbers, an unknown id, a body decoding past the deployment's limit (rows × (64 +
    48·K) bytes, the parse's count) — and no bigger body than that."""
    shape = {"epsilon": 1, "example_ids": ["e1", "e2"]}
    body = _checks(client, consumer, dataset, prior_releases=[shape]).json()
    assert body["prior_releases"][0]["error"]["code"] == "mechanism_domain_mismatch"
    wide = new_dataset(client, admin, name="wide", label_kind="classes", num_classes=5000, epsilon_total=2)
    assert upload(client, admin, wide, labels_csv({f"c{i}": i % 5000 for i in range(3000)})).status_code == 200
    assert client.post(f"/v1/datasets/{wide}/grants", json={"org": "publisher", "epsilon": 2},
                       headers=admin).status_code == 201
    row = 64 + 48 * 5000  # bytes per row; 192 MiB by default
    fits, too_many = (192 << 20) // (row + 6) - 1, (192 << 20) // row + 1
    shapes = [{"epsilon": 1, "example_ids": [f"c{i}" for i in range(min(fits, 3000))]},
              {"epsilon": 1, "example_ids": [f"c{i}" for i in range(9)] + ["ghost"]}]
    checked = _checks(client, consumer, wide, prior_releases=shapes).json()["prior_releases"]
    assert checked[0] == {"num_examples": min(fits, 3000), "error": None}
    assert checked[1]["error"]["code"] == "unknown_example_ids"
    assert too_many < 3000  # 3,000 examples over 5,000 classes decode to 720 MB: refused, before any body is sent
    many = _checks(client, consumer, wide, prior_releases=[{"epsilon": 1, "example_ids": [
        f"c{i}" for i in range(too_many)]}]).json()["prior_releases"][0]
    assert many["error"]["code"] == "body_too_large" and "max_columnar_decoded_bytes" in many["error"]["message"]
