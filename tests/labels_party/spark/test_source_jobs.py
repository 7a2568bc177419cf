"""Issue 29: source jobs survive their worker. Two labels-party contexts on one database (SQLite and PostgreSQL) and
one data directory stand for two replicas (each its own job runner, its own claim on the data directory, one shared
secret key file); Spark is a real local session.

* a release whose first worker dies (claimed, never finished, its lease expired) is finished by the other runner:
  the same bytes as a run never interrupted with the release's secret, one ledger record, the audit clean;
* a worker that lost its lease and finishes late changes nothing (its files discarded, the holder's recorded);
* the secret key file removed between the charge and the job: the release is failed with ``secret_key_missing`` at
  once (no retry), the service still answers, a new release is refused before its charge (503), and with the key
  back the same request runs it;
* no file under the data directory, and no log line, ever holds the release's 32-byte secret;
* a job whose workers keep dying is failed once its attempts ran out (release_failed, charged), and re-sent runs.
"""

from __future__ import annotations

import base64
import logging
import threading
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import create_key
from labels_party.ledger import documents, entries
from labels_party.releases.privatization import secret_context
from labels_party.runtime import jobs, workers
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.spark.jobs import privatize
from labels_party.store import db
from shared.mechanisms.documents import sampler_from_description
from shared.service.leases import Lease
from shared.service.sealing import write_key_file
from tests.labels_party.spark.sources import register, write_source

N = 20_000


@pytest.fixture()
def replicas(spark, tmp_path, database_url):
    """Two contexts (replicas) on one database and data directory, a registered source dataset granted to a
    publisher, and a client of each."""
    sources = tmp_path / "sources"
    labels = np.random.default_rng(3).integers(0, 10, size=N)
    write_source(sources / "weeks", [f"p{i}" for i in range(N)], labels.astype(np.int64), files=3)
    key_file = tmp_path / "secret.key"
    write_key_file(key_file)
    settings = LabelsSettings(database_url=database_url, data_dir=tmp_path / "data", secret_key_file=key_file,
                              spark_sources={"hospital": [f"{sources}/"]}, job_retry_seconds=0)
    first = make_context(settings=settings)
    second = make_context(settings=settings)  # another live process on the data directory: collects nothing
    with first.sessions() as session, session.begin():
        keys = {"owner": create_key(first.ledger, session, "hospital", "admin"),
                "publisher": create_key(first.ledger, session, "publisher", "consumer")}
    headers = {who: {"Authorization": f"Bearer {key}"} for who, key in keys.items()}
    clients = [TestClient(create_app(ctx), raise_server_exceptions=False) for ctx in (first, second)]
    dataset = register(first, clients[0], headers["owner"], {
        "name": "weeks", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 5,
        "source": f"{sources}/weeks"})
    assert dataset["state"] == "ready" and dataset["num_examples"] == N, dataset
    assert clients[1].post(f"/v1/datasets/{dataset['id']}/grants", json={"org": "publisher", "epsilon": 5},
                           headers=headers["owner"]).status_code == 201
    yield (first, second), clients, headers, dataset["id"], key_file, tmp_path
    for ctx in (first, second):
        ctx.close()


def _release(client, headers, dataset, key="weekly"):
    return client.post(f"/v1/datasets/{dataset}/releases", headers={**headers["publisher"], "Idempotency-Key": key},
                       json={"mechanism": "rr", "epsilon": 1})


def _claim(ctx) -> Lease:
    """This runner claims the next job and does nothing with it (its worker died, or is paused)."""
    with ctx.sessions() as session, session.begin():
        lease = ctx.jobs.table.claim(session, ctx.jobs.owner, ctx.settings.job_lease_seconds)
    assert lease is not None
    return lease


def _expire(ctx, job_id: str) -> None:
    with ctx.sessions() as session, session.begin():
        session.get(db.Job, job_id).lease_expires_at = db.utcnow() - timedelta(seconds=1)


