"""Trainer jobs across failures and replicas (issue 29), against a real labels-party server over HTTP: the jobs table
is the queue, so a job whose release answer was lost, whose request was resent, whose worker died or whose secret
key went missing is finished once and charged once; the labels-party API key is never stored in plain text.

The last test runs two `labeldp features serve` processes on one PostgreSQL database and kills the one training."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text, update

from features_party import attempt, db, jobs
from features_party.api import create_app as create_trainer
from labeldp.local_services import free_port, serve_in_thread, serve_process
from shared.service.database import utcnow
from shared.service.sealing import write_key_file
from tests.features_party import test_api
from tests.features_party.test_api import _finish, _job, _spent, _upload, trainer_client, trainer_context
from tests.support.databases import POSTGRES_URL, fresh_database
from tests.support.proxy import LossyProxy

parties = test_api.parties  # the fixture: a labels-party server with a dataset of N labels, and a trainer


def _ledger(parties) -> tuple[float, int]:
    """What the labels party charged: ε spent on the dataset, and its releases."""
    releases = parties["owner"].get(f"/v1/datasets/{parties['dataset']}/releases").json()
    return _spent(parties), len(releases)


def _releases_post(method: str, path: str) -> bool:
    return method == "POST" and path.endswith("/releases")


def _row(ctx, job_id: str) -> db.Job:
    with ctx.sessions() as session:
        row = session.get(db.Job, job_id)
        session.expunge(row)
        return row


@pytest.mark.parametrize("mode", ["drop", "fail"])
def test_a_lost_answer_to_the_release_request_interrupts_the_job_which_then_succeeds_charged_once(parties, mode):
    """drop: the labels party commits each release request, and its first three answers never reach the trainer
    (the defect: 502, the job deleted, a resubmission charged again). fail: a gateway answers 502 twice."""
    times = 3 if mode == "drop" else 2
    with LossyProxy(parties["labels_url"], _releases_post, times=times, mode=mode) as proxy:
        ctx = trainer_context(parties["tmp"] / f"lossy-{mode}", proxy.url, upstream_retry_seconds=0.3)
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        created = trainer.post("/v1/jobs", json=_job(parties))
        assert created.status_code == 202, created.text
        view = created.json()
        code = "labels_party_unreachable" if mode == "drop" else "labels_party_failed"
        assert (view["status"], view["error_code"]) == ("interrupted", code), view
        assert parties["consumer"] not in created.text
        job = _finish(trainer, view["id"])  # the workers ask again, with the same key, until the answer comes
        ctx.jobs.stop()
        assert job["status"] == "succeeded", job
        assert proxy.lost == times and sum(_releases_post(*r) for r in proxy.seen) == times + 1
    spent, releases = _ledger(parties)
    assert (spent, releases) == (4.0, 1)  # one charge: the job's ε, one release
    assert job["release"]["id"] == parties["owner"].get(
        f"/v1/datasets/{parties['dataset']}/releases").json()[0]["id"]
    assert _row(ctx, job["id"]).attempts == times  # the request's own try is not an attempt: the last one answered


def test_a_job_whose_labels_party_never_answers_fails_after_its_attempts_charged_once(parties):
    with LossyProxy(parties["labels_url"], _releases_post, times=100) as proxy:
        ctx = trainer_context(parties["tmp"] / "never", proxy.url, upstream_retry_seconds=0.1, job_max_attempts=2)
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        created = trainer.post("/v1/jobs", json=_job(parties))
        assert created.status_code == 202 and created.json()["status"] == "interrupted", created.text
        job = _finish(trainer, created.json()["id"])
        ctx.jobs.stop()
        assert (job["status"], job["error_code"]) == ("failed", "job_attempts_exhausted"), job
        assert proxy.lost == 3  # the request's own, then two attempts
    assert _ledger(parties) == (4.0, 1)
    assert _row(ctx, job["id"]).sealed_api_key is None  # cleared when the job ended


def test_a_resent_job_request_after_a_lost_answer_is_the_same_job_charged_once(parties):
    ctx, trainer = parties["trainer_ctx"], parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    body, key = _job(parties), {"Idempotency-Key": "nightly-2024-05-01"}
    with serve_in_thread(create_trainer(ctx)) as url, \
            LossyProxy(url, lambda method, path: method == "POST" and path == "/v1/jobs", times=1) as proxy, \
            httpx.Client(base_url=proxy.url, headers=dict(trainer.headers), timeout=60) as http:
        with pytest.raises(httpx.TransportError):  # the trainer made the job; its answer is lost
            http.post("/v1/jobs", json=body, headers=key)
        again = http.post("/v1/jobs", json=body, headers=key)
        assert again.status_code == 200, again.text  # the job the lost answer was about
        job_id = again.json()["id"]
        assert [j["id"] for j in trainer.get("/v1/jobs").json()] == [job_id]
        assert _finish(trainer, job_id)["status"] == "succeeded"
        # the same request again, even with another api_key (not part of the request's identity): the same job
        third = http.post("/v1/jobs", json={**body, "api_key": "ldp_00000000_other"}, headers=key)
        assert (third.status_code, third.json()["id"], third.json()["status"]) == (200, job_id, "succeeded")
        other = http.post("/v1/jobs", json={**body, "train": {**body["train"], "epochs": 2}}, headers=key)
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused", other.text
        for bad in ("x" * 201, "two words", "clé"):
            refused = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": bad.encode()})
            assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_request"
    assert len(trainer.get("/v1/jobs").json()) == 1
    assert _ledger(parties) == (4.0, 1)
    # keys are per organization: another organization's job with this key is its own
    adnet = trainer_client(ctx, "adnet")
    assert _upload(adnet, parties["features"]).status_code == 200
    release_id = trainer.get(f"/v1/jobs/{job_id}").json()["release"]["id"]
    theirs = adnet.post("/v1/jobs", json={**body, "release": None, "release_id": release_id}, headers=key)
    assert theirs.status_code == 202 and theirs.json()["id"] != job_id, theirs.text
    assert _finish(adnet, theirs.json()["id"])["status"] == "succeeded"
    assert _ledger(parties) == (4.0, 1)


def test_a_job_whose_worker_died_mid_training_is_finished_by_another_which_alone_records(parties, monkeypatch,
                                                                                           caplog):
    ctx = trainer_context(parties["tmp"] / "takeover", parties["labels_url"], start=False)
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    created = trainer.post("/v1/jobs", json=_job(parties))
    assert created.status_code == 202 and created.json()["status"] == "queued", created.text
    job_id = created.json()["id"]
    first, second = jobs.make_runner(ctx), jobs.make_runner(ctx)  # two processes' workers
    assert first.owner != second.owner
    paused, go_on = threading.Event(), threading.Event()
    record = attempt.Attempt.update

    def update(attempt, **fields):  # the first worker stalls before it records its second epoch (a long pause)
        if attempt.lease.owner == first.owner and fields.get("epoch") == 2:
            paused.set()
            go_on.wait(120)
        return record(attempt, **fields)

    monkeypatch.setattr(attempt.Attempt, "update", update)
    worker = threading.Thread(target=first.run_pending)
    with caplog.at_level(logging.WARNING, logger="labeldp.jobs"):
        worker.start()
        assert paused.wait(120)
        stalled = trainer.get(f"/v1/jobs/{job_id}").json()
        assert (stalled["status"], stalled["progress"]["epoch"]) == ("running", 1)
        assert (ctx.data_dir / "jobs" / job_id).exists() is False  # nothing written yet but progress
        with ctx.sessions() as session, session.begin():  # its lease expires (it stopped renewing)
            session.execute(update_lease(job_id, utcnow() - timedelta(seconds=1)))
        assert second.run_pending() == 1  # taken over: the release asked for again, replayed; trained
        done = _row(ctx, job_id)
        go_on.set()
        worker.join(120)
    assert not worker.is_alive()
    assert any("attempt 1 lost its lease" in r.getMessage() for r in caplog.records)
    after = _row(ctx, job_id)
    assert after.status == "succeeded" and after.attempts == 2 and after.lease_owner is None
    fields = ("status", "epoch", "metrics_json", "model_file", "predictions_file", "updated_at", "seconds")
    assert [getattr(after, f) for f in fields] == [getattr(done, f) for f in fields]  # the late worker: nothing
    assert sorted(p.name for p in (ctx.data_dir / "jobs" / job_id).iterdir()) == ["attempt-2"]
    assert after.model_file.endswith("attempt-2/model.npz") and Path(after.model_file).exists()
    assert trainer.get(f"/v1/jobs/{job_id}/model").status_code == 200
    assert _ledger(parties) == (4.0, 1)


def update_lease(job_id: str, expires):
    return update(db.Job).where(db.Job.id == job_id).values(lease_expires_at=expires)


def _sealing_trainer(parties, name: str):
    """A trainer context with its own secret key file (in a fresh directory), and its publisher's client."""
    tmp = parties["tmp"] / name
    tmp.mkdir()
    key_file = tmp / "secret.key"
    write_key_file(key_file)
    ctx = trainer_context(tmp, parties["labels_url"], start=False, secret_key_file=key_file)
    return ctx, trainer_client(ctx, "publisher"), key_file


