"""The trainer's bounds on what a job holds besides its training work (review of issue 32): its predictions — one
number per row of its features table and model output (a class's probability), for either learner — and, for trees,
its memory (the model, XGBoost's cached histograms, the training matrices). ``max_job_size`` counts neither: a job
training on 10 rows of a 100,000-class dataset was accepted, to predict 1.5·10⁸ probabilities and grow up to 5·10⁷
trees."""

from __future__ import annotations

from features_party.learn import gbdt
from tests.features_party import test_api
from tests.features_party.test_api import N, _job, _upload, trainer_client, trainer_context

parties = test_api.parties  # the fixture: a labels-party server with a dataset of N labels, and a trainer


def _classes_dataset(parties, num_classes: int) -> str:
    """A classes dataset of the features' examples, granted to the publisher."""
    owner, ids = parties["owner"], parties["features"]["example_id"]
    dataset = owner.post("/v1/datasets", json={"name": f"k{num_classes}", "label_kind": "classes",
                                               "num_classes": num_classes, "epsilon_total": 10}).json()["id"]
    body = "example_id,label\n" + "\n".join(f"{i},{n % num_classes}" for n, i in enumerate(ids))
    assert owner.put(f"/v1/datasets/{dataset}/labels", content=body,
                     headers={"Content-Type": "text/csv"}).status_code == 200
    assert owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 10}).status_code < 300
    return dataset


def _rr_job(parties, dataset: str, train: dict) -> dict:
    ids = parties["features"]["example_id"].tolist()[:10]  # ten rows to train on: a tiny job by max_job_size
    return {**_job(parties), "dataset_id": dataset, "release": {"mechanism": "rr", "epsilon": 1.0, "example_ids": ids},
            "train": train, "estimate_fraction": 0}  # all ten trained on (an estimate would keep one)


MLP = {"hidden": [], "epochs": 1, "batch_size": 16, "patience": 1}
TREES = {"model": "gbdt", "gbdt": {"n_estimators": 100, "max_depth": 4}}


def test_many_classes_on_a_tiny_job_are_refused_by_the_default_limits(parties):
    ctx = trainer_context(parties["tmp"] / "defaults", parties["labels_url"], start=False)
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    dataset = _classes_dataset(parties, 100_000)
    for train in (MLP, {"model": "gbdt"}):
        refused = trainer.post("/v1/jobs", json=_rr_job(parties, dataset, train))
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_too_large", refused.text
    assert trainer.get("/v1/jobs").json() == []
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


def test_predictions_are_bounded_for_either_learner(parties):
    cells = N * 3  # every row of the features table (not only the 10 trained on) × 3 class probabilities
    dataset = _classes_dataset(parties, 3)
    for limit, accepted in ((cells - 1, False), (cells, True)):
        ctx = trainer_context(parties["tmp"] / f"cells{limit}", parties["labels_url"], start=False,
                              max_prediction_cells=limit)
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        for train in (MLP, TREES):
            answer = trainer.post("/v1/jobs", json=_rr_job(parties, dataset, train))
            if accepted:
                assert answer.status_code == 202, answer.text
                continue
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "job_too_large", answer.text
            assert f"{N:,} rows of features table 'f' × 3 outputs" in answer.json()["error"]["message"]


def test_a_tree_jobs_memory_is_bounded_by_its_model_histograms_and_matrices(parties):
    """10 rows, 100 rounds × 3 trees (one per class) of depth 4: a tree holds at most 2·10 − 1 = 19 nodes (not 31);
    each node ~64 bytes plus ~7 per level a categorical split may list (half of the column's 3 levels and the
    unseen code: 2), each tree 600; XGBoost caches min(1024, 19) nodes' histograms of 256 bins per numeric feature
    (2) and one per categorical code (4), 16 bytes a bin; 10 rows × 3 cells × 13 bytes of matrices."""
    model = 300 * 600 + 100 * 3 * 19 * (64 + 7 * 2)
    histograms = 19 * (256 * 2 + 4) * 16
    expected = model + histograms + 10 * 3 * 13
    memory = gbdt.memory(100, 4, 3, 10, 2, (4,))
    assert (memory.model, memory.histograms, memory.total) == (model, histograms, expected)
    assert gbdt.most_nodes(100, 4, 3, 10) == 100 * 3 * 19 and gbdt.most_nodes(100, 4, 3, 10_000) == 100 * 3 * 31
    # a wide categorical column: its splits list up to half its levels, and its bins are histogram bins
    wide = gbdt.memory(100, 4, 3, 10, 2, (100_001,))
    assert wide.model == 300 * 600 + 100 * 3 * 19 * (64 + 7 * 50_000)
    dataset = _classes_dataset(parties, 3)
    for limit, accepted in ((expected - 1, False), (expected, True)):
        ctx = trainer_context(parties["tmp"] / f"bytes{limit}", parties["labels_url"], start=False,
                              max_tree_bytes=limit)
        trainer = trainer_client(ctx, "publisher")
        assert _upload(trainer, parties["features"]).status_code == 200
        answer = trainer.post("/v1/jobs", json=_rr_job(parties, dataset, TREES))
        if accepted:
            assert answer.status_code == 202, answer.text
            continue
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "job_too_large", answer.text
        assert f"the trees may take {expected:.3g} bytes = model {model:.3g} + histograms {histograms:.3g}" in \
            answer.json()["error"]["message"]


def test_an_mlp_jobs_memory_is_bounded_by_its_parameters_and_activations(parties):
    """Issue 40: an MLP of 1.3·10⁸ parameters trained on a few rows is small by max_job_size, and took the trainer
    from 537 MB to 3.8 GB. Eight hidden layers of 4,096 (1.2·10⁸ parameters, 32 bytes each: 3.8 GB) are refused by
    the default max_mlp_bytes before the labels party is asked for anything; the usual MLP is not."""
    from features_party.planning import mlp_memory
    from shared import models

    spec = models.ModelSpec(2, (4,), 4, (4096,) * 8, 1)  # x0, x1, group (3 levels and the unseen code)
    parameters = models.num_params(spec)
    assert parameters == (2 + 4) * 4096 + 7 * 4096 * 4096 + 4096 + 4 * 4 + 8 * 4096 + 1 > 1.1e8
    memory = mlp_memory(spec, batch_size=16, rows=10)
    assert (memory.parameters, memory.activations, memory.matrices) == (32 * parameters,
                                                                        12 * 10 * (6 + 8 * 4096 + 1), 8 * 10 * 3)
    assert mlp_memory(spec, batch_size=16, rows=10, fits=3).parameters == (32 + 8) * parameters  # kept candidates
    ctx = trainer_context(parties["tmp"] / "mlp", parties["labels_url"], start=False)
    trainer = trainer_client(ctx, "publisher")
    assert _upload(trainer, parties["features"]).status_code == 200
    dataset = _classes_dataset(parties, 3)
    wide = {**MLP, "hidden": [4096] * 8}
    refused = trainer.post("/v1/jobs", json=_rr_job(parties, dataset, wide))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_too_large", refused.text
    assert "(max_mlp_bytes)" in refused.json()["error"]["message"]
    assert trainer.get("/v1/jobs").json() == []
    assert parties["owner"].get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0
    for train in (MLP, {**MLP, "hidden": [64, 32]}):
        assert trainer.post("/v1/jobs", json=_rr_job(parties, dataset, train)).status_code == 202
