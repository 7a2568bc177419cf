"""An uploaded dataset's release is computed in its request under a lease (labels_party/releases/liveness.py). Two
contexts on one database and data directory stand for two replicas (SQLite and PostgreSQL):

* a release computed normally leaves its ``compute_release`` job ``succeeded`` (leased by its process while it
  computed, renewed by its runner's heartbeat) and is otherwise what it was: one ledger record, 201, the replay 200;
* a process that died after the charge (its lease left to expire) has its release failed by the other replica's
  worker — charged once, its file removed — and the client's re-send gets ``release_failed``, no longer
  ``release_in_progress``; a lone start then changes nothing, and a lone start that comes first fails it once;
* a request whose lease was taken over (before or after it wrote its labels, the release already failed or the job
  only claimed) neither makes its release available nor delivers anything: it answers the same ``release_failed``
  as any failure after the charge;
* a job out of attempts fails its release the same way.

No clock decides anything here: leases are expired by writing their expiry, renewals are ``beat()``, workers run by
``run_pending()``. The contexts' leases last an hour, so their heartbeats (every 20 minutes) never run during a test.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.ledger import entries
from labels_party.releases import transaction
from labels_party.runtime import jobs, workers
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.service.leases import Lease
from tests.labels_party.api.helpers import bearer, labels_csv, new_dataset, upload

EPSILON = 1.0
FAILED = {"code": "release_failed", "message": "the release could not be completed after it was charged"}


class Died(BaseException):
    """The process computing the release is gone: nothing after this point of the request runs."""


class Checkpoints:
    """The release transaction's checkpoints, each with an action a test sets."""

    def __init__(self):
        self.actions: dict = {}

    def __call__(self, name: str) -> None:
        action = self.actions.pop(name, None)
        if action is not None:
            action()


@pytest.fixture()
def replicas(tmp_path, database_url):
    """Two contexts (replicas) on one database and data directory, an uploaded dataset granted to a publisher, a
    client of each, and the first context's checkpoints."""
    settings = LabelsSettings(database_url=database_url, data_dir=tmp_path / "data", job_lease_seconds=3600,
                              job_retry_seconds=0)
    checkpoints = Checkpoints()
    first = make_context(settings=settings, checkpoint=checkpoints)
    second = make_context(settings=settings)  # another live process on the data directory: a lone start it is not
    with first.sessions() as session, session.begin():
        keys = {"owner": bearer(create_key(first.ledger, session, "hospital", "admin")),
                "publisher": bearer(create_key(first.ledger, session, "publisher", "consumer"))}
    clients = [TestClient(create_app(ctx), raise_server_exceptions=False) for ctx in (first, second)]
    dataset = new_dataset(clients[0], keys["owner"], name="visits", label_kind="integer", min=0, max=9,
                          epsilon_total=3)
    assert upload(clients[0], keys["owner"], dataset,
                  labels_csv({f"p{i}": i % 10 for i in range(300)})).status_code == 200
    assert clients[0].post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3},
                           headers=keys["owner"]).status_code == 201
    yield (first, second), clients, keys, dataset, checkpoints
    for ctx in (first, second):
        ctx.close()


def _release(client, keys, dataset, key="weekly"):
    return client.post(f"/v1/datasets/{dataset}/releases", headers={**keys["publisher"], "Idempotency-Key": key},
                       json={"mechanism": "rr", "epsilon": EPSILON})


def _only_release(ctx, dataset) -> db.Release:
    with ctx.sessions() as session:
        [release] = session.scalars(select(db.Release).where(db.Release.dataset_id == dataset)).all()
        return release


def _job(ctx, release_id) -> db.Job:
    with ctx.sessions() as session:
        job = jobs.job_of(session, jobs.COMPUTE_RELEASE, release_id)
        assert job is not None
        return job


def _expire(ctx, job_id: str) -> None:
    """The lease runs out: nothing renewed it (its process is gone, or cut off past it)."""
    with ctx.sessions() as session, session.begin():
        session.get(db.Job, job_id).lease_expires_at = db.utcnow() - timedelta(seconds=1)


