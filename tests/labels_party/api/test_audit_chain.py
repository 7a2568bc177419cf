"""An audit an outsider can check (issue 28, items 8 and 9): the chain covers budget facts, its heads are signed
and exported after every commit, and verify-audit with a pinned head detects every tampering the review did —
without false alarms on honest ledgers, and without crashing on damaged files. ~15 s on SQLite."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text

from labeldp import cli
from labels_party.http import audit as audit_log
from labels_party.http.auth import KEYS, create_key
from labels_party.ledger import canonical, chain_hash, signing, verification, within_charge
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.service.keys import KeyRef
from tests.labels_party.api.helpers import created, expect_error, release

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


@pytest.fixture
def audit_key(tmp_path):
    path = tmp_path / "keys" / "audit.pem"
    return path, signing.public_hex(signing.create_key_file(path))


@pytest.fixture
def ctx(db_url, data_dir, tmp_path, audit_key):
    """The API tests' context, with an audit key and an export directory outside the database and data dir."""
    settings = LabelsSettings(database_url=db_url, data_dir=data_dir, audit_key_file=audit_key[0],
                              audit_log_dir=tmp_path / "audit")
    return make_context(settings=settings)


def _log(tmp_path) -> list[signing.SignedHead]:
    return signing.read_heads(tmp_path / "audit" / signing.LOG_NAME)


def _verify(ctx, tmp_path, audit_key, pinned=None) -> dict:
    heads = _log(tmp_path) if pinned is None else pinned
    return verification.verify(ctx.sessions, ctx.ledger, pinned=heads,
                               public_key=signing.parse_public_key(audit_key[1]))


def _sql(ctx, *statements: str, **params) -> None:
    with ctx.sessions() as s, s.begin():
        for statement in statements:
            s.execute(text(statement), params)


def _problems(report: dict) -> list[str]:
    return [p for d in report["datasets"] for p in d["problems"]] + report.get("pinned", {}).get("problems", [])


def test_heads_are_signed_and_exported_after_every_commit(ctx, client, admin, consumer, other_admin, dataset,
                                                          tmp_path, audit_key):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=0.5))
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))
    assert stat.S_IMODE(os.stat(audit_key[0]).st_mode) == 0o600
    public = signing.parse_public_key(audit_key[1])
    heads = _log(tmp_path)
    # creation (totals, owner, domain, owner's allocation and key), the labels, the grant (the grantee's key, two
    # allocations, the grant), two charges each followed by its release becoming available (its file and mechanism
    # document): a head per commit
    assert [(h.dataset_id, h.seq) for h in heads] == [(dataset, s) for s in (5, 6, 10, 11, 12, 13, 14)]
    assert all(h.signed_by(public) for h in heads)
    with ctx.sessions() as s:
        row = s.get(db.Dataset, dataset)
        assert (heads[-1].seq, heads[-1].head) == (row.ledger_seq, row.ledger_head)
    # a signature covers the head: another head with it does not verify
    forged = signing.SignedHead(**{**heads[-1].__dict__, "seq": 3})
    assert not forged.signed_by(public)

    r = client.get("/v1/audit/heads", params={"dataset": dataset}, headers=admin)
    assert r.status_code == 200, r.text
    [polled] = [signing.SignedHead.parse(h) for h in r.json()]
    assert polled.signed_by(public) and (polled.seq, polled.head) == (heads[-1].seq, heads[-1].head)
    # a consumer sees no head (its sequence number counts every organization's releases); another owner: 404
    assert client.get("/v1/audit/heads", params={"dataset": dataset}, headers=consumer).status_code == 403
    expect_error(client.get("/v1/audit/heads", params={"dataset": dataset}, headers=other_admin), 404, "not_found")
    assert client.get("/v1/audit/heads", headers=other_admin).json() == []
    report = _verify(ctx, tmp_path, audit_key, [polled, *heads])
    assert report["valid"] is True and report["pinned"] == {"heads": 8, "problems": []}, report


