"""Releases that would carry no information about the labels (issue 31): refused before any charge when public
inputs decide it, replaced by the family's fallback when the noisy prior decides it, and kept only on an explicit
opt-in (``allow_uninformative``) for research."""

from __future__ import annotations

import json

import numpy as np
import pytest

from labeldp.cli import main as labels_cli
from labels_party.core import pipeline, registry
from shared.domains import Classes, domain_from_spec
from shared.errors import LabelDPError
from shared.mechanisms.protocol import uninformative_reason
from shared.privacy import EPSILON_MIN
from tests.labels_party.api.helpers import admin_client, expect_error
from tests.labels_party.api.test_per_example_priors import _post as post_priors

SKEWED = np.array([0.9] + [0.1 / 9] * 9)  # one class 81 times as likely as any other


def test_rr_with_prior_on_a_skewed_prior_keeps_one_class_and_says_nothing():
    mechanism = registry.build("rr-with-prior", Classes(10), 1.0, SKEWED).mechanism
    assert mechanism.num_outputs == 1 and mechanism.certified_epsilon == 0.0
    assert "single possible output" in uninformative_reason(mechanism)
    with pytest.raises(LabelDPError) as refused:
        registry.refuse_uninformative(mechanism, 1.0, prior_known=True)
    assert refused.value.code == "uninformative_release" and "larger epsilon" in str(refused.value)
    # at ε = 5 every class: e⁵/(e⁵ + 9) ≈ 0.943 correct beats 0.9 for k = 1
    informative = registry.build("rr-with-prior", Classes(10), 5.0, SKEWED).mechanism
    assert uninformative_reason(informative) is None and informative.num_outputs == 10


def test_a_build_on_a_noisy_prior_that_would_say_nothing_falls_back():
    built = registry.build_on_private_prior("rr-with-prior", Classes(10), 1.0, SKEWED)
    assert built.diagnostics["fallback"] == "rr" and built.diagnostics["reason"] == "uninformative"
    assert built.mechanism.num_outputs == 10
    assert built.mechanism.certified_epsilon == pytest.approx(1.0, abs=1e-9)
    kept = registry.build_on_private_prior("rr-with-prior", Classes(10), 1.0, SKEWED, allow_uninformative=True)
    assert "fallback" not in kept.diagnostics and kept.mechanism.certified_epsilon == 0.0


def test_the_pipeline_spends_epsilon_on_labels_that_depend_on_the_label():
    labels = np.where(np.arange(5000) % 10 == 0, np.arange(5000) % 7 + 1, 0)  # 90% class 0
    result = pipeline.privatize_labels(Classes(10), labels, "rr-with-prior", 1.5, np.random.default_rng(3),
                                       prior_epsilon=0.5)
    assert result.diagnostics["reason"] == "uninformative" and result.mechanism.name == "rr"
    assert result.certified_epsilon == pytest.approx(1.5, abs=1e-6)
    # RR at ε₂ = 1 over 10 classes keeps the label with probability e/(e+9) ≈ 0.232: the released labels track them
    kept = np.mean(result.noisy_labels == labels)
    assert abs(kept - np.e / (np.e + 9)) < 4 * np.sqrt(0.232 * 0.768 / labels.size)
    opted = pipeline.privatize_labels(Classes(10), labels, "rr-with-prior", 1.5, np.random.default_rng(3),
                                      prior_epsilon=0.5, allow_uninformative=True)
    assert set(np.unique(opted.noisy_labels)) == {0.0} and opted.certified_epsilon < 0.5 + 1e-9


@pytest.fixture()
def skewed_dataset(tmp_path):
    _, client = admin_client(tmp_path)
    dataset = client.post("/v1/datasets", json={"name": "skewed", "label_kind": "classes", "num_classes": 10,
                                                "epsilon_total": 4.0}).json()["id"]
    labels = np.where(np.arange(2000) % 10 == 0, np.arange(2000) % 7 + 1, 0)
    body = "example_id,label\n" + "\n".join(f"e{i},{v}" for i, v in enumerate(labels))
    assert client.put(f"/v1/datasets/{dataset}/labels", content=body,
                      headers={"Content-Type": "text/csv"}).status_code == 200
    return client, dataset


def _release(client, dataset, key, **body):
    return client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": key},
                       json={"mechanism": "rr-with-prior", "epsilon": 1.5, "prior_epsilon": 0.5, **body})


def test_the_service_releases_the_fallback_and_names_it(skewed_dataset):
    client, dataset = skewed_dataset
    response = _release(client, dataset, "a")
    assert response.status_code == 201, response.text
    release = response.json()
    document = client.get(f"/v1/mechanisms/{release['mechanism_hash']}").json()["description"]
    assert (document["fallback"], document["fallback_from"], document["reason"]) == \
        ("rr", "rr-with-prior", "uninformative")
    assert document["num_outputs"] == 10 and release["certified_epsilon"] == pytest.approx(1.5, abs=1e-6)
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 1.5
    # the opt-in keeps the one-class randomizer, and hashes as another body under the same key
    assert _release(client, dataset, "a", allow_uninformative=True).status_code == 409
    opted = _release(client, dataset, "b", allow_uninformative=True)
    assert opted.status_code == 201, opted.text
    kept = client.get(f"/v1/mechanisms/{opted.json()['mechanism_hash']}").json()["description"]
    assert kept["num_outputs"] == 1 and "fallback" not in kept
    assert opted.json()["certified_epsilon"] <= 0.5 + 1e-9  # the prior's ε₁ only: the randomizer says nothing
    events = client.get("/v1/audit", params={"dataset": dataset}).json()["events"]
    assert ["allow_uninformative" in e["record"]["request"] for e in events] == [False, True]