def _charged_once(ctx, dataset, release_id) -> None:
    with ctx.sessions() as session:
        records = [entry.record for entry in entries(session, dataset) if entry.is_release]
        spent = session.get(db.Dataset, dataset).epsilon_spent_units
    assert [record["release_id"] for record in records] == [release_id]
    assert spent == records[0]["charge_units"] == EPSILON * 10**9


def _release_dies_at(name: str, replicas, monkeypatch) -> None:
    """A release sent to the first replica, whose process dies at checkpoint ``name``: nothing it would do next
    happens (no failure recorded, no renewal)."""
    _, clients, keys, dataset, checkpoints = replicas
    monkeypatch.setattr(transaction, "fail", lambda *_args: None)
    died: list[str] = []

    def die() -> None:
        died.append(name)
        raise Died

    checkpoints.actions[name] = die
    answer = _release(clients[0], keys, dataset)
    assert died == [name] and answer.status_code == 500  # no answer of the service's (TestClient's own 500)


def test_a_release_computed_normally_leaves_its_job_succeeded(replicas):
    (first, second), clients, keys, dataset, checkpoints = replicas
    seen: dict = {}

    def computing() -> None:  # the request, its labels written: its lease is held and renewed
        release_id = _only_release(first, dataset).id
        before = _job(first, release_id)
        first.jobs.beat()
        seen.update(before=before, after=_job(first, release_id), holding=first.jobs.holding())

    checkpoints.actions["release_written"] = computing
    answer = _release(clients[0], keys, dataset)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    before, after = seen["before"], seen["after"]
    assert (before.state, before.attempts, before.lease_owner, before.spec_json) == ("running", 1, first.jobs.owner,
                                                                                     "{}")
    assert after.lease_expires_at > before.lease_expires_at  # renewed by the heartbeat
    assert seen["holding"] == [before.id]
    job = _job(first, body["id"])
    assert (job.state, job.attempts, job.lease_owner, job.lease_expires_at) == ("succeeded", 1, None, None)
    with first.sessions() as session:
        publisher = session.scalar(select(db.Organization.id).where(db.Organization.name == "publisher"))
    assert job.org_id == publisher and job.subject_id == body["id"]
    assert first.jobs.holding() == []  # let go with the request
    _expire(first, job.id)
    assert second.jobs.run_pending() == 0  # a finished job is nobody's to take over
    assert body["state"] == "available" and body["error"] is None
    _charged_once(first, dataset, body["id"])
    again = _release(clients[1], keys, dataset)
    assert again.status_code == 200 and again.json() == body
    assert clients[1].get(f"/v1/releases/{body['id']}/labels", headers=keys["publisher"]).status_code == 200


@pytest.mark.parametrize("died_at", ["after_charge_commit", "release_written"])
def test_a_dead_processes_release_is_failed_by_the_other_replica(replicas, monkeypatch, died_at):
    (first, second), clients, keys, dataset, checkpoints = replicas
    monkeypatch.setattr(transaction, "OUTCOME_WAIT_SECONDS", 0)  # a re-send answers at once
    _release_dies_at(died_at, replicas, monkeypatch)
    release = _only_release(second, dataset)
    job = _job(second, release.id)
    assert (release.state, job.state, job.lease_owner, job.attempts) == ("running", "running", first.jobs.owner, 1)
    assert first.jobs.holding() == []  # nothing renews it
    written = second.store.path(release.file)
    assert written.exists() == (died_at == "release_written")
    resent = _release(clients[1], keys, dataset)
    assert (resent.status_code, resent.json()["error"]["code"]) == (409, "release_in_progress")
    assert second.jobs.run_pending() == 0  # its lease is live: nobody may take it

    _expire(second, job.id)
    assert second.jobs.run_pending() == 1
    release, job = _only_release(second, dataset), _job(second, release.id)
    assert (release.state, json.loads(release.error_json)) == ("failed", FAILED)
    assert (job.state, job.attempts, job.lease_owner, job.error_code) == ("failed", 2, None, "release_failed")
    assert not written.exists()
    _charged_once(second, dataset, release.id)
    for client in clients:  # the client's re-sends converge: the release's failure, never a new draw or charge
        resent = _release(client, keys, dataset)
        assert (resent.status_code, resent.json()["error"]["code"]) == (503, "release_failed")
    assert second.jobs.run_pending() == 0
    _charged_once(second, dataset, release.id)


