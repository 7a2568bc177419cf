"""Schema migrations (labels_party/store/migrations, Alembic) on SQLite and PostgreSQL: a fresh database is built at the
head revision; a database from before exact accounting is refused until upgraded, and the upgrade converts its
float budgets to units (never resetting them), moves descriptions into mechanism documents, scopes idempotency keys
per organization — and leaves the same schema a fresh database has."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, select, text

from labels_party.http.audit import verify_audit
from labels_party.ledger import canonical, chain_hash, documents, entries
from labels_party.runtime.context import make_context
from labels_party.store import db
from labels_party.store.migrations import MIGRATIONS
from labels_party.store.storage import DataStore
from shared.errors import LabelDPError
from shared.service.keys import hash_key

HEAD = "0022"  # the newest migration in labels_party/store/migrations/versions

def _schema(url: str) -> dict:
    """Columns (nullability, type family), unique column sets and foreign keys of every table."""
    engine = db.make_engine(url)
    inspector = inspect(engine)
    schema = {}
    for table in inspector.get_table_names():
        if table == "alembic_version":
            continue
        columns = {c["name"]: (c["nullable"], type(c["type"]).__name__.upper()[:3])
                   for c in inspector.get_columns(table)}
        uniques = {frozenset(u["column_names"]) for u in inspector.get_unique_constraints(table)}
        uniques |= {frozenset(i["column_names"]) for i in inspector.get_indexes(table) if i.get("unique")}
        keys = {(tuple(f["constrained_columns"]), f["referred_table"]) for f in inspector.get_foreign_keys(table)}
        schema[table] = (columns, uniques, keys)
    engine.dispose()
    return schema


def _legacy_database(url: str, data_dir) -> dict:
    """A database at revision 0001 with what the service wrote before exact accounting: float budgets (a float sum
    of 2856 charges of 0.001), a release whose description holds its arrays, a float spent vector file and a
    hash-chained ledger record with a float charge."""
    engine = db.make_engine(url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0001")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'owner', :t), "
                                "(2, 'publisher', :t)"), {"t": db.utcnow()})
        store = DataStore(data_dir)
        spent = store.write_array("datasets/d1/spent_00000001.npy", np.array([2.8559999999997965, 0.0]))
        coverage = np.array([0], dtype=np.int64)
        coverage_file = store.write_array("datasets/d1/coverage_00000001.npy", coverage)
        record = {"seq": 1, "dataset_id": "d1", "release_id": "r1", "charge": 2.8559999999997965,
                  "coverage": {"file": coverage_file, "sha256": hashlib.sha256(coverage.tobytes()).hexdigest()},
                  "dp_event": {"type": "LocalRandomizerDpEvent", "mechanism": "rr", "epsilon": 2.85}}
        record_json = canonical(record)
        digest = chain_hash("0" * 64, record_json)
        connection.execute(text(
            "INSERT INTO datasets (id, owner_org_id, name, label_kind, domain_json, epsilon_total, epsilon_spent, "
            "allow_central_training, label_version, num_examples, registry_size, spent_file, ledger_seq, "
            "ledger_head, created_at) VALUES ('d1', 1, 'weeks', 'integer', :domain, 3.0, 2.8559999999997965, "
            ":false, 0, 2, 2, :spent, 1, :head, :t)"),
            {"domain": json.dumps({"kind": "integer", "min": 0, "max": 9}), "spent": spent, "head": digest,
             "t": db.utcnow(), "false": False})
        description = {"mechanism": "rr", "epsilon": 2.856, "output_values": [0.0, 1.0, 2.0],
                       "parameters": {"num_labels": 10, "matrix": [[1, 2], [3, 4]]}}
        connection.execute(text(
            "INSERT INTO releases (id, dataset_id, requester_org_id, idempotency_key, body_hash, mechanism, "
            "epsilon, certified_epsilon, prior_epsilon, randomizer_epsilon, num_examples, label_version, "
            "description_json, prior_json, file, created_at) VALUES ('r1', 'd1', 2, 'key', 'h', 'rr', "
            "2.856, 2.85, 0.0, 2.856, 1, 0, :description, NULL, 'releases/r1.parquet', :t)"),
            {"description": json.dumps(description), "t": db.utcnow()})
        connection.execute(text("INSERT INTO ledger (dataset_id, seq, release_id, record, prev_hash, hash, "
                                "created_at) VALUES ('d1', 1, 'r1', :record, :prev, :hash, :t)"),
                           {"record": record_json, "prev": "0" * 64, "hash": digest, "t": db.utcnow()})
    engine.dispose()
    return description


def test_a_fresh_database_is_built_at_head(database_url, tmp_path):
    ctx = make_context(database_url, tmp_path / "data")
    with ctx.sessions() as session:
        assert MIGRATIONS.current(session.connection()) == MIGRATIONS.head() == HEAD


def test_an_old_database_is_refused_then_upgraded_without_losing_a_budget(database_url, tmp_path):
    description = _legacy_database(database_url, tmp_path / "data")
    with pytest.raises(LabelDPError) as refused:
        make_context(database_url, tmp_path / "data")
    assert refused.value.code == "database_outdated" and "upgrade-db" in str(refused.value)

    ctx = make_context(database_url, tmp_path / "data", upgrade=True)
    with ctx.sessions() as session, session.begin():
        dataset = session.get(db.Dataset, "d1")
        assert dataset.epsilon_total_units == 3_000_000_000
        assert dataset.epsilon_spent_units == 2_856_000_000  # the float sum's noise shed, then rounded up
        # the per-organization accounts were rebuilt from the record alone: the publisher's release is its own,
        # and its allocation is what it spent; the owner holds the rest
        accounts = {a.org_id: a for a in session.query(db.BudgetAccount).filter_by(dataset_id="d1")}
        assert {org: (a.spent_max_units, a.epsilon_units) for org, a in accounts.items()} == {
            1: (0, 144_000_000), 2: (2_856_000_000, 2_856_000_000)}
        spent, sizes = ctx.ledger.spent_classes(accounts[2], dataset.registry_size)
        assert dict(zip(spent.tolist(), sizes.tolist(), strict=True)) == {2_856_000_000: 1, 0: 1}
        assert not list((tmp_path / "data" / "datasets" / "d1").glob("spent_*.npy"))  # the old state is gone
        release = session.get(db.Release, "r1")
        assert release.charge_units == 2_856_000_000
        document = documents.unpack(session.get(db.MechanismDocument, release.mechanism_hash).body)
        assert document == {"description": description, "noisy_prior": None}  # arrays kept, once
        assert documents.address(document) == release.mechanism_hash
        assert json.loads(release.description_json) == {"mechanism": "rr", "epsilon": 2.856,
                                                        "parameters": {"num_labels": 10}}
        # idempotency keys are now per organization: the owner may use the publisher's key
        session.add(db.Release(id="r2", dataset_id="d1", requester_org_id=1, idempotency_key="key", body_hash="h",
                               mechanism="rr", epsilon=0.1, charge_units=100_000_000, certified_epsilon=0.1,
                               prior_epsilon=0.0, randomizer_epsilon=0.1, num_examples=0, label_version=0,
                               description_json="{}", mechanism_hash=release.mechanism_hash, file="f"))
    report = verify_audit(ctx)["datasets"][0]
    assert report["epsilon_spent"] == 2.856
    # only the row this test added, and the legacy release whose file this test never wrote: the chain's facts
    # (0010's, then the rebuilt allocations) agree with the tables
    assert report["problems"] == ["release r2 is not in the chain",
                                  "release r1: its file's size and hash were never recorded",
                                  "release r2: its file's size and hash were never recorded"]
    with ctx.sessions() as session:
        events = [e.record.get("event", "label_release") for e in entries(session, "d1")]
    assert events == ["label_release", "dataset_budget", "allocation",  # migration 0010, once (the owner's account)
                      "owner",  # migration 0019
                      "domain", "release_summary",  # migration 0022 (r1 is available: its summary as its row says)
                      "dataset_budget", "allocation", "allocation"]  # the accounts rebuilt at the first start
    fresh = tmp_path / "fresh.sqlite"
    make_context(f"sqlite:///{fresh}", tmp_path / "fresh-data")
    assert _schema(database_url) == _schema(f"sqlite:///{fresh}") or database_url.startswith("postgresql")
    migrated, built = _schema(database_url), _schema(f"sqlite:///{fresh}")
    assert {t: (set(c), u, k) for t, (c, u, k) in migrated.items()} == \
        {t: (set(c), u, k) for t, (c, u, k) in built.items()}


def test_upgrade_db_command(tmp_path):
    url = f"sqlite:///{tmp_path}/old.sqlite"
    _legacy_database(url, tmp_path / "data")
    done = subprocess.run([sys.executable, "-m", "labeldp", "labels", "upgrade-db", "--database-url", url,
                           "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"revision_before": "0001", "revision_after": HEAD, "keys_not_certified": []}
    again = subprocess.run([sys.executable, "-m", "labeldp", "labels", "upgrade-db", "--database-url", url],
                           capture_output=True, text=True, timeout=120)
    assert json.loads(again.stdout) == {"revision_before": HEAD, "revision_after": HEAD, "keys_not_certified": []}
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT epsilon_total_units FROM datasets")).scalar() == 3_000_000_000


OLD_KEY = "ldp_0000000a_owner"  # the owner's admin key in the old-layout database (made before it)


def _old_layout_dataset(url: str, data_dir) -> None:
    """A database at revision 0008 holding a dataset in the layout before label versions carried their ids: a
    registry file (ids by row number) and two versions of ``registry_index, label`` with neither ranges nor
    coverage sets. Version 1 introduced a, b, c; version 2 dropped b and introduced d, e."""
    engine = db.make_engine(url)
    store = DataStore(data_dir)
    registry = store.write_table("datasets/d1/registry.parquet", pa.table({"example_id": ["a", "b", "c", "d", "e"]}))
    def old_version(name: str, index: list[int], labels: list[float]) -> str:
        return store.write_table(f"datasets/d1/{name}.parquet", pa.table(
            {"registry_index": pa.array(index, pa.int64()), "label": labels}))

    v1 = old_version("labels_v1", [0, 1, 2], [1.0, 2.0, 3.0])
    v2 = old_version("labels_v2", [0, 2, 3, 4], [4.0, 5.0, 6.0, 7.0])
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0008")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'owner', :t)"),
                           {"t": db.utcnow()})
        connection.execute(text(
            "INSERT INTO datasets (id, owner_org_id, name, label_kind, domain_json, epsilon_total_units, "
            "epsilon_spent_units, delta_total, allow_central_training, label_version, num_examples, registry_file, "
            "registry_size, ledger_seq, ledger_head, created_at) VALUES ('d1', 1, 'weeks', 'integer', :domain, "
            "100000000000, 0, 0, :false, 2, 4, :registry, 5, 0, :head, :t)"),
            {"domain": json.dumps({"kind": "integer", "min": 0, "max": 9}), "registry": registry, "head": "0" * 64,
             "t": db.utcnow(), "false": False})
        connection.execute(text(
            "INSERT INTO budget_accounts (dataset_id, org_id, epsilon_units, delta, generation, spent_max_units, "
            "needs_rebuild, created_at) VALUES ('d1', 1, 100000000000, 0, 0, 0, :false, :t)"),
            {"t": db.utcnow(), "false": False})
        connection.execute(text("INSERT INTO api_keys (id, org_id, role, key_hash, prefix, revoked, created_at) "
                                "VALUES (1, 1, 'admin', :h, '0000000a', :false, :t)"),
                           {"h": hash_key(OLD_KEY), "false": False, "t": db.utcnow()})
        for version, file, rows in ((1, v1, 3), (2, v2, 4)):
            connection.execute(text(
                "INSERT INTO label_versions (dataset_id, version, file, num_examples, clipped_below, clipped_above, "
                "created_at) VALUES ('d1', :v, :f, :n, 0, 0, :t)"), {"v": version, "f": file, "n": rows,
                                                                     "t": db.utcnow()})
    engine.dispose()


def test_old_label_versions_are_rewritten_once_into_the_one_layout(database_url, tmp_path):
    """Migration 0009: each old version gets its ids, its registry range and its coverage set; the registry file
    goes. Releases by id and of the whole version then read the labels the versions held, and a new upload keeps
    every known id's index (its budget)."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.store.labelstore import read_coverage
    from tests.labels_party.api.helpers import download_rows

    data = tmp_path / "data"
    _old_layout_dataset(database_url, data)
    ctx = make_context(database_url, data, upgrade=True)
    with ctx.sessions() as session:
        versions = {v.version: v for v in session.query(db.LabelVersion).filter_by(dataset_id="d1")}
        assert {k: (v.registry_start, v.registry_end) for k, v in versions.items()} == {1: (0, 3), 2: (3, 5)}
        version2 = ctx.store.read_table(versions[2].file).to_pydict()
        assert version2 == {"registry_index": [0, 2, 3, 4], "example_id": ["a", "c", "d", "e"],
                            "label": [4.0, 5.0, 6.0, 7.0]}
        coverage = read_coverage(ctx.store, versions[2].coverage_file, versions[2].coverage_sha256, 4)
        assert np.asarray(coverage.slice(0, 4)).tolist() == [0, 2, 3, 4]
        assert hashlib.sha256(np.array([0, 2, 3, 4], np.int64).tobytes()).hexdigest() == versions[2].coverage_sha256
        assert "registry_file" not in {c["name"] for c in inspect(session.connection()).get_columns("datasets")}
    key = OLD_KEY  # on the chain since migration 0016
    client = TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})
    chosen = client.post("/v1/datasets/d1/releases", headers={"Idempotency-Key": "ids"},
                         json={"mechanism": "rr", "epsilon": 30, "example_ids": ["e", "a"]})
    assert chosen.status_code == 201, chosen.text
    # ε = 30: RR keeps each label but with probability below 10⁻¹¹
    assert download_rows(client, {}, chosen.json()["id"]) == [("e", 7.0), ("a", 4.0)]
    whole = client.post("/v1/datasets/d1/releases", headers={"Idempotency-Key": "all"},
                        json={"mechanism": "rr", "epsilon": 1})
    assert whole.status_code == 201 and whole.json()["num_examples"] == 4
    upload = client.put("/v1/datasets/d1/labels", content="example_id,label\ne,1\nb,2\nf,3\n",
                        headers={"Content-Type": "text/csv"})
    assert upload.status_code == 200 and upload.json()["new_examples"] == 1, upload.text
    with ctx.sessions() as session:
        version3 = ctx.store.read_table(session.query(db.LabelVersion).filter_by(dataset_id="d1", version=3)
                                        .one().file).to_pydict()
    assert dict(zip(version3["example_id"], version3["registry_index"], strict=True)) == {"b": 1, "e": 4, "f": 5}
    assert verify_audit(ctx)["valid"]


