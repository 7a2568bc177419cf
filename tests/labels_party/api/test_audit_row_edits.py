"""Issue 40, the second hostile review: rows a database writer edits *while the service runs* (and puts back before
anyone restarts it) are not honoured. Each attack below succeeded before: a label version's coverage narrowed to
one example (a full release charged to example 0 only), another dataset's label file swapped in, a chained key moved
to another organization or made the owner's admin, a revoked key un-revoked in its row, a key's secret swapped, a
grant inserted and a release moved to read another organization's labels, and a forged head signed by
``GET /v1/audit/heads``, an account's spent state reset (the whole allocation again) or pointed at a missing file (a
500), a missing label file (charged, then failed). Now each is 503 ``ledger_tampered`` (or ``ledger_rollback``) with
nothing charged, served or signed. ~25 s on SQLite."""

from __future__ import annotations

import dataclasses
import json

import pytest
from sqlalchemy import select, text

from labels_party.http.auth import KEYS
from labels_party.ledger import entries
from labels_party.store import db
from shared.errors import LabelDPError
from shared.service.keys import KeyRef, hash_key
from tests.labels_party.api import test_audit_chain as chain_tests
from tests.labels_party.api.helpers import created, expect_error, release
from tests.labels_party.api.test_audit_chain import _sql

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
audit_key, ctx = chain_tests.audit_key, chain_tests.ctx


def _key_id(ctx, headers) -> int:
    prefix = headers["Authorization"].removeprefix("Bearer ").split("_")[1]
    with ctx.sessions() as s:
        return s.scalar(select(db.ApiKey.id).where(db.ApiKey.prefix == prefix))


def _spent(ctx, dataset: str) -> int:
    with ctx.sessions() as s:
        return s.get(db.Dataset, dataset).ledger_seq


def _refused(response) -> None:
    """A key row edited outside the service fails its certificate: an unknown key's 401, before any dataset is read
    (the chain's own check of the key, behind it, is the second line: labels_party/ledger/agreement.key_problems)."""
    expect_error(response, 401, "unauthorized")


def _tampered(response, *, code: str = "ledger_tampered", says: str = "") -> None:
    expect_error(response, 503, code)
    assert says in response.json()["error"]["message"], response.text


def test_a_narrowed_coverage_row_is_not_what_a_release_charges(ctx, client, consumer, dataset):
    from labels_party.store import labelstore

    one = labelstore.range_coverage(0, 1)
    seq = _spent(ctx, dataset)
    _sql(ctx, "UPDATE label_versions SET coverage_file = :f, coverage_sha256 = :h, num_examples = 1 "
              "WHERE dataset_id = :d", f=one.file, h=one.sha256, d=dataset)
    _tampered(release(client, consumer, dataset, "x", mechanism="rr", epsilon=2.5), says="differs from the chain's")
    assert _spent(ctx, dataset) == seq  # nothing appended, nothing charged


def test_another_datasets_label_file_is_not_read(ctx, client, consumer, dataset, dataset_small):
    with ctx.sessions() as s:
        theirs = s.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset_small)).one().file
    seq = _spent(ctx, dataset)
    _sql(ctx, "UPDATE label_versions SET file = :f WHERE dataset_id = :d", f=theirs, d=dataset)
    _tampered(release(client, consumer, dataset, "x", mechanism="rr", epsilon=2.5),
              says="file is not the one its chain records")
    assert _spent(ctx, dataset) == seq


def test_a_key_moved_to_another_organization_neither_reads_nor_charges(ctx, client, admin, consumer, stranger,
                                                                          dataset):
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2.5},
                       headers=admin).status_code == 201
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "adnet", "epsilon": 0.5},
                       headers=admin).status_code == 201  # adnet's key is on the chain, as adnet's
    victim = created(release(client, consumer, dataset, "v", mechanism="rr", epsilon=0.5))
    _sql(ctx, "UPDATE api_keys SET org_id = (SELECT id FROM organizations WHERE name = 'publisher') WHERE id = :k",
         k=_key_id(ctx, stranger))
    _refused(client.get(f"/v1/releases/{victim['id']}/labels", headers=stranger))
    seq = _spent(ctx, dataset)
    _refused(release(client, stranger, dataset, "s", mechanism="rr", epsilon=2.0))
    assert _spent(ctx, dataset) == seq


def test_a_consumer_key_made_the_owners_admin_does_not_grant(ctx, client, admin, consumer, dataset):
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 1},
                       headers=admin).status_code == 201
    _sql(ctx, "UPDATE api_keys SET org_id = (SELECT id FROM organizations WHERE name = 'hospital'), role = 'admin' "
              "WHERE id = :k", k=_key_id(ctx, consumer))
    seq = _spent(ctx, dataset)
    _refused(client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3},
                          headers=consumer))
    assert _spent(ctx, dataset) == seq  # no allocation chained (nor signed)


def test_a_key_revoked_on_the_chain_and_unrevoked_in_its_row_is_refused(ctx, client, admin, consumer, dataset):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    ring = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)
    ids = []
    for headers in (admin, consumer):
        prefix = headers["Authorization"].removeprefix("Bearer ").split("_")[1]
        with ctx.sessions() as s, s.begin():
            ring.revoke(s, KeyRef(None, prefix), by="test")
        ids.append(_key_id(ctx, headers))
    _sql(ctx, "UPDATE api_keys SET revoked_at = NULL, revoked_by = NULL WHERE id IN (:a, :c)", a=ids[0], c=ids[1])
    seq = _spent(ctx, dataset)
    _refused(client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3},
                          headers=admin))
    _refused(client.get(f"/v1/releases/{body['id']}/labels", headers=consumer))
    assert _spent(ctx, dataset) == seq  # no allocation chained


def test_a_chained_keys_secret_swapped_in_its_row_is_refused(ctx, client, consumer, dataset):
    """A writer who cannot read secrets sets a chained key's stored hash to that of a secret of their own: the key
    authenticates, but the chain names another secret."""
    mine = "ldp_" + "f" * 8 + "_" + "A" * 43
    _sql(ctx, "UPDATE api_keys SET key_hash = :h WHERE id = :k", h=hash_key(mine), k=_key_id(ctx, consumer))
    seq = _spent(ctx, dataset)
    forged = {"Authorization": f"Bearer {mine}"}
    _refused(release(client, forged, dataset, "s", mechanism="rr", epsilon=0.5))
    assert _spent(ctx, dataset) == seq


def test_a_grant_row_and_a_moved_release_do_not_let_another_organization_read(ctx, client, consumer, stranger,
                                                                              dataset):
    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, "INSERT INTO grants (dataset_id, org_id, created_at) VALUES "
              "(:d, (SELECT id FROM organizations WHERE name = 'adnet'), CURRENT_TIMESTAMP)",
         "UPDATE releases SET requester_org_id = (SELECT id FROM organizations WHERE name = 'adnet') WHERE id = :r",
         d=dataset, r=body["id"])
    response = client.get(f"/v1/releases/{body['id']}/labels", headers=stranger)
    assert response.status_code == 503 and "labels" not in response.headers.get("content-type", "")
    assert response.json()["error"]["code"] == "ledger_tampered"


