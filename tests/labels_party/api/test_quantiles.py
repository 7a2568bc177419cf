"""POST /v1/datasets/{id}/quantiles: DP quantiles charged like any release, audited, idempotent, refused on
public inputs before the charge, invisible to other organizations."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import select

import labels_party.releases.kinds as kinds
from labels_party.core.quantiles import MIN_SECONDS, RankCounts, draw_floor_seconds
from labels_party.http.audit import verify_audit
from labels_party.store import db
from tests.labels_party.api.helpers import (
    MISSING_DATASET,
    audit_events,
    budget,
    expect_error,
    labels_csv,
    new_dataset,
    state,
    upload,
)

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


def quantiles(client, headers, dataset_id, key, **body):
    return client.post(f"/v1/datasets/{dataset_id}/quantiles", json=body,
                       headers={**headers, "Idempotency-Key": key})


def test_a_consumer_gets_quantiles_charged_to_the_covered_examples_and_audited(client, admin, consumer, dataset,
                                                                                labels, ctx):
    ids = [f"e{i}" for i in range(1000)]
    r = quantiles(client, consumer, dataset, "q1", quantiles=[0.1, 0.9], epsilon=0.5, example_ids=ids)
    assert r.status_code == 201, r.text
    release = r.json()
    description = release["description"]
    assert release["mechanism"] == "quantiles" and release["num_examples"] == 1000
    assert release["charged_epsilon"] == 0.5 and 0.5 * (1 - 1e-9) < release["certified_epsilon"] <= 0.5
    assert description["candidates"] == 52 and description["epsilon_per_quantile"] <= 0.25
    values = description["values"]
    assert list(values) == ["0.1", "0.9"] and values["0.1"] < values["0.9"]
    truth = np.array([labels[i] for i in ids], dtype=float)
    for q, value in values.items():  # 1..52 uniform: ~19 labels a value, so ε/2 lands within a few values
        assert abs(value - np.quantile(truth, float(q))) <= 6

    # charged ε to each covered example, the other 1000 untouched: the consumer's account shows 0.5 spent
    assert budget(client, consumer, dataset)["epsilon_spent"] == 0.5
    event = audit_events(client, admin, dataset)[-1]["record"]
    assert (event["mechanism"], event["examples_covered"], event["charge_units"]) == ("quantiles", 1000, 500_000_000)
    assert event["request"] == {"quantiles": [0.1, 0.9], "epsilon": 0.5}  # no example ids in the record
    assert [e["type"] for e in event["dp_event"]["events"]] == ["ExponentialMechanismDpEvent"] * 2
    rest = [f"e{i}" for i in range(1000, 2000)]  # the other half still has its whole 3
    assert quantiles(client, consumer, dataset, "q2", quantiles=[0.5], epsilon=3.0, example_ids=rest).status_code \
        == 201
    assert verify_audit(ctx)["valid"]


def test_a_quick_draw_is_padded_to_the_public_floor(client, consumer, dataset, ctx):
    """Whether the labels are concentrated or spread (the rejection sampler's time depends on it), the response
    takes at least the floor computed from the candidates and the number of quantiles."""
    ids = [f"e{i}" for i in range(10)]
    started = time.monotonic()
    r = quantiles(client, consumer, dataset, "floor", quantiles=[0.5], epsilon=0.5, example_ids=ids)
    assert r.status_code == 201, r.text
    assert time.monotonic() - started >= draw_floor_seconds(10, 52, 1) == MIN_SECONDS


def test_counting_and_a_failing_draw_run_inside_the_padding(client, admin, consumer, dataset, monkeypatch):
    """Counting the ranks (a binary search per label: its time depends on the labels) runs inside the padded
    section, and a draw that fails there still answers after the floor: 503 release_failed, charged."""
    inside = []

    class Padded:
        def __init__(self, seconds):
            self.seconds = seconds

        def __enter__(self):
            inside.append(self.seconds)

        def __exit__(self, *exc):
            inside.append("exit")
            time.sleep(self.seconds)

    counted = RankCounts.add

    def add(self, labels):
        assert inside and inside[-1] != "exit", "labels counted outside the padding"
        counted(self, labels)

    def fail(*_):
        raise ArithmeticError("Bernoulli(exp(-gamma)) ran past K = 64")

    monkeypatch.setattr(kinds, "at_least", Padded)
    monkeypatch.setattr(RankCounts, "add", add)
    monkeypatch.setattr(kinds, "release_quantiles", fail)
    started = time.monotonic()
    r = quantiles(client, consumer, dataset, "fails", quantiles=[0.5], epsilon=0.5)
    error = expect_error(r, 503, "release_failed")
    assert "Bernoulli" not in error["message"]
    assert time.monotonic() - started >= MIN_SECONDS and inside == [draw_floor_seconds(2000, 52, 1), "exit"]
    assert budget(client, consumer, dataset)["epsilon_spent"] == 0.5  # drawn (or about to be): charged


def test_the_quota_debits_the_padded_time_not_the_cpu_time(client, consumer, dataset, ctx):
    """The release-seconds bucket loses the padded floor (what the response time shows anyway), not the few
    milliseconds of CPU the draws took — those depend on the labels and Retry-After would show them."""
    with ctx.sessions() as session:
        org = session.scalar(select(db.Organization.id).where(db.Organization.name == "publisher"))
    before = ctx.quotas.balance(org)
    started = time.monotonic()
    r = quantiles(client, consumer, dataset, "debit", quantiles=[0.5], epsilon=0.5, example_ids=["e1", "e2"])
    assert r.status_code == 201, r.text
    spent = before - ctx.quotas.balance(org)
    assert MIN_SECONDS <= spent <= time.monotonic() - started


def test_the_whole_version_by_default_and_an_idempotent_retry_returns_the_same_values(client, admin, consumer,
                                                                                      dataset):
    r = quantiles(client, consumer, dataset, "all", quantiles=[0.05, 0.5, 0.95], epsilon=1.0)
    assert r.status_code == 201, r.text
    first = r.json()
    assert first["num_examples"] == 2000
    retry = quantiles(client, consumer, dataset, "all", quantiles=[0.05, 0.5, 0.95], epsilon=1.0)
    assert retry.status_code == 200 and retry.json()["id"] == first["id"]
    assert retry.json()["description"]["values"] == first["description"]["values"]
    assert budget(client, consumer, dataset)["epsilon_spent"] == 1.0  # charged once
    expect_error(quantiles(client, consumer, dataset, "all", quantiles=[0.5], epsilon=1.0), 409,
                 "idempotency_conflict")
    page = client.get(f"/v1/releases/{first['id']}/labels", headers=consumer)  # CSV: the covered examples' ids
    assert page.status_code == 200 and len(page.text.splitlines()) == 1 + 2000
    document = client.get(f"/v1/mechanisms/{first['mechanism_hash']}", headers=consumer).json()["description"]
    assert document["values"] == first["description"]["values"]
    assert document["draw"]["rate_rational"].count("/") == 1
    assert [e["epsilon"] for e in document["dp_event"]["events"]] == [document["epsilon_per_quantile"]] * 3


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"quantiles": [0.9, 0.1], "epsilon": 0.5}, 400, "invalid_input"),  # not sorted
    ({"quantiles": [0.5, 0.5], "epsilon": 0.5}, 400, "invalid_input"),  # not distinct
    ({"quantiles": [0.0, 0.5], "epsilon": 0.5}, 422, "invalid_request"),
    ({"quantiles": [1.0], "epsilon": 0.5}, 422, "invalid_request"),
    ({"quantiles": [], "epsilon": 0.5}, 422, "invalid_request"),
    ({"quantiles": ["0.5"], "epsilon": 0.5}, 422, "invalid_request"),
    ({"quantiles": [0.5], "epsilon": 0}, 400, "epsilon_out_of_range"),
    ({"quantiles": [0.5], "epsilon": 51}, 400, "epsilon_out_of_range"),
    ({"quantiles": [0.5], "epsilon": 3.5}, 409, "budget_exceeded"),
    ({"quantiles": [0.5], "epsilon": 0.5, "example_ids": ["e1", "ghost"]}, 400, "unknown_example_ids"),
    ({"quantiles": [0.5], "epsilon": 0.5, "example_ids": ["e1", "e1"]}, 400, "duplicate_example_id"),
])
def test_refusals_change_nothing(client, admin, consumer, dataset, ctx, body, status, code):
    before = state(client, admin, dataset)
    releases = ctx.store.path("releases")
    expect_error(client.post(f"/v1/datasets/{dataset}/quantiles", json=body,
                             headers={**consumer, "Idempotency-Key": "x"}), status, code)
    assert state(client, admin, dataset) == before
    assert not releases.exists() or not any(releases.iterdir())


def test_class_labels_are_refused_before_the_charge(client, admin):
    dataset = new_dataset(client, admin, name="classes", label_kind="classes", num_classes=3, epsilon_total=1)
    assert upload(client, admin, dataset, labels_csv({"a": 0, "b": 2})).status_code == 200
    before = state(client, admin, dataset)
    expect_error(quantiles(client, admin, dataset, "c", quantiles=[0.5], epsilon=0.5), 400,
                 "mechanism_domain_mismatch")
    # refused on the domain before the ids are looked up: an unknown id is not what it reports
    expect_error(quantiles(client, admin, dataset, "c2", quantiles=[0.5], epsilon=0.5, example_ids=["a", "zz"]),
                 400, "mechanism_domain_mismatch")
    assert state(client, admin, dataset) == before


def test_the_key_is_required(client, admin, consumer, dataset):
    before = state(client, admin, dataset)
    expect_error(client.post(f"/v1/datasets/{dataset}/quantiles", json={"quantiles": [0.5], "epsilon": 0.5},
                             headers=consumer), 422, "invalid_request")
    expect_error(quantiles(client, consumer, dataset, "k" * 201, quantiles=[0.5], epsilon=0.5), 422,
                 "invalid_request")
    assert state(client, admin, dataset) == before


@pytest.mark.parametrize("who", ["stranger", "other_admin"])
def test_other_organizations_get_404_and_nothing_is_charged(client, admin, keys, dataset, who):
    headers = {"Authorization": f"Bearer {keys[who]}"}
    before = state(client, admin, dataset)
    inaccessible = quantiles(client, headers, dataset, "k", quantiles=[0.5], epsilon=0.5)
    missing = quantiles(client, headers, MISSING_DATASET, "k", quantiles=[0.5], epsilon=0.5)
    assert expect_error(inaccessible, 404, "not_found") == expect_error(missing, 404, "not_found")
    assert state(client, admin, dataset) == before


def test_the_owner_may_choose_its_clip_privately(client, admin, consumer, dataset_small):
    """The owner's admin asks too (its account pays); a consumer does not see that release."""
    r = quantiles(client, admin, dataset_small, "own", quantiles=[0.99], epsilon=0.25)
    assert r.status_code == 201, r.text
    assert budget(client, admin, dataset_small)["epsilon_spent"] == 0.25
    expect_error(client.get(f"/v1/releases/{r.json()['id']}", headers=consumer), 404, "not_found")
