"""``release.mechanism: "auto"`` end to end against a real labels-party server: the trainer splits the training rows
into disjoint parts by a public rule, charges every example the job's ε once (labels and the central mean), chooses
among its candidates on unbiased validation labels, returns the constant when the labels carry no signal, says so,
and never charges twice when an attempt is redone; refusals before anything is asked charge nothing."""

from __future__ import annotations

import io
import json
import time

import httpx
import numpy as np
import pandas as pd
import pytest

from features_party import auto as auto_module
from features_party.client import LabelsPartyClient
from features_party.jobs import predictions_frame
from features_party.learn.output import Output
from features_party.parts import AutoPlan, mean_epsilon
from shared.errors import LabelDPError
from tests.features_party import test_api
from tests.features_party.test_api import N, _spent, _upload

parties = test_api.parties  # the fixture: a labels-party server with a dataset of N labels, and a trainer

EPSILON = 4.0


def _auto_job(parties, epsilon: float = EPSILON, **release) -> dict:
    return {"features": "f", "api_key": parties["consumer"], "dataset_id": parties["dataset"],
            "release": {"mechanism": "auto", "epsilon": epsilon, **release},
            "numeric": ["x0", "x1"], "categorical": ["group"], "train": {"epochs": 30, "batch_size": 128}}