def test_an_old_layout_whose_registry_lacks_ids_is_refused_and_changes_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/old.sqlite"
    data = tmp_path / "data"
    _old_layout_dataset(url, data)
    DataStore(data).write_table("datasets/d1/registry.parquet", pa.table({"example_id": ["a", "b", "c", "d"]}))
    with pytest.raises(LabelDPError) as refused:
        make_context(url, data, upgrade=True)
    assert refused.value.code == "database_outdated" and "beyond its registry" in str(refused.value)
    engine = create_engine(url)
    with engine.connect() as connection:
        assert MIGRATIONS.current(connection) == "0008"
        assert connection.execute(text("SELECT registry_file FROM datasets")).scalar() is not None
    engine.dispose()



def _chain(connection, data_dir, dataset_id: str, releases: list[str], facts: list[dict] = ()) -> None:
    """Give a hand-made dataset the chain the service would have written: a legacy record per release (charged
    1 ε each), then ``facts``; its head on the row and anchored in ``data_dir`` — the service refuses tables that
    disagree with their chain (labels_party/ledger/agreement.py)."""
    head, seq = "0" * 64, 0
    records = [{"seq": 0, "dataset_id": dataset_id, "release_id": r, "charge_units": 1_000_000_000, "delta": 0.0}
               for r in releases] + [{"seq": 0, "dataset_id": dataset_id, **f} for f in facts]
    for record in records:
        seq += 1
        body = canonical({**record, "seq": seq})
        digest = chain_hash(head, body)
        connection.execute(text("INSERT INTO ledger (dataset_id, seq, release_id, record, prev_hash, hash, created_at) "
                                "VALUES (:d, :s, :r, :b, :p, :h, :t)"),
                           {"d": dataset_id, "s": seq, "r": record.get("release_id"), "b": body, "p": head,
                            "h": digest, "t": db.utcnow()})
        head = digest
    connection.execute(text("UPDATE datasets SET ledger_seq = :s, ledger_head = :h WHERE id = :d"),
                       {"s": seq, "h": head, "d": dataset_id})
    (data_dir / "anchors").mkdir(parents=True, exist_ok=True)
    (data_dir / "anchors" / f"{dataset_id}.json").write_text(json.dumps(
        {"seq": seq, "head": head, "previous_seq": seq, "previous_head": head}))