def _verify_log(ctx, tmp_path, audit_key) -> dict:
    """verify-audit as an outsider runs it with the service's whole export of signed transitions."""
    return verification.verify(ctx.sessions, ctx.ledger, pinned=_log(tmp_path),
                               public_key=signing.parse_public_key(audit_key[1]), heads_log=lambda: _log(tmp_path))


def _append_forged_facts(ctx, dataset) -> int:
    """The review's attack, as a database (and data-directory) writer: facts appended at the chain's end with their
    hashes computed as the service would — the dataset's total × 100 and the publisher's allocation raised to
    match — the tables and the anchor moved along. Returns the new head's seq."""
    with ctx.sessions() as s, s.begin():
        row = s.get(db.Dataset, dataset)
        seq, head, total = row.ledger_seq, row.ledger_head, row.epsilon_total_units * 100
        facts = [{"event": "dataset_budget", "change": "changed", "epsilon_total_units": total, "delta_total": 0.0},
                 {"event": "allocation", "org": "publisher", "epsilon_units": total // 2, "delta": 0.0}]
        for fact in facts:
            seq += 1
            record = canonical({**fact, "seq": seq, "dataset_id": dataset, "created_at": db.utcnow().isoformat()})
            digest = chain_hash(head, record)
            s.add(db.LedgerEntry(dataset_id=dataset, seq=seq, record=record, prev_hash=head, hash=digest))
            head = digest
        row.epsilon_total_units, row.ledger_seq, row.ledger_head = total, seq, head
        publisher = s.scalar(select(db.Organization).where(db.Organization.name == "publisher"))
        s.execute(text("UPDATE budget_accounts SET epsilon_units = :u WHERE dataset_id = :d AND org_id = :o"),
                  {"u": total // 2, "d": dataset, "o": publisher.id})
        ctx.ledger.anchor(row)  # the anchor is a plain file in the data directory: moved too
    return seq


def test_facts_appended_outside_the_service_are_found_even_under_later_signed_heads(
        ctx, client, consumer, dataset, tmp_path, audit_key):
    """Every head the service exports is a transition (the head before its transaction → the head after): entries
    appended by anyone else are covered by none, even once the service has signed heads on top of them."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    assert _verify_log(ctx, tmp_path, audit_key)["valid"] is True
    last = _append_forged_facts(ctx, dataset)
    # with only the pinned heads (each still contained), the forged tail would pass; the transitions do not
    assert _verify(ctx, tmp_path, audit_key)["valid"] is True
    gap = f"entries {last - 1}–{last} are covered by no head the service signed and exported"
    report = _verify_log(ctx, tmp_path, audit_key)
    assert report["valid"] is False and any(p.startswith(gap) for p in _problems(report)), _problems(report)
    # the service goes on (its anchor agrees with the forged table) and signs its next transaction on top
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))
    # a transition from the forged head (the charge's; its release's availability follows), not one covering it
    assert _log(tmp_path)[-2].previous_seq == last
    report = _verify_log(ctx, tmp_path, audit_key)
    assert report["valid"] is False and any(p.startswith(gap) for p in _problems(report)), _problems(report)


def test_the_cli_checks_the_configured_heads_log(ctx, client, consumer, dataset, tmp_path, audit_key, db_url,
                                                 data_dir, capsys):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    flags = ["labels", "verify-audit", "--database-url", db_url, "--data-dir", str(data_dir), "--heads-log",
             str(tmp_path / "audit" / signing.LOG_NAME), "--public-key", audit_key[1]]
    assert cli.main(flags) == 0
    capsys.readouterr()
    _append_forged_facts(ctx, dataset)
    assert cli.main(flags) == 1
    assert "covered by no head the service signed" in capsys.readouterr().out


def test_with_the_public_key_a_missing_heads_log_is_no_pass(ctx, client, consumer, dataset, tmp_path, audit_key,
                                                             db_url, data_dir, capsys):
    """The review of issue 40 (F7): the configured log deleted (after a whole-chain rewrite) made verify-audit
    "check nothing" and exit 0 even with --public-key; now every entry is unsigned, and the report invalid."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    flags = ["labels", "verify-audit", "--database-url", db_url, "--data-dir", str(data_dir), "--public-key",
             audit_key[1]]
    ctx.close()
    (tmp_path / "audit" / signing.LOG_NAME).unlink()
    settings = {"LABELDP_AUDIT_LOG_DIR": str(tmp_path / "audit"), "LABELDP_AUDIT_KEY_FILE": str(audit_key[0])}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        assert cli.main(flags) == 1
    assert "covered by no head the service signed" in capsys.readouterr().out


def _delete_everything(ctx, dataset):
    _sql(ctx, "DELETE FROM ledger WHERE dataset_id = :d", "DELETE FROM releases WHERE dataset_id = :d",
         "UPDATE datasets SET ledger_seq = 0, ledger_head = :zero, epsilon_spent_units = 0 WHERE id = :d",
         "UPDATE budget_accounts SET classes_file = NULL, spent_file = NULL, rdp_file = NULL, spent_max_units = 0,"
         " generation = 0 WHERE dataset_id = :d", d=dataset, zero="0" * 64)
    for file in ctx.store.path(f"datasets/{dataset}/budget").rglob("*.npy"):
        file.unlink()


def _truncate(ctx, dataset, keep=5):
    """Back to the chain's first ``keep`` entries (before any release), its releases and spent state gone."""
    with ctx.sessions() as s:
        head = s.scalar(text("SELECT hash FROM ledger WHERE dataset_id = :d AND seq = :k"), {"d": dataset, "k": keep})
    _delete_everything(ctx, dataset)  # then re-insert nothing but the prefix: the same as deleting the rest
    _sql(ctx, "UPDATE datasets SET ledger_seq = :k, ledger_head = :h WHERE id = :d", d=dataset, k=keep, h=head)


def _rewrite(ctx, dataset):
    """Halve the first release's charge in its record and re-chain everything after it: a consistent chain."""
    with ctx.sessions() as s, s.begin():
        rows = s.execute(text("SELECT id, seq, record, prev_hash FROM ledger WHERE dataset_id = :d ORDER BY seq"),
                         {"d": dataset}).all()
        head = "0" * 64
        for row in rows:
            record = json.loads(row.record)
            if record.get("event", "label_release") == "label_release" and record["charge_units"] == 500_000_000:
                record["charge_units"], record["charge"] = 250_000_000, 0.25
            record_json = canonical(record)
            digest = chain_hash(head, record_json)
            s.execute(text("UPDATE ledger SET record = :r, prev_hash = :p, hash = :h WHERE id = :id"),
                      {"r": record_json, "p": head, "h": digest, "id": row.id})
            head = digest
        s.execute(text("UPDATE datasets SET ledger_head = :h WHERE id = :d"), {"h": head, "d": dataset})


TAMPERINGS = {
    "total_times_100": lambda ctx, d: _sql(
        ctx, "UPDATE datasets SET epsilon_total_units = epsilon_total_units * 100 WHERE id = :d", d=d),
    "delete_everything": _delete_everything,
    "truncate_to_a_prefix": _truncate,
    "rewrite_and_rechain": _rewrite,
}
EXPECTED = {
    "total_times_100": "the dataset's totals differ from the chain's",
    "delete_everything": "pinned head at seq 14: the chain no longer contains it",
    "truncate_to_a_prefix": "pinned head at seq 14: the chain no longer contains it",
    "rewrite_and_rechain": "pinned head at seq 14: the chain no longer contains it",
}


@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_each_tampering_is_detected(ctx, client, consumer, dataset, tmp_path, audit_key, db_url, data_dir,
                                    capsys, tampering):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=0.5))
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))
    pinned = _log(tmp_path)[-1]  # what an outsider pinned: seq 14
    assert pinned.seq == 14
    assert _verify(ctx, tmp_path, audit_key, [pinned])["valid"] is True
    TAMPERINGS[tampering](ctx, dataset)
    report = _verify(ctx, tmp_path, audit_key, [pinned])
    assert report["valid"] is False
    assert any(p.startswith(EXPECTED[tampering]) for p in _problems(report)), _problems(report)
    # the same from the command line, with the pinned line in a file and the public key on the command line
    pin = tmp_path / "pinned.jsonl"
    pin.write_text(pinned.line() + "\n")
    argv = ["labels", "verify-audit", "--database-url", db_url, "--data-dir", str(data_dir), "--pinned", str(pin),
            "--public-key", audit_key[1]]
    assert cli.main(argv) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and any(p.startswith(EXPECTED[tampering]) for p in _problems(out))


