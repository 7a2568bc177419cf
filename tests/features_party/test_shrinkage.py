"""A fixed-mechanism job's shrinkage toward the mean of its unbiased training labels
(features_party/learn/shrinkage.py): a model that only fitted noise becomes the constant, a good one is kept; biased
mechanisms' models are kept as trained; end to end, a job on labels the features do not predict is no worse than the
mean."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from features_party.learn import shrinkage
from labels_party.core import pipeline
from shared.domains import integer_range
from shared.validation import PrivatizedLabels
from tests.features_party import test_api
from tests.features_party.test_api import _finish, _job, _upload

parties = test_api.parties

DOMAIN = integer_range(0, 20)
N = 4000


def _released(labels: np.ndarray, epsilon: float, seed: int) -> PrivatizedLabels:
    prepared = pipeline.prepare(DOMAIN, "opt-unbiased", epsilon, len(labels))
    counts = np.bincount(labels.astype(int), minlength=DOMAIN.support().size)
    mechanism = pipeline.plan(prepared, counts, np.random.default_rng(3)).sampler
    return PrivatizedLabels(mechanism.sample(labels, np.random.default_rng(1000 + seed)).astype(float), mechanism)


def _model(predictions: np.ndarray):
    """A learner's result that predicts ``predictions`` for the N rows (its validation split: 20 %, seed 0)."""
    return SimpleNamespace(config=SimpleNamespace(validation_fraction=0.2, seed=0),
                           predict=lambda numeric, categorical: predictions)


@pytest.mark.parametrize("seed", range(5))
def test_a_model_of_pure_noise_becomes_the_constant(seed):
    """Predictions independent of the labels, spread around the released labels' mean as a model fitted to them
    is: every weight above 0 adds their variance (16) to the loss, which 800 validation labels at ε = 0.5 see; the
    constant is the mean of the released labels (unbiased: within 4 of its standard errors of the true mean 8)."""
    rng = np.random.default_rng(seed)
    labels = rng.binomial(20, 0.4, size=N).astype(float)
    released = _released(labels, 0.5, seed)
    mean = float(released.noisy.mean())
    chosen = shrinkage.choose(_model(rng.normal(mean, 4.0, size=N)), np.zeros((N, 0)), np.zeros((N, 0)), released,
                              "squared")
    assert chosen is not None and chosen.rows == 800
    assert chosen.output.weight == 0.0, chosen.differences
    assert chosen.output.constant == pytest.approx(mean)
    assert abs(mean - 8.0) < 4 * float(released.noisy.std()) / np.sqrt(N)


def test_a_good_model_is_kept_as_trained():
    rng = np.random.default_rng(7)
    labels = rng.binomial(20, 0.4, size=N).astype(float)
    chosen = shrinkage.choose(_model(labels + rng.normal(0, 0.5, size=N)), np.zeros((N, 0)), np.zeros((N, 0)),
                              _released(labels, 4.0, 7), "squared")
    assert chosen is not None and chosen.output.kind == "model" and chosen.output.weight == 1.0
    difference, error = chosen.differences[1.0]
    assert difference + shrinkage.Z * error < 0 and chosen.differences[0.0] == (0.0, 0.0)


def test_a_model_predicting_nan_is_left_as_trained():
    labels = np.arange(N, dtype=float) % 21
    predictions = np.full(N, np.nan)
    assert shrinkage.choose(_model(predictions), np.zeros((N, 0)), np.zeros((N, 0)), _released(labels, 1.0, 0),
                            "squared") is None


def test_too_few_validation_rows_keep_the_model():
    labels = np.arange(100, dtype=float) % 21
    assert shrinkage.choose(_model(labels), np.zeros((100, 0)), np.zeros((100, 0)), _released(labels, 1.0, 0),
                            "squared") is None  # 20 validation rows


@pytest.mark.labels_seed(0)  # a statistical outcome: the same noise every run, not a 1-in-20 failure
def test_a_fixed_job_on_labels_the_features_do_not_predict_is_shrunk_to_the_mean(parties):
    """Opt-unbiased at ε = 0.3 on labels independent of the features (an MLP with hidden layers and no patience
    fits their noise): the job shrinks it toward the mean of its released labels, says so, and its test loss on the
    true labels is within 5 % of that constant's."""
    trainer, features = parties["trainer"], parties["features"].copy()
    rng = np.random.default_rng(5)
    features[["x0", "x1"]] = rng.normal(size=(len(features), 2))
    features["group"] = rng.choice(["a", "b", "c"], size=len(features))
    assert _upload(trainer, features).status_code == 200
    request = _job(parties, epsilon=0.3)
    request["train"] = {"hidden": [64, 64], "epochs": 40, "learning_rate": 0.01, "batch_size": 64, "patience": 40}
    created = trainer.post("/v1/jobs", json=request)
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    shrunk = job["shrinkage"]
    assert shrunk is not None and shrunk["weight"] <= 0.5, shrunk
    assert [row["weight"] for row in shrunk["differences"]] == list(shrinkage.WEIGHTS)
    page = trainer.get(f"/v1/jobs/{job['id']}/predictions", headers={"Accept": "application/json"},
                       params={"limit": 5000}).json()
    predicted = pd.Series([r["prediction"] for r in page["items"]], index=[r["example_id"] for r in page["items"]])
    truth = parties["labels"][predicted.index]
    # no worse than the constant it shrinks toward (the mean of 1,200 labels released at ε = 0.3: itself noisy)
    assert np.mean((predicted - truth) ** 2) <= 1.05 * np.mean((shrunk["constant"] - truth) ** 2)


def test_a_biased_mechanisms_model_is_kept_as_trained(parties):
    trainer = parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    created = trainer.post("/v1/jobs", json=_job(parties, mechanism="rr-on-bins", epsilon=1.0))
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["shrinkage"] is None
