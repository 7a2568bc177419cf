"""Issue 40, items 1–5: the chain is the only source of truth. Each rewrite the review made as a database writer —
laundering totals through a rebuild, moving a release to another organization, replacing a release's file and its
recorded hash, un-revoking a key, editing an allocation while the service runs, a mechanism document that does not
hash to its address — is refused by the service (it does not start, or the request is 503 ``ledger_tampered`` with
nothing charged or served) and reported by verify-audit; the honest workflow of the README's key commands, run
without any audit key configured, leaves verify-audit valid. ~40 s on SQLite."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from sqlalchemy import func, select, text

from labeldp import cli
from labels_party.http.auth import KEYS
from labels_party.ledger import LedgerTampered, documents, entries
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.service.keys import KeyRef
from tests.labels_party.api import test_audit_chain as chain_tests
from tests.labels_party.api.helpers import created, expect_error, labels_csv, release, upload
from tests.labels_party.api.test_audit_chain import _log, _problems, _sql, _verify

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
audit_key, ctx = chain_tests.audit_key, chain_tests.ctx  # the same fixtures: an audit key and its export


def _settings(ctx) -> LabelsSettings:
    return ctx.settings


def _restart(ctx) -> None:
    """Start the service again on the same database and data directory (what a rebuild flag waits for)."""
    ctx.close()
    again = make_context(settings=_settings(ctx))
    again.close()


def _chain_length(ctx, dataset: str) -> int:
    with ctx.sessions() as s:
        return s.scalar(select(func.count()).select_from(db.LedgerEntry).where(db.LedgerEntry.dataset_id == dataset))


def test_laundering_totals_through_a_rebuild_is_refused_and_nothing_is_signed(ctx, client, consumer, dataset,
                                                                                tmp_path, audit_key):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    length, exported = _chain_length(ctx, dataset), len(_log(tmp_path))
    _sql(ctx, "UPDATE datasets SET epsilon_total_units = epsilon_total_units * 100 WHERE id = :d",
         "UPDATE budget_accounts SET needs_rebuild = :t WHERE dataset_id = :d", d=dataset, t=True)
    with pytest.raises(LedgerTampered, match="marked for a rebuild"):
        _restart(ctx)
    assert _chain_length(ctx, dataset) == length and len(_log(tmp_path)) == exported  # nothing appended or signed
    report = _verify(ctx, tmp_path, audit_key)
    assert "the dataset's totals differ from the chain's" in _problems(report)


def test_totals_or_an_allocation_edited_while_the_service_runs_are_refused_at_the_charge(ctx, client, consumer,
                                                                                          dataset):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    length = _chain_length(ctx, dataset)
    _sql(ctx, "UPDATE budget_accounts SET epsilon_units = epsilon_units * 100 WHERE dataset_id = :d", d=dataset)
    expect_error(release(client, consumer, dataset, "b", mechanism="rr", epsilon=5), 503, "ledger_tampered")
    _sql(ctx, "UPDATE budget_accounts SET epsilon_units = epsilon_units / 100 WHERE dataset_id = :d",
         "UPDATE datasets SET epsilon_total_units = epsilon_total_units * 100 WHERE id = :d", d=dataset)
    expect_error(release(client, consumer, dataset, "c", mechanism="rr", epsilon=0.5), 503, "ledger_tampered")
    with ctx.sessions() as s:
        assert s.scalar(select(func.count()).select_from(db.Release)) == 1  # nothing charged
    assert _chain_length(ctx, dataset) == length
    with pytest.raises(LedgerTampered, match="totals differ"):
        _restart(ctx)


def test_a_release_moved_to_another_organization_is_found(ctx, client, consumer, dataset, tmp_path, audit_key):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, "UPDATE releases SET requester_org_id = (SELECT owner_org_id FROM datasets WHERE id = :d) "
              "WHERE id = :r", d=dataset, r=body["id"])
    assert f"release {body['id']}'s requester differs from the organization its record charged" in \
        _problems(_verify(ctx, tmp_path, audit_key))
    with pytest.raises(LedgerTampered, match="requester differs"):
        _restart(ctx)


def test_a_replaced_release_file_with_its_recorded_hash_is_not_served(ctx, client, consumer, dataset, tmp_path,
                                                                       audit_key):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    assert client.get(f"/v1/releases/{body['id']}/labels", headers=consumer).status_code == 200
    with ctx.sessions() as s:
        path = ctx.store.path(s.get(db.Release, body["id"]).file)
    forged = path.read_bytes() + b"the true labels"
    path.write_bytes(forged)
    _sql(ctx, "UPDATE releases SET file_size = :n, file_sha256 = :h WHERE id = :r", n=len(forged),
         h=hashlib.sha256(forged).hexdigest(), r=body["id"])
    expect_error(client.get(f"/v1/releases/{body['id']}/labels", headers=consumer), 503, "release_file_damaged")
    expect_error(client.get(f"/v1/releases/{body['id']}/labels", headers={**consumer, "Accept": "application/json"}),
                 503, "release_file_damaged")  # a JSON page too, however its file's size was matched
    assert f"release {body['id']}'s file or mechanism document differs from the chain's" in \
        _problems(_verify(ctx, tmp_path, audit_key))


def test_a_release_marked_available_without_its_fact_is_not_served(ctx, client, consumer, dataset):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s, s.begin():  # as if its availability were never chained: the fact row is gone
        s.execute(text("DELETE FROM ledger WHERE release_id = :r AND record LIKE '%release_available%'"),
                  {"r": body["id"]})
    # the chain no longer ends at the dataset's head: refused before anything is read
    response = client.get(f"/v1/releases/{body['id']}/labels", headers=consumer)
    assert response.status_code == 503 and response.json()["error"]["code"] in ("ledger_tampered",
                                                                                 "ledger_rollback")


def test_a_certified_epsilon_edited_on_the_row_is_found(ctx, client, consumer, dataset, tmp_path, audit_key):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, "UPDATE releases SET certified_epsilon = 0.01 WHERE id = :r", r=body["id"])
    assert f"release {body['id']}'s file or mechanism document differs from the chain's" in \
        _problems(_verify(ctx, tmp_path, audit_key))


def test_a_mechanism_document_that_does_not_hash_to_its_address_is_found(ctx, client, consumer, dataset,
                                                                         tmp_path, audit_key):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s, s.begin():
        stored = s.get(db.MechanismDocument, s.get(db.Release, body["id"]).mechanism_hash)
        document = documents.unpack(stored.body)
        document["description"]["certified_epsilon"] = 0.001
        stored.body = documents.pack(document)
    assert any("does not hash to its address" in p for p in _problems(_verify(ctx, tmp_path, audit_key)))


def test_an_honest_document_re_certifies_within_its_charge(ctx, client, consumer, dataset, tmp_path, audit_key):
    for name, mechanism in (("a", "rr"), ("b", "laplace"), ("c", "opt-unbiased")):
        created(release(client, consumer, dataset, name, mechanism=mechanism, epsilon=0.5))
    report = _verify(ctx, tmp_path, audit_key)
    assert report["valid"] is True, _problems(report)


def test_a_key_un_revoked_in_its_table_charges_nothing(ctx, client, keys, consumer, dataset, tmp_path, audit_key):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    ring = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)
    token = consumer["Authorization"].removeprefix("Bearer ")
    with ctx.sessions() as s, s.begin():
        ring.revoke(s, KeyRef(None, token.split("_")[1]), by="test")
    _sql(ctx, "UPDATE api_keys SET revoked_at = NULL, revoked_by = NULL WHERE prefix = :p", p=token.split("_")[1])
    expect_error(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5), 401, "unauthorized")
    assert any("is revoked in the chain but not in the keys table" in p
               for p in _problems(_verify(ctx, tmp_path, audit_key)))
    with pytest.raises(LedgerTampered):
        _restart(ctx)


def test_the_readme_key_workflow_without_a_configured_audit_key_leaves_verify_valid(tmp_path, capsys):
    """create-key, list-keys, rotate-key and revoke-key from the command line with no LABELDP_AUDIT_KEY_FILE (as
    the README's examples run them), beside a dataset with a grant and a release: every fact they append is signed
    with the key the first command made under the data directory, and verify-audit — with that export — stays
    valid."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from tests.labels_party.api.helpers import bearer, labels_csv, new_dataset, upload

    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    where = ["--database-url", database, "--data-dir", str(data)]

    def run(*argv: str) -> dict | list:
        capsys.readouterr()
        assert cli.main(["labels", *argv, *where, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    admin = bearer(run("create-key", "--org", "hospital", "--role", "admin")["key"])
    consumer = bearer(run("create-key", "--org", "publisher", "--role", "consumer")["key"])
    service = make_context(database, data)
    try:
        with TestClient(create_app(service)) as client:
            dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=3)
            assert upload(client, admin, dataset, labels_csv({f"e{i}": 1 + i % 52 for i in range(300)})) \
                .status_code == 200
            granted = client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2},
                                  headers=admin)
            assert granted.status_code == 201, granted.text
            created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    finally:
        service.close()
    second = run("create-key", "--org", "publisher", "--role", "consumer")
    run("list-keys")
    rotated = run("rotate-key", "--prefix", second["prefix"], "--by", "operator")
    run("revoke-key", "--prefix", rotated["prefix"], "--by", "operator")
    capsys.readouterr()
    assert cli.main(["labels", "verify-audit", *where]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is True and out["datasets"][0]["entries"] >= 10, out
    assert (data / "audit" / "heads.jsonl").exists()


def test_a_rewritten_label_file_or_version_row_is_found(ctx, client, consumer, dataset, tmp_path, audit_key):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s:
        version = s.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset)).one()
        path, number = ctx.store.path(version.file), version.version
    path.write_bytes(path.read_bytes() + b"\0")
    assert f"label version {number}: its file is not the one uploaded" in _problems(_verify(ctx, tmp_path,
                                                                                            audit_key))
    _sql(ctx, "UPDATE label_versions SET num_examples = num_examples + 1 WHERE dataset_id = :d", d=dataset)
    with pytest.raises(LedgerTampered, match=f"label version {number} differs from the chain's"):
        _restart(ctx)