def test_without_a_pinned_head_the_facts_still_catch_a_wiped_dataset(ctx, client, consumer, dataset):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=0.5))
    _delete_everything(ctx, dataset)
    problems = _problems(audit_log.verify_audit(ctx))
    assert "the chain records no budget for the dataset" in problems
    assert "the database is behind the data directory's anchor (restored from an older backup)" in problems


def test_a_pinned_head_signed_by_another_key_is_refused(ctx, client, consumer, dataset, tmp_path, audit_key):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=0.5))
    other = signing.HeadSigner(signing.Ed25519PrivateKey.generate(), None)
    with ctx.sessions() as s:
        row = s.get(db.Dataset, dataset)
        fake = other.sign(dataset, row.ledger_seq, row.ledger_head)
    report = _verify(ctx, tmp_path, audit_key, [fake])
    assert _problems(report) == [f"pinned head at seq {fake.seq}: not signed by the audit key"]


@pytest.mark.parametrize("epsilon", [0.01, 0.02, 0.05, 0.1, 0.3, 0.7])
def test_no_false_alarm_on_honest_additive_releases(ctx, client, consumer, dataset, tmp_path, audit_key, epsilon):
    """Item 9: Laplace and staircase at ε 0.01 … 0.1 once made verify-audit exit 1 (a double against exact
    units); the comparison is now exact in integer units."""
    for mechanism in ("laplace", "staircase"):
        created(release(client, consumer, dataset, mechanism, mechanism=mechanism, epsilon=epsilon))
    created(release(client, consumer, dataset, "rr", mechanism="rr", epsilon=epsilon, example_ids=["e1", "e2"]))
    report = _verify(ctx, tmp_path, audit_key)
    assert report["valid"] is True, _problems(report)
    assert report["datasets"][0]["releases"] == 3