def test_a_job_whose_secret_key_is_gone_is_interrupted_and_resumes_with_its_api_key(parties):
    ctx, trainer, key_file = _sealing_trainer(parties, "sealed")
    assert _upload(trainer, parties["features"]).status_code == 200
    created = trainer.post("/v1/jobs", json=_job(parties))
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    key_file.unlink()  # before the job runs
    assert ctx.jobs.run_pending() == 1
    job = trainer.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["error_code"]) == ("interrupted", "secret_key_missing"), job
    assert _row(ctx, job_id).sealed_api_key is None and ctx.jobs.run_pending() == 0  # only a resume runs it
    for refused in (trainer.post(f"/v1/jobs/{job_id}/resume", json={"api_key": parties["consumer"]}),
                    trainer.post("/v1/jobs", json=_job(parties))):  # nothing can be sealed: nothing stored
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "secret_key_missing", refused.text
        assert str(key_file) not in refused.text
    assert len(trainer.get("/v1/jobs").json()) == 1
    write_key_file(key_file)  # the operator puts a key back (here a new one: the job's key is sealed again)
    resumed = trainer.post(f"/v1/jobs/{job_id}/resume", json={"api_key": parties["consumer"]})
    assert resumed.status_code == 202 and resumed.json()["status"] == "queued", resumed.text
    assert ctx.jobs.run_pending() == 1
    job = trainer.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["release"]["id"] == created.json()["release"]["id"], job
    assert _ledger(parties) == (4.0, 1)