def test_a_lone_start_fails_a_dead_processes_release_once(replicas, monkeypatch):
    (first, second), clients, keys, dataset, checkpoints = replicas
    _release_dies_at("release_written", replicas, monkeypatch)
    settings = first.settings
    for ctx in (first, second):
        ctx.close()
    alone = make_context(settings=settings)  # the only process on the data directory: it sweeps
    try:
        release = _only_release(alone, dataset)
        job = _job(alone, release.id)
        assert (release.state, json.loads(release.error_json)) == ("failed", FAILED)
        assert (job.state, job.lease_owner, job.error_code) == ("failed", None, "release_failed")
        assert not alone.store.path(release.file).exists()
        _expire(alone, job.id)
        assert alone.jobs.run_pending() == 0  # finished with its release: no worker handles it again
        _charged_once(alone, dataset, release.id)
    finally:
        alone.close()


def test_a_lone_start_after_the_takeover_changes_nothing(replicas, monkeypatch):
    (first, second), clients, keys, dataset, checkpoints = replicas
    _release_dies_at("after_charge_commit", replicas, monkeypatch)
    release_id = _only_release(second, dataset).id
    _expire(second, _job(second, release_id).id)
    assert second.jobs.run_pending() == 1
    failed = _only_release(second, dataset)
    settings = first.settings
    for ctx in (first, second):
        ctx.close()
    alone = make_context(settings=settings)
    try:
        again = _only_release(alone, dataset)
        assert (again.state, again.error_json) == ("failed", failed.error_json)
        assert _job(alone, release_id).attempts == 2
    finally:
        alone.close()


@pytest.mark.parametrize("taken_at", ["after_charge_commit", "release_written"])
def test_a_request_whose_lease_was_taken_over_delivers_nothing(replicas, taken_at):
    """The request is slow (paused, cut off from the database) past its lease: the other replica fails the
    release, before or after the request wrote its labels; the request, going on, records nothing, removes what it
    wrote and answers like any failure after the charge."""
    (first, second), clients, keys, dataset, checkpoints = replicas

    def taken_over() -> None:
        release = _only_release(second, dataset)
        _expire(second, _job(second, release.id).id)
        assert second.jobs.run_pending() == 1
        assert _only_release(second, dataset).state == "failed"

    checkpoints.actions[taken_at] = taken_over
    answer = _release(clients[0], keys, dataset)
    release = _only_release(second, dataset)
    assert answer.status_code == 503, answer.text
    assert answer.json() == {"error": {"code": "release_failed", "message": str(transaction.release_failed(
        release.id))}}  # what any failure after the charge answers: nothing about the data
    assert (release.state, json.loads(release.error_json), release.mechanism_hash) == ("failed", FAILED, None)
    assert not second.store.path(release.file).exists()
    job = _job(second, release.id)
    assert (job.state, job.attempts, job.lease_owner) == ("failed", 2, None)
    assert first.jobs.holding() == []
    _charged_once(second, dataset, release.id)
    assert clients[1].get(f"/v1/releases/{release.id}/labels", headers=keys["publisher"]).status_code != 200
    resent = _release(clients[1], keys, dataset)
    assert (resent.status_code, resent.json()["error"]["code"]) == (503, "release_failed")