def test_the_heads_endpoint_signs_no_forged_head(ctx, client, admin, consumer, dataset):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, "UPDATE datasets SET ledger_seq = 999, ledger_head = :h WHERE id = :d", h="ab" * 32, d=dataset)
    response = client.get("/v1/audit/heads", params={"dataset": dataset}, headers=admin)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] in ("ledger_rollback", "ledger_tampered")


@pytest.mark.parametrize("statement", [
    "UPDATE budget_accounts SET spent_file = NULL, classes_file = NULL, rdp_file = NULL",  # the whole budget again
    "UPDATE budget_accounts SET spent_file = 'datasets/x/nope.npy'",  # a 500 before
    "UPDATE budget_accounts SET classes_file = 'datasets/x/nope.npy'",
    "UPDATE budget_accounts SET rdp_file = 'datasets/x/nope.npy'",
])
def test_a_spent_state_reset_or_pointed_elsewhere_is_refused(ctx, client, consumer, dataset, statement):
    """ε 2.5 of the 3 granted spent; the account's state row reset (or pointed at a missing file): the next charge
    is refused — before, resetting it admitted another 2.5."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=2.5))
    expect_error(release(client, consumer, dataset, "b", mechanism="rr", epsilon=2.5), 409, "budget_exceeded")
    seq = _spent(ctx, dataset)
    _sql(ctx, statement + " WHERE dataset_id = :d AND org_id = (SELECT id FROM organizations WHERE name = "
                          "'publisher')", d=dataset)
    _tampered(release(client, consumer, dataset, "c", mechanism="rr", epsilon=2.5),
              says="spent state is not the one its last charge left")
    assert _spent(ctx, dataset) == seq


@pytest.mark.parametrize("column", ["epsilon = 0.001", "num_examples = 3", "mechanism = 'laplace'",
                                    "label_version = 2", "prior_epsilon = 0.25", "randomizer_epsilon = 0.25"])
def test_a_release_rows_displayed_columns_edited_are_refused_and_reported(ctx, client, consumer, dataset, tmp_path,
                                                                          audit_key, column):
    """Issue 40: a release row's ε (what a consumer and the console display), example count or mechanism set to
    something its record does not say was verified as valid. verify-audit names the release, and the service
    refuses to start on the tables (as for every other disagreement with the chain)."""
    from labels_party.ledger.agreement import LedgerTampered
    made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, f"UPDATE releases SET {column} WHERE id = :r", r=made["id"])
    said = f"release {made['id']}'s mechanism, ε, ε split, example count or label version differs from its record's"
    problems = [p for d in chain_tests._verify(ctx, tmp_path, audit_key)["datasets"] for p in d["problems"]]
    assert said in problems, problems
    from labels_party.runtime.context import make_context
    with pytest.raises(LedgerTampered, match=said):
        make_context(settings=ctx.settings)  # a restart


@pytest.mark.parametrize("edit, said", [
    ("needs_rebuild = TRUE", "publisher's account is marked for a rebuild, but its chain records budgets set since"),
    ("generation = 0", "publisher's account generation 0 does not name its spent table"),
])
def test_an_accounts_bookkeeping_edited_is_reported(ctx, client, consumer, dataset, tmp_path, audit_key, edit, said):
    """The twenty-fifth review's last rewrites verify-audit passed: a rebuild flag (the service refused to start,
    and verify said valid) and an account's generation set back (its next spent table would take an older one's
    name). Both are findings now, for verify-audit and at a start."""
    from labels_party.ledger.agreement import LedgerTampered
    from labels_party.runtime.context import make_context

    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, f"UPDATE budget_accounts SET {edit} WHERE dataset_id = :d AND org_id = (SELECT id FROM organizations "
              "WHERE name = 'publisher')", d=dataset)
    problems = [p for d in chain_tests._verify(ctx, tmp_path, audit_key)["datasets"] for p in d["problems"]]
    assert any(p.startswith(said) for p in problems), problems
    with pytest.raises(LedgerTampered, match="marked for a rebuild|does not name its spent table"):
        make_context(settings=ctx.settings)  # a restart


def test_a_missing_label_file_is_refused_before_the_charge(ctx, client, consumer, dataset):
    """Before, the release was charged and then failed (release_failed): a writer could burn a consumer's budget."""
    seq = _spent(ctx, dataset)
    _sql(ctx, "UPDATE label_versions SET file = 'datasets/x/nope.parquet' WHERE dataset_id = :d", d=dataset)
    _tampered(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    assert _spent(ctx, dataset) == seq


# -- the third review: rows the download, the charge and an allocation still trusted -----------------------------

def test_a_release_row_inserted_or_moved_is_not_served(ctx, client, admin, consumer, stranger, other_admin, dataset,
                                                       dataset_small):
    """A forged row naming the dataset's own label file (its true size and hash) served the true labels, uncharged;
    a release moved to a dataset the reader is granted on (or owns) served another dataset's release."""
    from tests.labels_party.api.helpers import labels_csv, new_dataset, upload

    with ctx.sessions() as s:
        version = s.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset)).one()
    size, sha = ctx.store.checked_digest(version.file)
    _sql(ctx, "INSERT INTO releases (id, dataset_id, requester_org_id, idempotency_key, body_hash, mechanism, epsilon,"
              " charge_units, certified_epsilon, prior_epsilon, randomizer_epsilon, num_examples, label_version,"
              " description_json, file, file_size, file_sha256, state, created_at) VALUES ('forged', :d,"
              " (SELECT id FROM organizations WHERE name = 'publisher'), 'k', 'h', 'rr', 0.5, 0, 0.5, 0, 0.5, 2000, 1,"
              " '{}', :f, :n, :h, 'available', CURRENT_TIMESTAMP)", d=dataset, f=version.file, n=size, h=sha)
    _tampered(client.get("/v1/releases/forged/labels", headers=consumer), says="not charged on the dataset's chain")
    _sql(ctx, "DELETE FROM releases WHERE id = 'forged'")

    body = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    assert client.post(f"/v1/datasets/{dataset_small}/grants", json={"org": "adnet", "epsilon": 0.5},
                       headers=admin).status_code == 201
    _sql(ctx, "UPDATE releases SET dataset_id = :b, requester_org_id = (SELECT id FROM organizations "
              "WHERE name = 'adnet') WHERE id = :r", b=dataset_small, r=body["id"])
    _tampered(client.get(f"/v1/releases/{body['id']}/labels", headers=stranger))
    mine = new_dataset(client, other_admin, name="mine", label_kind="integer", min=1, max=52, epsilon_total=1)
    assert upload(client, other_admin, mine, labels_csv({"e0": 1, "e1": 2})).status_code == 200
    _sql(ctx, "UPDATE releases SET dataset_id = :b WHERE id = :r", b=mine, r=body["id"])
    _tampered(client.get(f"/v1/releases/{body['id']}/labels", headers=other_admin))