def test_a_recomputed_epsilon_is_compared_in_exact_units():
    assert within_charge(0.1, 100_000_000)  # 0.1000000000000000055… is the decimal 0.1
    assert within_charge(0.30000000000000004, 300_000_001)
    assert not within_charge(0.30000000000000004, 300_000_000)  # 0.1 + 0.2 as a double is not 0.3
    assert not within_charge(0.100000001, 100_000_000)
    assert not within_charge(float("nan"), 10**18) and not within_charge(float("inf"), 10**18)


def _a_budget_file(ctx, dataset, kind="spent"):
    with ctx.sessions() as s:
        account = s.execute(text("SELECT spent_file, classes_file FROM budget_accounts WHERE dataset_id = :d AND "
                                 "spent_file IS NOT NULL"), {"d": dataset}).one()
    return ctx.store.path(account.spent_file if kind == "spent" else account.classes_file)


@pytest.mark.parametrize("kind", ["spent", "classes"])
def test_a_truncated_budget_file_is_reported_not_raised(ctx, client, consumer, dataset, tmp_path, audit_key, kind):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=0.5))
    path = _a_budget_file(ctx, dataset, kind)
    path.write_bytes(path.read_bytes()[:70])
    report = _verify(ctx, tmp_path, audit_key)
    assert report["valid"] is False
    assert "publisher: its budget state file is missing or damaged" in _problems(report)