def _finish(trainer, job_id: str, seconds: float = 1200.0) -> dict:
    """The job once finished: an auto job fits about twenty models, which a loaded machine makes slow (a lower
    bound of patience, not a speed assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job = trainer.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish in {seconds:g} s")


def _predictions(trainer, job_id: str) -> pd.Series:
    frame = pd.read_parquet(io.BytesIO(trainer.get(f"/v1/jobs/{job_id}/predictions", headers={
        "Accept": "application/vnd.apache.parquet"}).content))
    return frame.set_index("example_id")["prediction"]


def _consumer(parties) -> LabelsPartyClient:
    return LabelsPartyClient(parties["labels_url"], parties["consumer"], retries=0)


@pytest.mark.labels_seed(0)  # a statistical outcome: the same noise every run, not a 1-in-20 failure
def test_auto_on_a_strong_signal_returns_a_model_charged_epsilon_once_per_example(parties):
    trainer, features, truth = parties["trainer"], parties["features"], parties["labels"]
    assert _upload(trainer, features).status_code == 200
    created = trainer.post("/v1/jobs", json=_auto_job(parties))
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    report = job["auto"]
    assert report["chosen"]["candidate"] != "constant" and job["warnings"] == []
    assert job["estimate"]["better"] and job["estimate"]["level"] == 0.975
    assert {row["candidate"].split("/")[0] for row in report["candidates"]} == {"opt-unbiased", "rr-on-bins", "pooled"}
    assert len(report["candidates"]) == 12  # 3 training sets × 2 learners × 2 regularizations

    # the parts: disjoint releases covering exactly the training rows, at label ε; the mean on all of them
    plan = AutoPlan.build(("opt-unbiased", "rr-on-bins"), False, EPSILON, N, 0)
    assert report["mean_epsilon"] == plan.mean_epsilon == mean_epsilon(EPSILON, N) > 0
    assert report["label_epsilon"] == pytest.approx(EPSILON - plan.mean_epsilon, abs=1e-12)
    parts = job["release"]["parts"]
    assert set(parts) == {"opt-unbiased", "rr-on-bins"}
    with _consumer(parties) as consumer:
        covered = [set(consumer.download_labels(p["id"]).column("example_id").to_pylist()) for p in parts.values()]
        mean = consumer.get_release(job["release"]["mean"]["id"])
    assert covered[0].isdisjoint(covered[1]) and covered[0] | covered[1] == set(features["example_id"])
    assert mean.mechanism == "evaluation" and mean.num_examples == N and mean.epsilon == plan.mean_epsilon
    expected = {i: p for i, p in zip(features["example_id"], plan.parts(features["example_id"]), strict=True)}
    assert covered[1] == {i for i, p in expected.items() if p == "rr-on-bins"}

    # every example was charged exactly ε: the rest of the grant (10) fits on all of them, not a unit more
    assert _spent(parties) == EPSILON
    with _consumer(parties) as consumer:
        ids = features["example_id"].tolist()
        consumer.request_release(parties["dataset"], {"mechanism": "rr", "epsilon": 10 - EPSILON, "example_ids": ids})
        with pytest.raises(Exception, match="budget"):
            consumer.request_release(parties["dataset"], {"mechanism": "rr", "epsilon": 0.01, "example_ids": ids[:1]})

    # the model beats the mean on the true labels, and the file predicts what the job did (its output map applied)
    predicted = _predictions(trainer, job["id"])
    assert np.mean((predicted - truth[predicted.index]) ** 2) < 0.5 * np.var(truth)
    model = parties["tmp"] / "auto-model"
    model.write_bytes(trainer.get(f"/v1/jobs/{job['id']}/model").content)
    again = predictions_frame(model, features.set_index("example_id", drop=False)).set_index("example_id")
    np.testing.assert_allclose(again["prediction"][predicted.index], predicted, rtol=1e-5, atol=1e-5)


@pytest.mark.labels_seed(0)  # a statistical outcome: the same noise every run, not a 1-in-20 failure
def test_auto_without_signal_returns_the_constant_and_warns(parties):
    """Labels independent of the features: every candidate only fits noise, so the job returns the central DP mean
    for every example, says why, and its test loss is within 2 % of predicting the true mean."""
    trainer, features = parties["trainer"], parties["features"].copy()
    rng = np.random.default_rng(9)
    features[["x0", "x1"]] = rng.normal(size=(N, 2))
    features["group"] = rng.choice(["a", "b", "c"], size=N)
    assert _upload(trainer, features).status_code == 200
    job = _finish(trainer, trainer.post("/v1/jobs", json=_auto_job(parties, epsilon=0.5)).json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["auto"]["chosen"] == {"candidate": "constant"}
    assert len(job["warnings"]) == 1 and job["warnings"][0].startswith("auto chose the constant predictor")
    predicted, truth = _predictions(trainer, job["id"]), parties["labels"]
    assert predicted.nunique() == 1 and predicted.iloc[0] == pytest.approx(job["auto"]["constant"])
    assert np.mean((predicted - truth[predicted.index]) ** 2) <= 1.02 * np.var(truth)


@pytest.mark.parametrize(("change", "code", "message"), [
    ({"candidates": ["rr-with-prior"]}, "invalid_job", "do not fit integer labels"),
    ({"candidates": ["opt-unbiased", "block-rr"]}, "invalid_job", "do not fit integer labels"),
    ({"epsilon": 0.0015}, "epsilon_out_of_range", "too small for an auto job"),
])
def test_auto_refusals_before_anything_is_asked_charge_nothing(parties, change, code, message):
    trainer = parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    response = trainer.post("/v1/jobs", json=_auto_job(parties, **change))
    assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
    assert message in response.json()["error"]["message"] and _spent(parties) == 0.0


@pytest.mark.labels_seed(0)
def test_an_opt_in_candidate_gets_its_own_part_released_by_its_mechanism(parties):
    """rp-with-prior is not a default candidate but one a job may name (features_party/parts.OPT_IN_ARMS): its part
    is released by RPWithPrior (its prior from its own rows), disjoint from the others, and every example is still
    charged ε once."""
    trainer, features = parties["trainer"], parties["features"]
    assert _upload(trainer, features).status_code == 200
    created = trainer.post("/v1/jobs", json=_auto_job(parties, candidates=["opt-unbiased", "rp-with-prior"]))
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert set(job["release"]["parts"]) == {"opt-unbiased", "rp-with-prior"}
    names = {row["candidate"].split("/")[0] for row in job["auto"]["candidates"]}
    assert names == {"opt-unbiased", "rp-with-prior", "pooled"}
    with _consumer(parties) as consumer:
        part = consumer.get_release(job["release"]["parts"]["rp-with-prior"]["id"])
    plan = AutoPlan.build(("opt-unbiased", "rp-with-prior"), False, EPSILON, N, 0)
    assert part.mechanism == "rp-with-prior"
    assert part.num_examples == int(np.sum(plan.parts(features["example_id"]) == "rp-with-prior")) > 0
    assert _spent(parties) == EPSILON


@pytest.mark.parametrize(("body", "message"), [
    ({"protocol": "lp-mst"}, "chooses among protocols itself"),
    ({"train": {"model": "auto"}, "release": {"mechanism": "opt-unbiased", "epsilon": 1.0}}, "train.model 'auto'"),
])
def test_auto_options_that_cannot_run_are_refused(parties, body, message):
    trainer = parties["trainer"]
    assert _upload(trainer, parties["features"]).status_code == 200
    response = trainer.post("/v1/jobs", json={**_auto_job(parties), **body})
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
    assert _spent(parties) == 0.0


def test_an_auto_job_redone_after_a_lost_answer_charges_nothing_more(parties, monkeypatch):
    """The first attempt's training sees the labels party fail (a transport error): the job is interrupted and
    asks again; every part comes back under the same Idempotency-Key, so the second attempt spends nothing."""
    trainer, ctx = parties["trainer"], parties["trainer_ctx"]
    assert _upload(trainer, parties["features"]).status_code == 200
    real, calls = auto_module._fit_all, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectError("lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(auto_module, "_fit_all", flaky)
    object.__setattr__(ctx.settings, "upstream_retry_seconds", 0.2)
    job = _finish(trainer, trainer.post("/v1/jobs", json=_auto_job(parties)).json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert len(calls) == 2 and _spent(parties) == EPSILON


def test_output_maps_apply_and_damaged_ones_are_refused():
    raw = np.array([1.0, 2.0, 4.0])
    assert Output().apply(raw).tolist() == raw.tolist()
    assert Output("shrunk", 10.0, 2.0, 0.5).apply(raw).tolist() == [9.5, 10.0, 11.0]
    np.testing.assert_allclose(Output("shrunk", 3.0, float(np.log(2.0)), 1.0, True).apply(raw), [1.5, 3.0, 6.0])
    assert Output("constant", 2.0, num_classes=3).apply(raw).tolist() == [[0.0, 0.0, 1.0]] * 3
    for damaged, outputs in (({"kind": "magic"}, 1), ({"weight": "1"}, 1), ({"constant": float("inf")}, 1),
                             ({"extra": 1}, 1), ({"kind": "constant", "constant": 3.0, "num_classes": 3}, 3),
                             ({"log_scale": 1}, 1), ([], 1), ({"weight": 1e300}, 1), ({"weight": -1.0}, 1),
                             ({"constant": 1e16}, 1), ({"log_scale": True, "constant": 0.0}, 1),
                             ({"kind": "constant", "constant": 1.0, "num_classes": 10**12}, 3),
                             ({"kind": "constant", "constant": 1.0}, 3), ({"num_classes": 3}, 1)):
        with pytest.raises(LabelDPError) as caught:
            Output.from_dict(damaged, outputs)
        assert caught.value.code == "malformed_file", damaged
    assert Output.from_dict(json.loads(json.dumps(Output("shrunk", 1.0, 0.5, 2.0).describe())), 1) == \
        Output("shrunk", 1.0, 0.5, 2.0)
    assert Output.from_dict({"kind": "constant", "constant": 2.0, "num_classes": 3}, 3).num_classes == 3


@pytest.mark.parametrize("learner", ["mlp", "gbdt"])
def test_a_saved_model_carries_its_output_map_for_labeldp_predict(tmp_path, learner):
    """What an auto job saves — the strong regularization's and a refit's options, and the shrinkage — is a model
    file `labeldp predict` reads back (the trees' file passes its checks) and applies the same way."""
    from features_party.auto import refit_config, strong
    from features_party.features import Preprocessor
    from features_party.learn.gbdt import GbdtConfig, train_gbdt
    from features_party.learn.gbdt_file import save_model as save_trees
    from features_party.learn.train import TrainConfig, save_model, train

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"example_id": [f"r{i}" for i in range(300)], "x": rng.normal(size=300),
                          "g": rng.choice(["a", "b"], size=300)}).set_index("example_id", drop=False)
    labels = 3 * frame["x"].to_numpy() + rng.normal(size=300)
    preprocessor = Preprocessor.fit(frame, ["x"], ["g"])
    numeric, categorical = preprocessor.transform(frame)
    output = Output("shrunk", 1.5, 0.25, 0.5)
    path = tmp_path / ("model.json" if learner == "gbdt" else "model.npz")
    if learner == "gbdt":
        config = refit_config(strong(GbdtConfig(min_child_weight=1e5)), (7, 8))
        assert (config.n_estimators, config.validation_fraction, config.min_child_weight) == (8, 0.0, 1e6)
        result = train_gbdt(config, numeric, categorical, labels)
        save_trees(path, result, preprocessor.to_dict(), {"output": output.describe()})
    else:
        config = refit_config(strong(TrainConfig(hidden=(4,), l2=0.5)), (3,))
        assert (config.epochs, config.patience, config.l2) == (3, 3, 1.0)
        result = train(config, numeric, categorical, labels, vocab_sizes=preprocessor.vocab_sizes)
        save_model(path, result, preprocessor.to_dict(), {"output": output.describe()})
    read = predictions_frame(path, frame).set_index("example_id")["prediction"]
    np.testing.assert_allclose(read.to_numpy(), output.apply(result.predict(numeric, categorical)), rtol=1e-5)