def _secret_and_reference(ctx, release_id: str, dataset: str, out: Path):
    """The release's secret, opened as a job would, and what an undisturbed run with it writes."""
    with ctx.sessions() as session:
        job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release_id)
        secret = ctx.sealer.open(job.sealed_secret, secret_context(release_id))
        release = session.get(db.Release, release_id)
        document = documents.unpack(documents.stored(session, release.mechanism_hash))
    result = privatize(ctx.spark_jobs.session(), ctx.store.path(f"sources/{dataset}").resolve().as_uri(), str(out),
                       sampler_from_description(document["description"]), secret, support_values=np.arange(10.0))
    parts = sorted(out.glob("part-*.parquet"))
    assert result.rows_written == N and len(parts) == result.partitions > 1
    return secret, parts


def _parts(ctx, release_id: str) -> list[Path]:
    return sorted(ctx.store.path(f"releases/{release_id}").glob("part-*.parquet"))


def test_a_dead_workers_release_is_finished_by_the_other_replica(replicas):
    (first, second), clients, headers, dataset, _, tmp_path = replicas
    started = _release(clients[0], headers, dataset)
    assert started.status_code == 202, started.text
    release_id = started.json()["id"]
    dead = _claim(first)  # the first replica's worker took the job, then died
    assert dead.attempt == 1
    assert second.jobs.run_pending() == 0  # its lease is live: nobody else may take it
    _, reference = _secret_and_reference(second, release_id, dataset, tmp_path / "reference")
    _expire(first, dead.job_id)  # no heartbeat: the lease runs out
    assert second.jobs.run_pending() == 1
    done = clients[1].get(f"/v1/releases/{release_id}", headers=headers["publisher"]).json()
    assert done["state"] == "available", done
    assert [p.read_bytes() for p in _parts(second, release_id)] == [p.read_bytes() for p in reference]
    with second.sessions() as session:
        job = session.get(db.Job, dead.job_id)
        assert (job.state, job.attempts, job.lease_owner, job.sealed_secret) == ("succeeded", 2, None, None)
        records = [e for e in entries(session, dataset) if e.is_release]
    assert [e.record["release_id"] for e in records] == [release_id]  # charged once
    again = _release(clients[0], headers, dataset)  # the client re-sends: the stored release, nothing new
    assert again.status_code == 200 and again.json()["id"] == release_id
    for ctx in (first, second):
        report = verify_audit(ctx)
        assert report["valid"], report


def test_a_worker_that_lost_its_lease_changes_nothing(replicas):
    (first, second), clients, headers, dataset, _, tmp_path = replicas
    release_id = _release(clients[0], headers, dataset).json()["id"]
    paused = _claim(first)
    _expire(first, paused.job_id)
    holder = _claim(second)  # taken over; its worker has not finished yet
    assert (holder.job_id, holder.attempt) == (paused.job_id, 2)
    workers.run(first, paused, threading.Event())  # the paused worker wakes up and runs the whole job
    with first.sessions() as session:
        release, job = session.get(db.Release, release_id), session.get(db.Job, paused.job_id)
        assert (release.state, release.file_sha256) == ("running", None)  # nothing recorded
        assert (job.state, job.lease_owner, job.attempts) == ("running", second.jobs.owner, 2)
    assert not first.store.path(f"releases/{release_id}").exists()
    assert list(first.store.path(jobs.ATTEMPTS).iterdir()) == []  # its attempt's files discarded
    _, reference = _secret_and_reference(second, release_id, dataset, tmp_path / "reference")
    workers.run(second, holder, threading.Event())
    done = clients[1].get(f"/v1/releases/{release_id}", headers=headers["publisher"]).json()
    assert done["state"] == "available", done
    assert [p.read_bytes() for p in _parts(second, release_id)] == [p.read_bytes() for p in reference]
    assert verify_audit(second)["valid"]


