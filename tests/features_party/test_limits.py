"""The trainer's bounds (issue 28, items 3 and 11) against a real labels-party server: a job over the size limit
is refused before the labels party is asked anything, a job over the wall-time limit stops (its worker free again)
and fails with ``job_time_limit``, an organization's jobs are capped (429 + Retry-After), organizations take turns
in the queue, and a job whose features share no id with the labels, or too few, is refused with nothing charged.
About 40 s on the 2-core development machine."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from features_party import process as trainer_context_module
from features_party.api import create_app as create_trainer
from features_party.client import BudgetExceeded, LabelsPartyClient
from features_party.settings import TrainerSettings
from labeldp.local_services import serve_in_thread
from shared import models
from tests.features_party import test_api
from tests.features_party.test_api import (
    N,
    _finish,
    _job,
    _Listener,
    _spent,
    _upload,
    kept_for_estimate,
    trainer_client,
    trainer_context,
)

parties = test_api.parties  # the fixture: a labels-party server with a dataset of N labels, and a trainer


def _ledger(parties) -> tuple[float, int, int]:
    """What the labels party has recorded: ε spent on the dataset, its releases, its audit records."""
    owner, dataset = parties["owner"], parties["dataset"]
    return (_spent(parties), len(owner.get(f"/v1/datasets/{dataset}/releases").json()),
            len(owner.get("/v1/audit", params={"dataset": dataset}).json()["events"]))


def test_a_job_over_the_size_limit_is_refused_before_the_labels_party_is_asked_anything(parties):
    big = {"hidden": [2048] * 4, "epochs": 1000, "batch_size": 1, "patience": 1000}  # the review's job
    # 2 numeric + 4 × (3 groups + unseen) embeddings → 2048 ×4 → 1 output; counted by hand, not by the code
    parameters = 4 * 4 + (6 * 2048 + 2048) + 3 * (2048 * 2048 + 2048) + (2048 + 1)
    listener = _Listener()
    try:  # a trainer whose labels party is a bare listener: the refusal must not connect to it at all
        ctx = trainer_context(parties["tmp"] / "sized", listener.url)
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        refused = trainer.post("/v1/jobs", json={**_job(parties), "train": big})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_too_large", refused.text
        assert f"{parameters:,} parameters × 1,000 epochs × {N:,} rows" in refused.json()["error"]["message"]
        assert listener.connections == 0 and trainer.get("/v1/jobs").json() == []
        ctx.jobs.stop()
    finally:
        listener.close()
    before = _ledger(parties)
    trainer = parties["trainer"]  # the real labels party: nothing is released, charged or audited
    assert _upload(trainer, parties["features"]).status_code == 200
    refused = trainer.post("/v1/jobs", json={**_job(parties), "train": big})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_too_large"
    assert _ledger(parties) == before and before[:2] == (0.0, 0)
    under = {**big, "hidden": [64, 32], "batch_size": 1024, "patience": 3}  # 2,577 × 1,000 × 1,500 = 3.9e9
    assert trainer.post("/v1/jobs", json={**_job(parties, mechanism="rr"), "train": under}).status_code == 202
    assert models.num_params(models.ModelSpec(2, (4,), 4, (2048,) * 4, 1)) == parameters


def test_a_job_over_the_time_limit_stops_fails_with_its_code_and_frees_its_worker(parties):
    limit = 3.0
    ctx = trainer_context(parties["tmp"] / "timed", parties["labels_url"], max_job_seconds=limit, workers=1)
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    slow = {"hidden": [512, 512], "epochs": 1000, "batch_size": 1, "patience": 1000, "learning_rate": 1e-4}
    created = trainer.post("/v1/jobs", json={**_job(parties, mechanism="rr", epsilon=1.0), "train": slow})  # 4e11
    assert created.status_code == 202, created.text
    quick = trainer.post("/v1/jobs", json={**_job(parties), "release_id": created.json()["release"]["id"],
                                           "release": None})  # queued behind it on the only worker
    assert quick.status_code == 202, quick.text
    stopped = _finish(trainer, created.json()["id"])
    assert stopped["status"] == "failed" and stopped["error_code"] == "job_time_limit", stopped
    # stopped at a device call past the limit (no upper bound on the wall time: a loaded machine stretches it),
    # long before the 1000 epochs it asked for
    assert stopped["seconds"] >= limit and stopped["progress"]["epoch"] < 1000, stopped
    done = _finish(trainer, quick.json()["id"])  # the worker was freed: the next job ran
    # to the end — or, on a machine loaded enough that its compilation alone takes 3 s, to the same limit: it ran
    assert (done["status"], done["error_code"]) in {("succeeded", None), ("failed", "job_time_limit")}, done
    assert _spent(parties) == 1.0  # the stopped job's release was drawn, so it stays charged; the other reused it
    ctx.jobs.stop()


def test_jobs_per_organization_and_organizations_take_turns(parties):
    ctx = trainer_context(parties["tmp"] / "fair", parties["labels_url"], start=False, workers=1,
                          max_jobs_per_org=4)  # its one worker starts once every job is queued
    a, b = trainer_client(ctx, "publisher"), trainer_client(ctx, "adnet")
    for client in (a, b):
        assert _upload(client, parties["features"]).status_code == 200
    first = a.post("/v1/jobs", json=_job(parties, mechanism="rr", epsilon=1.0))  # the one release; the rest reuse it
    assert first.status_code == 202, first.text
    seconds = {"hidden": [256, 256], "batch_size": 16, "epochs": 30, "patience": 30}  # ~1 s each
    reuse = {**_job(parties), "release": None, "release_id": first.json()["release"]["id"], "train": seconds}
    queued = [a.post("/v1/jobs", json=reuse) for _ in range(3)]
    assert [r.status_code for r in queued] == [202] * 3
    over = a.post("/v1/jobs", json=reuse)  # a fifth job of the organization: refused, nothing asked upstream
    assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_jobs", over.text
    assert over.headers["Retry-After"] == "30" and len(a.get("/v1/jobs").json()) == 4
    other = b.post("/v1/jobs", json=reuse)  # another organization's job: its own slots, its own turn
    assert other.status_code == 202, other.text
    order = [first.json()["id"]] + [r.json()["id"] for r in queued]
    ctx.jobs.start()  # A's four jobs, then B's, were queued: A's first runs, then B's (first in, first out: A's four)
    while (view := b.get(f"/v1/jobs/{other.json()['id']}").json())["status"] not in ("succeeded", "failed"):
        time.sleep(0.02)
    statuses = [a.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in order]
    assert view["status"] == "succeeded", view
    # B's job ran right after the job that was running when it came: A's queued jobs did not go first
    assert statuses[0] == "succeeded" and "succeeded" not in statuses[1:], statuses
    assert all(_finish(a, job_id)["status"] == "succeeded" for job_id in order)
    assert a.post("/v1/jobs", json=reuse).status_code == 202  # its slots are free again
    assert _spent(parties) == 1.0
    ctx.jobs.stop()


def test_an_organizations_job_count_holds_under_concurrent_requests(parties, database_url):
    """Eight jobs of one organization at once over HTTP, on SQLite and PostgreSQL: exactly the limit is kept."""
    if database_url.startswith("sqlite"):  # the fixture's SQLite file is the labels party's
        database_url = f"sqlite:///{parties['tmp']}/concurrent.db"
    ctx = trainer_context_module.make_context(TrainerSettings(
        database_url=database_url, data_dir=parties["tmp"] / "concurrent", labels_parties={"office": parties[
            "labels_url"]}, upstream_timeout_seconds=20, upstream_retries=0, workers=1, max_jobs_per_org=3,
        job_poll_seconds=0.1))  # its workers start once the jobs are created: nothing finishes before
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    first = trainer.post("/v1/jobs", json=_job(parties, mechanism="rr", epsilon=1.0))
    assert first.status_code == 202, first.text
    reuse = {**_job(parties), "release": None, "release_id": first.json()["release"]["id"]}
    with serve_in_thread(create_trainer(ctx)) as url:
        def post(_):
            with httpx.Client(base_url=url, headers=dict(trainer.headers), timeout=60) as http:
                return http.post("/v1/jobs", json=reuse).status_code

        with ThreadPoolExecutor(8) as pool:
            statuses = sorted(pool.map(post, range(8)))
        ctx.jobs.start()
        assert statuses == [202] * 2 + [429] * 6
        jobs = trainer.get("/v1/jobs").json()
        assert len(jobs) == 3 and all(_finish(trainer, job["id"])["status"] == "succeeded" for job in jobs)
    ctx.jobs.stop()


def test_workers_claim_for_the_organization_that_started_a_job_longest_ago(database_url, tmp_path):
    """The claim order of the jobs table (features_party.jobs), on SQLite and PostgreSQL: the organization whose
    last job started longest ago first (one that never started a job first), then the oldest job."""
    from datetime import timedelta

    from features_party import db
    from features_party.jobs import job_table
    from shared.service.database import utcnow

    if database_url.startswith("sqlite"):
        database_url = f"sqlite:///{tmp_path}/fair.db"
    ctx = trainer_context_module.make_context(TrainerSettings(database_url=database_url, data_dir=tmp_path / "t"))
    table, names = job_table(ctx), {}
    with ctx.sessions() as session, session.begin():
        orgs = [db.Organization(name=name) for name in ("a", "b", "c")]
        session.add_all(orgs)
        session.flush()
        org_ids = {org.name: org.id for org in orgs}
    created = utcnow()

    def queue(name: str) -> None:
        nonlocal created
        created += timedelta(seconds=1)  # the order they were created in, whatever the clock's resolution
        with ctx.sessions() as session, session.begin():
            row = db.Job(org_id=org_ids[name[0]], status="queued", labels_party="office", dataset_id="d",
                         request_json="{}", sealed_api_key=b"sealed", created_at=created)
            session.add(row)
            session.flush()
            names[row.id] = name

    def claim_and_finish() -> str | None:
        with ctx.sessions() as session, session.begin():
            lease = table.claim(session, "worker", 30)
            if lease is None:
                return None
            table.finish(session.get(db.Job, lease.job_id), "succeeded")
            return names[lease.job_id]

    queue("a1")
    ran = [claim_and_finish()]  # a1 runs at once (a free worker)
    for name in ("a2", "a3", "a4", "b1", "c1", "b2"):
        queue(name)
    while (name := claim_and_finish()) is not None:
        ran.append(name)
    assert ran == ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]


def test_a_job_sharing_no_id_or_too_few_with_the_labels_is_refused_and_charges_nothing(parties):
    trainer = parties["trainer"]
    strangers = parties["features"].assign(example_id=[f"s{i}" for i in range(N)])  # no id of the labels
    assert _upload(trainer, strangers).status_code == 200
    before = _ledger(parties)
    refused = trainer.post("/v1/jobs", json=_job(parties))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "labels_party_refused", refused.text
    assert "s0" not in refused.text and "nothing was spent" in refused.json()["error"]["message"]
    few = _upload(trainer, parties["features"].head(9), name="few")
    assert few.status_code == 200
    for job in ({**_job(parties), "features": "few"},
                {**_job(parties, example_ids=[f"u{i}" for i in range(5)]), "features": "few"}):
        response = trainer.post("/v1/jobs", json=job)
        assert response.status_code == 400 and response.json()["error"]["code"] == "too_few_examples", response.text
    assert _ledger(parties) == before and before[:2] == (0.0, 0) and trainer.get("/v1/jobs").json() == []
    # an existing release shares no id with this table either: the job fails without naming one, nothing spent
    assert _upload(trainer, parties["features"], name="f2").status_code == 200
    first = trainer.post("/v1/jobs", json={**_job(parties, mechanism="rr", epsilon=1.0), "features": "f2",
                                           "train": {"epochs": 1}})
    release = _finish(trainer, first.json()["id"])["release"]
    spent = _spent(parties)
    job = _finish(trainer, trainer.post("/v1/jobs", json={**_job(parties), "release": None,
                                                           "release_id": release["id"]}).json()["id"])
    assert job["status"] == "failed" and job["error_code"] == "no_overlap", job
    assert "s0" not in job["error"] and "u0" not in job["error"] and _spent(parties) == spent == 1.0


def test_a_whole_dataset_job_asks_for_the_ids_of_its_features_table_only(parties):
    """Examples without features are not charged: the job over half the table releases half the examples, and the
    other half can still spend all of the organization's ε."""
    trainer, half = parties["trainer"], N // 2
    assert _upload(trainer, parties["features"].iloc[:half]).status_code == 200
    job = _finish(trainer, trainer.post("/v1/jobs", json={**_job(parties, mechanism="rr", epsilon=1.0),
                                                          "train": {"epochs": 2}}).json()["id"])
    assert job["status"] == "succeeded", job
    # RR is biased on numbers: the estimate rows have an opt-unbiased release of their own, at the same ε
    kept = kept_for_estimate(parties["features"]["example_id"].iloc[:half])
    assert job["release"]["num_examples"] == job["num_train_examples"] == half - kept
    assert job["request"]["release"]["num_example_ids"] == half and job["estimate"]["num_examples"] == kept
    ids = [f"u{i}" for i in range(N)]
    with LabelsPartyClient(parties["labels_url"], parties["consumer"], retries=0) as labels:
        with pytest.raises(BudgetExceeded):  # the trained-on half has 9 of its 10 left
            labels.request_release(parties["dataset"], {"mechanism": "rr", "epsilon": 9.5, "example_ids": ids[:half]})
        rest = labels.request_release(parties["dataset"], {"mechanism": "rr", "epsilon": 9.5,
                                                           "example_ids": ids[half:]})
    assert rest.num_examples == half