def test_no_file_or_row_holds_the_labels_party_api_key_in_plain_text(parties, caplog):
    ctx, trainer, key_file = _sealing_trainer(parties, "plain")
    tmp = key_file.parent
    secret = parties["consumer"].encode()

    def holders() -> list[str]:
        found = [str(p) for p in tmp.rglob("*") if p.is_file() and secret in p.read_bytes()]
        assert any(job_id.encode() in p.read_bytes() for p in tmp.glob("trainer.db*")), "the scan sees the rows"
        return found

    with caplog.at_level(logging.DEBUG):
        assert _upload(trainer, parties["features"]).status_code == 200
        job_id = trainer.post("/v1/jobs", json=_job(parties)).json()["id"]
        assert _row(ctx, job_id).sealed_api_key  # pending: the key is kept, sealed
        assert holders() == []
        assert ctx.jobs.run_pending() == 1
        assert trainer.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
        assert _row(ctx, job_id).sealed_api_key is None
        assert holders() == []
        assert trainer.post(f"/v1/jobs/{job_id}/resume", json={"api_key": parties["consumer"]}).status_code == 409
    assert parties["consumer"] not in caplog.text and parties["consumer"] not in json.dumps(
        trainer.get("/v1/jobs").json())


# -- replicas ----------------------------------------------------------------------------------------------------