def test_auto_refuses_what_would_fail_after_a_charge_before_anything_is_charged(parties):
    """The review of issue 39: an auto job asks for its releases when it is created — the central mean first, which
    names every training id — once the organization's budget covers ε on every training example; an unknown id, a
    budget short of ε or folds too small to train on are 4xx with nothing spent."""
    trainer, features = parties["trainer"], parties["features"]
    ghost = pd.concat([features, features.iloc[:1].assign(example_id="ghost")], ignore_index=True)
    assert _upload(trainer, ghost).status_code == 200
    unknown = trainer.post("/v1/jobs", json=_auto_job(parties))
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "labels_party_refused", unknown.text
    assert _spent(parties) == 0.0 and trainer.get("/v1/jobs").json() == []
    assert _upload(trainer, features).status_code == 200
    with _consumer(parties) as consumer:  # 7 of the 10 granted spent on one example
        consumer.request_release(parties["dataset"], {"mechanism": "rr", "epsilon": 7.0, "example_ids": ["u0"]})
    short = trainer.post("/v1/jobs", json=_auto_job(parties))  # 4 > 3 left on u0
    assert short.status_code == 409 and short.json()["error"]["code"] == "labels_party_budget_exceeded", short.text
    assert "3 left" in short.json()["error"]["message"] and _spent(parties) == 7.0
    tiny = trainer.post("/v1/jobs", json={**_auto_job(parties, epsilon=1.0, example_ids=features["example_id"]
                                                      .iloc[1:30].tolist())})
    assert tiny.status_code == 400 and tiny.json()["error"]["code"] == "too_few_examples", tiny.text
    assert "smallest of the auto job's candidate fits" in tiny.json()["error"]["message"]
    assert _spent(parties) == 7.0