def test_damaged_release_files_are_503_and_reported(ctx, client, admin, consumer, dataset, tmp_path, audit_key):
    a = created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=0.5))
    b = created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))
    c = created(release(client, consumer, dataset, "c", mechanism="rr", epsilon=0.5, example_ids=["e1", "e2"]))
    good = client.get(f"/v1/releases/{c['id']}/labels", headers=consumer)
    assert good.status_code == 200 and good.text.count("\n") == 3
    with ctx.sessions() as s:
        files = {r.id: r.file for r in s.query(db.Release)}
        sealed = s.get(db.Release, a["id"])
        assert sealed.file_size == ctx.store.path(files[a["id"]]).stat().st_size and len(sealed.file_sha256) == 64
    truncated = ctx.store.path(files[a["id"]])
    truncated.write_bytes(truncated.read_bytes()[:100])
    same_size = ctx.store.path(files[b["id"]])  # one byte changed, the size kept: only the hash tells
    data = bytearray(same_size.read_bytes())
    data[len(data) // 2] ^= 0xFF
    same_size.write_bytes(bytes(data))
    ctx.store.path(files[c["id"]]).unlink()
    for release_id in (a["id"], b["id"], c["id"]):
        for accept in ("text/csv", "application/x-ndjson", "application/vnd.apache.parquet"):
            r = client.get(f"/v1/releases/{release_id}/labels", headers={**consumer, "Accept": accept})
            expect_error(r, 503, "release_file_damaged")
    expect_error(client.get(f"/v1/releases/{a['id']}/labels", headers={**consumer, "Accept": "application/json"}),
                 503, "release_file_damaged")  # a page of a truncated file: its size says so
    expect_error(client.get(f"/v1/releases/{c['id']}/labels", headers={**admin, "Accept": "application/json"}),
                 503, "release_file_damaged")
    problems = _problems(_verify(ctx, tmp_path, audit_key))
    assert f"release {a['id']}: its labels file is damaged (100 bytes, {sealed.file_size} recorded)" in problems
    assert any(p.startswith(f"release {b['id']}: its labels file is damaged") for p in problems)
    assert f"release {c['id']}: its labels file is missing" in problems
    spec = client.get("/openapi.json").json()
    assert "release_file_damaged" in spec["paths"]["/v1/releases/{release_id}/labels"]["get"]["responses"]["503"][
        "description"]


def test_a_damaged_coverage_file_is_reported(ctx, client, consumer, dataset, tmp_path, audit_key):
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5, example_ids=["e1", "e2", "e3"]))
    record = client.get("/v1/audit", params={"dataset": dataset}, headers={
        "Authorization": consumer["Authorization"]})  # a consumer: 403 (the audit is the owner's)
    assert record.status_code == 403
    with ctx.sessions() as s:
        coverage = json.loads(s.scalar(text("SELECT record FROM ledger WHERE release_id IS NOT NULL")))["coverage"]
    path = ctx.store.path(coverage["file"])
    path.write_bytes(path.read_bytes()[:90])
    problems = _problems(_verify(ctx, tmp_path, audit_key))
    assert any("coverage file" in p and "missing or damaged" in p for p in problems), problems


def test_key_facts_are_chained_and_checked(ctx, client, admin, consumer, dataset, tmp_path, audit_key):
    """The function the keys code calls: a revoked key is on the chain of every dataset its organization holds an
    account on, and the keys table must agree."""
    with ctx.sessions() as s, s.begin():
        key = s.query(db.ApiKey).join(db.Organization).filter(db.Organization.name == "publisher").one()
        key = s.query(db.ApiKey).join(db.Organization).filter(db.Organization.name == "publisher").one()
        prefix = key.prefix
    # the key commands' key ring, as `labeldp labels revoke-key` binds it
    keys = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)
    with ctx.sessions() as s, s.begin():
        keys.revoke(s, KeyRef(None, prefix), by="ops")
    facts = client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()["facts"]
    assert {k: facts[-1]["record"][k] for k in ("event", "change", "org", "role", "key_prefix", "revoked_by")} == {
        "event": "key", "change": "revoked", "org": "publisher", "role": "consumer", "key_prefix": prefix,
        "revoked_by": "ops"}
    assert _verify(ctx, tmp_path, audit_key)["valid"] is True
    _sql(ctx, "UPDATE api_keys SET revoked_at = :t WHERE prefix = :p", t=None, p=prefix)  # un-revoked by SQL
    assert f"key {prefix} is revoked in the chain but not in the keys table" in _problems(
        _verify(ctx, tmp_path, audit_key))
    with ctx.sessions() as s, s.begin():  # made and then revoked later: the chain names another time
        issued = keys.issue(s, "publisher", "consumer")
        keys.revoke(s, KeyRef(issued.info.id, None), by="ops")
        s.get(db.ApiKey, issued.info.id).revoked_at += timedelta(days=1)
    facts = client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()["facts"]
    assert [f["record"]["change"] for f in facts[-2:]] == ["created", "revoked"]
    assert any(f"key {issued.info.prefix} is revoked from" in p for p in _problems(_verify(ctx, tmp_path, audit_key)))