def test_per_example_priors_that_all_keep_one_class_are_refused_before_any_charge(skewed_dataset):
    client, dataset = skewed_dataset
    ids = [f"e{i}" for i in range(100)]
    expect_error(post_priors(client, dataset, ids, np.tile(SKEWED, (100, 1))), 400, "uninformative_release")
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0
    assert client.get("/v1/audit", params={"dataset": dataset}).json()["events"] == []
    mixed = np.tile(SKEWED, (100, 1))
    mixed[0] = np.full(10, 0.1)  # one example with a flat prior: its label is informative
    assert post_priors(client, dataset, ids, mixed).status_code == 201


def test_a_mixed_request_charges_and_releases_only_the_examples_whose_prior_says_something(skewed_dataset):
    """99 priors with k = 1 and one flat prior (k = 10): only the flat one is covered, charged and released; the
    99 keep their whole budget, and the description says how many were left out."""
    client, dataset = skewed_dataset
    ids = [f"e{i}" for i in range(100)]
    mixed = np.tile(SKEWED, (100, 1))
    mixed[37] = np.full(10, 0.1)
    response = post_priors(client, dataset, ids, mixed, key="mixed")
    assert response.status_code == 201, response.text
    release = response.json()
    assert release["num_examples"] == 1 and release["certified_epsilon"] <= 1.0
    assert release["description"]["uninformative_examples"] == 99
    assert release["description"]["requested_examples"] == 100 and release["description"]["mean_k"] == 10.0
    document = client.get(f"/v1/mechanisms/{release['mechanism_hash']}").json()["description"]
    assert document["uninformative_examples"] == 99 and document["k_histogram"] == [0] * 9 + [1]
    rows = client.get(f"/v1/releases/{release['id']}/labels", headers={"Accept": "application/json"},
                      params={"limit": 1000}).json()["items"]
    assert [row["example_id"] for row in rows] == ["e37"]
    replay = post_priors(client, dataset, ids, mixed, key="mixed")  # the same release, not a second charge
    assert replay.status_code == 200 and replay.json()["id"] == release["id"]
    events = client.get("/v1/audit", params={"dataset": dataset}).json()["events"]
    assert [e["record"]["examples_covered"] for e in events] == [1]
    # the 99 were not charged: a release of the whole budget (4.0) on them fits; on e37 (1.0 spent) it does not
    others = [i for i in ids if i != "e37"]
    whole = {"mechanism": "rr", "epsilon": 4.0}
    assert client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": "others"},
                       json={**whole, "example_ids": others}).status_code == 201
    expect_error(client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": "e37"},
                             json={**whole, "example_ids": ["e37"]}), 409, "budget_exceeded")


def test_the_ids_a_release_leaves_out_are_still_checked(skewed_dataset):
    client, dataset = skewed_dataset
    priors = np.tile(SKEWED, (3, 1))
    priors[0] = np.full(10, 0.1)
    expect_error(post_priors(client, dataset, ["e0", "e1", "nobody"], priors), 400, "unknown_example_ids")
    expect_error(post_priors(client, dataset, ["e0", "e1", "e1"], priors), 400, "duplicate_example_id")
    assert client.get("/v1/audit", params={"dataset": dataset}).json()["events"] == []


def test_the_cli_refuses_a_one_class_randomizer_unless_opted_in(tmp_path, capsys):
    prior = tmp_path / "prior.csv"
    prior.write_text("label,weight\n" + "".join(f"{k},{w}\n" for k, w in enumerate(SKEWED)))
    args = ["randomizer", "solve", "--mechanism", "rr-with-prior", "--epsilon", "1", "--labels", "0:9",
            "--prior-file", str(prior), "--json"]
    assert labels_cli(args) != 0
    captured = capsys.readouterr()
    assert captured.out == "" and "single possible output" in captured.err and "--allow-uninformative" in captured.err
    assert labels_cli([*args, "--allow-uninformative"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_outputs"] == 1 and report["certified_epsilon"] == 0.0


GRID_50K = domain_from_spec({"kind": "continuous", "min": 0, "max": 1, "grid_size": 50_000})


@pytest.mark.parametrize("domain", [Classes(2), Classes(2000), GRID_50K],
                         ids=["2 classes", "2000 classes", "grid of 50k"])
def test_every_fallback_says_something_at_the_smallest_epsilon(domain):
    """Why a release built on a noisy prior needs no public check of its fallback: RR and dbRR are informative at
    every ε the library certifies, on the largest domains the families take."""
    fallbacks = {f.fallback for f in registry.FAMILIES.values() if f.fallback and domain.label_kind in f.label_kinds}
    assert fallbacks
    for name in fallbacks:
        mechanism = registry.build(name, domain, EPSILON_MIN).mechanism
        assert uninformative_reason(mechanism) is None and 0 < mechanism.certified_epsilon <= EPSILON_MIN