def test_where_a_versions_new_ids_start_is_checked_against_the_chain(ctx, client, admin, dataset, labels):
    """The twenty-first review: an edited ``registry_start`` passed verify-audit (the next upload of the same ids
    then counted them as new). A version's new ids start where the chain's previous version's registry ended."""
    more = {f"new{i}": 7 for i in range(100)}
    assert upload(client, admin, dataset, labels_csv({**labels, **more})).status_code == 200
    with ctx.sessions() as s:
        number = s.scalar(select(func.max(db.LabelVersion.version)).where(db.LabelVersion.dataset_id == dataset))
    _sql(ctx, "UPDATE label_versions SET registry_start = registry_start + 50 WHERE dataset_id = :d AND version = :v",
         d=dataset, v=number)
    with pytest.raises(LedgerTampered, match=f"label version {number}'s new ids do not start where"):
        _restart(ctx)


def test_a_datasets_number_of_examples_is_its_chained_versions(ctx, client, admin, dataset):
    """The twenty-third review: ``datasets.num_examples`` (what the API shows and releases count) edited passed
    verify-audit."""
    _sql(ctx, "UPDATE datasets SET num_examples = 5 WHERE id = :d", d=dataset)
    with pytest.raises(LedgerTampered, match="number of examples differs from its label version's on the chain"):
        _restart(ctx)


