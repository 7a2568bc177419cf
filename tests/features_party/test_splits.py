"""Jobs by split against a real labels-party server: a hashed holdout fraction or a named id list uploaded once
instead of every training id in the job body; the labels party is asked for the training rows only, the predictions
mark the held-out ones, splits that cannot run are 4xx that spend nothing, id lists belong to their organization
and never show their ids, a split job's attempts ask for the same release, and a succeeded job has its seconds."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import event

from features_party import db
from features_party.api import create_app as create_trainer
from features_party.client import LabelsPartyClient
from features_party.trainer_client import TrainerClient
from labeldp.local_services import serve_in_thread
from shared.splits import holdout_mask
from tests.features_party import test_api
from tests.features_party.test_api import N, _finish, _job, _spent, _upload, trainer_client, trainer_context

parties = test_api.parties  # the fixture: a labels-party server with a dataset of N labels, and a trainer


def _split_job(parties, split):
    job = _job(parties)
    return {**job, "split": split}


def _released_ids(parties, release_id: str) -> set[str]:
    with LabelsPartyClient(parties["labels_url"], parties["consumer"]) as client:
        return set(client.download_labels(release_id).column("example_id").to_pylist())


def _csv(ids) -> str:
    return "example_id\n" + "".join(f"{i}\n" for i in ids)


def test_a_job_by_holdout_fraction_trains_on_the_rows_the_hash_keeps(parties):
    trainer, features = parties["trainer"], parties["features"]
    assert _upload(trainer, features).status_code == 200
    held = holdout_mask(features["example_id"], 0.2, 7)  # what the user computes on their own
    assert 0.15 < held.mean() < 0.25
    created = trainer.post("/v1/jobs", json=_split_job(parties, {"holdout_fraction": 0.2, "seed": 7}))
    assert created.status_code == 202, created.text
    view = created.json()
    assert view["request"]["split"] == {"holdout_fraction": 0.2, "seed": 7}
    assert view["request"]["release"]["num_example_ids"] == view["release"]["num_examples"] == N - held.sum()
    assert _released_ids(parties, view["release"]["id"]) == set(features["example_id"][~held])  # none held out
    assert _spent(parties) == 4.0
    job = _finish(trainer, view["id"])
    assert job["status"] == "succeeded", job["error"]
    assert (job["num_train_examples"], job["num_holdout_examples"]) == (N - held.sum(), held.sum())
    assert job["seconds"] > 0
    predictions = pd.read_parquet(io.BytesIO(trainer.get(f"/v1/jobs/{job['id']}/predictions", headers={
        "Accept": "application/vnd.apache.parquet"}).content)).set_index("example_id")
    assert predictions["holdout"].dtype == bool
    expected = pd.Series(held, index=features["example_id"])
    pd.testing.assert_series_equal(predictions["holdout"], expected[predictions.index], check_names=False)
    test_ids = predictions.index[predictions["holdout"]]
    truth = parties["labels"][test_ids]
    assert np.mean((predictions["prediction"][test_ids] - truth) ** 2) < 0.25 * np.var(truth)
    page = trainer.get(f"/v1/jobs/{job['id']}/predictions", headers={"Accept": "application/json"},
                       params={"limit": N}).json()
    assert sum(item["holdout"] is True for item in page["items"]) == held.sum()
    as_csv = pd.read_csv(io.StringIO(trainer.get(f"/v1/jobs/{job['id']}/predictions").text))
    assert as_csv["holdout"].dtype == bool and as_csv["holdout"].sum() == held.sum()
    last = job["metrics"][-1]
    assert last["val_mse"] == pytest.approx(2 * last["val_loss"])


def test_a_job_by_an_id_list_uploaded_once_through_the_client(parties):
    ctx, features = parties["trainer_ctx"], parties["features"]
    trainer = parties["trainer"]
    assert _upload(trainer, features).status_code == 200
    test_ids = features["example_id"].sample(300, random_state=1).tolist()
    member = trainer_client(ctx, "publisher", role="member")
    with serve_in_thread(create_trainer(ctx)) as url, \
            TrainerClient(url, member.headers["Authorization"].removeprefix("Bearer ")) as client:
        uploaded = client.put_id_list("test-rows", test_ids)  # any key of the organization
        assert (uploaded.name, uploaded.num_ids) == ("test-rows", 300)
        assert [v.name for v in client.id_lists()] == ["test-rows"]
        job = client.train(_split_job(parties, {"holdout_ids": "test-rows"}))
        assert (job.num_train_examples, job.num_holdout_examples) == (N - 300, 300)
        assert job.release is not None and job.release["num_examples"] == N - 300
        assert _released_ids(parties, job.release["id"]).isdisjoint(test_ids)
        predictions = client.predictions(job.id).set_index("example_id")
    assert set(predictions.index[predictions["holdout"]]) == set(test_ids)
    shown = trainer.get("/v1/id-lists/test-rows")
    assert shown.status_code == 200 and set(shown.json()) == {"name", "num_ids", "updated_at"}
    assert not any(i in shown.text or i in trainer.get("/v1/id-lists").text for i in test_ids[:20])
    other = trainer_client(ctx, "adnet")  # another organization: its 404s, its own namespace
    assert other.get("/v1/id-lists/test-rows").status_code == 404 and other.get("/v1/id-lists").json() == []
    assert _upload(other, features).status_code == 200
    refused = other.post("/v1/jobs", json=_split_job(parties, {"holdout_ids": "test-rows"}))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    replaced = trainer.put("/v1/id-lists/test-rows", content=_csv(test_ids[:5]), headers={"Content-Type": "text/csv"})
    assert replaced.status_code == 200 and replaced.json()["num_ids"] == 5


@pytest.mark.parametrize(("split", "release", "status", "code"), [
    ({"holdout_fraction": 0.2, "seed": 7}, {"example_ids": ["u1", "u2"]}, 400, "invalid_job"),
    ({"holdout_ids": "nothing-of-that-name"}, {}, 404, "not_found"),
    ({"holdout_ids": "everyone"}, {}, 400, "too_few_examples"),  # no row left to train on
    ({"holdout_fraction": 0.0, "seed": 7}, {}, 422, "invalid_request"),
    ({"holdout_fraction": 0.95, "seed": 7}, {}, 422, "invalid_request"),
    ({"holdout_fraction": 0.2, "seed": -1}, {}, 422, "invalid_request"),
    ({"holdout_fraction": 0.2, "seed": 1.5}, {}, 422, "invalid_request"),
    ({"holdout_fraction": 0.2}, {}, 422, "invalid_request"),
    ({"holdout_fraction": 0.2, "seed": 7, "holdout_ids": "everyone"}, {}, 422, "invalid_request"),
    ({"holdout_ids": "../x"}, {}, 422, "invalid_request"),
], ids=repr)
def test_splits_that_cannot_run_spend_nothing(parties, split, release, status, code):
    trainer, owner = parties["trainer"], parties["owner"]
    assert _upload(trainer, parties["features"]).status_code == 200
    everyone = trainer.put("/v1/id-lists/everyone", content=_csv(parties["features"]["example_id"]),
                           headers={"Content-Type": "text/csv"})
    assert everyone.status_code == 200 and everyone.json()["num_ids"] == N
    job = _split_job(parties, split)
    job["release"] = {**job["release"], **release}
    response = trainer.post("/v1/jobs", json=job)
    assert response.status_code == status and response.json()["error"]["code"] == code, response.text
    assert _spent(parties) == 0.0
    assert owner.get("/v1/audit", params={"dataset": parties["dataset"]}).json()["events"] == []
    assert trainer.get("/v1/jobs").json() == []


@pytest.mark.parametrize(("body", "media", "status", "code"), [
    ("example_id,x\n1,2\n", "text/csv", 400, "malformed_file"),  # one column only
    ("id\n1\n", "text/csv", 400, "malformed_file"),
    ("example_id\n1\n1\n", "text/csv", 400, "duplicate_example_id"),
    ("", "text/csv", 400, "malformed_file"),
    ("example_id\n1\n", "text/plain", 415, "unsupported_media_type"),
    ("example_id\n" + "x" * 2000 + "\n", "text/csv", 413, "body_too_large"),
], ids=repr)
def test_bad_id_lists_are_refused(tmp_path, body, media, status, code):
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", max_features_bytes=1000)
    trainer = trainer_client(ctx, "publisher", role="member")
    response = trainer.put("/v1/id-lists/bad", content=body, headers={"Content-Type": media})
    assert response.status_code == status and response.json()["error"]["code"] == code, response.text
    assert trainer.get("/v1/id-lists").json() == []
    assert trainer.put("/v1/id-lists/good", content="example_id\n007\n", headers={
        "Content-Type": "text/csv"}).json()["num_ids"] == 1
    ctx.jobs.stop()


def test_every_attempt_of_a_split_job_asks_for_the_same_release_and_succeeds_with_its_seconds(parties):
    """The training ids of a split are named once, when the job is planned: an attempt after the features table
    changed (rows added) asks for the same release — the labels party answers the one it charged, where other ids
    under the job's key would be refused. Every UPDATE of the job is recorded: the one that marks it succeeded
    writes its seconds too (one transaction), so no poll can read a succeeded job with 0 seconds."""
    ctx = trainer_context(parties["tmp"] / "queued", parties["labels_url"], start=False)
    trainer = trainer_client(ctx, "publisher")
    features = parties["features"]
    assert _upload(trainer, features).status_code == 200
    created = trainer.post("/v1/jobs", json=_split_job(parties, {"holdout_fraction": 0.3, "seed": 11}))
    assert created.status_code == 202 and created.json()["status"] == "queued", created.text
    spent = _spent(parties)
    more = pd.DataFrame({"example_id": [f"new{i}" for i in range(50)], "x0": 0.0, "x1": 0.0, "group": "a"})
    assert _upload(trainer, pd.concat([features, more])).status_code == 200
    updates: list[tuple[str, float]] = []

    def record(_mapper, _connection, row: db.Job) -> None:
        updates.append((row.status, row.seconds))

    event.listen(db.Job, "after_update", record)
    try:
        assert ctx.jobs.run_pending() == 1
    finally:
        event.remove(db.Job, "after_update", record)
    job = trainer.get(f"/v1/jobs/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    assert job["release"]["id"] == created.json()["release"]["id"] and _spent(parties) == spent
    held = holdout_mask(features["example_id"], 0.3, 11)
    assert job["num_train_examples"] == N - held.sum()  # the new rows have no released label: not trained on
    assert job["num_holdout_examples"] == holdout_mask(pd.concat([features, more])["example_id"], 0.3, 11).sum()
    statuses = [status for status, _ in updates]
    assert statuses[0] == "running" and statuses.count("succeeded") == 1 and statuses[-1] == "succeeded"
    assert all(seconds > 0 for status, seconds in updates if status == "succeeded")
    assert job["seconds"] == updates[-1][1]


def test_a_split_of_an_existing_release_trains_on_its_rows_that_are_not_held_out(parties):
    """A release of the whole dataset (or a source dataset's) covers the held-out rows too: the job leaves them out
    of training and spends nothing more."""
    trainer, features = parties["trainer"], parties["features"]
    assert _upload(trainer, features).status_code == 200
    release = test_api._consumer_post(parties, f"/v1/datasets/{parties['dataset']}/releases", "whole",
                                      json={"mechanism": "opt-unbiased", "epsilon": 4})
    assert release.status_code == 201, release.text
    spent = _spent(parties)
    job = {**_split_job(parties, {"holdout_fraction": 0.5, "seed": 3}), "release": None,
           "release_id": release.json()["id"]}
    created = trainer.post("/v1/jobs", json=job)
    assert created.status_code == 202, created.text
    finished = _finish(trainer, created.json()["id"])
    assert finished["status"] == "succeeded", finished["error"]
    held = holdout_mask(features["example_id"], 0.5, 3)
    assert (finished["num_train_examples"], finished["num_holdout_examples"]) == (N - held.sum(), held.sum())
    predictions = pd.read_csv(io.StringIO(trainer.get(f"/v1/jobs/{finished['id']}/predictions").text))
    assert predictions.set_index("example_id")["holdout"][features["example_id"]].tolist() == held.tolist()
    assert _spent(parties) == spent