def test_stored_documents_are_packed_once_and_old_group_documents_become_columnar(database_url, tmp_path):
    """Migration 0012: every JSON document is stored packed under the same address; an old group release's document
    (each group listing its whole randomizer and prior) takes the columnar shape under its new address, and its
    release points at it. Runtime ~1 s."""
    grid = [0.0, 1.0, 2.0]
    matrix = [[9007199254740992, 0, 0]] * 3  # RR-Top-1 as the old finite randomizer: always class 0

    def group(name, counts):
        return {"group": name, "examples": 1, "certified_epsilon": 0.5,
                "mechanism": {"mechanism": "rr-with-prior", "input_values": grid, "output_values": grid,
                              "matrix_counts_over_2_53": matrix, "certified_epsilon": 0.0},
                "noisy_prior": {"weights": [1.0, 0.0, 0.0], "noisy_counts": counts, "epsilon": 0.5,
                                "certified_epsilon": 0.5, "noise": "discrete-laplace", "scale": 4.0}}

    old_groups = {"description": {"mechanism": "rr-with-prior", "group_priors": True, "num_groups": 2,
                                  "groups": [group("a", [3, -1, 0]), group("b", [5, 0, -2])]}, "noisy_prior": None}
    plain = {"description": {"mechanism": "rr", "output_values": grid, "parameters": {"num_labels": 3}},
             "noisy_prior": None}
    engine = db.make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0009")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'owner', :t)"),
                           {"t": db.utcnow()})
        connection.execute(text(
            "INSERT INTO datasets (id, owner_org_id, name, label_kind, domain_json, epsilon_total_units, "
            "epsilon_spent_units, delta_total, allow_central_training, label_version, num_examples, "
            "registry_size, ledger_seq, ledger_head, created_at) VALUES ('d1', 1, 'c', 'classes', :domain, "
            "1000000000, 0, 0, :false, 0, 0, 0, 0, :head, :t)"),
            {"domain": json.dumps({"kind": "classes", "num_classes": 3}), "head": "0" * 64, "t": db.utcnow(),
             "false": False})
        for release_id, document in (("r1", old_groups), ("r2", plain)):
            digest = hashlib.sha256(canonical(document).encode()).hexdigest()
            connection.execute(text("INSERT INTO mechanism_documents (hash, document, created_at) "
                                    "VALUES (:h, :d, :t)"), {"h": digest, "d": canonical(document), "t": db.utcnow()})
            connection.execute(text(
                "INSERT INTO releases (id, dataset_id, requester_org_id, idempotency_key, body_hash, mechanism, "
                "epsilon, charge_units, certified_epsilon, prior_epsilon, randomizer_epsilon, num_examples, "
                "label_version, description_json, file, mechanism_hash, state, created_at) VALUES (:id, 'd1', 1, "
                ":id, 'h', 'rr', 1.0, 1000000000, 0.5, 0.5, 0.5, 2, 0, '{}', 'f', :h, 'available', :t)"),
                {"id": release_id, "h": digest, "t": db.utcnow()})
        _chain(connection, tmp_path / "data", "d1", ["r1", "r2"])  # 0010 adds the facts
    engine.dispose()
    ctx = make_context(database_url, tmp_path / "data", upgrade=True)
    with ctx.sessions() as session:
        stored = {r.id: (r.mechanism_hash, json.loads(r.description_json)) for r in session.query(db.Release)}
        unpacked = {r: documents.unpack(session.get(db.MechanismDocument, h).body) for r, (h, _) in stored.items()}
        assert session.query(db.MechanismDocument).count() == 2  # the old group document is gone
    assert unpacked["r2"] == plain and stored["r2"][0] == documents.address(plain)  # same content, same address
    columnar = unpacked["r1"]["description"]
    assert stored["r1"][0] == documents.address(unpacked["r1"]) != documents.address(old_groups)
    assert columnar["grid"] == grid and columnar["mechanisms"] == [
        {"mechanism": "rr-with-prior", "matrix_counts_over_2_53": matrix, "certified_epsilon": 0.0}]  # once
    assert columnar["groups"] == {"group": ["a", "b"], "examples": [1, 1], "certified_epsilon": [0.5, 0.5],
                                  "mechanism": [0, 0], "noisy_counts": [[3, -1, 0], [5, 0, -2]]}
    assert columnar["noisy_prior"]["scale"] == 4.0 and "max(noisy_counts, 0)" in columnar["noisy_prior"]["weights"]
    assert stored["r1"][1]["num_groups"] == 2 and "groups" in stored["r1"][1]  # the summary, recomputed