def test_audit_key_command(tmp_path, capsys):
    path = tmp_path / "k" / "audit.pem"
    assert cli.main(["labels", "audit-key", "--key-file", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"public_key", "key_id"} and len(out["public_key"]) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "PRIVATE" not in json.dumps(out)
    loaded = signing.load_key_file(path)
    assert signing.public_hex(loaded.public_key()) == out["public_key"]
    assert cli.main(["labels", "audit-key", "--key-file", str(path)]) == 2  # never overwritten
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err
    path.chmod(0o644)
    with pytest.raises(Exception, match="chmod 600"):
        signing.load_key_file(path)


def test_a_deployment_without_a_configured_key_signs_with_one_it_made(tmp_path, caplog):
    """No LABELDP_AUDIT_KEY_FILE: the first start makes a key under the data directory (0600, logged public key),
    a second start (and a command) uses the same key, never a new one, and the heads route signs with it."""
    with caplog.at_level("WARNING", logger="labeldp.labels"):
        plain = make_context(f"sqlite:///{tmp_path}/plain.sqlite", tmp_path / "plain")
    path = tmp_path / "plain" / "audit" / "audit-key.pem"
    public = signing.public_hex(plain.ledger.signer.public)
    assert path.stat().st_mode & 0o777 == 0o600 and public in caplog.text
    try:
        from fastapi.testclient import TestClient

        from labels_party.http.api import create_app
        with plain.sessions() as s, s.begin():
            key = create_key(plain.ledger, s, "hospital", "admin")
        with TestClient(create_app(plain)) as client:
            response = client.get("/v1/audit/heads", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200
    finally:
        plain.close()
    caplog.clear()
    again = make_context(f"sqlite:///{tmp_path}/plain.sqlite", tmp_path / "plain")
    try:
        assert signing.public_hex(again.ledger.signer.public) == public and "made the audit key" not in caplog.text
    finally:
        again.close()


def test_a_command_without_the_deployments_audit_key_is_refused_and_changes_nothing(
        ctx, client, consumer, dataset, db_url, data_dir, tmp_path, audit_key, monkeypatch, capsys):
    """Issue 40's sixth review: ``create-key`` run without LABELDP_AUDIT_KEY_FILE (the deployment keeps its key
    elsewhere) made a second key under the data directory and signed with it: verify-audit reported the key facts
    as unsigned for good and the new key answered 401. The data directory records its signer; another is refused."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    for name in [n for n in os.environ if n.startswith("LABELDP_")]:
        monkeypatch.delenv(name)
    before = _verify(ctx, tmp_path, audit_key)
    code = cli.main(["labels", "create-key", "--database-url", db_url, "--data-dir", str(data_dir), "--org",
                     "publisher", "--role", "consumer", "--json"])
    out = capsys.readouterr()
    assert code != 0 and out.out == "" and f"signed by the audit key {audit_key[1][:16]}" in out.err
    assert not (data_dir / "audit" / "audit-key.pem").exists()
    assert before["valid"] and _verify(ctx, tmp_path, audit_key) == before
    other = tmp_path / "other.pem"
    signing.create_key_file(other)
    monkeypatch.setenv("LABELDP_AUDIT_KEY_FILE", str(other))
    assert cli.main(["labels", "create-key", "--database-url", db_url, "--data-dir", str(data_dir), "--org",
                     "publisher", "--role", "consumer"]) != 0  # another key named: refused too
    monkeypatch.setenv("LABELDP_AUDIT_KEY_FILE", str(audit_key[0]))
    assert cli.main(["labels", "create-key", "--database-url", db_url, "--data-dir", str(data_dir), "--org",
                     "publisher", "--role", "consumer"]) == 0
    assert _verify(ctx, tmp_path, audit_key)["valid"]


@pytest.mark.parametrize("record", ["gone (a deployment from before the record)", "empty (a crash)"])
def test_a_data_directory_signed_before_makes_no_new_key_whatever_its_record(
        ctx, client, consumer, dataset, db_url, data_dir, tmp_path, audit_key, monkeypatch, record):
    """Issue 40's seventh review: without a record (a deployment from before it, whose key is elsewhere) the first
    command run without LABELDP_AUDIT_KEY_FILE made and recorded a key of its own — the service was then refused
    for good — and an empty record (a crash mid-write) read as none. Signed accounts without the key are refused;
    a record that is not a public key is refused."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    signer = data_dir / "audit-signer"
    if record.startswith("gone"):
        signer.unlink()
    else:
        signer.write_text("")
    for name in [n for n in os.environ if n.startswith("LABELDP_")]:
        monkeypatch.delenv(name)
    with pytest.raises(Exception) as refused:
        make_context(settings=LabelsSettings(database_url=db_url, data_dir=data_dir))
    assert getattr(refused.value, "code", None) == "audit_key_mismatch", refused.value
    assert not (data_dir / "audit" / "audit-key.pem").exists()
    if record.startswith("gone"):  # the deployment's own key records itself
        again = make_context(settings=LabelsSettings(database_url=db_url, data_dir=data_dir,
                                                     audit_key_file=audit_key[0], audit_log_dir=tmp_path / "audit"))
        again.close()
        assert signer.read_text().strip() == audit_key[1]


def _move_after(ctx, dataset, release_id: str, fact_seq: int) -> None:
    """Forge the chain so that ``release_id``'s record comes right after the fact at ``fact_seq`` (dated just after
    it), everything re-numbered and re-chained: a consistent chain in which a key charged after its revocation."""
    with ctx.sessions() as s, s.begin():
        rows = s.execute(text("SELECT id, seq, record, release_id FROM ledger WHERE dataset_id = :d ORDER BY seq"),
                         {"d": dataset}).all()
        records = [(json.loads(r.record), r.release_id) for r in rows]
        moved = next(i for i, (record, _) in enumerate(records) if record.get("release_id") == release_id)
        record, name = records.pop(moved)
        fact = next(i for i, (r, _) in enumerate(records) if r["seq"] == fact_seq)
        record["created_at"] = (datetime.fromisoformat(records[fact][0]["created_at"])
                                + timedelta(seconds=1)).isoformat()
        records.insert(fact + 1, (record, name))
        head = "0" * 64
        for row, (record, name) in zip(rows, records, strict=True):
            record["seq"] = row.seq
            record_json = canonical(record)
            digest = chain_hash(head, record_json)
            s.execute(text("UPDATE ledger SET record = :r, release_id = :n, prev_hash = :p, hash = :h WHERE id = :id"),
                      {"r": record_json, "n": name, "p": head, "h": digest, "id": row.id})
            head = digest
        s.execute(text("UPDATE datasets SET ledger_head = :h WHERE id = :d"), {"h": head, "d": dataset})


def test_a_release_charged_by_a_key_after_its_revocation_is_flagged(ctx, client, admin, consumer, keys, dataset,
                                                                     tmp_path, audit_key):
    """Each record names the key that asked (its id and public prefix, never its secret); verify-audit flags a
    record that follows its key's revocation fact on the chain — but not one charged during a rotation's grace."""
    keyring = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)
    first = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    events = client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()["events"]
    prefix = keys["consumer"].split("_")[1]
    assert events[-1]["record"]["actor"]["key_prefix"] == prefix
    assert keys["consumer"] not in json.dumps(events[-1]["record"])
    # a rotation with a grace period: the old key still charges until it ends — after the revocation's fact
    with ctx.sessions() as s, s.begin():
        new, _old = keyring.rotate(s, KeyRef(None, prefix), by="ops", grace=timedelta(hours=1))
    in_grace = created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))
    created(release(client, {"Authorization": f"Bearer {new.secret}"}, dataset, "c", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s, s.begin():  # the grace ended early: from now on the old key is refused
        keyring.revoke(s, KeyRef(None, prefix), by="ops")
    expect_error(release(client, consumer, dataset, "d", mechanism="rr", epsilon=0.5), 401, "unauthorized")
    chain = client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()
    assert [e["record"]["release_id"] for e in chain["events"]][:2] == [first["id"], in_grace["id"]]
    revocation = chain["facts"][-1]["record"]
    assert (revocation["change"], revocation["key_prefix"]) == ("revoked", prefix)
    assert _verify(ctx, tmp_path, audit_key, pinned=[])["valid"] is True  # honest: nothing after its revocation
    _move_after(ctx, dataset, first["id"], revocation["seq"])
    problems = _problems(_verify(ctx, tmp_path, audit_key, pinned=[]))
    assert f"seq {revocation['seq']}: key {prefix} charged release {first['id']} after its revocation at seq " \
           f"{revocation['seq'] - 1}" in problems, problems
    assert not any(in_grace["id"] in p for p in problems)  # charged in the grace: still no problem
DAMAGED_RECORDS = {"not_json": "notjson", "a_list": "[1,2]",
                   "a_release_without_its_charge": '{"event":"label_release","release_id":"x"}'}


@pytest.mark.parametrize("damage", sorted(DAMAGED_RECORDS))
def test_a_damaged_ledger_row_is_reported_and_the_other_datasets_still_verified(
        ctx, client, admin, consumer, dataset, dataset_small, tmp_path, audit_key, db_url, data_dir, capsys, damage):
    """The hostile review: one ledger row's record set to something unreadable crashed verify-audit ("internal
    error: JSONDecodeError", an AttributeError, a KeyError 'charge') with no report for any dataset. Now the row is
    that dataset's problem, named by its seq, and every other dataset is still verified."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    created(release(client, admin, dataset_small, "s", mechanism="rr", epsilon=0.25))
    with ctx.sessions() as s:
        seq = s.scalar(text("SELECT seq FROM ledger WHERE dataset_id = :d AND release_id IS NOT NULL"), {"d": dataset})
        rows = s.scalar(text("SELECT count(*) FROM ledger WHERE dataset_id = :d"), {"d": dataset})
    _sql(ctx, "UPDATE ledger SET record = :r WHERE dataset_id = :d AND seq = :s", r=DAMAGED_RECORDS[damage],
         d=dataset, s=seq)
    for report in (_verify(ctx, tmp_path, audit_key), None):
        if report is None:  # the same from the command line
            assert cli.main(["labels", "verify-audit", "--database-url", db_url, "--data-dir", str(data_dir),
                             "--public-key", audit_key[1], "--heads-log",
                             str(tmp_path / "audit" / signing.LOG_NAME)]) == 1
            report = json.loads(capsys.readouterr().out)
        by_id = {d["dataset_id"]: d for d in report["datasets"]}
        assert report["valid"] is False and set(by_id) == {dataset, dataset_small}
        damaged = [p for p in by_id[dataset]["problems"] if p.startswith(f"seq {seq}: record damaged: ")]
        assert len(damaged) == 1 and "Traceback" not in damaged[0], by_id[dataset]["problems"]
        assert by_id[dataset]["entries"] == rows >= seq  # every row is counted, the damaged one too
        assert by_id[dataset_small]["problems"] == [] and by_id[dataset_small]["releases"] == 1
