"""The exact ledger: ε in integer units of 10⁻⁹ (no float sums, no tolerance), the deployment's ε range, releases
that belong to the organization that asked for them, and ledger records built from the mechanisms' own events."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import create_key
from labels_party.ledger import budget_units, charge_units, units_epsilon
from labels_party.runtime.context import make_context
from shared.mechanisms import events


def test_units_are_the_decimal_the_client_sent():
    assert charge_units(0.1) == 100_000_000 and charge_units(0.2) == 200_000_000 and budget_units(0.3) == 300_000_000
    assert charge_units(0.1) + charge_units(0.2) == budget_units(0.3)  # where 0.1 + 0.2 != 0.3 in floats
    assert charge_units(1e-3) == 1_000_000 and charge_units(50.0) == 50_000_000_000
    assert charge_units(0.5 + 1e-9) == 500_000_001
    assert charge_units(1.0000000001) == 1_000_000_001  # rounded up to the unit when charged
    assert budget_units(1.0000000009) == 1_000_000_000  # a budget rounds down
    assert units_epsilon(300_000_000) == 0.3 and repr(units_epsilon(2_856_000_000)) == "2.856"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1_000_000, 50_000_000_000), min_size=1, max_size=200))
def test_sums_of_charges_are_exact(units):
    """Any sequence of charges, each a decimal with at most 9 digits after the point, sums without error."""
    charges = [charge_units(units_epsilon(u)) for u in units]
    assert charges == units
    assert sum(charges) == sum(units)


@pytest.fixture()
def service(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        keys = {"owner": create_key(ctx.ledger, session, "hospital", "admin"),
                "a": create_key(ctx.ledger, session, "publisher", "consumer"),
                "b": create_key(ctx.ledger, session, "adnet", "consumer")}
    client = TestClient(create_app(ctx), raise_server_exceptions=False)

    def as_(who: str) -> dict:
        return {"Authorization": f"Bearer {keys[who]}"}

    def dataset(total: float, shares: tuple[float, float] = (1.0, 0.0)) -> str:
        """A dataset of ``total`` whose accounts give publisher and adnet these shares of it."""
        dataset_id = client.post("/v1/datasets", headers=as_("owner"), json={
            "name": f"d{total}", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": total}).json()["id"]
        csv = "example_id,label\n" + "".join(f"e{i},{i % 10}\n" for i in range(50))
        assert client.put(f"/v1/datasets/{dataset_id}/labels", content=csv,
                          headers={**as_("owner"), "Content-Type": "text/csv"}).status_code == 200
        for org, share in zip(("publisher", "adnet"), shares, strict=True):
            assert client.post(f"/v1/datasets/{dataset_id}/grants", json={"org": org, "epsilon": share * total},
                               headers=as_("owner")).status_code == 201
        return dataset_id

    return ctx, client, as_, dataset


def _release(client, headers, dataset_id, key, epsilon, mechanism="rr"):
    return client.post(f"/v1/datasets/{dataset_id}/releases", json={"mechanism": mechanism, "epsilon": epsilon},
                       headers={**headers, "Idempotency-Key": key})


def test_budget_point_three_takes_point_one_and_point_two_exactly(service):
    ctx, client, as_, dataset = service
    d = dataset(0.3)
    assert _release(client, as_("a"), d, "one", 0.1).status_code == 201
    assert _release(client, as_("a"), d, "two", 0.2).status_code == 201
    budget = client.get(f"/v1/datasets/{d}/budget", headers=as_("owner")).json()
    assert budget["epsilon_spent"] == 0.3 and budget["epsilon_remaining"] == 0.0
    refused = _release(client, as_("a"), d, "three", 1e-3)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "budget_exceeded"
    assert set(refused.json()["error"]) == {"code", "message"}  # no figures in a consumer's refusal
    assert client.get(f"/v1/datasets/{d}/budget", headers=as_("a")).json()["epsilon_remaining"] == 0.0
    assert verify_audit(ctx)["valid"]


def test_one_unit_over_the_budget_is_refused_and_tiny_epsilons_are_out_of_range(service):
    _, client, as_, dataset = service
    d = dataset(1.0)
    assert _release(client, as_("a"), d, "half", 0.5).status_code == 201
    over = _release(client, as_("a"), d, "over", 0.5 + 1e-9)
    assert over.status_code == 409 and over.json()["error"]["code"] == "budget_exceeded"
    for key, tiny in (("a", 1e-17), ("b", 1e-300)):
        response = _release(client, as_("a"), d, key, tiny)
        assert response.status_code == 400 and response.json()["error"]["code"] == "epsilon_out_of_range"
    assert _release(client, as_("a"), d, "rest", 0.5).status_code == 201  # exactly what is left
    assert client.get(f"/v1/datasets/{d}/budget", headers=as_("a")).json()["epsilon_spent"] == 1.0


def test_releases_belong_to_the_organization_that_asked(service):
    ctx, client, as_, dataset = service
    d = dataset(5.0, (0.5, 0.5))
    mine = _release(client, as_("a"), d, "shared-key", 0.5).json()
    # the other organization's identical request with the same key is its own new release, charged again
    theirs = _release(client, as_("b"), d, "shared-key", 0.5)
    assert theirs.status_code == 201 and theirs.json()["id"] != mine["id"]
    theirs = theirs.json()
    # and its reuse of the key with another body is its own conflict, revealing nothing about organization a
    conflict = _release(client, as_("b"), d, "shared-key", 0.25)
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "idempotency_conflict"
    for reader, own, other in (("a", mine, theirs), ("b", theirs, mine)):
        assert client.get(f"/v1/releases/{own['id']}", headers=as_(reader)).status_code == 200
        for path in (f"/v1/releases/{other['id']}", f"/v1/releases/{other['id']}/labels"):
            response = client.get(path, headers=as_(reader))
            assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
            assert response.json() == client.get("/v1/releases/" + "0" * 32, headers=as_(reader)).json()
        listed = client.get(f"/v1/datasets/{d}/releases", headers=as_(reader)).json()
        assert [r["id"] for r in listed] == [own["id"]]
    assert {r["id"] for r in client.get(f"/v1/datasets/{d}/releases", headers=as_("owner")).json()} == \
        {mine["id"], theirs["id"]}
    assert client.get(f"/v1/releases/{mine['id']}/labels", headers=as_("owner")).status_code == 200
    audit = client.get("/v1/audit", params={"dataset": d}, headers=as_("owner")).json()
    assert [{k: e["record"]["actor"][k] for k in ("org", "role")} for e in audit["events"]] == [
        {"org": "publisher", "role": "consumer"}, {"org": "adnet", "role": "consumer"}]
    assert all(len(e["record"]["actor"]["key_prefix"]) == 8 for e in audit["events"])  # the key that asked
    assert client.get(f"/v1/datasets/{d}/budget", headers=as_("owner")).json()["epsilon_spent"] == 1.0


def test_mechanism_documents_are_stored_once_and_shown_to_who_may_see_a_release(service):
    _, client, as_, dataset = service
    d = dataset(5.0)
    first = _release(client, as_("a"), d, "l1", 1.0, "laplace").json()
    second = _release(client, as_("a"), d, "l2", 1.0, "laplace").json()
    assert first["mechanism_hash"] == second["mechanism_hash"]  # the same public description, stored once
    assert client.get(f"/v1/mechanisms/{first['mechanism_hash']}", headers=as_("a")).status_code == 200
    assert client.get(f"/v1/mechanisms/{first['mechanism_hash']}", headers=as_("b")).status_code == 404
    assert client.get(f"/v1/mechanisms/{first['mechanism_hash']}", headers=as_("owner")).status_code == 200


def test_ledger_records_are_the_mechanisms_events(service):
    ctx, client, as_, dataset = service
    d = dataset(5.0)
    prior_based = _release(client, as_("a"), d, "p", 1.0, "rr-on-bins").json()
    _release(client, as_("a"), d, "l", 1.0, "laplace")
    records = [e["record"] for e in client.get("/v1/audit", params={"dataset": d}, headers=as_("owner")).json()
               ["events"]]
    composed, laplace = (events.from_dict(r["dp_event"]) for r in records)
    assert [type(e).__name__ for e in composed.events] == ["DiscreteLaplaceDpEvent", "LocalRandomizerDpEvent"]
    assert composed.events[0].sensitivity == 2  # the histogram's, from the prior object itself
    # charged before the prior was drawn: the prior's exact event and the randomizer's bound ε₂; the mechanism
    # built on the noisy prior certifies within it
    assert events.epsilon_of(composed) <= 1.0 and events.epsilon_of(composed) == pytest.approx(1.0, abs=1e-11)
    assert prior_based["certified_epsilon"] <= events.epsilon_of(composed)
    assert type(laplace.events[0]).__name__ == "DiscreteLaplaceDpEvent"
    assert laplace.events[0].sensitivity == 9 and events.epsilon_of(laplace) <= 1.0
    for record in records:
        assert record["charge_units"] == 1_000_000_000 and record["charge"] == 1.0
        assert set(record) >= {"actor", "account", "coverage", "spent_max_after_units", "dp_event", "rdp_units"}
    assert verify_audit(ctx)["valid"]