@pytest.mark.parametrize("registry_size", [0, -5, 1000])
def test_a_registry_size_edited_is_refused(ctx, client, consumer, dataset, registry_size):
    """At 0 every covered example fell in the fresh class: four releases of ε 2.5 against an allocation of 3."""
    seq = _spent(ctx, dataset)
    _sql(ctx, "UPDATE datasets SET registry_size = :n WHERE id = :d", n=registry_size, d=dataset)
    _tampered(release(client, consumer, dataset, "a", mechanism="rr", epsilon=2.5), says="registry size")
    assert _spent(ctx, dataset) == seq


def test_an_allocation_reads_the_spent_state_not_the_rows_maximum(ctx, client, admin, dataset_small):
    """The owner spent 0.8 of 1; its row's spent_max_units zeroed, a grant of 1 to publisher went through."""
    created(release(client, admin, dataset_small, "own", mechanism="rr", epsilon=0.8))
    grant = {"org": "publisher", "epsilon": 1}
    expect_error(client.post(f"/v1/datasets/{dataset_small}/grants", json=grant, headers=admin), 409,
                 "allocation_exceeded")
    _sql(ctx, "UPDATE budget_accounts SET spent_max_units = 0 WHERE dataset_id = :d", d=dataset_small)
    expect_error(client.post(f"/v1/datasets/{dataset_small}/grants", json=grant, headers=admin), 409,
                 "allocation_exceeded")


def test_a_key_rotated_before_its_account_opened_stays_revoked(ctx, client, admin, stranger, dataset_small):
    """Rotated with a grace while adnet held no account, then granted: the chain recorded the key as made but not
    its revocation, so clearing revoked_at brought it back."""
    import time
    from datetime import timedelta

    prefix = stranger["Authorization"].removeprefix("Bearer ").split("_")[1]
    ring = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)
    with ctx.sessions() as s, s.begin():
        ring.rotate(s, KeyRef(None, prefix), by="ops", grace=timedelta(seconds=1))
    assert client.post(f"/v1/datasets/{dataset_small}/grants", json={"org": "adnet", "epsilon": 0.5},
                       headers=admin).status_code == 201
    time.sleep(1.5)
    expect_error(release(client, stranger, dataset_small, "x", mechanism="rr", epsilon=0.1), 401, "unauthorized")
    _sql(ctx, "UPDATE api_keys SET revoked_at = NULL, revoked_by = NULL WHERE prefix = :p", p=prefix)
    _refused(release(client, stranger, dataset_small, "y", mechanism="rr", epsilon=0.1))


def test_a_spent_file_pointed_at_the_class_file_is_refused_not_a_500(ctx, client, consumer, dataset):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, "UPDATE budget_accounts SET spent_file = classes_file WHERE dataset_id = :d", d=dataset)
    seq = _spent(ctx, dataset)
    _tampered(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5), says="spent state")
    assert _spent(ctx, dataset) == seq


# -- issue 40's third review (a database writer; the findings each got past the service and verify-audit) --------

def test_a_dataset_given_to_another_organization_is_refused_and_verify_names_it(ctx, client, admin, labels,
                                                                                   tmp_path, audit_key):
    """The owner is on the chain: a row naming the grantee as owner neither lets the grantee's admin key
    administer the dataset (grant, upload) nor read its owner's releases, and verify-audit reports it."""
    from labels_party.http.auth import create_key
    from tests.labels_party.api.helpers import bearer, labels_csv, new_dataset, upload
    with ctx.sessions() as s, s.begin():
        publisher_admin = bearer(create_key(ctx.ledger, s, "publisher", "admin"))
    dataset = new_dataset(client, admin, name="mine", label_kind="integer", min=1, max=52, epsilon_total=2)
    assert upload(client, admin, dataset, labels_csv(labels)).status_code == 200
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 1},
                       headers=admin).status_code == 201
    own = created(release(client, admin, dataset, "own", mechanism="rr", epsilon=0.2))
    seq = _spent(ctx, dataset)
    _sql(ctx, "UPDATE datasets SET owner_org_id = (SELECT id FROM organizations WHERE name = 'publisher') "
              "WHERE id = :d", d=dataset)
    _tampered(client.post(f"/v1/datasets/{dataset}/grants", json={"org": "adnet", "epsilon": 1},
                          headers=publisher_admin), says="owner differs")
    _tampered(client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\ne0,1\n",
                         headers={**publisher_admin, "Content-Type": "text/csv"}), says="owner differs")
    _tampered(client.get(f"/v1/releases/{own['id']}/labels", headers=publisher_admin), says="owner differs")
    assert _spent(ctx, dataset) == seq
    assert any("owner differs" in p for p in chain_tests._problems(chain_tests._verify(ctx, tmp_path, audit_key)))


def test_a_revocation_reaches_the_certified_organization_and_an_expiry_cannot_be_lifted(
        ctx, client, admin, consumer, dataset):
    """A key moved to an organization without accounts while it is revoked: the revocation still goes to the
    chains of the organization its certificate names, and the key moved back with revoked_at cleared is refused.
    An expired key whose expires_at is cleared is refused too (its certificate states the expiry)."""
    from datetime import timedelta

    from labels_party.http.auth import create_key
    from tests.labels_party.api.helpers import bearer
    key = _key_id(ctx, consumer)
    _sql(ctx, "INSERT INTO organizations (name, created_at) VALUES ('evil', CURRENT_TIMESTAMP)")
    _sql(ctx, "UPDATE api_keys SET org_id = (SELECT id FROM organizations WHERE name = 'evil') WHERE id = :k", k=key)
    ring = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)
    prefix = consumer["Authorization"].removeprefix("Bearer ").split("_")[1]
    with ctx.sessions() as s, s.begin():
        ring.revoke(s, KeyRef(None, prefix), by="ops")
    with ctx.sessions() as s:
        revoked = [e.record for e in entries(s, dataset)
                   if e.record.get("event") == "key" and e.record.get("change") == "revoked"]
    assert [(r["org"], r["key_id"]) for r in revoked] == [("publisher", key)]
    _sql(ctx, "UPDATE api_keys SET org_id = (SELECT id FROM organizations WHERE name = 'publisher'), "
              "revoked_at = NULL, revoked_by = NULL WHERE id = :k", k=key)
    _refused(release(client, consumer, dataset, "r", mechanism="rr", epsilon=0.1))
    with ctx.sessions() as s, s.begin():
        expiring = bearer(create_key(ctx.ledger, s, "publisher", "consumer",
                                     expires_at=db.utcnow() + timedelta(seconds=1)))
    _sql(ctx, "UPDATE api_keys SET expires_at = NULL WHERE id = :k", k=_key_id(ctx, expiring))
    _refused(release(client, expiring, dataset, "e", mechanism="rr", epsilon=0.1))