def test_the_mean_of_a_one_value_range_is_refused_before_the_charge(tmp_path):
    from tests.labels_party.api.helpers import admin_client

    _, client = admin_client(tmp_path)
    dataset = client.post("/v1/datasets", json={"name": "one", "label_kind": "integer", "min": 3, "max": 3,
                                                "epsilon_total": 1}).json()["id"]
    client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\na,3\nb,3",
               headers={"Content-Type": "text/csv"})
    answer = client.post(f"/v1/datasets/{dataset}/evaluations", json={"metric": "mean", "epsilon": 0.5,
                                                                       "example_ids": ["a", "b"]},
                         headers={"Idempotency-Key": "one"})
    assert answer.status_code == 400 and "one value" in answer.json()["error"]["message"]
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


@pytest.mark.labels_seed(0)  # a statistical outcome: the same noise every run, not a 1-in-20 failure
def test_auto_on_classes_without_signal_returns_the_majority_class_from_the_noisy_histogram(parties):
    """Issue 39's class constant: 3,000 labels over 7 classes, class 2 at 40 % and each other at 10 %, independent of
    the features, at ε = 0.25. The constant is the majority class of the RRWithPrior part's central DP histogram
    (about 900 labels, discrete-Laplace noise of scale 2/ε_prior ≈ 23 on counts of about 360 against 90) — right
    with probability above 1 − 10⁻⁴. The selection rows' K-ary RR frequencies, its former source, put class 2 at
    0.153 against 0.141 for each other class, with a standard error of 0.016 on 450 rows: a coin toss."""
    owner, trainer = parties["owner"], parties["trainer"]
    rng = np.random.default_rng(11)
    n = 3000
    labels = rng.choice(7, size=n, p=[0.1, 0.1, 0.4, 0.1, 0.1, 0.1, 0.1])
    ids = [f"c{i}" for i in range(n)]
    dataset = owner.post("/v1/datasets", json={"name": "storms", "label_kind": "classes", "num_classes": 7,
                                               "epsilon_total": 1}).json()["id"]
    body = "example_id,label\n" + "\n".join(f"{i},{v}" for i, v in zip(ids, labels, strict=True))
    assert owner.put(f"/v1/datasets/{dataset}/labels", content=body,
                     headers={"Content-Type": "text/csv"}).status_code == 200
    assert owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 1}).status_code == 201
    features = pd.DataFrame({"example_id": ids, "x0": rng.normal(size=n), "x1": rng.normal(size=n),
                             "group": rng.choice(["a", "b", "c"], size=n)})
    assert _upload(trainer, features, "storms").status_code == 200
    created = trainer.post("/v1/jobs", json={
        **_auto_job(parties, epsilon=0.25), "features": "storms", "dataset_id": dataset, "num_classes": 7,
        "train": {"epochs": 10, "batch_size": 128}})
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    report = job["auto"]
    assert report["constant"] == 2 and "noisy histogram" in report["constant_source"], report["constant_source"]
    assert report["chosen"] == {"candidate": "constant"}
    predicted = _predictions(trainer, job["id"])
    assert (predicted == 2).all()
    assert owner.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.25