def test_keys_flagged_revoked_before_revocations_were_recorded_stay_revoked(database_url, tmp_path):
    """Migration 0011: the ``revoked`` flag becomes a revocation time and who (a note: its time was never kept);
    the flagged key is revoked, the other one is not, and neither expires. Neither is on a chain (their
    organization holds no account), so the upgrade to key certificates (0019) certifies neither: both refused."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from shared.service.keys import hash_key

    engine = db.make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0009")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'owner', :t)"),
                           {"t": db.utcnow()})
        for id_, key, revoked in ((1, "ldp_0000000a_kept", False), (2, "ldp_0000000b_flagged", True)):
            connection.execute(text("INSERT INTO api_keys (id, org_id, role, key_hash, prefix, revoked, created_at) "
                                    "VALUES (:i, 1, 'admin', :h, :p, :r, :t)"),
                               {"i": id_, "h": hash_key(key), "p": key.split("_")[1], "r": revoked, "t": db.utcnow()})
    engine.dispose()
    before = db.utcnow()
    ctx = make_context(database_url, tmp_path / "data", upgrade=True)
    with ctx.sessions() as session:
        keys = {k.id: k for k in session.query(db.ApiKey)}
        assert (keys[1].revoked_at, keys[1].revoked_by, keys[1].expires_at) == (None, None, None)
        assert before - timedelta(seconds=1) <= keys[2].revoked_at <= db.utcnow()
        assert "before migration 0011" in keys[2].revoked_by and keys[2].status(db.utcnow()) == "revoked"
        assert "revoked" not in {c["name"] for c in inspect(session.connection()).get_columns("api_keys")}
        assert [k.certificate for k in keys.values()] == [None, None]
    client = TestClient(create_app(ctx))
    assert client.get("/v1/datasets", headers={"Authorization": "Bearer ldp_0000000a_kept"}).status_code == 401
    assert client.get("/v1/datasets", headers={"Authorization": "Bearer ldp_0000000b_flagged"}).status_code == 401


def test_pickled_source_jobs_are_retired_and_their_files_deleted(database_url, tmp_path):
    """Migration 0013: source releases left running or failed with a pickled job file (it held their secret in
    plain bytes) become failed with job_format_retired — charged, never run again, and re-sending them says so —
    a running one without a job file is failed like any interrupted release, and every pickle goes. Without the data
    directory the upgrade is refused and changes nothing; existing datasets become ready."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.releases.kinds import LabelRelease
    from labels_party.releases.transaction import body_hash_of
    from shared import schemas

    data = tmp_path / "data"
    jobs = data / "jobs"
    jobs.mkdir(parents=True)
    request = schemas.ReleaseRequest(mechanism="rr", epsilon=1)
    engine = db.make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0012")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'owner', :t)"),
                           {"t": db.utcnow()})
        connection.execute(text(
            "INSERT INTO datasets (id, owner_org_id, name, label_kind, domain_json, epsilon_total_units, "
            "epsilon_spent_units, delta_total, allow_central_training, label_version, num_examples, registry_size, "
            "ledger_seq, ledger_head, source_uri, created_at) VALUES ('d1', 1, 'weeks', 'integer', :domain, "
            "5000000000, 0, 0, :false, 0, 10, 10, 0, :head, '/somewhere/weeks', :t)"),
            {"domain": json.dumps({"kind": "integer", "min": 0, "max": 9}), "head": "0" * 64, "t": db.utcnow(),
             "false": False})
        for release_id, state in (("running", "running"), ("failed", "failed"), ("orphan", "running"),
                                  ("early", "failed"), ("done", "available")):
            connection.execute(text(
                "INSERT INTO releases (id, dataset_id, requester_org_id, idempotency_key, body_hash, mechanism, "
                "epsilon, charge_units, certified_epsilon, prior_epsilon, randomizer_epsilon, num_examples, "
                "label_version, description_json, file, state, error_json, created_at) VALUES (:id, 'd1', 1, :id, "
                ":body, 'rr', 1.0, 1000000000, NULL, 0, 1.0, 10, 0, '{}', :file, :state, :error, :t)"),
                {"id": release_id, "body": body_hash_of(LabelRelease(request)), "file": f"releases/{release_id}",
                 "state": state, "t": db.utcnow(),
                 "error": json.dumps({"code": "release_failed", "message": "old"}) if state == "failed" else None})
        _chain(connection, data, "d1", ["running", "failed", "orphan", "early", "done"],
               [{"event": "dataset_budget", "change": "migrated", "epsilon_total_units": 5_000_000_000,
                 "delta_total": 0.0, "created_at": "2026-01-01T00:00:00+00:00"}])
    engine.dispose()
    secret = bytes(range(32))
    for name in ("running.pickle", "failed.pickle", "unknown.pickle", f".done.pickle.{'0' * 32}.tmp"):
        (jobs / name).write_bytes(b"cloudpickle of a sampler and " + secret)
    with pytest.raises(LabelDPError) as refused:
        MIGRATIONS.prepare(db.make_engine(database_url), upgrade=True)  # no data directory given
    assert refused.value.code == "database_outdated" and "--data-dir" in str(refused.value)
    engine = db.make_engine(database_url)
    with engine.connect() as connection:
        assert MIGRATIONS.current(connection) == "0012"
    engine.dispose()
    assert len(list(jobs.iterdir())) == 4

    ctx = make_context(database_url, data, upgrade=True)
    with ctx.sessions() as session, session.begin():
        releases = {r.id: (r.state, json.loads(r.error_json)["code"] if r.error_json else None)
                    for r in session.query(db.Release)}
        assert releases == {"running": ("failed", "job_format_retired"), "failed": ("failed", "job_format_retired"),
                            "orphan": ("failed", "release_failed"), "early": ("failed", "release_failed"),
                            "done": ("available", None)}
        assert session.get(db.Dataset, "d1").state == "ready"
        assert session.query(db.Job).count() == 0
        key = create_key(ctx.ledger, session, "owner", "admin")
    assert not jobs.exists()  # every pickle deleted, and the directory
    client = TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})
    again = client.post("/v1/datasets/d1/releases", headers={"Idempotency-Key": "running"},
                        json=request.model_dump(exclude_none=True))
    assert again.status_code == 503 and again.json()["error"]["code"] == "job_format_retired", again.text
    early = client.post("/v1/datasets/d1/releases", headers={"Idempotency-Key": "early"},
                        json=request.model_dump(exclude_none=True))
    assert early.status_code == 503 and early.json()["error"]["code"] == "release_failed", early.text