def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeldp", *args]


def _utc(moment: datetime) -> datetime:
    """A timestamp read with plain SQL, in UTC (PostgreSQL's timestamptz comes back aware already)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _run(args: list[str], env: dict | None = None) -> str:
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=300).stdout.strip()


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES_URL, reason="set LABELDP_TEST_POSTGRES_URL to run two trainers on PostgreSQL")
def test_two_trainer_processes_a_killed_ones_job_is_finished_by_the_other_charged_once(tmp_path):
    import numpy as np

    lease_seconds, n, epsilon = 5, 2000, 2.0
    labels_db = ["--database-url", f"sqlite:///{tmp_path}/labels.db", "--data-dir", str(tmp_path / "labels")]
    admin = _run(_cli("labels", "create-key", "--org", "office", "--role", "admin", *labels_db))
    consumer = _run(_cli("labels", "create-key", "--org", "publisher", "--role", "consumer", *labels_db))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 4))
    labels = np.clip(np.rint(10 + 3 * x[:, 0] - 2 * x[:, 1] + rng.normal(size=n)), 0, 30).astype(int)
    ids = [f"u{i}" for i in range(n)]
    labels_port = free_port()
    labels_url = f"http://127.0.0.1:{labels_port}"
    with fresh_database("postgresql", tmp_path) as database_url, \
            serve_process(_cli("labels", "serve", "--port", str(labels_port), *labels_db), labels_url,
                          log=tmp_path / "labels.log"):
        owner = httpx.Client(base_url=labels_url, headers={"Authorization": f"Bearer {admin}"}, timeout=60)
        dataset = owner.post("/v1/datasets", json={"name": "y", "label_kind": "integer", "min": 0, "max": 30,
                                                   "epsilon_total": 10}).json()["id"]
        assert owner.put(f"/v1/datasets/{dataset}/labels", headers={"Content-Type": "text/csv"}, content=(
            "example_id,label\n" + "\n".join(f"{i},{v}" for i, v in zip(ids, labels, strict=True)))).is_success
        assert owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 10}).is_success
        key_file = tmp_path / "secret.key"
        _run(_cli("features", "secret-key", "--key-file", str(key_file)))
        env = {**os.environ, "LABELDP_TRAINER_DATABASE_URL": database_url,
               "LABELDP_TRAINER_DATA_DIR": str(tmp_path / "trainer"),  # one data directory for both
               "LABELDP_TRAINER_LABELS_PARTIES": json.dumps({"office": labels_url}),
               "LABELDP_TRAINER_SECRET_KEY_FILE": str(key_file),
               "LABELDP_TRAINER_JOB_LEASE_SECONDS": str(lease_seconds)}
        trainer_key = _run(_cli("features", "create-key", "--org", "publisher", "--role", "admin"), env)  # + schema
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        engine = create_engine(database_url)
        with serve_process(_cli("features", "serve", "--port", str(ports[0])), urls[0], env=env,
                           log=tmp_path / "trainer-0.log") as one, \
                serve_process(_cli("features", "serve", "--port", str(ports[1])), urls[1], env=env,
                              log=tmp_path / "trainer-1.log") as two:
            clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {trainer_key}"}, timeout=120)
                       for url in urls]
            features = "example_id,x0,x1,x2,x3\n" + "\n".join(
                f"{i}," + ",".join(f"{v:.6f}" for v in row) for i, row in zip(ids, x, strict=True))
            assert clients[0].put("/v1/features/f", content=features,
                                  headers={"Content-Type": "text/csv"}).status_code == 200
            created = clients[0].post("/v1/jobs", headers={"Idempotency-Key": "replicas"}, json={
                "features": "f", "api_key": consumer, "dataset_id": dataset,
                "release": {"mechanism": "opt-unbiased", "epsilon": epsilon}, "numeric": ["x0", "x1", "x2", "x3"],
                "train": {"hidden": [128, 128], "epochs": 40, "patience": 40, "batch_size": 32}})
            assert created.status_code == 202, created.text
            job_id = created.json()["id"]

            def lease() -> tuple[str, str | None, int, int]:
                with engine.connect() as connection:
                    return tuple(connection.execute(text(
                        "SELECT status, lease_owner, epoch, attempts FROM jobs WHERE id = :id"), {"id": job_id}).one())

            deadline = time.monotonic() + 600  # bounds here are for a failure, not a speed (a loaded machine)
            while (state := lease())[0] != "running" or state[2] < 1:  # training: its first epoch recorded
                assert state[0] in ("queued", "running") and time.monotonic() < deadline, state
                time.sleep(0.05)
            holder = int(state[1].split(":")[1])  # host:pid:random
            processes = {one.pid: (one, 1), two.pid: (two, 0)}  # the process, and the other's index
            assert holder in processes, (state, one.pid, two.pid)
            victim, survivor = processes[holder]
            os.kill(holder, signal.SIGKILL)
            killed = time.monotonic()
            assert victim.wait(120) == -signal.SIGKILL
            with engine.connect() as connection:  # final: the dead process renews nothing
                expires = connection.execute(text("SELECT lease_expires_at FROM jobs WHERE id = :id"),
                                             {"id": job_id}).scalar()
            taken_over = None
            while (view := clients[survivor].get(f"/v1/jobs/{job_id}").json())["status"] != "succeeded":
                assert view["status"] in ("queued", "running", "interrupted") and time.monotonic() - killed < 600, view
                if taken_over is None and lease()[3] == 2:
                    taken_over = time.monotonic() - killed
                time.sleep(0.05)
            succeeded = time.monotonic() - killed
            final = lease()
            with engine.connect() as connection:
                started = connection.execute(text("SELECT started_at FROM jobs WHERE id = :id"),
                                             {"id": job_id}).scalar()
            engine.dispose()
        spent = owner.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"]
        releases = owner.get(f"/v1/datasets/{dataset}/releases").json()
    print(f"\nkill -9 of the training trainer (pid {holder}) at epoch {state[2]}: taken over after "
          f"{taken_over if taken_over is None else round(taken_over, 1)} s, succeeded after {succeeded:.1f} s "
          f"(lease {lease_seconds} s)")
    assert final[0] == "succeeded" and final[3] == 2 and final[1] is None, final  # taken over once, finished
    assert view["release"]["charged_epsilon"] == epsilon
    # the survivor's claim (its attempt's start) came once the dead one's lease had expired, not before — a lower
    # bound, which load cannot break (issue 40: "the lease, then the next poll" as a stopwatch failed under load)
    assert _utc(started) >= _utc(expires), (started, expires)
    assert spent == epsilon and len(releases) == 1  # charged once
    assert view["release"]["id"] == releases[0]["id"]


def test_a_replay_while_the_first_request_still_creates_the_job_waits_for_its_outcome(parties):
    """The review's race: while the first request with a key still asks for the release (which may be refused, and
    then its job is not kept), a replay answered 200 with a job that later read 404. Now it answers 409
    release_in_progress until the creating request is done, then the job as it is."""
    ctx, trainer = parties["trainer_ctx"], parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    body, key = _job(parties), {"Idempotency-Key": "still-creating"}
    created = trainer.post("/v1/jobs", json=body, headers=key)
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    with ctx.sessions() as session, session.begin():  # as the creating request of another process holds it
        session.execute(update(db.Job).where(db.Job.id == job_id).values(
            status="queued", attempts=0, lease_owner="another-process",
            lease_expires_at=utcnow() + timedelta(seconds=60)))
    replay = trainer.post("/v1/jobs", json=body, headers=key)
    assert replay.status_code == 409 and replay.json()["error"]["code"] == "release_in_progress", replay.text
    with ctx.sessions() as session, session.begin():  # that process died: its lease expired
        session.execute(update(db.Job).where(db.Job.id == job_id).values(
            lease_expires_at=utcnow() - timedelta(seconds=1)))
    replay = trainer.post("/v1/jobs", json=body, headers=key)
    assert (replay.status_code, replay.json()["id"]) == (200, job_id), replay.text