@pytest.mark.labels_seed(0)  # a statistical outcome: the same noise every run, not a 1-in-20 failure
def test_auto_on_classes_weighs_alibi_soft_labels_with_the_mlp_only_charged_once(parties):
    """ALIBI is a class candidate (issue 41): its part's noisy vectors train the MLP with the alibi loss — trees have
    no soft-label loss, so no tree candidate on that part, and asking for alibi with trees alone is refused before
    anything is charged. 2,000 labels, 4 classes decided by x0 with some noise, ε = 2: a model beats the constant."""
    owner, trainer = parties["owner"], parties["trainer"]
    rng = np.random.default_rng(41)
    n = 2000
    x0 = rng.normal(size=n)
    labels = np.digitize(x0 + 0.3 * rng.normal(size=n), [-0.7, 0.0, 0.7])
    ids = [f"a{i}" for i in range(n)]
    dataset = owner.post("/v1/datasets", json={"name": "quarters", "label_kind": "classes", "num_classes": 4,
                                               "epsilon_total": 2}).json()["id"]
    assert owner.put(f"/v1/datasets/{dataset}/labels", headers={"Content-Type": "text/csv"}, content=(
        "example_id,label\n" + "\n".join(f"{i},{v}" for i, v in zip(ids, labels, strict=True)))).status_code == 200
    assert owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2}).status_code == 201
    features = pd.DataFrame({"example_id": ids, "x0": x0, "x1": rng.normal(size=n),
                             "group": rng.choice(["a", "b", "c"], size=n)})
    assert _upload(trainer, features, "quarters").status_code == 200
    job = {**_auto_job(parties, epsilon=2.0), "features": "quarters", "dataset_id": dataset, "num_classes": 4,
           "train": {"epochs": 10, "batch_size": 128}}
    refused = trainer.post("/v1/jobs", json={**job, "release": {**job["release"], "candidates": ["alibi"]},
                                             "train": {"model": "gbdt"}})
    assert refused.status_code == 400 and "only the MLP" in refused.json()["error"]["message"], refused.text
    assert owner.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0
    created = trainer.post("/v1/jobs", json=job)
    assert created.status_code == 202, created.text
    done = _finish(trainer, created.json()["id"])
    assert done["status"] == "succeeded", done["error"]
    names = {row["candidate"] for row in done["auto"]["candidates"]}
    assert {"alibi/mlp/job", "alibi/mlp/strong"} <= names and not any(n.startswith("alibi/gbdt") for n in names)
    assert "pooled/mlp/job" in names  # the parts of RR, RRWithPrior and LP-2ST pooled, ALIBI's not
    assert "pooled-alibi/mlp/job" in names and not any(n.startswith("pooled-alibi/gbdt") for n in names)
    assert "rr/gbdt/job" in names  # K-ary RR a candidate too, judged out of fold
    assert done["auto"]["chosen"]["candidate"] != "constant"
    predicted = _predictions(trainer, done["id"])
    truth = pd.Series(labels, index=ids)[predicted.index]
    assert np.mean(predicted == truth) > 0.6  # the majority class is right on about 0.27 of the rows
    assert owner.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 2.0  # each row once, at ε


