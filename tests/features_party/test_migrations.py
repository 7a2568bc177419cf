"""The trainer's schema migrations (features_party/migrations, Alembic) on SQLite and PostgreSQL: the baseline
revision builds exactly the schema the models declare, a fresh database is created at head, and
``labeldp features upgrade-db`` reports and is idempotent."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from alembic import command
from sqlalchemy import inspect, text

from features_party import db
from features_party.migrations import MIGRATIONS, make_sessionmaker
from shared.service.database import make_engine
from tests.support.databases import fresh_database

HEAD = "0007"  # the newest revision of features_party/migrations/versions


def _schema(url: str) -> dict:
    """Every table's columns (type, nullability), unique column sets, indexes and foreign keys."""
    engine = make_engine(url)
    inspector = inspect(engine)
    schema = {}
    for table in inspector.get_table_names():
        columns = {c["name"]: (c["nullable"], repr(c["type"])) for c in inspector.get_columns(table)}
        uniques = {frozenset(u["column_names"]) for u in inspector.get_unique_constraints(table)}
        indexes = {(frozenset(i["column_names"]), bool(i.get("unique"))) for i in inspector.get_indexes(table)}
        keys = {(tuple(f["constrained_columns"]), f["referred_table"]) for f in inspector.get_foreign_keys(table)}
        schema[table] = (columns, uniques, indexes, keys)
    engine.dispose()
    return schema


def test_the_baseline_migration_builds_the_declared_schema(database_url, tmp_path):
    kind = "postgresql" if database_url.startswith("postgresql") else "sqlite"
    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "head")
    engine.dispose()
    with fresh_database(kind, tmp_path / "declared") as declared_url:
        (tmp_path / "declared").mkdir(exist_ok=True)
        engine = make_engine(declared_url)
        make_sessionmaker(engine)  # an empty database: created from the models and stamped at head
        engine.dispose()
        migrated, declared = _schema(database_url), _schema(declared_url)
    assert set(migrated) == {"alembic_version", "organizations", "api_keys", "feature_tables", "id_lists", "jobs"}
    assert migrated == declared


def test_a_fresh_database_is_at_head_and_keeps_its_rows(database_url):
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    with engine.connect() as connection:
        assert MIGRATIONS.current(connection) == MIGRATIONS.head() == HEAD
    with sessions() as session, session.begin():
        session.add(db.Organization(name="publisher"))
    make_sessionmaker(engine)  # a restart: nothing is recreated or reset
    with engine.connect() as connection:
        assert connection.execute(text("SELECT name FROM organizations")).scalars().all() == ["publisher"]
    engine.dispose()


def test_upgrade_db_command(tmp_path):
    url = f"sqlite:///{tmp_path}/trainer.sqlite"

    def upgrade() -> dict:
        done = subprocess.run([sys.executable, "-m", "labeldp", "features", "upgrade-db", "--database-url", url],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert upgrade() == {"revision_before": None, "revision_after": HEAD}
    assert upgrade() == {"revision_before": HEAD, "revision_after": HEAD}


def test_keys_flagged_revoked_before_revocations_were_recorded_stay_revoked(database_url):
    """Migration 0002: the ``revoked`` flag becomes a revocation time and who (a note: its time was never kept)."""
    from features_party.auth import authenticate
    from shared.errors import LabelDPError
    from shared.service.database import utcnow
    from shared.service.keys import hash_key

    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0001")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'publisher', :t)"),
                           {"t": utcnow()})
        for id_, key, revoked in ((1, "trn_0000000a_kept", False), (2, "trn_0000000b_flagged", True)):
            connection.execute(text("INSERT INTO api_keys (id, org_id, role, key_hash, prefix, revoked, created_at) "
                                    "VALUES (:i, 1, 'member', :h, :p, :r, :t)"),
                               {"i": id_, "h": hash_key(key), "p": key.split("_")[1], "r": revoked, "t": utcnow()})
    sessions = make_sessionmaker(engine, upgrade=True)
    with sessions() as session:
        keys = {k.id: k for k in session.query(db.ApiKey)}
        assert (keys[1].revoked_at, keys[1].revoked_by) == (None, None) and keys[2].revoked_at <= utcnow()
        assert "before migration 0002" in keys[2].revoked_by
        assert authenticate(session, "Bearer trn_0000000a_kept").role == "member"
        with pytest.raises(LabelDPError, match="invalid API key"):
            authenticate(session, "Bearer trn_0000000b_flagged")
    engine.dispose()


