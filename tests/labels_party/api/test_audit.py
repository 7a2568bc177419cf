"""The audit log: one hash-chained event per release, and tampering detected by the API, verify_audit and the CLI."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, text

from labeldp import cli
from labels_party.http import audit as audit_log
from labels_party.store import db
from shared.mechanisms import events as events_
from shared.service.keys import hash_key
from tests.labels_party.api.helpers import FIGURES, NUM_LABELS, created, expect_error, release

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


RECORD_FIELDS = {"epsilon_requested", "mechanism", "release_id", "examples_covered", "dp_event", "charge",
                 "charge_units", "account", "coverage"}


def _tamper(ctx) -> None:
    with ctx.sessions() as s, s.begin():
        result = s.execute(text("UPDATE ledger SET record = replace(record, :old, :new) WHERE record LIKE :match"),
                           {"old": '"charge":1.0', "new": '"charge":0.1', "match": '%"charge":1.0%'})
        assert result.rowcount == 1


def test_audit_events(ctx, client, admin, consumer, keys, dataset):
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
    assert [{key: b[key] for key in FIGURES} for b in audit["budgets"]] == [
        {"dataset_id": dataset, "epsilon_total": 3.0, "epsilon_spent": 1.5, "epsilon_remaining": 1.5}]
    # The chain starts with the dataset's facts: its totals, its owner and domain, the owner's account and keys at
    # creation, its labels, the grant (the publisher's keys, the owner's allocation moved to the publisher's, and the
    # grant itself); the charges follow.
    facts = audit["facts"]
    shown = ("seq", "event", "org", "epsilon_units", "epsilon_total_units", "change", "source")
    assert [{k: f["record"][k] for k in shown if k in f["record"]} for f in facts] == [
        {"seq": 1, "event": "dataset_budget", "epsilon_total_units": 3_000_000_000, "change": "created"},
        {"seq": 2, "event": "owner", "org": "hospital", "source": None},
        {"seq": 3, "event": "domain"},
        {"seq": 4, "event": "allocation", "org": "hospital", "epsilon_units": 3_000_000_000},
        {"seq": 5, "event": "key", "org": "hospital", "change": "created"},  # the owner's admin key
        {"seq": 6, "event": "labels"},
        {"seq": 7, "event": "key", "org": "publisher", "change": "created"},  # its account opened: its key
        {"seq": 8, "event": "allocation", "org": "hospital", "epsilon_units": 0},
        {"seq": 9, "event": "allocation", "org": "publisher", "epsilon_units": 3_000_000_000},
        {"seq": 10, "event": "grant", "org": "publisher", "change": "created"},
        {"seq": 12, "event": "release_available"}, {"seq": 14, "event": "release_available"}]
    assert facts[0]["prev_hash"] == "0" * 64 and all(f["dataset_id"] == dataset for f in facts)
    # each release's availability: its file and mechanism document, as the release row has them
    assert [f["record"]["release_id"] for f in facts[10:]] == [a["id"], b["id"]]
    assert [f["record"]["mechanism_hash"] for f in facts[10:]] == [a["mechanism_hash"], b["mechanism_hash"]]
    events = audit["events"]
    with ctx.sessions() as session:
        consumer_key = session.scalars(select(db.ApiKey).where(db.ApiKey.key_hash == hash_key(keys["consumer"]))).one()
    assert [e["seq"] for e in events] == [11, 13]
    assert events[0]["prev_hash"] == facts[9]["hash"] and events[1]["prev_hash"] == facts[10]["hash"]
    for event, rel, covered in ((events[0], a, NUM_LABELS), (events[1], b, 2)):
        record = event["record"]
        assert RECORD_FIELDS <= set(record)
        assert record["release_id"] == rel["id"] and record["mechanism"] == rel["mechanism"]
        assert record["epsilon_requested"] == rel["epsilon"] == record["charge"]
        # charged before the mechanism existed: the release's certified ε is within the charged event's (which, for
        # these mechanisms without a prior, is the mechanism's own, recomputed from its doubles)
        charged = events_.epsilon_of(events_.from_dict(record["dp_event"]))
        assert rel["certified_epsilon"] <= charged + 1e-12 and charged <= record["charge"]
        assert record["account"] == {"org": "publisher", "epsilon_units": 3_000_000_000, "delta": 0.0}
        assert record["examples_covered"] == covered
        # the key that asked, named by its id and public prefix (never its secret)
        assert record["actor"] == {"org": "publisher", "role": "consumer", "key_id": consumer_key.id,
                                   "key_prefix": consumer_key.prefix}
        assert consumer_key.prefix == keys["consumer"].split("_")[1] and keys["consumer"] not in json.dumps(record)
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
    report = audit_log.verify_audit(ctx)
    assert report["valid"] is True
    assert [(d["dataset_id"], d["entries"], d["releases"], d["problems"]) for d in report["datasets"]] == [
        (dataset, 12, 1, [])]  # ten facts, one release, its availability
    _tamper(ctx)
    report = audit_log.verify_audit(ctx)
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