def _row(ctx, key_id: int) -> dict:
    with ctx.sessions() as s:
        return dict(s.execute(text("SELECT org_id, certificate, revoked_at, revoked_by FROM api_keys WHERE id = :k"),
                              {"k": key_id}).mappings().one())


def _put_back(ctx, key_id: int, row: dict) -> None:
    _sql(ctx, "UPDATE api_keys SET org_id = :org_id, certificate = :certificate, revoked_at = :revoked_at, "
              "revoked_by = :revoked_by WHERE id = :k", k=key_id, **row)


@pytest.mark.parametrize("before_revoking", ["nothing", "uncertified in a look-alike organization"])
def test_a_revoked_keys_row_and_certificate_put_back_are_still_refused(ctx, client, admin, consumer, dataset,
                                                                       tmp_path, audit_key, before_revoking):
    """Issue 40's fifth review: a writer saves the key's row and certificate, (optionally) points the row at a
    look-alike organization with no certificate — so that the revocation reached no chain — and after the
    revocation puts the row back: the revoked key charged and acted on datasets made after. The data directory's
    revocation names the key by every identity it had: refused everywhere, and verify-audit names it."""
    from labels_party.ledger import signing, verification
    key = _key_id(ctx, consumer)
    saved = _row(ctx, key)
    if before_revoking != "nothing":
        _sql(ctx, "INSERT INTO organizations (name, created_at) VALUES ('publisher​', CURRENT_TIMESTAMP)")
        _sql(ctx, "UPDATE api_keys SET certificate = NULL, org_id = (SELECT id FROM organizations WHERE name = "
                  "'publisher​') WHERE id = :k", k=key)
    prefix = consumer["Authorization"].removeprefix("Bearer ").split("_")[1]
    with ctx.sessions() as s, s.begin():
        dataclasses.replace(KEYS, audit=ctx.ledger.key_changed).revoke(s, KeyRef(None, prefix), by="ops")
    _put_back(ctx, key, saved)
    _refused(release(client, consumer, dataset, "r", mechanism="rr", epsilon=0.1))
    made = client.post("/v1/datasets", headers=admin, json={
        "name": "later", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 2})
    assert made.status_code == 201, made.text
    fresh = made.json()["id"]
    assert client.post(f"/v1/datasets/{fresh}/grants", headers=admin,
                       json={"org": "publisher", "epsilon": 1}).status_code == 201
    _refused(client.get(f"/v1/datasets/{fresh}", headers=consumer))  # a dataset made after the revocation too
    report = verification.verify(ctx.sessions, ctx.ledger, public_key=signing.parse_public_key(audit_key[1]),
                                 heads_log=lambda: chain_tests._log(tmp_path))
    assert report["valid"] is False
    assert f"key {prefix} of publisher is in force in the database but was revoked (the data directory's " \
           "revocations name it)" in report["problems"], report.get("problems")


def test_a_key_marked_revoked_by_a_writer_is_still_revoked_by_the_operator(ctx, client, consumer, dataset):
    """Issue 40's sixth review: a writer marked a leaked key revoked in its row just before the operator revoked it;
    revoke-key answered "already revoked" and wrote nothing, and with the row put back the key charged again. A
    row's "revoked" that neither the data directory nor the key's certificate confirms is revoked anew."""
    from labels_party.http.auth import key_ring
    key = _key_id(ctx, consumer)
    saved = _row(ctx, key)
    _sql(ctx, "UPDATE api_keys SET revoked_at = '2026-01-01 00:00:00.000000', revoked_by = 'security-team' "
              "WHERE id = :k", k=key)
    with ctx.sessions() as s, s.begin():
        revoked = key_ring(ctx.ledger).revoke(s, KeyRef(key, None), by="operator")
    assert revoked.revoked_by == "operator"
    assert sorted(p.name for p in ctx.ledger.store.path("keys/revoked").glob("*.json"))  # outside the database
    with ctx.sessions() as s, s.begin(), pytest.raises(LabelDPError, match="already revoked"):  # now it truly is
        key_ring(ctx.ledger).revoke(s, KeyRef(key, None), by="operator")
    _put_back(ctx, key, saved)
    _refused(release(client, consumer, dataset, "after", mechanism="rr", epsilon=0.1))


def test_a_certificate_copied_onto_a_key_being_revoked_revokes_only_that_key(ctx, client, admin, consumer, dataset):
    """Issue 40's sixth review: the owner's admin certificate copied onto the consumer key the operator revoked
    made the data directory's revocation name the admin key too — locked out for good. A certificate counts for a
    key only when it is that key's (its id)."""
    from labels_party.http.auth import key_ring
    key, owner = _key_id(ctx, consumer), _key_id(ctx, admin)
    _sql(ctx, "UPDATE api_keys SET certificate = (SELECT certificate FROM api_keys WHERE id = :a) WHERE id = :k",
         a=owner, k=key)
    with ctx.sessions() as s, s.begin():
        key_ring(ctx.ledger).revoke(s, KeyRef(key, None), by="operator")
    owners = client.get(f"/v1/datasets/{dataset}/budget", headers=admin)
    assert owners.status_code == 200, owners.text
    _refused(release(client, consumer, dataset, "after", mechanism="rr", epsilon=0.1))
    with ctx.sessions() as s:
        facts = [e.record for e in entries(s, dataset)
                 if e.record.get("event") == "key" and e.record.get("change") == "revoked"]
    assert [f["key_id"] for f in facts] == [key]


def test_a_revocation_whose_certified_organization_was_renamed_still_revokes(ctx, client, consumer, dataset):
    """Issue 40's sixth review: the certificate's organization renamed away made revoke-key fail on an assertion,
    and the key kept working once the name was put back. It is revoked (on its row's organization's chains)."""
    from labels_party.http.auth import key_ring
    key = _key_id(ctx, consumer)
    _sql(ctx, "UPDATE organizations SET name = 'publisher-x' WHERE name = 'publisher'")
    with ctx.sessions() as s, s.begin():
        key_ring(ctx.ledger).revoke(s, KeyRef(key, None), by="operator")
    assert list(ctx.ledger.store.path("keys/revoked").glob("*.json"))  # outside the database, whatever the name
    _sql(ctx, "UPDATE organizations SET name = 'publisher' WHERE name = 'publisher-x'")
    _refused(release(client, consumer, dataset, "after", mechanism="rr", epsilon=0.1))