def test_where_the_first_versions_ids_start_is_checked(ctx, client, admin, dataset):
    """The twenty-second review: the check skipped the dataset's first version (no chained version before it),
    whose new ids start at 0."""
    _sql(ctx, "UPDATE label_versions SET registry_start = 100 WHERE dataset_id = :d", d=dataset)
    with pytest.raises(LedgerTampered, match="label version 1's new ids do not start where"):
        _restart(ctx)


def test_a_key_row_written_outside_the_service_is_not_honoured(ctx, client, admin, consumer, dataset, tmp_path,
                                                               audit_key):
    """Keys made by the service carry the audit key's certificate; a row inserted into the keys table has none: it
    neither charges nor grants nor uploads, on a dataset made before it or after it (issue 40's review: the service
    put such a row on a new dataset's chain itself, and the grant of a new organization did the same), and changes
    nothing."""
    from labels_party.http.auth import KEYS
    from tests.labels_party.api.helpers import bearer

    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s, s.begin():  # KEYS without the ledger: exactly a row written into the table
        inserted_consumer = bearer(KEYS.create(s, "publisher", "consumer"))
        inserted_admin = bearer(KEYS.create(s, "hospital", "admin"))
        newcomer = bearer(KEYS.create(s, "acme", "consumer"))
    length = _chain_length(ctx, dataset)
    expect_error(release(client, inserted_consumer, dataset, "b", mechanism="rr", epsilon=0.5), 401, "unauthorized")
    expect_error(client.post(f"/v1/datasets/{dataset}/grants", json={"org": "adnet", "epsilon": 0.5},
                             headers=inserted_admin), 401, "unauthorized")
    expect_error(client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\nx,1\n",
                            headers={**inserted_admin, "Content-Type": "text/csv"}), 401, "unauthorized")
    assert _chain_length(ctx, dataset) == length
    # a dataset the owner makes afterwards, and a grant to the inserted key's new organization: not chained
    later = client.post("/v1/datasets", json={"name": "later", "label_kind": "integer", "min": 0, "max": 9,
                                              "epsilon_total": 2}, headers=admin).json()["id"]
    assert client.post(f"/v1/datasets/{later}/grants", json={"org": "acme", "epsilon": 1},
                       headers=admin).status_code == 201
    with ctx.sessions() as s:
        made = [e.record for e in entries(s, later) if e.record.get("event") == "key"]
    expect_error(client.post(f"/v1/datasets/{later}/grants", json={"org": "adnet", "epsilon": 0.5},
                             headers=inserted_admin), 401, "unauthorized")
    expect_error(release(client, newcomer, later, "n", mechanism="rr", epsilon=0.5), 401, "unauthorized")
    chained, inserted = {r["key_prefix"] for r in made}, {inserted_admin["Authorization"].split("_")[1],
                                                          newcomer["Authorization"].split("_")[1]}
    assert chained and not chained & inserted
    assert created(release(client, consumer, dataset, "c", mechanism="rr", epsilon=0.5))  # the real key still works