def _granted_dataset(database: str, data):
    """A service with 200 labels of a dataset its owner (hospital) granted publisher ε 2 on: (its context, the
    owner's admin headers, the dataset)."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from tests.labels_party.api.helpers import bearer, labels_csv, new_dataset, upload

    ctx = make_context(database, data)
    with ctx.sessions() as s, s.begin():
        admin = bearer(create_key(ctx.ledger, s, "hospital", "admin"))
    with TestClient(create_app(ctx)) as client:
        dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=3)
        assert upload(client, admin, dataset, labels_csv({f"e{i}": 1 + i % 52 for i in range(200)})).status_code \
            == 200
        assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2},
                           headers=admin).status_code == 201
    return ctx, admin, dataset


def test_keys_made_before_their_account_opened_go_on_the_chain_once(tmp_path):
    """Migration 0016: a key of an organization holding an account that the chain does not name (made before this
    version recorded keys when accounts open) gets a ``key`` fact; the upgrading process signs the transition, so
    verify-audit with the exported heads stays valid, and the key charges; run again, nothing more is appended."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.ledger import signing
    from labels_party.ledger.verification import verify
    from tests.labels_party.api.helpers import bearer

    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    ctx, admin, dataset = _granted_dataset(database, data)
    with ctx.sessions() as s, s.begin():  # a key the chain does not name, as an older version left it
        consumer = bearer(_unchained_key(ctx, s, "publisher", "consumer"))
        s.execute(text("UPDATE alembic_version SET version_num = '0015'"))
        seq = s.get(db.Dataset, dataset).ledger_seq
    ctx.close()
    upgraded = make_context(database, data, upgrade=True)
    try:
        with upgraded.sessions() as s:
            added = [e.record for e in entries(s, dataset) if e.seq > seq]
        # 0016's fact, then 0017's naming the key's secret (0016 wrote facts without it)
        assert [(r["event"], r["org"], r["role"], r.get("secret_digest") is not None) for r in added] == [
            ("key", "publisher", "consumer", False), ("key", "publisher", "consumer", True)]
        with TestClient(create_app(upgraded)) as client:
            r = client.post(f"/v1/datasets/{dataset}/releases", headers={**consumer, "Idempotency-Key": "a"},
                            json={"mechanism": "rr", "epsilon": 0.5})
            assert r.status_code == 201, r.text
        log = data / "audit"
        report = verify(upgraded.sessions, upgraded.ledger, public_key=upgraded.ledger.signer.public,
                        heads_log=lambda: signing.read_log(log))
        assert report["valid"] is True, report
    finally:
        upgraded.close()


