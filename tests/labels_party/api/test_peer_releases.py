"""The published peers over HTTP (issue 41): an ``rp-with-prior`` release of integer labels and a ``block-rr`` release
of imbalanced classes — each charged its ε once (its noisy prior's share included, published with the release),
its mechanism document re-certifying; refusals on public inputs before any charge."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shared.mechanisms.documents import sampler_from_description
from tests.labels_party.api.helpers import (
    audit_events,
    budget,
    created,
    expect_error,
    labels_csv,
    new_dataset,
    release,
    state,
    upload,
)


def test_rp_with_prior_releases_grid_labels_inside_its_interval(client, admin, consumer, dataset):
    body = created(release(client, consumer, dataset, "rp", mechanism="rp-with-prior", epsilon=1))
    assert body["mechanism"] == "rp-with-prior" and body["prior_epsilon"] > 0
    assert body["prior_epsilon"] + body["randomizer_epsilon"] == pytest.approx(1.0)
    document = client.get(f"/v1/mechanisms/{body['mechanism_hash']}", headers=consumer).json()["description"]
    low, high = document["parameters"]["interval"]
    assert 1 <= low < high <= 52
    rebuilt = sampler_from_description(document)  # re-certified from the document's own probabilities
    assert rebuilt.certified_epsilon <= body["randomizer_epsilon"] + 1e-12
    rows = client.get(f"/v1/releases/{body['id']}/labels", headers={**consumer, "Accept": "application/x-ndjson"})
    released = np.array([json.loads(line)["label"] for line in rows.text.splitlines()])
    assert released.size == 2000 and low <= released.min() and released.max() <= high
    assert budget(client, consumer, dataset)["epsilon_spent"] == 1.0
    record = audit_events(client, admin, dataset)[-1]["record"]
    assert record["mechanism"] == "rp-with-prior" and record["dp_event"]["events"][0]["type"] == \
        "DiscreteLaplaceDpEvent"


def test_block_rr_releases_imbalanced_classes_and_is_refused_on_numbers(client, admin, dataset):
    dataset_id = new_dataset(client, admin, name="imbalanced", label_kind="classes", num_classes=5, epsilon_total=3)
    counts = [600, 250, 80, 50, 20]
    truth = {f"c{i}": cls for i, cls in enumerate(np.repeat(np.arange(5), counts).tolist())}
    assert upload(client, admin, dataset_id, labels_csv(truth)).status_code == 200
    before = state(client, admin, dataset_id)
    expect_error(release(client, admin, dataset_id, "x", mechanism="rp-with-prior", epsilon=1), 400,
                 "mechanism_domain_mismatch")
    assert state(client, admin, dataset_id) == before
    before_numbers = state(client, admin, dataset)
    expect_error(release(client, admin, dataset, "y", mechanism="block-rr", epsilon=1), 400,
                 "mechanism_domain_mismatch")
    assert state(client, admin, dataset) == before_numbers
    body = created(release(client, admin, dataset_id, "brr", mechanism="block-rr", epsilon=2))
    document = client.get(f"/v1/mechanisms/{body['mechanism_hash']}", headers=admin).json()["description"]
    assert sampler_from_description(document).certified_epsilon <= body["randomizer_epsilon"] + 1e-12
    assert document["parameters"]["majority"][0] == 0.0  # the most frequent class is in the majority block
    rows = client.get(f"/v1/releases/{body['id']}/labels", headers={**admin, "Accept": "application/x-ndjson"})
    released = {json.loads(line)["example_id"]: json.loads(line)["label"] for line in rows.text.splitlines()}
    assert set(released) == set(truth) and set(released.values()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    kept = np.mean([released[k] == v for k, v in truth.items()])
    assert kept > 0.4  # e^ε β ≈ 0.47 on the majority classes at the randomizer's ε (RR on 5 classes: 0.65 at ε 2)
    assert budget(client, admin, dataset_id)["epsilon_spent"] == 2.0


def test_a_domain_beyond_block_rrs_limit_is_refused_before_any_charge(client, admin):
    dataset_id = new_dataset(client, admin, name="wide", label_kind="classes", num_classes=300, epsilon_total=3)
    assert upload(client, admin, dataset_id, labels_csv({f"w{i}": i % 300 for i in range(600)})).status_code == 200
    before = state(client, admin, dataset_id)
    error = expect_error(release(client, admin, dataset_id, "w", mechanism="block-rr", epsilon=1), 400,
                         "domain_too_large")
    assert "256" in error["message"]
    assert state(client, admin, dataset_id) == before


def test_the_peers_take_a_prior_per_group(tmp_path):
    """A group release builds one randomizer per group on that group's noisy prior: RPWithPrior's intervals follow
    each group's labels."""
    from features_party.client import LabelsPartyClient
    from labeldp.local_services import serve_in_thread
    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.runtime.context import make_context

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
    rng = np.random.default_rng(4)
    groups = rng.integers(0, 2, size=2000)
    labels = np.clip(np.rint(5 + 25 * groups + rng.normal(0, 2, size=2000)), 0, 40).astype(int)
    ids = [f"g{i}" for i in range(2000)]
    with serve_in_thread(create_app(ctx)) as base, LabelsPartyClient(base, admin) as client:
        dataset = client.create_dataset(name="g", label_kind="integer", min=0, max=40, epsilon_total=2.0).id
        client.upload_labels(dataset, ids, labels)
        release = client.request_group_release(dataset, ids, groups, "rp-with-prior", 2.0, 0.5,
                                               idempotency_key="groups")
        described = client.mechanism_document(release.mechanism_hash)["description"]
        intervals = [described["mechanisms"][i]["parameters"]["interval"] for i in described["groups"]["mechanism"]]
        assert release.certified_epsilon <= 2.0 and client.budget(dataset).epsilon_spent == 2.0
    (low0, high0), (low1, high1) = intervals
    assert high0 < 15 < low1  # group 0 around 5, group 1 around 30: disjoint intervals


