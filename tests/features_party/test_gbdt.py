"""Gradient-boosted trees (``train.model: "gbdt"``, features_party/learn/gbdt.py) with the real XGBoost against a real
labels-party server: they learn the signal from an opt-unbiased release and classes from an RR release, stop early
on the job's *released* validation labels, are downloaded as XGBoost JSON that reproduces the predictions, refuse
options that do not fit before anything is spent, and stop at the trainer's deadline."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
import xgboost as xgb

from features_party.client import LabelsPartyClient
from features_party.features import Preprocessor
from features_party.learn import gbdt
from features_party.learn.train import TimeLimitExceeded, validation_split
from features_party.parts import estimate_mask
from labeldp.cli import main as cli
from shared.splits import holdout_mask
from tests.features_party import test_api
from tests.features_party.test_api import (
    N,
    _finish,
    _job,
    _spent,
    _upload,
    kept_for_estimate,
    trainer_client,
    trainer_context,
)

parties = test_api.parties  # the fixture: a labels-party server with a dataset of N integer labels, and a trainer
TREES = {"n_estimators": 300, "learning_rate": 0.1, "max_depth": 3, "min_child_weight": 20,
         "early_stopping_rounds": 20}
SPLIT = {"holdout_fraction": 0.2, "seed": 5}


def _gbdt_job(parties, dataset=None, trees=None, **release):
    job = _job(parties, **release)
    return {**job, "dataset_id": dataset or job["dataset_id"], "split": SPLIT,
            "train": {"model": "gbdt", "gbdt": {**TREES, **(trees or {})}}}


def _predictions(trainer, job_id) -> pd.DataFrame:
    table = trainer.get(f"/v1/jobs/{job_id}/predictions", headers={"Accept": "application/vnd.apache.parquet"})
    return pd.read_parquet(io.BytesIO(table.content)).set_index("example_id")


def _classes(parties) -> tuple[str, pd.Series]:
    """A 3-class dataset of the same examples, granted to the publisher: the class follows x0 and the group."""
    features = parties["features"]
    classes = np.where(features["x0"] < -0.4, 0, np.where(features["group"] == "c", 2, 1))
    owner = parties["owner"]
    dataset = owner.post("/v1/datasets", json={"name": "k", "label_kind": "classes", "num_classes": 3,
                                               "epsilon_total": 10}).json()["id"]
    body = "example_id,label\n" + "\n".join(f"{i},{c}" for i, c in zip(features["example_id"], classes, strict=True))
    owner.put(f"/v1/datasets/{dataset}/labels", content=body, headers={"Content-Type": "text/csv"})
    owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 10})
    return dataset, pd.Series(classes, index=features["example_id"])


def test_trees_learn_from_an_opt_unbiased_release_and_validate_on_its_released_labels(parties):
    trainer, features, truth = parties["trainer"], parties["features"], parties["labels"]
    assert _upload(trainer, features).status_code == 200
    created = trainer.post("/v1/jobs", json=_gbdt_job(parties))
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["device"].startswith("xgboost") and job["request"]["train"]["model"] == "gbdt"
    held = holdout_mask(features["example_id"], SPLIT["holdout_fraction"], SPLIT["seed"])
    kept = kept_for_estimate(features["example_id"][~held])
    assert job["num_holdout_examples"] == held.sum() and job["num_train_examples"] == N - held.sum() - kept

    # held-out rows against their true labels (the test has them; the trainer never does)
    predictions = _predictions(trainer, job["id"])
    assert predictions["holdout"].to_numpy().tolist() == held.tolist()
    test_ids, train_ids = features["example_id"][held], features["example_id"][~held]
    train_ids = train_ids[~estimate_mask(train_ids, 0.1, 0)]  # less the job's estimate rows
    mse = float(np.mean((predictions["prediction"][test_ids] - truth[test_ids]) ** 2))
    mean_predictor = float(np.mean((truth[train_ids].mean() - truth[test_ids]) ** 2))
    assert mse < 0.15 * mean_predictor, (mse, mean_predictor)

    # the model: XGBoost's JSON, loaded by XGBoost itself, reproduces the predictions from its own preprocessing
    download = trainer.get(f"/v1/jobs/{job['id']}/model")
    assert download.status_code == 200 and download.headers["content-type"] == "application/json"
    booster = xgb.Booster(model_file=bytearray(download.content))
    header = json.loads(booster.attr("labeldp"))
    numeric, categorical = Preprocessor.from_dict(header["preprocessing"]).transform(features)
    reproduced = booster.predict(gbdt.matrix(numeric, categorical))
    np.testing.assert_allclose(reproduced, predictions["prediction"][features["example_id"]], rtol=1e-6)
    model_path, features_path = parties["tmp"] / "trees.json", parties["tmp"] / "features.csv"
    model_path.write_bytes(download.content)
    features.to_csv(features_path, index=False)
    assert cli(["predict", "--model", str(model_path), "--features", str(features_path),
                "--out", str(parties["tmp"] / "p.csv")]) == 0
    offline = pd.read_csv(parties["tmp"] / "p.csv").set_index("example_id")["prediction"]
    np.testing.assert_allclose(offline[features["example_id"]], reproduced, rtol=1e-5)

    # early stopping looked at the released labels of the job's validation rows: the kept round's recorded val_mse
    # is the model's error on those rows against the released labels, not against the true ones
    with LabelsPartyClient(parties["labels_url"], parties["consumer"]) as client:
        released = client.download_labels(job["release"]["id"]).to_pandas().set_index("example_id")["label"]
    validation, _ = validation_split(len(train_ids), 0.2, np.random.default_rng(0))  # the job's seed: 0
    rows = train_ids.to_numpy()[validation]
    kept = job["metrics"][header["best_epoch"] - 1]
    assert header["best_epoch"] < len(job["metrics"]) <= TREES["n_estimators"]  # stopped early
    on_released = float(np.mean((predictions["prediction"][rows].to_numpy() - released[rows].to_numpy()) ** 2))
    on_truth = float(np.mean((predictions["prediction"][rows].to_numpy() - truth[rows].to_numpy()) ** 2))
    assert kept["val_mse"] == pytest.approx(on_released, rel=1e-4)
    assert on_truth < 0.5 * on_released  # the released labels are that much noisier than the true ones
    assert min(m["val_loss"] for m in job["metrics"]) == pytest.approx(kept["val_loss"])


def test_trees_learn_classes_from_an_rr_release(parties):
    trainer, features = parties["trainer"], parties["features"]
    dataset, classes = _classes(parties)
    assert _upload(trainer, features).status_code == 200
    created = trainer.post("/v1/jobs", json=_gbdt_job(parties, dataset, mechanism="rr", epsilon=2.0))
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert "val_mse" not in job["metrics"][0] and job["metrics"][0]["val_loss"] > 0  # nats per example
    predictions = _predictions(trainer, job["id"])
    probabilities = predictions[["p_class_0", "p_class_1", "p_class_2"]].to_numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    test_ids = predictions.index[predictions["holdout"]]
    accuracy = float(np.mean(predictions["prediction"][test_ids] == classes[test_ids]))
    majority = float(classes[test_ids].value_counts(normalize=True).max())
    assert accuracy > majority + 0.3, (accuracy, majority)
    assert _spent(parties) == 0.0  # the integer dataset's budget: this job spent the classes dataset's
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 2.0


@pytest.mark.parametrize(("change", "status", "code"), [
    ({"train": {"model": "gbdt", "gbdt": {"max_depth": 0}}}, 422, "invalid_request"),
    ({"train": {"model": "gbdt", "gbdt": {"learning_rate": 0}}}, 422, "invalid_request"),
    ({"train": {"model": "gbdt", "gbdt": {"subsample": 1.5}}}, 422, "invalid_request"),
    ({"train": {"model": "gbdt", "gbdt": {"n_estimators": 10_001}}}, 422, "invalid_request"),
    ({"train": {"model": "gbdt", "gbdt": {"early_stopping_rounds": 0}}}, 422, "invalid_request"),
    ({"train": {"model": "forest"}}, 422, "invalid_request"),
    ({"train": {"model": "mlp", "gbdt": {}}}, 400, "invalid_job"),
    ({"train": {"gbdt": {"max_depth": 3}}}, 400, "invalid_job"),  # the MLP by default
    ({"train": {"model": "gbdt", "hidden": [8]}}, 400, "invalid_job"),
    ({"train": {"model": "gbdt", "epochs": 5}}, 400, "invalid_job"),
    ({"train": {"model": "gbdt"}, "numeric": [], "categorical": []}, 400, "invalid_job"),
    ({"train": {"model": "gbdt", "loss": "cross_entropy"}}, 400, "invalid_job"),
    ({"train": {"model": "gbdt", "validation_fraction": 0}}, 400, "invalid_job"),  # no early stopping on noisy labels
], ids=repr)
def test_tree_options_that_do_not_fit_are_refused_before_anything_is_spent(parties, change, status, code):
    trainer = parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    response = trainer.post("/v1/jobs", json={**_job(parties), **change})
    assert response.status_code == status and response.json()["error"]["code"] == code, response.text
    assert _spent(parties) == 0.0
    assert parties["owner"].get("/v1/audit", params={"dataset": parties["dataset"]}).json()["events"] == []
    assert trainer.get("/v1/jobs").json() == []


def test_trees_refuse_the_subset_loss_of_class_labels(parties):
    trainer = parties["trainer"]
    dataset, _ = _classes(parties)
    assert _upload(trainer, parties["features"]).status_code == 200
    response = trainer.post("/v1/jobs", json=_gbdt_job(parties, dataset, mechanism="subset", epsilon=1.0))
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_job", response.text
    assert "model gbdt has no 'subset' loss" in response.json()["error"]["message"]
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


def test_lp_mst_boosts_trees_stage_after_stage(parties):
    """LP-2ST with trees: stage 2's priors are the stage-1 trees' softmax, and its model boosts on from them."""
    trainer, features = parties["trainer"], parties["features"]
    dataset, classes = _classes(parties)
    assert _upload(trainer, features).status_code == 200
    body = {**_gbdt_job(parties, dataset, mechanism="rr", epsilon=1.0), "protocol": "lp-mst", "stages": 2,
            "num_classes": 3}
    created = trainer.post("/v1/jobs", json=body)
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    stages = job["release"]["stages"]
    assert len(stages) == 2 and sum(s["examples"] for s in stages) == job["num_train_examples"]
    assert stages[1]["mean_k"] < 3  # the stage-1 trees' priors narrowed stage 2's randomized response
    assert job["progress"]["epochs"] == 2 * TREES["n_estimators"] and job["device"].startswith("xgboost")
    predictions = _predictions(trainer, job["id"])
    test_ids = predictions.index[predictions["holdout"]]
    accuracy = float(np.mean(predictions["prediction"][test_ids] == classes[test_ids]))
    assert accuracy > float(classes[test_ids].value_counts(normalize=True).max()) + 0.3, accuracy
    booster = xgb.Booster(model_file=bytearray(trainer.get(f"/v1/jobs/{job['id']}/model").content))
    header = json.loads(booster.attr("labeldp"))
    assert header["protocol"] == "lp-mst" and booster.num_boosted_rounds() == header["best_epoch"]
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 1.0


def test_a_tree_job_over_the_size_limit_is_refused(parties):
    ctx = trainer_context(parties["tmp"] / "sized", parties["labels_url"], max_job_size=1e8)
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    big = _gbdt_job(parties, trees={"n_estimators": 2000, "max_depth": 8})
    refused = trainer.post("/v1/jobs", json=big)
    rows = N - int(holdout_mask(parties["features"]["example_id"], 0.2, 5).sum())
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_too_large", refused.text
    # a tree unit's cost (16) × 2,000 rounds × 1 tree × (rows × 3 feature columns × depth 8 + 8 units × 255 splits
    # of a depth-8 tree × 4 bins of the categorical column: its 3 levels and the unseen code), counted by hand
    size = 16 * 2000 * (rows * 3 * 8 + 8 * 255 * 4)
    assert f"job size {size:.3g} = 16 × 2,000 rounds × 1 tree(s) per round × ({rows:,} rows × 3 features × depth 8 " \
           "+ 8 × 255 splits × 4 categorical bins)" in refused.json()["error"]["message"]
    assert _spent(parties) == 0.0
    small = _gbdt_job(parties, trees={"n_estimators": 100, "max_depth": 4})  # 2.3e7
    assert trainer.post("/v1/jobs", json=small).status_code == 202
    ctx.jobs.stop()


def test_a_tree_job_stops_at_the_deadline(parties):
    ctx = trainer_context(parties["tmp"] / "timed", parties["labels_url"], max_job_seconds=2.0, workers=1)
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    # 10,000 tiny steps that keep improving the validation loss: far longer than 2 s, never stopped early
    slow = _gbdt_job(parties, trees={"n_estimators": 10_000, "learning_rate": 1e-4, "max_depth": 8,
                                     "min_child_weight": 0, "early_stopping_rounds": 1000})
    created = trainer.post("/v1/jobs", json=slow)
    assert created.status_code == 202, created.text
    stopped = _finish(trainer, created.json()["id"])
    assert stopped["status"] == "failed" and stopped["error_code"] == "job_time_limit", stopped
    assert stopped["progress"]["epoch"] < 10_000
    ctx.jobs.stop()


def test_a_passed_deadline_grows_no_tree_and_poisson_trees_take_negative_labels():
    rng = np.random.default_rng(0)
    numeric, categorical = rng.normal(size=(400, 2)), rng.integers(1, 4, size=(400, 1))
    rate = np.exp(0.8 * numeric[:, 0])
    noisy = rng.poisson(rate) + rng.laplace(0.0, 2.0, 400)  # unbiased but often below 0
    assert (noisy < 0).sum() > 50
    rounds: list[dict] = []
    config = gbdt.GbdtConfig(loss="poisson", n_estimators=200, learning_rate=0.1, max_depth=2)
    with pytest.raises(TimeLimitExceeded):
        gbdt.train_gbdt(config, numeric, categorical, noisy, on_epoch=rounds.append, deadline=0.0)
    assert rounds == []
    result = gbdt.train_gbdt(config, numeric, categorical, noisy, on_epoch=rounds.append)
    predicted = result.predict(numeric, categorical)
    assert rounds and np.all(predicted > 0)
    assert np.corrcoef(np.log(predicted), np.log(rate))[0, 1] > 0.7  # the rate's shape, from noisy counts
    # the recorded loss is the MLP's Poisson loss e^η − y·η on the validation rows, in label units
    validation, _ = validation_split(400, config.validation_fraction, np.random.default_rng(config.seed))
    margins = np.log(predicted[validation])
    expected = float(np.mean(np.exp(margins) - noisy[validation] * margins))
    assert result.history[result.best_epoch - 1]["val_loss"] == pytest.approx(expected, rel=1e-4)


def test_predict_refuses_json_that_is_not_a_tree_model_of_a_job(tmp_path, capsys):
    features = tmp_path / "features.csv"
    features.write_text("example_id,x0\na,1.0\nb,2.0\n")
    plain = xgb.train({"max_depth": 1}, xgb.DMatrix(np.array([[1.0], [2.0]]), label=np.array([0.0, 1.0])), 2)
    (tmp_path / "plain.json").write_bytes(bytes(plain.save_raw("json")))  # XGBoost's, without our header
    (tmp_path / "other.json").write_text('{"a": 1}')
    for name, header in (("garbled.json", "not json"), ("headless.json", '{"family": "gbdt"}'),
                         ("alien.json", '{"config": {"depth": 1}, "best_epoch": 1, "history": []}')):
        plain.set_attr(labeldp=header)  # an XGBoost model whose labeldp header is not a job's
        (tmp_path / name).write_bytes(bytes(plain.save_raw("json")))
    for name in ("plain.json", "other.json", "garbled.json", "headless.json", "alien.json"):
        assert cli(["predict", "--model", str(tmp_path / name), "--features", str(features),
                    "--out", str(tmp_path / "p.csv")]) != 0
        err = capsys.readouterr().err
        assert "not a labeldp job's tree model" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("value", ["inf", "-inf", "1e309", "1e101"])
def test_a_numeric_feature_that_is_not_a_finite_number_is_refused_before_anything_is_spent(parties, value):
    """An ``inf`` in a features CSV made the mean infinite: the trees' training failed after the release was
    charged (review of issue 32). The whole table is checked at planning, for either learner."""
    trainer = parties["trainer"]
    features = parties["features"].astype({"x1": object})
    features.loc[features.index[7], "x1"] = value
    assert _upload(trainer, features, name="bad").status_code == 200
    for train in ({"model": "gbdt"}, {"model": "mlp"}):
        response = trainer.post("/v1/jobs", json={**_job(parties), "features": "bad", "train": train})
        assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_file", response.text
        assert "['x1']" in response.json()["error"]["message"]
    assert _spent(parties) == 0.0 and trainer.get("/v1/jobs").json() == []


@pytest.mark.parametrize(("limit", "value", "code", "words"), [
    # XGBoost takes category codes below 2^24 and refused a wider column after the release was drawn (shown at a
    # limit of 2 levels: the features' group column has 3)
    ("MAX_CATEGORIES", 2, "invalid_job", "['group'] have more than 2 levels"),
    # a model labeldp predict would not read (it takes ~10x its file's size in memory to check and load)
    ("MAX_MODEL_BYTES", 10_000, "job_too_large", "more than labeldp predict reads (1e+04)"),
])
def test_trees_past_xgboosts_or_predicts_limits_are_refused_before_anything_is_spent(parties, monkeypatch, limit,
                                                                                      value, code, words):
    monkeypatch.setattr(gbdt, limit, value)
    trainer = parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    response = trainer.post("/v1/jobs", json=_gbdt_job(parties))
    assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
    assert words in response.json()["error"]["message"]
    assert _spent(parties) == 0.0


def test_a_job_takes_its_share_of_the_cores_this_process_may_use(monkeypatch, tmp_path):
    """The affinity (taskset, a cpuset) and a cgroup v2 quota bound the cores, not the machine's count."""
    monkeypatch.setattr(gbdt.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    monkeypatch.setattr(gbdt, "CPU_MAX", tmp_path / "cpu.max")
    assert gbdt.usable_cores() == 4 and gbdt.threads_per_job(2) == 2
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5: two cores, partly
    assert gbdt.usable_cores() == 2 and gbdt.threads_per_job(2) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert gbdt.usable_cores() == 4
    monkeypatch.setattr(gbdt.os, "sched_getaffinity", lambda _pid: {3})
    assert gbdt.usable_cores() == 1 and gbdt.threads_per_job(4) == 1


def test_tree_predictions_in_batches_equal_one_pass(monkeypatch):
    rng = np.random.default_rng(8)
    numeric, categorical = rng.normal(size=(500, 2)), rng.integers(1, 4, size=(500, 1))
    targets = numeric[:, 0] + categorical[:, 0] + rng.normal(size=500)
    result = gbdt.train_gbdt(gbdt.GbdtConfig(n_estimators=20, early_stopping_rounds=50), numeric, categorical,
                             targets, threads=1)
    whole, margins = result.predict(numeric, categorical), result.logits(numeric, categorical)
    monkeypatch.setattr(gbdt, "PREDICT_ROWS", 7)  # 500 = 71 × 7 + 3
    np.testing.assert_array_equal(result.predict(numeric, categorical), whole)
    np.testing.assert_array_equal(result.logits(numeric, categorical), margins)
    assert whole.shape == (500,) and result.predict(numeric[:0], categorical[:0]).shape == (0,)


def test_a_row_far_outside_the_training_spread_stays_finite():
    """Fitted on the training rows, a held-out row at 1e60 (planning allows up to 1e100) was inf in float32 and
    failed the trees' predictions after the charge (second review of issue 32): clipped, it is a finite number."""
    frame = pd.DataFrame({"x": np.r_[np.random.default_rng(0).normal(size=100), 1e60], "g": ["a"] * 101})
    preprocessor = Preprocessor.fit(frame.iloc[:100], ["x"], ["g"])
    numeric, _ = preprocessor.transform(frame)
    assert numeric.dtype == np.float32 and np.all(np.isfinite(numeric)) and numeric[-1, 0] == np.float32(1e30)


def test_predictions_with_many_classes_are_batched_by_cells(monkeypatch):
    rng = np.random.default_rng(9)
    numeric, categorical = rng.normal(size=(300, 2)), rng.integers(1, 4, size=(300, 1))
    classes = (numeric[:, 0] > 0).astype(int) + categorical[:, 0] % 2
    result = gbdt.train_gbdt(gbdt.GbdtConfig(loss="cross_entropy", n_estimators=5, early_stopping_rounds=50),
                             numeric, categorical, classes, num_classes=3, threads=1)
    assert result.num_classes == 3
    whole = result.predict(numeric, categorical)
    monkeypatch.setattr(gbdt, "PREDICT_CELLS", 7)  # 3 classes: 2 rows a batch
    np.testing.assert_array_equal(result.predict(numeric, categorical), whole)


def test_trees_that_fail_to_predict_are_one_line(monkeypatch, tmp_path, capsys):
    rng = np.random.default_rng(2)
    numeric, categorical = rng.normal(size=(200, 1)), np.zeros((200, 0), np.int32)
    result = gbdt.train_gbdt(gbdt.GbdtConfig(n_estimators=3, early_stopping_rounds=5), numeric, categorical,
                             numeric[:, 0], threads=1)
    from features_party.learn.gbdt_file import save_model

    save_model(tmp_path / "m.json", result, {"numeric": ["x"], "categorical": [], "means": [0.0], "stds": [1.0],
                                             "vocabularies": []})
    (tmp_path / "f.csv").write_text("example_id,x\na,1.0\n")

    def refuse(*_args, **_kwargs):
        raise xgb.core.XGBoostError("[12:00:00] src/predictor.cc:1: Check failed: ...\nStack trace: ...")

    monkeypatch.setattr(gbdt.GbdtResult, "predict", refuse)
    assert cli(["predict", "--model", str(tmp_path / "m.json"), "--features", str(tmp_path / "f.csv"),
                "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["labeldp: error: the model file's trees cannot predict (a damaged labeldp tree model)"]


def test_alibi_trains_the_mlp_on_soft_labels_and_is_refused_for_trees(parties):
    """ALIBI over HTTP: the release's noisy vectors (one integer column per class) train the MLP with the alibi
    loss (the posterior under its own prediction) well above the majority class at ε = 2; trees have no soft-label
    objective and are refused before anything is spent."""
    trainer, features = parties["trainer"], parties["features"]
    dataset, classes = _classes(parties)
    assert _upload(trainer, features).status_code == 200
    refused = trainer.post("/v1/jobs", json=_gbdt_job(parties, dataset, mechanism="alibi", epsilon=2.0))
    assert refused.status_code == 400 and "model gbdt has no 'alibi' loss" in refused.json()["error"]["message"]
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0
    job = {**_job(parties, mechanism="alibi", epsilon=2.0), "dataset_id": dataset, "split": SPLIT,
           "train": {"hidden": [16], "epochs": 60, "learning_rate": 0.01, "batch_size": 128, "patience": 60}}
    created = trainer.post("/v1/jobs", json=job)
    assert created.status_code == 202, created.text
    done = _finish(trainer, created.json()["id"])
    assert done["status"] == "succeeded", done["error"]
    predictions = _predictions(trainer, done["id"])
    test_ids = predictions.index[predictions["holdout"]]
    accuracy = float(np.mean(predictions["prediction"][test_ids] == classes[test_ids]))
    majority = float(classes[test_ids].value_counts(normalize=True).max())
    assert accuracy > majority + 0.2, (accuracy, majority)
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 2.0