def test_chained_keys_without_a_secret_digest_get_one_once(tmp_path):
    """Migration 0017: a key fact written before facts named the key's secret (here 0016's, as an older version
    wrote it) is restated once with its digest; from then on a row holding another secret is refused (a writer
    swapping in a secret of their own), verify-audit stays valid with the exported heads, and an upgrade run again
    appends nothing."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.ledger import signing
    from labels_party.ledger.verification import verify

    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    ctx, admin, dataset = _granted_dataset(database, data)
    with ctx.sessions() as s, s.begin():
        _unchained_key(ctx, s, "publisher", "consumer")  # not on the chain: 0016 records it, without a secret
        s.execute(text("UPDATE alembic_version SET version_num = '0015'"))
    ctx.close()
    make_context(database, data, upgrade=True).close()
    with make_context(database, data).sessions() as s:
        seq = s.get(db.Dataset, dataset).ledger_seq
        restated = [e.record for e in entries(s, dataset) if e.record.get("event") == "key"
                    and e.record.get("role") == "consumer"]
    assert [r.get("secret_digest") is not None for r in restated] == [False, True]
    with make_context(database, data).sessions() as s, s.begin():
        s.execute(text("UPDATE alembic_version SET version_num = '0016'"))
    again = make_context(database, data, upgrade=True)  # 0017 again: every chained key names its secret already
    try:
        with again.sessions() as s:
            assert s.get(db.Dataset, dataset).ledger_seq == seq
        mine = "ldp_" + "e" * 8 + "_" + "B" * 43
        with again.sessions() as s, s.begin():
            s.execute(text("UPDATE api_keys SET key_hash = :h WHERE role = 'consumer'"), {"h": hash_key(mine)})
        with TestClient(create_app(again)) as client:
            forged = client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "rr", "epsilon": 0.5},
                                 headers={"Authorization": f"Bearer {mine}", "Idempotency-Key": "a"})
            # its certificate names the secret too: refused as an unknown key before the chain is read
            assert forged.status_code == 401 and forged.json()["error"]["code"] == "unauthorized", forged.text
        with again.sessions() as s:
            assert s.get(db.Dataset, dataset).ledger_seq == seq  # nothing charged
        report = verify(again.sessions, again.ledger, public_key=again.ledger.signer.public,
                        heads_log=lambda: signing.read_log(data / "audit"))
        # the chains are intact; the key row whose secret was swapped is named
        assert all(not d["problems"] for d in report["datasets"]), report
        assert len(report["problems"]) == 1 and "publisher is in force but not as the service issued it" in \
            report["problems"][0], report
    finally:
        again.close()


def _unchained_key(ctx, session, org: str, role: str) -> str:
    """A key as a version before 0016 left it — on no chain — certified as migration 0019's upgrade certifies the
    keys it finds."""
    from labels_party.http.auth import KEYS
    from labels_party.ledger import key_certificates

    issued = KEYS.issue(session, org, role)  # no audit: nothing chained
    row = session.get(db.ApiKey, issued.info.id)
    row.certificate = key_certificates.issue(ctx.ledger.signer.key, row, org)
    return issued.secret


def test_the_head_the_service_states_is_the_one_alembic_reads():
    """A database at head is opened without Alembic (the migrations package states its head): the statement must
    be the scripts' own, or a service would take an old schema for a current one."""
    assert MIGRATIONS.head() == MIGRATIONS.scripts_head() == HEAD


