"""LP-MST against a real labels-party server: each example is released once at ε (the ledger shows it), the
stage-2 priors are informative (mean k < K), and the models learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from features_party import multistage
from features_party.learn.train import TrainConfig, train, validation_split
from features_party.multistage import train_multistage
from labeldp.benchmarks.classification import run_classification_bench
from labeldp.benchmarks.parties import CONSUMER, two_parties


def test_two_stage_training_spends_epsilon_once_per_example(tmp_path, monkeypatch):
    validated = []  # each stage's rows that may validate, as the stage's training saw them

    def spy(*args, validate_on, **kwargs):
        validated.append(np.asarray(validate_on, dtype=bool))
        return train(*args, validate_on=validate_on, **kwargs)

    monkeypatch.setattr(multistage, "train", spy)
    digits = load_digits()
    x = (digits.data[:900] / 16.0).astype(np.float32)
    y = digits.target[:900]
    ids = np.array([f"d{i}" for i in range(900)])
    none = np.zeros((900, 0), np.int32)
    with two_parties(tmp_path, seed=0) as parties:
        with parties.owner() as owner:
            dataset = owner.create_dataset(name="digits", label_kind="classes", num_classes=10, epsilon_total=2.0)
            owner.upload_labels(dataset.id, ids, y.astype(float))
            owner.grant(dataset.id, CONSUMER, 2.0)
        with parties.consumer() as client:
            model, reports, _labels = train_multistage(
                client, dataset.id, ids[:700], x[:700], none[:700], vocab_sizes=(), num_classes=10, epsilon=2.0,
                stages=2, config=TrainConfig(loss="cross_entropy", hidden=(32,), learning_rate=3e-3, epochs=25,
                                             batch_size=64, patience=25), seed=0)
            with pytest.raises(Exception) as refused:  # every training example has spent its whole budget
                client.request_release(dataset.id, {"mechanism": "rr", "epsilon": 0.1,
                                                    "example_ids": ids[:700].tolist()})
            assert getattr(refused.value, "code", None) == "budget_exceeded"
            # stage-2 examples whose prior gave k = 1 were left out of its release and kept their whole budget
            stage_2 = set(client.download_labels(reports[1].release_id).column("example_id").to_pylist())
            stage_1 = set(client.download_labels(reports[0].release_id).column("example_id").to_pylist())
            left_out = sorted(set(ids[:700].tolist()) - stage_1 - stage_2)
            assert len(left_out) == reports[1].uninformative > 0
            assert client.request_release(dataset.id, {"mechanism": "rr", "epsilon": 2.0,
                                                       "example_ids": left_out}).num_examples == len(left_out)
        with parties.owner() as owner:
            audit = owner.audit(dataset.id)
            budget = owner.budget(dataset.id)
    assert [r.examples for r in reports] == [350, 350] and reports[0].uninformative == 0
    assert reports[1].mean_k < 10 and reports[1].trained_on <= 700
    assert all(r.certified_epsilon <= 2.0 for r in reports)
    covered = [350, 350 - reports[1].uninformative, reports[1].uninformative]  # the last: the left-out ones at 2.0
    assert [e.record["examples_covered"] for e in audit.events] == covered and audit.chain_valid
    assert budget.epsilon_spent == 2.0  # parallel composition over the disjoint stages
    accuracy = np.mean(np.argmax(model.predict(x[700:], none[700:]), axis=1) == y[700:])
    assert accuracy > 0.6
    # a stage validates on its own released labels only: not on earlier stages' (the model it starts from fitted
    # them) nor on examples labelled by the model's own prediction (uninformative ones)
    assert [v.size for v in validated] == [350, reports[1].trained_on]
    assert validated[0].all() and validated[1].sum() == 350 - reports[1].uninformative


@pytest.mark.slow
def test_quick_classification_benchmark(tmp_path):
    runs = run_classification_bench([2.0], 1, tmp_path, epochs=12, progress=False)
    assert set(runs.method) == {"non-private", "rr (LP-1ST)", "LP-2ST", "LP-3ST", "subset", "cluster priors"}
    assert runs[runs.method == "non-private"].accuracy.iloc[0] > 0.9
    private = runs[runs.method != "non-private"]
    assert (private.certified_epsilon <= 2.0).all() and (private.accuracy > 0.3).all()
    assert "spent/total, max over examples): 10/10" in (tmp_path / "summary.md").read_text()
    assert "chain valid: True" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("stages", [2, 3])
def test_a_stage_whose_priors_would_say_nothing_is_not_released_and_spends_nothing(tmp_path, stages):
    """A sharpened model (temperature 0.01) gives every later-stage example a prior with k = 1: RRWithPrior would
    release the model's own predictions. The labels party refuses that before any charge; the job goes on to the
    next stage with the stage-1 model, and the refused stages' examples keep their budget. (The one feature is the
    label itself, so the model separates the two classes and every example's sharpened prior is one-hot.)"""
    y = np.arange(300) % 2
    x = np.eye(2, dtype=np.float32)[y]
    ids = np.array([f"b{i}" for i in range(300)])
    none = np.zeros((300, 0), np.int32)
    with two_parties(tmp_path, seed=0) as parties:
        with parties.owner() as owner:
            dataset = owner.create_dataset(name="binary", label_kind="classes", num_classes=2, epsilon_total=1.0)
            owner.upload_labels(dataset.id, ids, y.astype(float))
            owner.grant(dataset.id, CONSUMER, 1.0)
        with parties.consumer() as client:
            _, reports, _labels = train_multistage(
                client, dataset.id, ids, x, none, vocab_sizes=(), num_classes=2, epsilon=1.0, stages=stages,
                temperature=0.01, config=TrainConfig(loss="cross_entropy", hidden=(16,), learning_rate=3e-3,
                                                     epochs=10, batch_size=32, patience=10), seed=0)
        with parties.owner() as owner:
            audit = owner.audit(dataset.id)
    size = 300 // stages
    assert [(r.stage, r.examples, r.skipped) for r in reports] == \
        [(1, size, None)] + [(t, size, "uninformative_release") for t in range(2, stages + 1)]
    assert all(r.release_id is None and r.trained_on == 0 for r in reports[1:])
    assert [e.record["examples_covered"] for e in audit.events] == [size]  # the later stages charged nothing


def test_a_validation_split_restricted_to_some_rows_draws_only_from_them():
    rng = np.random.default_rng
    everything = validation_split(100, 0.2, rng(3))
    same = validation_split(100, 0.2, rng(3), np.ones(100, dtype=bool))  # all rows may validate: the same split
    assert all(np.array_equal(a, b) for a, b in zip(everything, same, strict=True))
    mask = np.arange(100) % 4 == 0  # 25 rows may validate
    validation, fit = validation_split(100, 0.2, rng(3), mask)
    assert validation.size == 5 and mask[validation].all()  # round(0.2 × 25)
    assert np.array_equal(np.sort(np.concatenate([validation, fit])), np.arange(100))
    assert validation_split(100, 0.2, rng(3), np.arange(100) < 9)[0].size == 0  # fewer than 10 candidates: none