def test_designs_pool_alibi_with_rr_as_likelihoods_and_never_refit_on_judging_rows():
    """The validation mechanism's part and the pooled parts are refitted on their folds, never on the selection or
    estimate rows; ALIBI's part is pooled with RR's folds (SOFT_POOLED), not with the other hard labels."""
    from features_party.auto import POOLED, SOFT_POOLED, designs

    names = ["selection"] * 3 + ["estimate"] * 2 + ["rr"] * 4 + ["rr-with-prior"] * 2 + ["alibi"] * 2
    ids = pd.Index([f"i{k}" for k in range(len(names))])
    part = pd.Series(names, index=ids, dtype=object)
    folds = pd.Series([k % 2 == 0 for k in range(len(ids))], index=ids)
    labelled = pd.Series(True, index=ids)
    plans, out_of_fold = designs(part, labelled, ["rr", "rr-with-prior", "alibi"], folds, "rr")
    by = {d.training: d for d in plans}
    assert set(by) == {"rr", "rr-with-prior", "alibi", POOLED, SOFT_POOLED}
    rr, selection = set(ids[part == "rr"]), set(ids[part == "selection"])
    assert set(out_of_fold) == rr
    assert set(by["rr"].refit) == rr
    assert set(by[POOLED].refit) == rr | set(ids[part == "rr-with-prior"])
    assert set(by[SOFT_POOLED].refit) == rr | set(ids[part == "alibi"])
    for design in plans:  # a fold's rows never judge the fit that trained on them
        assert not set(design.refit if design.refit is not None else []) & (selection | set(ids[part == "estimate"]))
        for trained, judged in design.fits:
            assert not set(trained) & set(judged)
    assert all(set(judged) <= rr for _, judged in by[SOFT_POOLED].fits)


def test_soft_targets_give_rr_rows_the_likelihood_of_their_released_class():
    """A SOFT_POOLED design's targets: ALIBI's rows their own log-likelihoods; an RR row log p for its released
    class and log q for every other (K = 3, ε = log 2: p = 1/2, q = 1/4)."""
    from features_party.auto import SOFT_POOLED, Targets

    labels = pd.Series([np.nan, 2.0, 0.0], index=["a", "r1", "r2"])
    soft = pd.DataFrame([[-1.0, -2.0, -3.0]], index=["a"])
    targets = Targets(labels, soft, (float(np.log(0.5)), float(np.log(0.25))))
    got = targets.of(pd.Index(["r1", "a", "r2"]), SOFT_POOLED, 3)
    p, q = np.log(0.5), np.log(0.25)
    np.testing.assert_allclose(got, [[q, q, p], [-1, -2, -3], [p, q, q]], rtol=1e-6)
    np.testing.assert_array_equal(targets.of(pd.Index(["r2", "r1"]), "rr", 3), [0, 2])


def test_an_auto_jobs_fits_are_counted_before_it_runs():
    """What a job's time and memory are planned for (features_party/planning._fits): per learner, two
    regularizations × (two folds of the unbiased part, one fit per other part, two folds pooled, and two of ALIBI's
    part pooled with RR's when ALIBI is a candidate), the chosen one refitted, LP-2ST's two stages."""
    from features_party import schemas
    from features_party.planning import _fits

    def request(**release) -> schemas.JobRequest:
        return schemas.JobRequest(features="f", api_key="k", dataset_id="d",
                                  release={"mechanism": "auto", "epsilon": 1.0, **release})

    assert _fits(request(), True) == 2 * (2 + 3 + 2 + 2) + 3  # the class default (four candidates, ALIBI's)
    assert _fits(request(candidates=["opt-unbiased", "rr-on-bins"]), True) == 2 * (2 + 1 + 2) + 3
    assert _fits(request(candidates=["rr"]), True) == 2 * 2 + 3


def test_the_candidates_a_job_may_name_are_the_arms_parts_knows():
    """The schema's AutoCandidate names exactly the default and opt-in arms of features_party.parts (one list each
    way, kept equal here)."""
    from typing import get_args

    from features_party import parts, schemas

    arms = {*parts.REGRESSION_ARMS, *parts.CLASS_ARMS, *(a for opt in parts.OPT_IN_ARMS.values() for a in opt)}
    assert set(get_args(schemas.AutoCandidate)) == arms
    assert all(arm in parts.ARM_RELEASES or arm in ("rr", "lp-2st") for arm in arms)


def _second_dataset(parties, name: str, spec: dict, labels, k: int | None = None) -> str:
    """Another dataset of the labels party on the fixture's ids (granted ε 10), the features table ``f`` uploaded."""
    owner, ids = parties["owner"], parties["features"]["example_id"]
    dataset = owner.post("/v1/datasets", json={"name": name, **spec, "epsilon_total": 10}).json()["id"]
    body = "example_id,label\n" + "\n".join(f"{i},{int(v)}" for i, v in zip(ids, labels, strict=True))
    assert owner.put(f"/v1/datasets/{dataset}/labels", content=body,
                     headers={"Content-Type": "text/csv"}).status_code == 200
    assert owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 10}).status_code == 201
    assert _upload(parties["trainer"], parties["features"]).status_code == 200
    return dataset