def test_a_label_version_set_back_is_not_released(ctx, client, admin, consumer, dataset, labels):
    from tests.labels_party.api.helpers import labels_csv, upload
    assert upload(client, admin, dataset, labels_csv({k: 1 for k in labels})).status_code == 200  # version 2
    _sql(ctx, "UPDATE datasets SET label_version = 1 WHERE id = :d", d=dataset)
    seq = _spent(ctx, dataset)
    _tampered(release(client, consumer, dataset, "old", mechanism="rr", epsilon=0.5), says="not the chain's latest")
    assert _spent(ctx, dataset) == seq


def test_a_mechanism_document_rewritten_is_not_served(ctx, client, consumer, dataset):
    first = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    second = created(release(client, consumer, dataset, "b", mechanism="laplace", epsilon=0.5))
    _sql(ctx, "UPDATE mechanism_documents SET body = (SELECT body FROM mechanism_documents WHERE hash = :o) "
              "WHERE hash = :h", o=second["mechanism_hash"], h=first["mechanism_hash"])
    _tampered(client.get(f"/v1/mechanisms/{first['mechanism_hash']}", headers=consumer),
              says="does not hash to its address")
    untouched = client.get(f"/v1/mechanisms/{second['mechanism_hash']}", headers=consumer)
    from labels_party.ledger import documents
    assert untouched.status_code == 200, untouched.text  # the other one, whose body is its own, is served
    assert documents.address(untouched.json()) == second["mechanism_hash"]


