"""The two services end to end on a small synthetic dataset: the trainer service requests a release from a real
labels-party server, trains, and serves predictions; bad features files and unknown ids are 4xx."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from conftest import running_server
from fastapi.testclient import TestClient

from features_party.api import create_app as create_trainer
from labels_party.api import create_app as create_labels
from labels_party.auth import create_key
from labels_party.service import make_context
from shared.cli import main as cli

N = 1500


@pytest.fixture()
def parties(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, 2))
    group = rng.choice(["a", "b", "c"], size=N)
    labels = np.clip(np.rint(10 + 4 * x[:, 0] - 3 * x[:, 1] + 5 * (group == "c") + rng.normal(size=N)), 0, 30)
    ids = [f"u{i}" for i in range(N)]
    ctx = make_context(f"sqlite:///{tmp_path}/labels.db", tmp_path / "labels")
    with ctx.sessions() as session, session.begin():
        admin = create_key(session, "office", "admin")
        consumer = create_key(session, "publisher", "consumer")
    with running_server(create_labels(ctx)) as labels_url:
        owner = TestClient(create_labels(ctx), headers={"Authorization": f"Bearer {admin}"})
        dataset = owner.post("/v1/datasets", json={"name": "y", "label_kind": "integer", "min": 0, "max": 30,
                                                   "epsilon_total": 10}).json()["id"]
        body = "example_id,label\n" + "\n".join(f"{i},{int(v)}" for i, v in zip(ids, labels, strict=True))
        owner.put(f"/v1/datasets/{dataset}/labels", content=body, headers={"Content-Type": "text/csv"})
        owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher"})
        trainer = TestClient(create_trainer(tmp_path / "trainer"))
        features = pd.DataFrame({"example_id": ids, "x0": x[:, 0], "x1": x[:, 1], "group": group})
        yield {"trainer": trainer, "labels_url": labels_url, "consumer": consumer, "dataset": dataset,
               "features": features, "labels": pd.Series(labels, index=ids), "tmp": tmp_path}


def _job(parties, **release):
    return {"features": "f", "labels_url": parties["labels_url"], "api_key": parties["consumer"],
            "dataset_id": parties["dataset"], "release": {"mechanism": "opt-unbiased", "epsilon": 4.0, **release},
            "numeric": ["x0", "x1"], "categorical": ["group"],
            "train": {"hidden": [], "epochs": 60, "learning_rate": 0.01, "batch_size": 128, "patience": 60}}


def _finish(trainer, job_id):
    for _ in range(600):
        job = trainer.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.1)
    raise AssertionError("job did not finish")


def test_release_train_predict_end_to_end(parties):
    trainer = parties["trainer"]
    upload = trainer.put("/v1/features/f", content=parties["features"].to_csv(index=False))
    assert upload.status_code == 200 and upload.json()["num_examples"] == N
    created = trainer.post("/v1/jobs", json=_job(parties))
    assert created.status_code == 202, created.text
    assert created.json()["release"]["certified_epsilon"] <= 4.0
    assert "api_key" not in created.json()["request"]
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["num_train_examples"] == N and job["progress"]["epoch"] >= 1 and job["metrics"]
    predictions = trainer.get(f"/v1/jobs/{job['id']}/predictions").json()
    predicted = pd.Series(predictions["predictions"], index=predictions["example_ids"])
    truth = parties["labels"][predicted.index]
    # a linear model on ε=4 unbiased labels: far better than predicting the mean
    assert np.mean((predicted - truth) ** 2) < 0.25 * np.var(truth)
    model = trainer.get(f"/v1/jobs/{job['id']}/model")
    assert model.status_code == 200
    model_path = parties["tmp"] / "model.npz"
    model_path.write_bytes(model.content)
    features_path = parties["tmp"] / "features.csv"
    parties["features"].to_csv(features_path, index=False)
    assert cli(["predict", "--model", str(model_path), "--features", str(features_path),
                "--out", str(parties["tmp"] / "p.csv")]) == 0
    offline = pd.read_csv(parties["tmp"] / "p.csv").set_index("example_id")["prediction"]
    np.testing.assert_allclose(offline[predicted.index].to_numpy(), predicted.to_numpy(), rtol=1e-5)


@pytest.mark.parametrize(("csv", "code"), [
    ("id,x0\n1,2\n", "malformed_file"),
    ("example_id,x0\n1,2\n1,3\n", "duplicate_example_id"),
])
def test_bad_features_files_are_refused(parties, csv, code):
    response = parties["trainer"].put("/v1/features/bad", content=csv)
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert parties["trainer"].post("/v1/jobs", json={**_job(parties), "features": "bad"}).status_code == 404


def test_non_numeric_values_and_unknown_ids_are_4xx(parties):
    trainer = parties["trainer"]
    frame = parties["features"].astype({"x1": object})
    frame.loc[3, "x1"] = "oops"
    frame.loc[len(frame)] = ["ghost", 0.0, 0.0, "a"]
    assert trainer.put("/v1/features/f", content=frame.to_csv(index=False)).status_code == 200
    bad_numeric = trainer.post("/v1/jobs", json=_job(parties))
    assert bad_numeric.status_code == 400 and "x1" in bad_numeric.json()["error"]["message"]
    frame.loc[3, "x1"] = 0.5
    assert trainer.put("/v1/features/f", content=frame.to_csv(index=False)).status_code == 200
    unknown = trainer.post("/v1/jobs", json=_job(parties, example_ids=["u1", "u2", "ghost"]))
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_example_ids"
    no_features = trainer.post("/v1/jobs", json=_job(parties, example_ids=["u1", "nobody"]))
    assert no_features.status_code == 400 and no_features.json()["error"]["code"] == "unknown_example_ids"
    over_budget = trainer.post("/v1/jobs", json=_job(parties, epsilon=11.0))
    assert over_budget.status_code == 409 and over_budget.json()["error"]["code"] == "budget_exceeded"


def test_lp_mst_job_over_http(tmp_path):
    """The trainer service runs multi-stage RRWithPrior against a real labels-party server."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    ids = [f"d{i}" for i in range(600)]
    ctx = make_context(f"sqlite:///{tmp_path}/labels.db", tmp_path / "labels")
    with ctx.sessions() as session, session.begin():
        admin = create_key(session, "office", "admin")
    with running_server(create_labels(ctx)) as labels_url:
        owner = TestClient(create_labels(ctx), headers={"Authorization": f"Bearer {admin}"})
        dataset = owner.post("/v1/datasets", json={"name": "d", "label_kind": "classes", "num_classes": 10,
                                                   "epsilon_total": 4}).json()["id"]
        body = "example_id,label\n" + "\n".join(f"{i},{v}" for i, v in zip(ids, digits.target[:600], strict=True))
        owner.put(f"/v1/datasets/{dataset}/labels", content=body, headers={"Content-Type": "text/csv"})
        trainer = TestClient(create_trainer(tmp_path / "trainer"))
        frame = pd.DataFrame(digits.data[:600] / 16.0, columns=[f"px{j}" for j in range(64)])
        frame.insert(0, "example_id", ids)
        assert trainer.put("/v1/features/digits", content=frame.to_csv(index=False)).status_code == 200
        created = trainer.post("/v1/jobs", json={
            "features": "digits", "labels_url": labels_url, "api_key": admin, "dataset_id": dataset,
            "release": {"mechanism": "rr-with-prior", "epsilon": 4.0, "example_ids": ids[:500]},
            "numeric": [f"px{j}" for j in range(64)], "num_classes": 10, "protocol": "lp-mst", "stages": 2,
            "train": {"hidden": [32], "epochs": 20, "learning_rate": 0.003, "batch_size": 64, "patience": 20}})
        assert created.status_code == 202, created.text
        job = _finish(trainer, created.json()["id"])
        assert job["status"] == "succeeded", job["error"]
        assert [s["examples"] for s in job["release"]["stages"]] == [250, 250]
        assert job["release"]["certified_epsilon"] <= 4.0
        predictions = trainer.get(f"/v1/jobs/{job['id']}/predictions").json()
        predicted = pd.Series(predictions["predictions"], index=predictions["example_ids"])
        held_out = [f"d{i}" for i in range(500, 600)]
        assert np.mean(predicted[held_out].to_numpy() == digits.target[500:600]) > 0.5  # chance: 0.1
        assert owner.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 4.0


def test_a_failing_job_is_recorded_and_the_error_kept(tmp_path):
    from features_party.jobs import Job, job_running

    job = Job(id="j", request={})
    with job_running(job, tmp_path / "j"):
        raise ValueError("no overlap")
    view = job.view()
    assert view["status"] == "failed" and view["error"] == "ValueError: no overlap"
    assert '"status": "failed"' in (tmp_path / "j" / "job.json").read_text()