def _spent_on(parties, dataset: str) -> float:
    return parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"]


def test_a_candidate_the_labels_party_would_refuse_is_refused_or_left_out_before_any_charge(parties):
    """The review of issue 41: 300 classes are more than BlockRR and ALIBI take (256); the auto job asked for its
    parts one by one, so a job naming block-rr, or the default candidates with the MLP (ALIBI among them), was
    created (202), charged RR's part and then refused BlockRR's or ALIBI's. The labels party now checks every part
    first (``release-checks``): a named candidate it would refuse is a 400 with nothing spent; a default one is left
    out, and the job's request names the ones kept."""
    trainer, truth = parties["trainer"], parties["labels"].to_numpy()
    dataset = _second_dataset(parties, "wide-classes", {"label_kind": "classes", "num_classes": 300},
                              (truth * 10).astype(int) % 300)
    job = {**_auto_job(parties, epsilon=1.0), "dataset_id": dataset, "num_classes": 300,
           "train": {"model": "mlp", "epochs": 2, "batch_size": 256}}
    for named, refused in ((["rr", "block-rr"], "block-rr"), (["rr", "alibi"], "alibi")):
        answer = trainer.post("/v1/jobs", json={**job, "release": {**job["release"], "candidates": named}})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "labels_party_refused" and f"'{refused}'" in error["message"]
        assert "domain_too_large" in error["message"] and "nothing was spent" in error["message"]
    assert _spent_on(parties, dataset) == 0.0 and trainer.get("/v1/jobs").json() == []
    created = trainer.post("/v1/jobs", json=job)  # the default candidates: ALIBI left out
    assert created.status_code == 202, created.text
    finished = _finish(trainer, created.json()["id"])
    assert finished["status"] == "succeeded", finished["error"]
    assert not any(row["candidate"].startswith(("alibi", "pooled-alibi")) for row in finished["auto"]["candidates"])
    assert finished["request"]["release"]["candidates"] == ["rr", "rr-with-prior", "lp-2st"]
    assert _spent_on(parties, dataset) == 1.0  # every training example once


def test_a_wide_integer_range_is_validated_by_dbrr_where_opt_unbiased_would_be_refused(parties):
    """1,501 labels are more than the opt-unbiased solver takes (1,000): the auto job's mean was charged and then its
    validation release refused. Now its validation mechanism is dbrr (unbiased, any domain), opt-unbiased is left
    out of the default candidates, and the job charges ε once; named, opt-unbiased is a 400 with nothing spent."""
    trainer, truth = parties["trainer"], parties["labels"].to_numpy()
    dataset = _second_dataset(parties, "wide-range", {"label_kind": "integer", "min": 0, "max": 1500},
                              truth * 40)
    job = {**_auto_job(parties, epsilon=2.0), "dataset_id": dataset, "train": {"model": "gbdt"}}
    named = trainer.post("/v1/jobs", json={**job, "release": {**job["release"], "candidates": ["opt-unbiased"]}})
    assert named.status_code == 400 and "'opt-unbiased'" in named.json()["error"]["message"], named.text
    assert _spent_on(parties, dataset) == 0.0
    created = trainer.post("/v1/jobs", json=job)
    assert created.status_code == 202, created.text
    finished = _finish(trainer, created.json()["id"])
    assert finished["status"] == "succeeded", finished["error"]
    report = finished["auto"]
    assert {row["candidate"].split("/")[0] for row in report["candidates"]} <= {"rr-on-bins", "dbrr", "constant"}
    assert report["validation_mechanism"] == "dbrr" and finished["request"]["release"]["candidates"] == ["rr-on-bins"]
    assert finished["request"]["release"]["validation"] == "dbrr"
    assert _spent_on(parties, dataset) == 2.0
    assert finished["estimate"]["mechanism"] == "dbrr"  # the estimate rows' labels: dbrr's, unbiased


def _classes_job(parties, dataset: str, k: int, **release) -> dict:
    return {**_auto_job(parties, epsilon=1.0, **release), "dataset_id": dataset, "num_classes": k,
            "train": {"model": "mlp", "epochs": 1, "batch_size": 256, "hidden": [8]}}


