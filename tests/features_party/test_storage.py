"""A trainer organization's jobs count against its storage quota (issue 40, the twenty-eighth review: seven jobs
reusing one release stored 31.5 MB against a 3 MB quota — models and predictions were not counted): a job whose
outputs (a prediction a row of its table, its model) would take its organization over its quota is 507
storage_quota_exceeded when it is created, before anything is asked of the labels party, and not kept."""

from __future__ import annotations

from shared.service.storage_quota import tree_bytes
from tests.features_party.test_api import _finish, _job, _spent, _upload, trainer_client, trainer_context


def test_jobs_stop_at_the_quota_their_outputs_count_against(parties):
    ctx = trainer_context(parties["tmp"] / "quota", parties["labels_url"], max_stored_bytes_per_org=600_000)
    try:
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        first = trainer.post("/v1/jobs", json=_job(parties))
        assert first.status_code == 202, first.text
        release_id = _finish(trainer, first.json()["id"])["release"]["id"]
        spent, codes = _spent(parties), []
        request = {key: value for key, value in _job(parties).items() if key != "release"}
        for _ in range(20):  # jobs on the same release: nothing more spent, but each stores its outputs
            answer = trainer.post("/v1/jobs", json={**request, "release_id": release_id})
            codes.append(answer.status_code)
            if answer.status_code != 202:
                break
            _finish(trainer, answer.json()["id"])
        assert codes[-1] == 507 and answer.json()["error"]["code"] == "storage_quota_exceeded", codes
        assert 2 <= len(codes) < 20
        assert len(trainer.get("/v1/jobs").json()) == len(codes)  # the refused job is not kept
        assert _spent(parties) == spent
    finally:
        ctx.jobs.stop()
        ctx.close()


def test_jobs_waiting_to_run_count_at_their_estimate(parties):
    """The thirty-second review (by reading; the twenty-ninth measured 2.18 times the quota): a job that has not
    written yet counted nothing, so ``max_jobs_per_org`` jobs created at once each passed against the same usage. A
    job's estimate is recorded with its check and counted until it ends: with the workers stopped, the quota that
    holds one job's outputs admits one job; the next is refused, and once the first has run (its real files counted
    instead) the count is what its directory holds."""
    from features_party import db

    probe = trainer_context(parties["tmp"] / "probe", parties["labels_url"], start=False)
    try:
        trainer = trainer_client(probe, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        first = trainer.post("/v1/jobs", json=_job(parties))
        assert first.status_code == 202, first.text
        with probe.sessions() as session:
            estimate = session.get(db.Job, first.json()["id"]).output_bytes
            table = probe._stored(session, session.get(db.Job, first.json()["id"]).org_id) - estimate
    finally:
        probe.jobs.stop()
        probe.close()
    assert estimate > 0
    ctx = trainer_context(parties["tmp"] / "quota", parties["labels_url"], start=False,
                          max_stored_bytes_per_org=table + estimate * 3 // 2)
    try:
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        spent = _spent(parties)
        first = trainer.post("/v1/jobs", json=_job(parties))
        assert first.status_code == 202, first.text
        spent_once = _spent(parties)
        second = trainer.post("/v1/jobs", json=_job(parties, epsilon=2.0))
        assert second.status_code == 507 and second.json()["error"]["code"] == "storage_quota_exceeded", second.text
        assert _spent(parties) == spent_once > spent  # refused before its release was asked for
        ctx.jobs.start()
        assert _finish(trainer, first.json()["id"])["status"] == "succeeded"
        with ctx.sessions() as session:
            org = session.get(db.Job, first.json()["id"]).org_id
            written = tree_bytes(ctx.data_dir / "jobs" / first.json()["id"])
            assert ctx._stored(session, org) == table + written
        assert 0 < written <= estimate
    finally:
        ctx.jobs.stop()
        ctx.close()