def test_a_missing_secret_key_fails_the_release_at_once_and_the_service_answers(replicas):
    (first, second), clients, headers, dataset, key_file, tmp_path = replicas
    started = _release(clients[0], headers, dataset)
    assert started.status_code == 202
    release_id = started.json()["id"]
    saved = key_file.read_bytes()
    key_file.unlink()  # between the charge and the job
    assert second.jobs.run_pending() == 1
    failed = clients[1].get(f"/v1/releases/{release_id}", headers=headers["publisher"])
    assert failed.status_code == 200 and failed.json()["state"] == "failed"
    assert failed.json()["error"]["code"] == "secret_key_missing"
    with second.sessions() as session:
        job = session.get(db.Job, jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release_id).id)
        assert (job.state, job.attempts, job.error_code) == ("failed", 1, "secret_key_missing")  # not retried
        assert job.sealed_secret is not None
    refused = _release(clients[1], headers, dataset, key="new")  # a new release: refused before its charge
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "secret_key_missing", refused.text
    spent = clients[1].get(f"/v1/datasets/{dataset}/budget", headers=headers["publisher"]).json()["epsilon_spent"]
    assert spent == 1.0  # the first release only
    assert clients[0].get("/healthz").status_code == 200

    key_file.write_bytes(saved)
    key_file.chmod(0o600)
    again = _release(clients[1], headers, dataset)  # the same request, the key back: its job runs again
    assert again.status_code == 202 and again.json()["id"] == release_id and again.json()["state"] == "running"
    assert first.jobs.run_pending() == 1
    done = clients[0].get(f"/v1/releases/{release_id}", headers=headers["publisher"]).json()
    assert done["state"] == "available" and done["error"] is None
    with first.sessions() as session:
        assert len([e for e in entries(session, dataset) if e.is_release]) == 1
    assert verify_audit(first)["valid"]


def test_no_file_or_log_line_holds_the_release_secret(replicas, caplog):
    (first, second), clients, headers, dataset, _, tmp_path = replicas
    caplog.set_level(logging.DEBUG)
    release_id = _release(clients[0], headers, dataset).json()["id"]
    with first.sessions() as session:
        job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release_id)
        secret = first.sealer.open(job.sealed_secret, secret_context(release_id))
    assert len(secret) == 32
    data = tmp_path / "data"

    def holders() -> list[str]:
        return [str(path.relative_to(data)) for path in data.rglob("*")
                if path.is_file() and not path.is_symlink() and secret in path.read_bytes()]

    assert holders() == []  # queued: only the database holds it, sealed
    assert first.jobs.run_pending() == 1
    assert clients[0].get(f"/v1/releases/{release_id}", headers=headers["publisher"]).json()["state"] == "available"
    assert holders() == []
    with first.sessions() as session:
        assert jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release_id).sealed_secret is None
    if first.settings.database_url.startswith("sqlite"):  # the database file too (it held the sealed form only)
        assert secret not in Path(first.settings.database_url.removeprefix("sqlite:///")).read_bytes()
    logged = caplog.text
    for form in (secret.hex(), base64.b64encode(secret).decode(), repr(secret)):
        assert form not in logged


def test_a_job_whose_workers_keep_dying_is_failed_after_its_attempts_and_can_be_sent_again(replicas):
    """Each claim's worker dies (claimed, lease expired, never finished): after job_max_attempts claims the next claim
    fails the job and its release (release_failed, charged) instead of running it; re-sent with its Idempotency-Key
    it is queued again with its attempts reset, and runs."""
    (first, second), clients, headers, dataset, _, _ = replicas
    release_id = _release(clients[0], headers, dataset).json()["id"]
    for attempt in range(1, first.settings.job_max_attempts + 1):
        lease = _claim(first if attempt % 2 else second)
        assert lease.attempt == attempt
        _expire(first, lease.job_id)
    assert second.jobs.run_pending() == 0  # out of attempts: failed by the claim, nothing run
    failed = clients[1].get(f"/v1/releases/{release_id}", headers=headers["publisher"]).json()
    assert failed["state"] == "failed" and failed["error"]["code"] == "release_failed", failed
    assert "attempts exhausted" in failed["error"]["message"]
    with first.sessions() as session:
        job = session.get(db.Job, lease.job_id)
        assert (job.state, job.attempts, job.lease_owner) == ("failed", 3, None) and job.sealed_secret is not None
    again = _release(clients[1], headers, dataset)
    assert again.status_code == 202 and again.json()["id"] == release_id
    with first.sessions() as session:
        job = session.get(db.Job, lease.job_id)
        assert (job.state, job.attempts, job.error_code) == ("queued", 0, None)
    assert first.jobs.run_pending() == 1
    assert clients[0].get(f"/v1/releases/{release_id}", headers=headers["publisher"]).json()["state"] == "available"
    with first.sessions() as session:
        assert len([e for e in entries(session, dataset) if e.is_release]) == 1
