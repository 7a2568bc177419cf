"""A trainer organization's jobs count against its storage quota (issue 40, the twenty-eighth review: seven jobs
reusing one release stored 31.5 MB against a 3 MB quota — models and predictions were not counted): a job whose
outputs (a prediction a row of its table, its model) would take its organization over its quota is 507
storage_quota_exceeded when it is created, before anything is asked of the labels party, and not kept."""

from __future__ import annotations

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