def test_a_request_whose_lease_was_claimed_but_not_yet_run_records_nothing(replicas):
    """The other replica's worker claimed the job and has not run it yet: the release is still ``running``, and the
    request, finishing, must not make it available (its lease is no longer its own)."""
    (first, second), clients, keys, dataset, checkpoints = replicas
    claimed: list[Lease] = []

    def claimed_by_the_other() -> None:
        _expire(second, _job(second, _only_release(second, dataset).id).id)
        with second.sessions() as session, session.begin():
            claimed.append(second.jobs.table.claim(session, second.jobs.owner, second.settings.job_lease_seconds))

    checkpoints.actions["release_written"] = claimed_by_the_other
    answer = _release(clients[0], keys, dataset)
    assert (answer.status_code, answer.json()["error"]["code"]) == (503, "release_failed")
    release = _only_release(second, dataset)
    assert (release.state, release.mechanism_hash) == ("running", None)  # the holder of the lease fails it
    assert not second.store.path(release.file).exists()  # what the request wrote went with it
    [lease] = claimed
    workers.run(second, lease, threading.Event())
    release, job = _only_release(second, dataset), _job(second, release.id)
    assert (release.state, json.loads(release.error_json)) == ("failed", FAILED)
    assert (job.state, job.attempts) == ("failed", 2)
    _charged_once(second, dataset, release.id)


def test_a_lost_lease_is_flagged_by_the_heartbeat(replicas, caplog):
    (first, second), clients, keys, dataset, checkpoints = replicas

    def taken_over_then_beat() -> None:
        release = _only_release(second, dataset)
        _expire(second, _job(second, release.id).id)
        assert second.jobs.run_pending() == 1
        first.jobs.beat()  # finds the lease someone else's: not renewed, flagged lost

    checkpoints.actions["release_written"] = taken_over_then_beat
    with caplog.at_level("WARNING", logger="labeldp.jobs"):
        assert _release(clients[0], keys, dataset).status_code == 503
    assert any("lost the lease" in record.getMessage() for record in caplog.records)
    assert _job(second, _only_release(second, dataset).id).lease_owner is None  # not renewed back


def test_a_job_out_of_attempts_fails_its_release_the_same_way(replicas, monkeypatch):
    (first, second), clients, keys, dataset, checkpoints = replicas
    _release_dies_at("release_written", replicas, monkeypatch)
    release = _only_release(second, dataset)
    _expire(second, _job(second, release.id).id)
    once = make_context(settings=second.settings.model_copy(update={"job_max_attempts": 1}))
    try:
        assert once.jobs.run_pending() == 0  # out of attempts: failed in the claim, not run
        release, job = _only_release(once, dataset), _job(once, release.id)
        assert (release.state, json.loads(release.error_json)) == ("failed", FAILED)
        assert (job.state, job.attempts, job.lease_owner) == ("failed", 1, None)
        assert not once.store.path(release.file).exists()
        _charged_once(once, dataset, release.id)
    finally:
        once.close()


def test_workers_take_the_job_of_the_organization_with_the_fewest_running_first(tmp_path, database_url):
    """The review's starvation: one organization queued 20 source releases and another's next one waited behind
    them all. Claims now go to the organization with the fewest jobs running, then the oldest job."""
    settings = LabelsSettings(database_url=database_url, data_dir=tmp_path / "data")
    ctx = make_context(settings=settings)
    try:
        with ctx.sessions() as session, session.begin():
            create_key(ctx.ledger, session, "busy", "admin")
            create_key(ctx.ledger, session, "other", "admin")
            orgs = {org.name: org.id for org in session.scalars(select(db.Organization))}
            busy = [jobs.queue(session, org_id=orgs["busy"], kind="privatize_source", subject_id=f"b{i}", spec={})
                    for i in range(3)]
        with ctx.sessions() as session, session.begin():  # the later job of the other organization
            theirs = jobs.queue(session, org_id=orgs["other"], kind="privatize_source", subject_id="o0", spec={})
        table = jobs.lease_table(settings, ctx.store)
        with ctx.sessions() as session, session.begin():
            assert table.claim(session, "worker-1", 60).job_id == busy[0].id  # none running: the oldest first
        with ctx.sessions() as session, session.begin():
            assert table.claim(session, "worker-2", 60).job_id == theirs.id  # busy has one running: other first
        with ctx.sessions() as session, session.begin():
            assert table.claim(session, "worker-3", 60).job_id == busy[1].id  # one running each: the oldest
    finally:
        ctx.close()