def test_jobs_an_older_trainer_left_queued_or_running_become_interrupted(database_url):
    """Migration 0004 (the jobs table becomes the queue): an older trainer's queued or running jobs never stored
    their labels-party key, so no worker could run them: they become interrupted, resumable with the key."""
    from shared.service.database import utcnow

    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0003")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'publisher', :t)"),
                           {"t": utcnow()})
        for job_id, status in (("a" * 32, "queued"), ("b" * 32, "running"), ("c" * 32, "succeeded")):
            connection.execute(text(
                "INSERT INTO jobs (id, org_id, status, labels_party, dataset_id, request_json, epoch, epochs, "
                "metrics_json, num_train_examples, seconds, device, created_at, updated_at) VALUES (:i, 1, :s, 'o', "
                "'d', '{}', 0, 0, '[]', 0, 0, '', :t, :t)"), {"i": job_id, "s": status, "t": utcnow()})
    sessions = make_sessionmaker(engine, upgrade=True)
    with sessions() as session:
        jobs = {job.id[0]: job for job in session.query(db.Job)}
        assert {k: job.status for k, job in jobs.items()} == {"a": "interrupted", "b": "interrupted",
                                                              "c": "succeeded"}
        assert "resume" in jobs["a"].error and jobs["c"].error is None
        assert all(job.attempts == 0 and job.sealed_api_key is None and job.lease_owner is None
                   for job in jobs.values())
    engine.dispose()


def test_jobs_stored_before_estimate_rows_replan_without_them_and_keep_their_digest(database_url):
    """Migration 0006: a job stored before estimate rows existed gets ``estimate_fraction: 0``, so an attempt or a
    resume asks for the release it was charged for; a request resent in its old shape still hashes as it did."""
    from features_party import schemas
    from features_party.service import request_digest, stored_request
    from shared.service.database import utcnow

    old = {"features": "f", "labels_party": None, "dataset_id": "d", "release": {
        "mechanism": "rr-on-bins", "epsilon": 1.0, "prior_epsilon": None, "mesh": None, "solver": None,
        "clip": False, "example_ids": ["a", "b"], "allow_uninformative": False}, "release_id": None, "split": None,
        "numeric": ["x"],
        "categorical": [], "num_classes": None, "train": {**schemas.TrainOptions().model_dump(mode="json"),
                                                          "model": "mlp"},
        "protocol": "single", "stages": 2, "temperature": 1.0}
    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(MIGRATIONS.config(connection), "0005")
        connection.execute(text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'publisher', :t)"),
                           {"t": utcnow()})
        connection.execute(text(
            "INSERT INTO jobs (id, org_id, status, labels_party, dataset_id, request_json, epoch, epochs, "
            "metrics_json, num_train_examples, num_holdout_examples, seconds, device, created_at, updated_at, "
            "attempts) VALUES (:i, 1, 'succeeded', 'o', 'd', :r, 0, 0, '[]', 0, 0, 0, '', :t, :t, 0)"),
            {"i": "a" * 32, "r": json.dumps(old), "t": utcnow()})
    sessions = make_sessionmaker(engine, upgrade=True)
    with sessions() as session:
        stored = json.loads(session.get(db.Job, "a" * 32).request_json)
    engine.dispose()
    assert stored == {**old, "estimate_fraction": 0}
    assert schemas.JobRequest(**stored, api_key="k").estimate_fraction == 0
    # the same body resent today (no estimate_fraction, no learner: the defaults) hashes as the old one did
    resent = {k: v for k, v in old.items()}
    resent["train"] = {k: v for k, v in old["train"].items() if k != "model"}
    old_digest = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
                                .encode()).hexdigest()
    assert request_digest(schemas.JobRequest(**resent, api_key="k")) == old_digest
    assert stored_request(schemas.JobRequest(**resent, api_key="k")) == old


def test_the_head_the_service_states_is_the_one_alembic_reads():
    """A database at head is opened without Alembic (the migrations package states its head): the statement must
    be the scripts' own, or a service would take an old schema for a current one."""
    assert MIGRATIONS.head() == MIGRATIONS.scripts_head() == HEAD