def test_migration_0021_records_the_ids_bytes_of_stored_versions(tmp_path):
    """Estimates read no labels (issue 40's 33rd review): versions stored before 0021 get their ids' bytes from
    their files' example_id column, so no estimate falls back to a file's size."""
    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    ctx, _admin, dataset = _granted_dataset(database, data)
    with ctx.sessions() as s, s.begin():
        s.execute(text("UPDATE label_versions SET id_bytes = 0"))
        s.execute(text("UPDATE alembic_version SET version_num = '0020'"))
    ctx.close()
    upgraded = make_context(database, data, upgrade=True)
    try:
        with upgraded.sessions() as s:
            assert s.scalar(select(db.LabelVersion.id_bytes)) == sum(len(f"e{i}") for i in range(200))
            assert MIGRATIONS.current(s.connection()) == HEAD
    finally:
        upgraded.close()


def test_migration_0022_chains_domains_and_summaries_once(tmp_path, monkeypatch):
    """A dataset and an available release as a version before 0022 chained them (no ``domain`` fact, no summary on
    the release's fact): the upgrade appends a ``domain`` fact and a ``release_summary`` fact, signed by the
    upgrading process (verify-audit with the exported heads is valid), once; from then on a domain or a summary
    edited in its row is found at a start."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.ledger import Ledger, LedgerTampered, agreement, chain, signing
    from labels_party.ledger.verification import verify
    from tests.labels_party.api.helpers import bearer, created, release

    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    with monkeypatch.context() as older:  # what a version before 0022 appended
        older.setattr(Ledger, "dataset_owner", lambda self, session, dataset: chain.owner(self, session, dataset))
        older.setattr(chain, "shown_summary", lambda release: None)
        creation = agreement.creation_problems
        older.setattr(agreement, "creation_problems", lambda *args: [
            p for p in creation(*args) if p != "the chain records no label domain for the dataset"])
        ctx, admin, dataset = _granted_dataset(database, data)
        with ctx.sessions() as s, s.begin():
            from labels_party.http.auth import create_key
            consumer = bearer(create_key(ctx.ledger, s, "publisher", "consumer"))
        with TestClient(create_app(ctx)) as client:
            made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    with ctx.sessions() as s, s.begin():
        seq = s.get(db.Dataset, dataset).ledger_seq
        assert not [e for e in entries(s, dataset) if e.record.get("event") in ("domain", "release_summary")]
        s.execute(text("UPDATE alembic_version SET version_num = '0021'"))
    ctx.close()
    with pytest.raises(LabelDPError, match="upgrade-db"):
        make_context(database, data)
    upgraded = make_context(database, data, upgrade=True)
    try:
        with upgraded.sessions() as s:
            added = [e.record for e in entries(s, dataset) if e.seq > seq]
            row = s.get(db.Dataset, dataset)
            assert [r["event"] for r in added] == ["domain", "release_summary"] and row.ledger_seq == seq + 2
            assert added[0]["domain_sha256"] == hashlib.sha256(row.domain_json.encode()).hexdigest()
            assert added[1]["release_id"] == made["id"]
        report = verify(upgraded.sessions, upgraded.ledger, public_key=upgraded.ledger.signer.public,
                        heads_log=lambda: signing.read_log(data / "audit"))
        assert report["valid"] is True, report
        with upgraded.sessions() as s, s.begin():
            s.execute(text("UPDATE alembic_version SET version_num = '0021'"))
    finally:
        upgraded.close()
    make_context(database, data, upgrade=True).close()  # again: everything is chained, nothing appended
    again = make_context(database, data)
    with again.sessions() as s, s.begin():
        assert s.get(db.Dataset, dataset).ledger_seq == seq + 2
        s.execute(text("UPDATE releases SET description_json = '{}'"))
    again.close()
    with pytest.raises(LedgerTampered, match="shown summary differs from the chain's"):
        make_context(database, data)


def test_migration_0022_chains_label_versions_uploaded_before_versions_were(tmp_path, monkeypatch):
    """Label versions uploaded before ``labels`` facts existed were read as their rows said (the thirty-ninth review
    hid one from the registry, and the same ids were registered again with fresh budgets); and a dataset with one
    took one more upload only. The upgrade appends a fact for each, once, from its row and file: the dataset then
    takes uploads (each reads the registry from the chain), keeps every id's index, and verify-audit is valid."""
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.ledger import chain, signing
    from labels_party.ledger.verification import verify
    from tests.labels_party.api.helpers import labels_csv, upload

    database, data = f"sqlite:///{tmp_path}/labels.sqlite", tmp_path / "data"
    with monkeypatch.context() as older:  # a version before label versions were chained
        older.setattr(chain, "labels", lambda *args: None)
        ctx, admin, dataset = _granted_dataset(database, data)
    with ctx.sessions() as s, s.begin():
        seq = s.get(db.Dataset, dataset).ledger_seq
        version = s.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset)).one()
        assert not [e for e in entries(s, dataset) if e.record.get("event") == "labels"]
        file = ctx.store.path(version.file).read_bytes()
        s.execute(text("UPDATE alembic_version SET version_num = '0021'"))
    ctx.close()
    make_context(database, data, upgrade=True).close()
    make_context(database, data, upgrade=True).close()  # again: nothing more
    upgraded = make_context(database, data)
    try:
        with upgraded.sessions() as s:
            added = [e.record for e in entries(s, dataset) if e.seq > seq]
        assert [(r["event"], r["version"], r["registry_end"], r["num_examples"]) for r in added] == \
            [("labels", 1, 200, 200)]
        assert (added[0]["file_bytes"], added[0]["file_sha256"]) == (len(file), hashlib.sha256(file).hexdigest())
        with TestClient(create_app(upgraded)) as client:
            for more in (100, 300):
                done = upload(client, admin, dataset, labels_csv({f"e{i}": 1 + i % 52 for i in range(more)}))
                assert done.status_code == 200, done.text
        with upgraded.sessions() as s:
            assert s.get(db.Dataset, dataset).registry_size == 300  # e0…e199 kept their indices
        report = verify(upgraded.sessions, upgraded.ledger, public_key=upgraded.ledger.signer.public,
                        heads_log=lambda: signing.read_log(data / "audit"))
        assert report["valid"] is True, report
    finally:
        upgraded.close()