def test_lp_mst_stages_are_checked_before_the_first_is_charged_and_wide_priors_travel_as_csv(parties):
    """The review of issue 41's fix: LP-MST's later stages are per-example prior releases whose bodies hold one
    prior per class and example; over 20,000 classes the second stage of ~675 rows decodes past the labels party's
    512 MiB, so the job was charged its first stage and then refused. Now every stage's shape is checked when the
    job is created (400, nothing spent), an auto job names LP-2ST or leaves it out on the same check, and priors
    travel as CSV (what the check counts; a Parquet footer of ~190 bytes per column passes 512 KiB at ~2,750
    classes): a fixed lp-mst job over 1,500 classes runs, each example charged once."""
    trainer, truth = parties["trainer"], parties["labels"].to_numpy().astype(int)
    wide = _second_dataset(parties, "twenty-thousand", {"label_kind": "classes", "num_classes": 20_000}, truth)
    fixed = {**_classes_job(parties, wide, 20_000), "release": {"mechanism": "rr", "epsilon": 1.0},
             "protocol": "lp-mst", "stages": 2}
    answer = trainer.post("/v1/jobs", json=fixed)
    assert answer.status_code == 400, answer.text
    assert "lp-mst" in answer.json()["error"]["message"] and "body_too_large" in answer.json()["error"]["message"]
    wider = _second_dataset(parties, "sixty-thousand", {"label_kind": "classes", "num_classes": 60_000}, truth)
    named = trainer.post("/v1/jobs", json=_classes_job(parties, wider, 60_000, candidates=["lp-2st"]))
    assert named.status_code == 400 and "'lp-2st'" in named.json()["error"]["message"], named.text
    assert _spent_on(parties, wide) == _spent_on(parties, wider) == 0.0 and trainer.get("/v1/jobs").json() == []
    csv = _second_dataset(parties, "fifteen-hundred", {"label_kind": "classes", "num_classes": 1500}, truth)
    created = trainer.post("/v1/jobs", json={**fixed, "dataset_id": csv, "num_classes": 1500})
    assert created.status_code == 202, created.text
    finished = _finish(trainer, created.json()["id"])
    assert finished["status"] == "succeeded", finished["error"]
    stages = finished["release"]["stages"]
    assert [s["stage"] for s in stages] == [1, 2] and stages[1]["release_id"] is not None
    assert _spent_on(parties, csv) == 1.0


def test_an_auto_requests_stored_shape_and_digest_are_unchanged_until_validation_is_filled_in():
    """The review of issue 41's fix: a new field left at its default must not change what a job record keeps, or a
    request resent with its Idempotency-Key across the upgrade would be a 409 instead of its job."""
    from features_party import schemas as trainer_schemas
    from features_party.service import request_digest, stored_request

    body = {"features": "f", "api_key": "k", "dataset_id": "d", "release": {"mechanism": "auto", "epsilon": 1.0}}
    request = trainer_schemas.JobRequest(**body)
    assert "validation" not in stored_request(request)["release"]
    assert request_digest(request) == request_digest(trainer_schemas.JobRequest(**body))
    filled = trainer_schemas.JobRequest(**{**body, "release": {**body["release"], "validation": "dbrr"}})
    assert stored_request(filled)["release"]["validation"] == "dbrr"
    assert request_digest(filled) != request_digest(request)


def test_a_fixed_jobs_estimate_rows_take_dbrr_where_opt_unbiased_is_refused(parties):
    """A fixed job's estimate rows are released by opt-unbiased when its own mechanism is biased; on 1,501 labels
    the labels party refuses it (before any charge), and the job had no estimate. It now asks dbrr instead (unbiased,
    any domain) under a key of its own: the job reports its estimate, every example charged once."""
    trainer, truth = parties["trainer"], parties["labels"].to_numpy()
    dataset = _second_dataset(parties, "wide-fixed", {"label_kind": "integer", "min": 0, "max": 1500}, truth * 40)
    job = {**_auto_job(parties), "dataset_id": dataset, "release": {"mechanism": "rr-on-bins", "epsilon": 2.0},
           "train": {"model": "gbdt"}}
    created = trainer.post("/v1/jobs", json=job)
    assert created.status_code == 202, created.text
    finished = _finish(trainer, created.json()["id"])
    assert finished["status"] == "succeeded", finished["error"]
    assert finished["estimate"]["mechanism"] == "dbrr" and not any("no estimate" in w for w in finished["warnings"])
    assert _spent_on(parties, dataset) == 2.0