def _document_bomb(references: int) -> bytes:
    """A packed document whose skeleton names one 10⁶-number array ``references`` times (8 KB at 100)."""
    import io
    import zipfile

    import numpy as np
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("document.json", '{"description":{"x":[' + ",".join(['{"$array":0}'] * references) + "]}}")
        with archive.open("a0.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros(1_000_000), allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("body", ["bomb", "not an archive", "an array not int64 or float64", "a skeleton bomb"])
def test_a_mechanism_document_row_that_would_expand_or_cannot_be_read_is_refused_in_bounded_memory(
        ctx, client, consumer, dataset, tmp_path, audit_key, body):
    """Issue 40's sixth review: an 8 KB row naming a 10⁶-number array 100 times took a consumer's GET to 2 GB and
    23 s before its 503; a row that is not an archive was a 500. Both are ledger_tampered, refused before anything
    expands (traced memory stays under 64 MB: the one array read is 8 MB), and verify-audit names the document."""
    import io
    import tracemalloc
    import zipfile

    import numpy as np
    stored = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    if body == "bomb":
        data = _document_bomb(100)
    elif body == "a skeleton bomb":  # the seventh review's: 32 MiB of "{}," (32 KB deflated) parsed to 1.5 GB
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("document.json", b"[" + b"{}," * ((32 << 20) // 3 - 1) + b"{}]")
        data = buffer.getvalue()
    elif body == "not an archive":
        data = b"not a zip archive at all"
    else:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("document.json", '{"description":{"x":{"$array":0}}}')
            with archive.open("a0.npy", "w") as member:
                np.lib.format.write_array(member, np.array(["x"] * 10, dtype=object), allow_pickle=True)
        data = buffer.getvalue()
    _sql(ctx, "UPDATE mechanism_documents SET body = :b WHERE hash = :h", b=data, h=stored["mechanism_hash"])
    tracemalloc.start()
    try:
        for accept in ("application/json", "application/vnd.labeldp.mechanism+npz"):
            _tampered(client.get(f"/v1/mechanisms/{stored['mechanism_hash']}", headers={**consumer, "Accept": accept}),
                      says=f"mechanism document {stored['mechanism_hash']}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    report = chain_tests._verify(ctx, tmp_path, audit_key)
    problems = [p for d in report["datasets"] for p in d["problems"]]
    assert not report["valid"] and any(f"mechanism document {stored['mechanism_hash'][:12]}" in p for p in problems)


def test_verify_with_the_heads_log_alone_finds_a_deleted_dataset(ctx, client, admin, dataset, tmp_path, audit_key):
    """A database and data-directory writer removes a dataset whole (rows, anchor): the heads log still holds the
    heads the service signed for it, and verify-audit with only the log (no pinned heads) says so."""
    from labels_party.ledger import signing, verification
    tables = ("ledger", "budget_accounts", "grants", "label_versions", "releases")
    for table in tables:
        _sql(ctx, f"DELETE FROM {table} WHERE dataset_id = :d", d=dataset)
    _sql(ctx, "DELETE FROM datasets WHERE id = :d", d=dataset)
    ctx.ledger.store.path(f"anchors/{dataset}.json").unlink()
    report = verification.verify(ctx.sessions, ctx.ledger, public_key=signing.parse_public_key(audit_key[1]),
                                 heads_log=lambda: chain_tests._log(tmp_path))
    assert report["valid"] is False
    assert f"dataset {dataset} has signed heads in the heads log but is not in the database" in report["problems"]


def test_central_training_switched_on_in_the_row_is_refused(ctx, client, consumer, dataset):
    """The owner's central-training choice is on the chain: a row switched on does not open the labels to central
    training (nor to any release, until it agrees again)."""
    _sql(ctx, "UPDATE datasets SET allow_central_training = TRUE WHERE id = :d", d=dataset)
    seq = _spent(ctx, dataset)
    _tampered(client.post(f"/v1/datasets/{dataset}/central-trainings", headers={**consumer, "Idempotency-Key": "c"},
                          json={"epsilon": 1, "example_ids": ["e0", "e1"], "features": [[0.0], [1.0]]}),
              says="central-training switch differs")
    assert _spent(ctx, dataset) == seq


def test_a_key_row_edited_is_not_rotated_into_a_certified_key(ctx, client, admin, consumer, dataset, tmp_path,
                                                               audit_key):
    """A consumer key edited into the owner's admin, then rotated by an honest operator: the rotation is refused
    (its successor would take the row's organization and role, certified), and verify-audit names the row."""
    from labels_party.http.auth import key_ring
    from labels_party.ledger import LedgerTampered
    _sql(ctx, "UPDATE api_keys SET org_id = (SELECT id FROM organizations WHERE name = 'hospital'), role = 'admin' "
              "WHERE id = :k", k=_key_id(ctx, consumer))
    prefix = consumer["Authorization"].removeprefix("Bearer ").split("_")[1]
    with pytest.raises(LedgerTampered, match="not as the service issued it"):
        with ctx.sessions() as s, s.begin():
            key_ring(ctx.ledger).rotate(s, KeyRef(None, prefix), by="ops")
    with ctx.sessions() as s:
        assert len(s.scalars(select(db.ApiKey.id)).all()) == 4  # no successor made
    report = chain_tests._verify(ctx, tmp_path, audit_key)
    assert report["valid"] is False
    assert any(p.startswith(f"key {prefix} of hospital is in force but not as the service issued it")
               for p in report["problems"]), report.get("problems")


def test_upgrade_db_certifies_the_keys_it_finds_once_per_data_directory(tmp_path, capsys):
    """`labeldp labels upgrade-db` (not only `serve --upgrade-db`) certifies the keys of a database from before key
    certificates that their chains made as they stand (a key on no chain is not certified, and says so); a writer
    who later drops the certificates and sets the schema back gets nothing certified by the next upgrade (the data
    directory remembers), so a row of theirs stays refused."""
    from fastapi.testclient import TestClient

    from labeldp import cli
    from labels_party.http.api import create_app
    from labels_party.http.auth import KEYS, create_key
    from labels_party.runtime.context import make_context
    from tests.labels_party.api.helpers import bearer
    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    first = make_context(database, data)
    with first.sessions() as s, s.begin():
        admin = bearer(create_key(first.ledger, s, "hospital", "admin"))
        idle = bearer(create_key(first.ledger, s, "clinic", "admin"))  # its organization holds no account
    with TestClient(create_app(first)) as client:  # the admin's key goes on the new dataset's chain
        assert client.post("/v1/datasets", headers=admin, json={
            "name": "weeks", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 1}).status_code == 201
    first.close()

    def older_schema(insert: bool = False) -> str | None:
        again = make_context(database, data)
        with again.sessions() as s, s.begin():
            inserted = bearer(KEYS.create(s, "hospital", "admin")) if insert else None
            s.execute(text("ALTER TABLE api_keys DROP COLUMN certificate"))
            s.execute(text("UPDATE alembic_version SET version_num = '0018'"))
        again.close()
        return inserted

    older_schema()
    (data / "keys-certified").unlink()  # as a data directory from before this version has none
    argv = ["labels", "upgrade-db", "--database-url", database, "--data-dir", str(data)]
    assert cli.main(argv) == 0
    upgraded = json.loads(capsys.readouterr().out)
    assert [line.split(":")[1].strip() for line in upgraded["keys_not_certified"]] == ["no chain made it"]
    assert " of clinic:" in upgraded["keys_not_certified"][0]
    ctx = make_context(database, data)
    with TestClient(create_app(ctx)) as client:
        assert client.get("/v1/datasets", headers=admin).status_code == 200  # certified by the upgrade
        assert client.get("/v1/datasets", headers=idle).status_code == 401  # not: on no chain
    ctx.close()
    inserted = older_schema(insert=True)
    assert cli.main(argv) == 0
    ctx = make_context(database, data)
    with TestClient(create_app(ctx)) as client:
        assert client.get("/v1/datasets", headers=inserted).status_code == 401
        assert client.get("/v1/datasets", headers=admin).status_code == 401  # its certificate was dropped too
    ctx.close()


def _shop_with_a_publisher(tmp_path):
    """A deployment on ``tmp_path``: the shop's admin key, the publisher's consumer key and a dataset of the shop's
    granted to the publisher. Returns (database URL, data directory, the first context, owner, consumer, dataset)."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.runtime.context import make_context
    from tests.labels_party.api.helpers import bearer
    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    first = make_context(database, data)
    with first.sessions() as s, s.begin():
        owner = bearer(create_key(first.ledger, s, "shop", "admin"))
        consumer = bearer(create_key(first.ledger, s, "publisher", "consumer"))
    with TestClient(create_app(first)) as client:
        made = client.post("/v1/datasets", headers=owner, json={
            "name": "weeks", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 2}).json()["id"]
        assert client.post(f"/v1/datasets/{made}/grants", headers=owner,
                           json={"org": "publisher", "epsilon": 1}).status_code == 201
    return database, data, first, owner, consumer, made


def test_the_certifying_upgrade_leaves_out_rows_their_chains_contradict(tmp_path, capsys):
    """Issue 40's fifth review: before the operator's upgrade to key certificates, a writer edited the publisher's
    chained consumer key into the owner's admin and inserted an admin row of the owner's; the upgrade certified
    both, and both then granted on the owner's new datasets. Only keys their chains made as they stand are
    certified now."""
    from fastapi.testclient import TestClient

    from labeldp import cli
    from labels_party.http.api import create_app
    from labels_party.runtime.context import make_context
    from tests.labels_party.api.helpers import bearer
    database, data, first, owner, consumer, _made = _shop_with_a_publisher(tmp_path)
    first.close()
    again = make_context(database, data)
    with again.sessions() as s, s.begin():  # the writer's edits, then the schema as before certificates
        inserted = bearer(KEYS.create(s, "shop", "admin"))
        shop = s.scalar(select(db.Organization.id).where(db.Organization.name == "shop"))
        prefix = consumer["Authorization"].split("_")[1]
        s.execute(text("UPDATE api_keys SET org_id = :o, role = 'admin' WHERE prefix = :p"), {"o": shop, "p": prefix})
        s.execute(text("ALTER TABLE api_keys DROP COLUMN certificate"))
        s.execute(text("UPDATE alembic_version SET version_num = '0018'"))
    again.close()
    (data / "keys-certified").unlink()  # as a data directory from before key certificates has none
    assert cli.main(["labels", "upgrade-db", "--database-url", database, "--data-dir", str(data)]) == 0
    left_out = json.loads(capsys.readouterr().out)["keys_not_certified"]
    assert sorted(line.split(": ", 1)[1] for line in left_out) == [
        "its row differs from what a chain recorded of it", "no chain made it"], left_out
    ctx = make_context(database, data)
    with TestClient(create_app(ctx)) as client:
        assert client.get("/v1/datasets", headers=owner).status_code == 200  # its chain made it so
        new = client.post("/v1/datasets", headers=owner, json={
            "name": "days", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 2}).json()["id"]
        for forged in (inserted, consumer):
            _refused(client.post(f"/v1/datasets/{new}/grants", headers=forged, json={"org": "evil", "epsilon": 1}))
    ctx.close()


def test_the_certifying_upgrade_leaves_out_a_revoked_key_whose_revocation_was_moved_to_the_future(tmp_path,
                                                                                                     capsys):
    """Issue 40's sixth review (by reading): a key revoked before the upgrade to certificates (and to the data
    directory's revocations), its row's revoked_at set far ahead by a writer, looked like a key in its rotation's
    grace and was certified in force. A row revoked later than its chain says is not certified."""
    import shutil

    from labeldp import cli
    from labels_party.http.auth import key_ring
    from labels_party.runtime.context import make_context
    database, data, first, _owner, consumer, _made = _shop_with_a_publisher(tmp_path)
    prefix = consumer["Authorization"].split("_")[1]
    with first.sessions() as s, s.begin():
        key_ring(first.ledger).revoke(s, KeyRef(None, prefix), by="ops")
    first.close()
    shutil.rmtree(data / "keys" / "revoked")  # a data directory from before its revocations
    from sqlalchemy import create_engine
    engine = create_engine(database)  # the writer's edit, then the schema as before certificates
    with engine.begin() as connection:
        connection.execute(text("UPDATE api_keys SET revoked_at = '2999-01-01 00:00:00.000000' WHERE prefix = :p"),
                           {"p": prefix})
        connection.execute(text("ALTER TABLE api_keys DROP COLUMN certificate"))
        connection.execute(text("UPDATE alembic_version SET version_num = '0018'"))
    engine.dispose()
    (data / "keys-certified").unlink()
    assert cli.main(["labels", "upgrade-db", "--database-url", database, "--data-dir", str(data)]) == 0
    left_out = json.loads(capsys.readouterr().out)["keys_not_certified"]
    assert [line.split(": ", 1)[1] for line in left_out] == ["its row differs from what a chain recorded of it"]
    assert f"prefix {prefix}" in left_out[0]
    from labels_party.ledger.agreement import LedgerTampered
    with pytest.raises(LedgerTampered, match=f"key {prefix} is revoked from 2999-01-01"):  # and the service
        make_context(database, data)  # refuses to start until the row agrees with its chain again


def test_the_owner_migration_0019_chains_is_the_one_the_chain_allocated_the_dataset_to():
    """Issue 40's fifth review: 0019 took the owner from the row, which a writer could have edited before the
    upgrade; it takes the organization the creation allocated the whole budget to."""
    import importlib.util
    from pathlib import Path

    path = Path(db.__file__).parent / "migrations" / "versions" / "0019_owners_and_key_certificates.py"
    spec = importlib.util.spec_from_file_location("migration_0019", path)
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    chain = [{"event": "dataset_budget", "change": "created"}, {"event": "allocation", "org": "shop"},
             {"event": "key", "org": "shop"}, {"event": "allocation", "org": "shop"},
             {"event": "allocation", "org": "publisher"}, {"event": "grant", "org": "publisher"}]
    assert migration._chained_owner(chain) == "shop"
    assert migration._chained_owner([{"event": "dataset_budget", "change": "migrated"},
                                     {"event": "allocation", "org": "publisher"}]) is None  # older than facts


def test_a_revocation_certifies_no_edited_row(ctx, client, consumer, dataset):
    """Revoking an inserted row, or a row whose expiry was lifted, leaves it uncertified (a revocation re-certifies
    only a row that agreed with its certificate), and rotating the lifted one is refused."""
    from datetime import timedelta

    from labels_party.http.auth import create_key, key_ring
    from labels_party.ledger import LedgerTampered, key_certificates
    from tests.labels_party.api.helpers import bearer
    with ctx.sessions() as s, s.begin():
        inserted = KEYS.issue(s, "publisher", "consumer")  # no certificate: a row written into the table
        lifted = bearer(create_key(ctx.ledger, s, "publisher", "consumer", expires_at=db.utcnow() + timedelta(days=1)))
    _sql(ctx, "UPDATE api_keys SET expires_at = NULL WHERE id = :k", k=_key_id(ctx, lifted))
    ring = key_ring(ctx.ledger)
    lifted_prefix = lifted["Authorization"].removeprefix("Bearer ").split("_")[1]
    with pytest.raises(LedgerTampered, match="not as the service issued it"):
        with ctx.sessions() as s, s.begin():
            ring.rotate(s, KeyRef(None, lifted_prefix), by="ops")
    for prefix in (inserted.info.prefix, lifted_prefix):
        with ctx.sessions() as s, s.begin():
            ring.revoke(s, KeyRef(None, prefix), by="ops")
    with ctx.sessions() as s:
        for prefix in (inserted.info.prefix, lifted_prefix):
            row = s.scalars(select(db.ApiKey).where(db.ApiKey.prefix == prefix)).one()
            assert not key_certificates.agrees(ctx.ledger.signer.public, row, "publisher")


def _restart_refused(ctx, said: str) -> None:
    from labels_party.ledger.agreement import LedgerTampered
    from labels_party.runtime.context import make_context
    with pytest.raises(LedgerTampered, match=said):
        make_context(settings=ctx.settings)


@pytest.mark.parametrize("edit", ["domain_json = replace(domain_json, '52', '2')", "label_kind = 'continuous'"])
def test_a_datasets_domain_edited_is_refused_and_reported(ctx, client, admin, consumer, dataset, labels, tmp_path,
                                                         audit_key, edit):
    """Issue 40's thirty-fourth review: a dataset's domain rewritten (a 2-class dataset made 3 classes) passed
    verify-audit, and every release and upload computed on the row's. The domain is on the chain (a ``domain``
    fact): a release and an upload are refused with nothing charged or stored, verify-audit names it, and the
    service does not start on it."""
    from tests.labels_party.api.helpers import labels_csv, upload
    seq = _spent(ctx, dataset)
    _sql(ctx, f"UPDATE datasets SET {edit} WHERE id = :d", d=dataset)
    said = "the dataset's label kind or domain differs from the chain's"
    _tampered(release(client, consumer, dataset, "x", mechanism="rr", epsilon=0.5), says=said)
    _tampered(upload(client, admin, dataset, labels_csv({k: 1 for k in labels})), says=said)
    assert _spent(ctx, dataset) == seq
    with ctx.sessions() as s:
        assert s.get(db.Dataset, dataset).label_version == 1  # no version stored
    problems = [p for d in chain_tests._verify(ctx, tmp_path, audit_key)["datasets"] for p in d["problems"]]
    assert said in problems, problems
    _restart_refused(ctx, said)


@pytest.mark.parametrize("edit", ["description_json = '{\"mechanism\": \"rr\", \"epsilon\": 2.0}'",
                                  "prior_json = '{\"epsilon\": 0.1}'", "description_json = '{}'"])
def test_a_releases_shown_summary_edited_is_refused_and_reported(ctx, client, consumer, dataset, tmp_path, audit_key,
                                                                 edit):
    """The review's second rewrite: what a release's row shows besides its record (its description's summary: ε, a
    metric and its interval; its noisy prior's; its ε split) set to something else passed verify-audit and was
    served. Its digest is on the release's ``release_available`` fact: a read of it, of its dataset's releases or its
    request sent again is refused; verify-audit names it — and that it is not its mechanism document's — and the
    service does not start on it (its ε split is its charge record's: the displayed-columns test above)."""
    made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    other = created(release(client, consumer, dataset, "b", mechanism="laplace", epsilon=0.5))
    assert client.get(f"/v1/releases/{made['id']}", headers=consumer).json() == made  # as created
    _sql(ctx, f"UPDATE releases SET {edit} WHERE id = :r", r=made["id"])
    said = f"release {made['id']}'s shown summary differs from the chain's"
    _tampered(client.get(f"/v1/releases/{made['id']}", headers=consumer), says=said)
    _tampered(client.get(f"/v1/datasets/{dataset}/releases", headers=consumer), says=said)
    # the request sent again with its Idempotency-Key (the thirty-fifth review: the replay showed the row unchecked)
    _tampered(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5), says=said)
    assert client.get(f"/v1/releases/{other['id']}", headers=consumer).status_code == 200  # its own row agrees
    problems = [p for d in chain_tests._verify(ctx, tmp_path, audit_key)["datasets"] for p in d["problems"]]
    assert said in problems, problems
    assert any(p.endswith("the release's shown summary is not its mechanism document's") for p in problems), problems
    _restart_refused(ctx, said)


def test_a_label_versions_id_bytes_edited_is_refused_and_reported(ctx, client, consumer, dataset, tmp_path, audit_key):
    """The review's LOW 6: a label version's ids' bytes (what its releases' storage estimates read: 1 would let an
    organization's releases outgrow its quota) edited passed verify-audit. They are on the version's ``labels``
    fact."""
    seq = _spent(ctx, dataset)
    _sql(ctx, "UPDATE label_versions SET id_bytes = 1 WHERE dataset_id = :d", d=dataset)
    said = "label version 1 differs from the chain's"
    _tampered(release(client, consumer, dataset, "x", mechanism="rr", epsilon=0.5), says="label version 1")
    assert _spent(ctx, dataset) == seq
    problems = [p for d in chain_tests._verify(ctx, tmp_path, audit_key)["datasets"] for p in d["problems"]]
    assert said in problems, problems
    _restart_refused(ctx, said)


def test_a_release_set_back_to_running_shows_nothing_the_chain_does_not_state(ctx, client, consumer, dataset):
    """The thirty-fifth review's LOW 5: a release row set to ``running`` with a forged description was shown (the
    live check skipped running rows). A running release the chain states no document for must show none."""
    made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, "UPDATE releases SET state = 'running', description_json = '{\"epsilon\": 9}' WHERE id = :r",
         r=made["id"])
    said = f"release {made['id']} is running and shows a mechanism document the chain does not state"
    for shown in (client.get(f"/v1/releases/{made['id']}", headers=consumer),
                  client.get(f"/v1/datasets/{dataset}/releases", headers=consumer)):
        assert shown.status_code == 503 and shown.json()["error"]["code"] == "ledger_tampered", shown.text
        assert said in shown.json()["error"]["message"] and '"epsilon": 9' not in shown.text


def test_a_domain_that_excludes_the_stored_labels_is_reported_by_verify(ctx, client, dataset, tmp_path, audit_key):
    """The thirty-fifth review's MEDIUM 3: migration 0022 chains a dataset's domain as its row says, so a domain
    shrunk before the upgrade would be chained (and its releases would charge, then fail on the labels outside it).
    verify-audit checks the current label version's labels against the domain."""
    narrow = json.dumps({"kind": "integer", "min": 1, "max": 2})
    _sql(ctx, "UPDATE datasets SET domain_json = :j WHERE id = :d", j=narrow, d=dataset)
    problems = [p for d in chain_tests._verify(ctx, tmp_path, audit_key)["datasets"] for p in d["problems"]]
    # found by the labels themselves, besides the chain's domain fact (which an upgrade on trust would not give)
    assert "label version 1 holds labels outside the dataset's domain" in problems, problems
    assert "the dataset's label kind or domain differs from the chain's" in problems, problems


@pytest.mark.parametrize("table, column, name", [
    ("label_versions", "file", "datasets/{d}/../../../../../../../../../../dev/zero"),
    ("label_versions", "file", "/dev/zero"),
    ("releases", "file", "/"),
    ("releases", "file", "releases/../../../../../../../../../../"),
])
def test_a_row_naming_a_path_outside_the_data_directory_is_refused_at_once(ctx, client, consumer, dataset, tmp_path,
                                                                          audit_key, table, column, name):
    """The thirty-seventh review: ``label_versions.file`` set to ``datasets/<id>/../../…/dev/zero`` passed the
    check of its prefix, and every release request on the dataset — and verify-audit — hashed /dev/zero forever
    (on SQLite, with the write lock held: the whole service stopped); ``releases.file = /`` made a release request
    walk the whole file system to count the organization's storage. A stored name that is absolute, steps out of
    the data directory, or names anything but a regular file or directory is refused at once (503
    ``ledger_tampered``); verify-audit finishes and names it."""
    import signal

    made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sql(ctx, f"UPDATE {table} SET {column} = :n WHERE " + ("dataset_id = :d" if table == "label_versions"
                                                             else "id = :r"), n=name.format(d=dataset), d=dataset,
         r=made["id"])
    seq = _spent(ctx, dataset)
    signal.alarm(60)  # (a hang is the failure this test is about)
    try:
        refused = release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5)
        report = chain_tests._verify(ctx, tmp_path, audit_key)
    finally:
        signal.alarm(0)
    _tampered(refused)
    assert _spent(ctx, dataset) == seq
    assert report["valid"] is False


def test_a_version_row_pointed_at_another_file_registers_no_id_again(ctx, client, admin, dataset, dataset_small,
                                                                     labels):
    """The thirty-eighth review: a version's row pointed at another dataset's label file made the owner's next upload
    of the same ids register them again, with fresh budgets (a second ε=1 release of one example on a total of 1,
    and verify valid once the row was put back). An upload reads the registry only from the files the chain
    records."""
    from tests.labels_party.api.helpers import labels_csv, upload
    with ctx.sessions() as s:
        other = s.scalar(select(db.LabelVersion.file).where(db.LabelVersion.dataset_id == dataset_small))
        registry = s.get(db.Dataset, dataset).registry_size
    _sql(ctx, "UPDATE label_versions SET file = :f WHERE dataset_id = :d", f=other, d=dataset)
    _tampered(upload(client, admin, dataset, labels_csv(labels)), says="is not the one its chain records")
    with ctx.sessions() as s:
        assert s.get(db.Dataset, dataset).registry_size == registry


def test_a_spent_table_replaced_by_a_large_file_is_refused_unread(ctx, client, consumer, dataset):
    """The thirty-eighth review's G4: a spent table replaced in the data directory by a 1.5 GiB sparse file was
    loaded whole (a request at 3.4 GB). A state file larger than the chain's registry allows is refused unread."""
    import resource

    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s:
        spent = s.scalars(select(db.BudgetAccount.spent_file).where(db.BudgetAccount.dataset_id == dataset,
                                                                   db.BudgetAccount.spent_file.is_not(None))).first()
    import numpy as np
    with open(ctx.store.path(spent), "wb") as handle:  # a table of 2^26 classes, sparse on disk
        np.lib.format.write_array_header_1_0(handle, {"descr": "<i8", "fortran_order": False, "shape": (1 << 26, 3)})
        handle.truncate(handle.tell() + (3 << 29))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _tampered(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5),
              says="spent state")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB: not loaded