def test_alibi_releases_one_integer_vector_per_example(client, admin):
    dataset_id = new_dataset(client, admin, name="vectors", label_kind="classes", num_classes=4, epsilon_total=2)
    truth = {f"a{i}": i % 4 for i in range(400)}
    assert upload(client, admin, dataset_id, labels_csv(truth)).status_code == 200
    body = created(release(client, admin, dataset_id, "alibi", mechanism="alibi", epsilon=2))
    assert body["prior_epsilon"] == 0 and body["noisy_prior"] is None
    rows = client.get(f"/v1/releases/{body['id']}/labels", headers={**admin, "Accept": "application/x-ndjson"})
    vectors = {json.loads(line)["example_id"]: json.loads(line)["noisy_vector"] for line in rows.text.splitlines()}
    assert set(vectors) == set(truth) and all(len(v) == 4 and all(isinstance(x, int) for x in v)
                                              for v in vectors.values())
    # the true class's coordinate carries the scale: the arg-max is the label far more often than chance
    hits = np.mean([int(np.argmax(vectors[k])) == v for k, v in truth.items()])
    assert hits > 0.45
    assert budget(client, admin, dataset_id)["epsilon_spent"] == 2.0


def test_wide_vectors_are_priced_before_the_charge_and_paged_by_cells(client, admin):
    """The review's: ALIBI on 256 classes with 100,000 named examples took +830 MB after the charge, and a JSON page
    of 100,000 rows of 256 columns +316 MB. A named-examples release of a column per class holds at most 2**24
    cells (refused before the charge), and pages and streamed batches are bounded in cells."""
    dataset_id = new_dataset(client, admin, name="wide", label_kind="classes", num_classes=256, epsilon_total=4)
    truth = {f"w{i}": i % 256 for i in range(65_537)}
    assert upload(client, admin, dataset_id, labels_csv(truth)).status_code == 200
    before = state(client, admin, dataset_id)
    error = expect_error(release(client, admin, dataset_id, "big", mechanism="alibi", epsilon=1,
                                 example_ids=list(truth)), 400, "too_large")
    assert "16,777,472 cells" in error["message"]
    assert state(client, admin, dataset_id) == before
    body = created(release(client, admin, dataset_id, "page", mechanism="alibi", epsilon=1,
                           example_ids=list(truth)[:2000]))
    page = client.get(f"/v1/releases/{body['id']}/labels", headers={**admin, "Accept": "application/json"},
                      params={"limit": 100_000}).json()
    assert len(page["items"]) == 200_000 // 257 == page["next_offset"] and page["total"] == 2000
    rest = client.get(f"/v1/releases/{body['id']}/labels", headers={**admin, "Accept": "application/x-ndjson"})
    assert len(rest.text.splitlines()) == 2000
