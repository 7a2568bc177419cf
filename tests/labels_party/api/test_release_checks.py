"""``POST /v1/datasets/{id}/release-checks``: releases a client means to ask for together, each checked as its own
request would be — its refusal on public inputs, or the examples it would cover — with nothing drawn, charged or
stored. The trainer's auto jobs check every part first, so none is refused after another was charged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from features_party.client import LabelsPartyClient, LabelsPartyError
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
    first = _checks(client, consumer, dataset, releases=[
        {"mechanism": "opt-unbiased", "epsilon": 0.5, "example_ids": ids},
        {"mechanism": "rr-with-prior", "epsilon": 0.5, "example_ids": ids},  # classes only
        {"mechanism": "opt-unbiased", "epsilon": 0.001, "example_ids": ids},  # under the continuous solver's floor
        {"mechanism": "rr-on-bins", "epsilon": 1, "example_ids": ["e1", "nope"]},  # an unknown id
    ])
    second = _checks(client, consumer, dataset, releases=[{"mechanism": "laplace", "epsilon": 1}],  # every example
                     evaluations=[{"metric": "mean", "epsilon": 0.1, "example_ids": ids},
                                  {"metric": "mse", "epsilon": 0.1, "example_ids": ids, "predictions": [1.0]}])
    assert first.status_code == 200 and second.status_code == 200, first.text + second.text
    body = {"releases": first.json()["releases"] + second.json()["releases"],
            "evaluations": second.json()["evaluations"]}
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
    expect_error(_checks(client, consumer, dataset, releases=[{"mechanism": "rr", "epsilon": 1}] * 5), 422,
                 "invalid_request")
    expect_error(_checks(client, consumer, dataset, evaluations=[{"metric": "mean", "epsilon": 1,
                                                                   "example_ids": ["e1"]}] * 5), 422,
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
    without them — a dataset of numbers, an unknown id, a body decoding past the deployment's limit (what the parse
    counts of a CSV body: a row's 136 bytes and 48 a class, its id's bytes six times) — and no bigger body than
    that; its real request, as the trainer sends it, is refused or taken as the check said."""
    from labels_party.store import uploads

    shape = {"epsilon": 1, "example_ids": ["e1", "e2"]}
    body = _checks(client, consumer, dataset, prior_releases=[shape]).json()
    assert body["prior_releases"][0]["error"]["code"] == "mechanism_domain_mismatch"
    k = 20_000
    wide = new_dataset(client, admin, name="wide", label_kind="classes", num_classes=k, epsilon_total=4)
    assert upload(client, admin, wide, labels_csv({f"c{i}": i % k for i in range(3000)})).status_code == 200
    assert client.post(f"/v1/datasets/{wide}/grants", json={"org": "publisher", "epsilon": 4},
                       headers=admin).status_code == 201
    ids = [f"c{i}" for i in range(3000)]
    row = uploads.ID_ROW_BYTES + uploads.PRIOR_CELL_BYTES * k
    held = [uploads.held_id_size(i) for i in ids]
    fits = next(n for n in range(3000, 0, -1) if n * row + sum(held[:n]) <= uploads.MAX_DECODED_BYTES)
    assert 0 < fits < 3000
    checked = [_checks(client, consumer, wide, prior_releases=[{"epsilon": 1, "example_ids": part}]).json()[
        "prior_releases"][0] for part in (ids[:fits], ids[:fits + 1], ids[:9] + ["ghost"])]
    assert checked[0] == {"num_examples": fits, "error": None}
    assert checked[1]["error"]["code"] == "body_too_large" and "max_columnar_decoded_bytes" in \
        checked[1]["error"]["message"]
    assert checked[2]["error"]["code"] == "unknown_example_ids"
    with LabelsPartyClient(str(client.base_url), consumer["Authorization"].split()[1], retries=0,
                           transport=client._transport) as trainer_client:
        priors = np.full((fits + 1, k), 1.0)  # uniform: every class kept (k = K), so the release is informative
        with pytest.raises(LabelsPartyError) as refused:  # the trainer's body of one row more: refused, as checked
            trainer_client.request_prior_release(wide, ids[:fits + 1], priors, 1.0, idempotency_key="over")
        assert refused.value.code == "body_too_large"
        taken = trainer_client.request_prior_release(wide, ids[:200], priors[:200], 1.0, idempotency_key="under")
        assert taken.num_examples == 200
