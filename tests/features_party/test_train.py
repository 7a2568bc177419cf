"""The JAX trainer (features_party/learn/train.py): fits that reach fixed error bounds on synthetic data (linear, MLP,
categorical embeddings, Poisson, classification, subset-selection labels), early stopping that keeps the best
parameters, save/load round trips, the unbiasedness claim in practice (optimally-unbiased labels recover the true
weights of a linear problem as n grows, RR-on-Bins labels do not), data-parallel training on 2 CPU devices, and the
trainer's pure pieces (features_party/learn/train_steps.py): an epoch's scan is the step applied by hand, and train() is
the plain per-step loop it replaced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest

from features_party.features import Preprocessor
from features_party.learn import losses, train_steps
from features_party.learn import train as train_module
from features_party.learn.model_file import load_model
from features_party.learn.train import TrainConfig, TrainResult, device_summary, save_model, train
from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased
from labels_party.core.solvers.rr_on_bins import solve_rr_on_bins
from shared import models
from shared.mechanisms.subset import SubsetSelectionRandomizer

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is tests/features_party/test_train.py)


def no_categorical(n: int) -> np.ndarray:
    return np.zeros((n, 0), dtype=np.int32)


def linear_data(n: int, seed: int, noise: float = 1.0):
    """y = X w + b + N(0, noise²) with 5 standard-normal features."""
    rng = np.random.default_rng(seed)
    w, b = np.array([1.5, -2.0, 0.5, 0.0, 3.0]), 4.0
    x = rng.normal(size=(n, w.size)).astype(np.float32)
    mean = x.astype(np.float64) @ w + b
    return x, mean + rng.normal(0.0, noise, n), mean


def split_like_train(config: TrainConfig, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The (validation, fit) index split that train() makes."""
    order = np.random.default_rng(config.seed).permutation(n)
    n_val = int(round(config.validation_fraction * n))
    return order[:n_val], order[n_val:]


def mse(a, b) -> float:
    return float(np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2))


# -- regression fits --------------------------------------------------------------------------------------------

def test_linear_model_reaches_the_noise_floor():
    x, y, _ = linear_data(3_000, seed=0)
    x_test, y_test, mean_test = linear_data(20_000, seed=1)
    config = TrainConfig(hidden=(), learning_rate=1e-2, batch_size=256, epochs=30, patience=5)
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    prediction = result.predict(x_test, no_categorical(len(y_test)))
    assert prediction.shape == (len(y_test),)
    assert abs(mse(prediction, y_test) - 1.0) < 0.1  # noise variance 1
    assert mse(prediction, mean_test) < 0.02  # the fitted function itself is close to X w + b
    assert np.var(y_test) > 15  # so the bounds above are far from a constant predictor's
    assert result.target_shift == pytest.approx(np.mean(y[split_like_train(config, len(y))[1]]), rel=1e-9)
    assert result.spec.hidden == () and len(result.params["layers"]) == 1
    assert all(np.isfinite(r["val_loss"]) and np.isfinite(r["train_loss"]) for r in result.history)
    assert [r["epoch"] for r in result.history] == list(range(1, len(result.history) + 1))


def test_mlp_learns_a_nonlinear_target():
    def data(n, seed):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(n, 2)).astype(np.float32)
        return x, np.sin(2 * x[:, 0]) + x[:, 1] ** 2 + rng.normal(0.0, 0.1, n)

    x, y = data(3_000, 0)
    x_test, y_test = data(5_000, 1)
    config = TrainConfig(hidden=(32, 16), learning_rate=3e-3, batch_size=128, epochs=60, patience=10)
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    prediction = result.predict(x_test, no_categorical(len(y_test)))
    assert np.var(y_test) > 2.0
    assert mse(prediction, y_test) < 0.15  # target variance ~2.5, noise 0.01
    # A linear model cannot do this: its best possible MSE (least squares on the test set itself) is far above.
    design = np.column_stack([np.ones(len(y_test)), x_test])
    residual = y_test - design @ np.linalg.lstsq(design, y_test, rcond=None)[0]
    assert np.mean(residual**2) > 1.5


def test_categorical_feature_is_learned_through_its_embedding():
    effects = np.array([0.0, -2.0, 1.0, 3.0, -1.0, 0.5])  # index 0 = unseen category

    def data(n, seed):
        rng = np.random.default_rng(seed)
        categories = rng.integers(1, 6, size=(n, 1)).astype(np.int32)
        numeric = rng.normal(size=(n, 1)).astype(np.float32)  # irrelevant to the target
        return numeric, categories, effects[categories[:, 0]] + rng.normal(0.0, 0.3, n)

    numeric, categories, y = data(3_000, 0)
    numeric_test, categories_test, y_test = data(5_000, 1)
    for hidden in [(), (16,)]:
        config = TrainConfig(hidden=hidden, learning_rate=1e-2, batch_size=256, epochs=30, patience=5)
        result = train(config, numeric, categories, y, vocab_sizes=(6,))
        assert result.params["embeddings"][0].shape == (6, config.embed_dim)
        prediction = result.predict(numeric_test, categories_test)
        assert np.var(y_test) > 2.5
        assert mse(prediction, y_test) < 0.12, hidden  # noise variance 0.09
        per_category = [prediction[categories_test[:, 0] == c].mean() for c in range(1, 6)]
        np.testing.assert_allclose(per_category, effects[1:], atol=0.1)


# -- early stopping ------------------------------------------------------------------------------------------------

def overfitting_problem():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 10)).astype(np.float32)
    y = x[:, 0] + rng.normal(0.0, 1.0, 60)  # little signal, lots of noise: a wide MLP overfits quickly
    config = TrainConfig(hidden=(64, 64), learning_rate=1e-2, batch_size=16, epochs=200, patience=4, seed=5)
    return config, x, y


def test_early_stopping_keeps_the_best_parameters():
    config, x, y = overfitting_problem()
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    val_losses = np.array([r["val_loss"] for r in result.history])
    best = int(np.argmin(val_losses)) + 1
    assert result.best_epoch == best
    # It stopped because validation loss went up, `patience` epochs after the best one, well before `epochs`.
    assert len(result.history) == best + config.patience < config.epochs
    assert val_losses[-1] > val_losses[best - 1] * 1.05
    # The returned parameters are those of the best epoch: their validation loss (½ squared error in label units,
    # what train() records) is the minimum of the history, not the last epoch's.
    val, fit = split_like_train(config, len(y))
    assert result.target_shift == pytest.approx(float(np.mean(y[fit])), rel=1e-6)
    assert result.target_scale == pytest.approx(float(np.std(y[fit])), rel=1e-6)
    prediction = result.predict(x[val], no_categorical(len(val)))
    recomputed = 0.5 * mse(prediction, y[val])
    assert recomputed == pytest.approx(val_losses.min(), rel=1e-4)
    assert abs(recomputed - val_losses[-1]) > 0.04 * val_losses.min()


@pytest.mark.parametrize("standardize", [True, False])
def test_metrics_are_in_label_units(standardize):
    """Labels around 1000 with sd 300: the reported validation MSE is the MSE of the model's own predictions on the
    validation rows, in squared label units (standardized, it would be ~90,000 times smaller)."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(800, 3)).astype(np.float32)
    y = 1000.0 + 300.0 * (x @ np.array([0.8, -0.5, 0.3])) + rng.normal(0.0, 60.0, 800)
    config = TrainConfig(hidden=(), learning_rate=1e-2, batch_size=64, epochs=6, patience=6,
                         standardize_targets=standardize)
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    assert len(result.history) == result.best_epoch == 6  # the last parameters are the reported epoch's
    val, _ = split_like_train(config, len(y))
    recomputed = mse(result.predict(x[val], no_categorical(len(val))), y[val])
    last = result.history[-1]
    assert last["val_mse"] == pytest.approx(recomputed, rel=1e-3)
    assert last["val_loss"] == pytest.approx(recomputed / 2, rel=1e-3)
    assert recomputed > 60.0**2  # the noise floor, in label units
    if standardize:  # it learned: better than a constant (whose MSE is about the variance, 97,600)
        assert recomputed < 0.2 * np.var(y)
        assert result.target_scale == pytest.approx(np.std(y[split_like_train(config, len(y))[1]]), rel=1e-6)
    else:
        assert result.target_scale == 1.0


def test_best_parameters_equal_a_run_that_ends_at_the_best_epoch():
    config, x, y = overfitting_problem()
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    assert 1 < result.best_epoch < len(result.history)
    # Same seed, same batches, stopped at best_epoch: its final parameters are the ones early stopping kept.
    short = train(TrainConfig(**{**config.__dict__, "epochs": result.best_epoch}), x, no_categorical(len(y)), y,
                  vocab_sizes=())
    assert short.best_epoch == result.best_epoch
    np.testing.assert_allclose([r["val_loss"] for r in short.history],
                               [r["val_loss"] for r in result.history[: result.best_epoch]], rtol=1e-6)
    grid = np.random.default_rng(9).normal(size=(200, 10)).astype(np.float32)
    np.testing.assert_allclose(result.predict(grid, no_categorical(200)), short.predict(grid, no_categorical(200)),
                               rtol=1e-6, atol=1e-6)


def test_metrics_log_and_epoch_callback(tmp_path):
    x, y, _ = linear_data(500, seed=2)
    seen = []
    config = TrainConfig(hidden=(), learning_rate=1e-2, batch_size=64, epochs=4, patience=10)
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=(), metrics_path=tmp_path / "metrics.json",
                   on_epoch=seen.append)
    logged = json.loads((tmp_path / "metrics.json").read_text())
    assert len(logged) == len(seen) == len(result.history) == 4
    assert [r["epoch"] for r in logged] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["val_loss"] for r in logged], [r["val_loss"] for r in seen], rtol=1e-12)
    assert logged[-1]["val_loss"] < logged[0]["val_loss"]


def test_an_epoch_in_several_device_calls_trains_exactly_as_in_one(monkeypatch):
    """A long epoch runs as several scans (so a deadline can stop it between them): the same updates, the same
    parameters, as one scan."""
    x, y, _ = linear_data(2_000, seed=3)
    config = TrainConfig(hidden=(16,), learning_rate=1e-2, batch_size=32, epochs=3, patience=10)
    whole = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    spec = models.ModelSpec(5, (), hidden=(16,))
    assert train_module.steps_per_call(models.num_params(spec), 32) >= 50  # 50 steps an epoch: one call
    monkeypatch.setattr(train_module, "WORK_PER_CALL", models.num_params(spec) * 64 * 7)  # 7 steps a call: 8 calls
    sliced = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    for a, b in zip(jax.tree_util.tree_leaves(whole.params), jax.tree_util.tree_leaves(sliced.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["val_loss"] for r in whole.history], [r["val_loss"] for r in sliced.history],
                               rtol=1e-5)


def test_a_deadline_stops_training_between_device_calls():
    """An epoch of 8,000 steps of batch 1 through (1024, 1024) takes about 14 s here as one call; it runs as calls
    of 63 steps (~0.1 s), and a deadline 2 s away stops it between two of them, inside the first epoch."""
    x, y, _ = linear_data(10_000, seed=4)
    config = TrainConfig(hidden=(1024, 1024), learning_rate=1e-4, batch_size=1, epochs=1000, patience=1000)
    spec = models.ModelSpec(5, (), hidden=(1024, 1024))
    assert train_module.steps_per_call(models.num_params(spec), 1) == 63
    params = models.init_params(jax.random.PRNGKey(0), spec)  # drawn before the clock starts (seconds on a CPU)
    epochs = []
    started = time.monotonic()
    with pytest.raises(train_module.TimeLimitExceeded):
        train(config, x, no_categorical(len(y)), y, vocab_sizes=(), on_epoch=epochs.append, init_params=params,
              deadline=started + 2.0)
    elapsed = time.monotonic() - started
    # Stopped inside the first epoch (no epoch reported), not before the deadline; no upper bound on a shared CI
    # machine's clock beyond that.
    assert epochs == [] and elapsed >= 2.0, (epochs, elapsed)
    with pytest.raises(train_module.TimeLimitExceeded):  # already past: not a single step
        train(config, x, no_categorical(len(y)), y, vocab_sizes=(), init_params=params, deadline=started)


def test_parameters_are_counted_as_init_params_makes_them():
    for spec in (models.ModelSpec(3, (5, 2), 4, (8, 6), 3), models.ModelSpec(0, (7,), 2, (), 1),
                 models.ModelSpec(4, (), 4, (2048,) * 4, 10)):
        made = jax.eval_shape(lambda key, spec=spec: models.init_params(key, spec), jax.random.PRNGKey(0))
        assert models.num_params(spec) == sum(leaf.size for leaf in jax.tree_util.tree_leaves(made))


def test_unknown_loss_is_rejected():
    x, y, _ = linear_data(50, seed=0)
    with pytest.raises(ValueError, match="unknown loss"):
        train(TrainConfig(loss="hinge"), x, no_categorical(50), y, vocab_sizes=())


# -- save / load ---------------------------------------------------------------------------------------------------

def test_save_and_load_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    n = 800
    frame = pd.DataFrame({"example_id": [f"e{i}" for i in range(n)], "age": rng.normal(40, 12, n),
                          "hours": rng.uniform(0, 60, n), "region": rng.choice(["north", "south", "east"], n)})
    y = 0.05 * frame["age"].to_numpy() + (frame["region"] == "south").to_numpy() * 2.0 + rng.normal(0, 0.5, n)
    preprocessor = Preprocessor.fit(frame, ["age", "hours"], ["region"])
    numeric, categorical = preprocessor.transform(frame)
    config = TrainConfig(hidden=(8,), embed_dim=3, learning_rate=1e-2, batch_size=128, epochs=8, patience=3,
                         seed=2)
    result = train(config, numeric, categorical, y, vocab_sizes=preprocessor.vocab_sizes)
    path = tmp_path / "model.npz"
    save_model(path, result, preprocessor.to_dict(), extra={"mechanism": "opt-unbiased"})
    loaded, header = load_model(path)

    assert isinstance(loaded, TrainResult)
    assert loaded.config == config and loaded.spec == result.spec
    assert loaded.target_shift == result.target_shift and loaded.target_scale == result.target_scale
    assert result.target_scale != 1.0 and result.target_shift != 0.0  # the scaling is really exercised
    assert loaded.best_epoch == result.best_epoch and loaded.history == result.history
    assert header["mechanism"] == "opt-unbiased"
    assert Preprocessor.from_dict(header["preprocessing"]) == preprocessor

    unseen = pd.DataFrame({"example_id": ["a", "b", "c"], "age": [20.0, 50.0, 70.0], "hours": [10.0, 40.0, 0.0],
                           "region": ["south", "west", "north"]})  # "west" is an unseen category (index 0)
    for data in (frame, unseen):
        num, cat = Preprocessor.from_dict(header["preprocessing"]).transform(data)
        np.testing.assert_allclose(loaded.predict(num, cat), result.predict(*preprocessor.transform(data)),
                                   rtol=1e-6)
    np.testing.assert_allclose(loaded.predict(numeric, categorical), result.predict(numeric, categorical),
                               rtol=1e-6)
    assert mse(result.predict(numeric, categorical), y) < 0.5 * np.var(y)  # a fitted model, not the init


def test_save_and_load_round_trip_for_classification(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(300, 2)).astype(np.float32)
    classes = (x[:, 0] > 0).astype(np.float64) + (x[:, 1] > 0.5)
    config = TrainConfig(loss="cross_entropy", hidden=(), learning_rate=1e-2, batch_size=64, epochs=5)
    result = train(config, x, no_categorical(300), classes, vocab_sizes=(), num_classes=3)
    preprocessing = Preprocessor(("a", "b"), (), (0.0, 0.0), (1.0, 1.0), ()).to_dict()
    save_model(tmp_path / "m.npz", result, preprocessing)
    loaded, header = load_model(tmp_path / "m.npz")
    assert loaded.spec.output_dim == 3 and header["preprocessing"] == preprocessing
    probabilities = loaded.predict(x, no_categorical(300))
    np.testing.assert_allclose(probabilities, result.predict(x, no_categorical(300)), rtol=1e-6)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


# -- Poisson regression --------------------------------------------------------------------------------------------

POISSON_A, POISSON_B = 0.3, np.array([0.6, -0.4])


def poisson_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 1.5, size=(n, 2)).astype(np.float32)
    rate = np.exp(POISSON_A + x.astype(np.float64) @ POISSON_B)
    return x, rng.poisson(rate).astype(np.float64), rate


def test_poisson_regression_recovers_the_rate():
    x, y, _ = poisson_data(20_000, 0)
    config = TrainConfig(loss="poisson", hidden=(), learning_rate=1e-2, batch_size=512, epochs=25, patience=5)
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    assert result.target_shift == 0.0 and result.target_scale == 1.0  # no target scaling for Poisson
    x_test, _, rate_test = poisson_data(5_000, 1)
    predicted = result.predict(x_test, no_categorical(len(x_test)))
    assert np.all(predicted > 0)
    assert np.max(np.abs(predicted / rate_test - 1)) < 0.08
    layer = result.params["layers"][0]
    np.testing.assert_allclose(np.asarray(layer["w"])[:, 0], POISSON_B, atol=0.05)
    assert float(np.asarray(layer["b"])[0]) == pytest.approx(POISSON_A, abs=0.05)


def test_poisson_training_on_unbiased_private_counts_with_negative_labels():
    x, y, _ = poisson_data(30_000, 2)
    y = np.minimum(y, 10.0)  # the label domain is 0..10 (rates here are <= 2.8: clipping is negligible)
    randomizer = solve_optimal_unbiased(np.arange(11.0), np.bincount(y.astype(int), minlength=11), 2.0)
    x_test, _, rate_test = poisson_data(5_000, 3)
    worst_errors = []
    # Three independent privatizations: early stopping on a validation split of *noisy* labels sometimes keeps an
    # under-trained epoch (seed 7 keeps epoch 1, max error 0.48; seeds 8-12 stay below 0.08), so the rate must be
    # recovered in most runs, and every run must stay finite.
    for seed in (7, 8, 9):
        private = randomizer.sample(y, np.random.default_rng(seed))
        assert np.mean(private < 0) > 0.05 and private.min() < -1 and private.max() > 10
        config = TrainConfig(loss="poisson", hidden=(), learning_rate=1e-2, batch_size=512, epochs=25, patience=5)
        result = train(config, x, no_categorical(len(y)), private, vocab_sizes=())
        assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["val_loss"]) for r in result.history)
        assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in result.params["layers"][0].values())
        predicted = result.predict(x_test, no_categorical(len(x_test)))
        assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)
        worst_errors.append(float(np.max(np.abs(predicted / rate_test - 1))))
    assert np.median(worst_errors) < 0.1 and max(worst_errors) < 0.6


def test_poisson_mlp_with_extreme_targets_stays_finite():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    y = rng.choice([-500.0, -3.0, 0.0, 2.0, 1e4], size=400, p=[0.1, 0.2, 0.3, 0.3, 0.1])
    config = TrainConfig(loss="poisson", hidden=(16,), learning_rate=1e-2, batch_size=64, epochs=5, patience=10)
    result = train(config, x, no_categorical(400), y, vocab_sizes=())
    assert len(result.history) == 5
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["val_loss"]) for r in result.history)
    assert np.all(np.isfinite(result.predict(x, no_categorical(400))))


# -- classification -----------------------------------------------------------------------------------------------

CLASS_DIRECTIONS = np.array([[2.0, 0.0, 1.0], [-1.0, 2.0, -1.0], [-1.0, -2.0, 0.5]])


def classification_data(n: int, seed: int):
    """Three linearly separable classes: y = argmax of X @ W (a margin of 0.1 removes near-ties)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4 * n, 3))
    scores = x @ CLASS_DIRECTIONS.T
    ordered = np.sort(scores, axis=1)
    keep = np.flatnonzero(ordered[:, -1] - ordered[:, -2] > 0.1)[:n]
    return x[keep].astype(np.float32), np.argmax(scores[keep], axis=1).astype(np.float64)


def accuracy(result: TrainResult, x: np.ndarray, classes: np.ndarray) -> float:
    probabilities = result.predict(x, no_categorical(len(x)))
    assert probabilities.shape == (len(x), 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    return float(np.mean(np.argmax(probabilities, axis=1) == classes))


def test_cross_entropy_on_separable_data_reaches_high_accuracy():
    x, classes = classification_data(4_000, 0)
    x_test, classes_test = classification_data(4_000, 1)
    assert np.bincount(classes_test.astype(int)).min() > 800  # balanced enough that chance is ~1/3
    config = TrainConfig(loss="cross_entropy", hidden=(), learning_rate=1e-2, batch_size=256, epochs=20)
    result = train(config, x, no_categorical(len(x)), classes, vocab_sizes=(), num_classes=3)
    assert accuracy(result, x_test, classes_test) > 0.95


def test_subset_loss_on_subset_randomized_labels_beats_chance():
    x, classes = classification_data(20_000, 2)
    x_test, classes_test = classification_data(4_000, 3)
    randomizer = SubsetSelectionRandomizer.build(3, 2.0)
    sets = randomizer.sample(classes, np.random.default_rng(11))
    weights = randomizer.unbiased_weights(sets)
    assert weights.shape == (len(classes), 3)
    # The released sets are noisy: the true class alone is released for only p (1 - q)² ≈ 39% of examples.
    p, q = randomizer.inclusion_probabilities
    alone = sets.sum(axis=1) == 1
    assert np.mean(alone & sets[np.arange(len(classes)), classes.astype(int)]) == pytest.approx(p * (1 - q) ** 2,
                                                                                              abs=0.01)
    config = TrainConfig(loss="subset", hidden=(), learning_rate=1e-2, batch_size=512, epochs=20)
    result = train(config, x, no_categorical(len(x)), weights, vocab_sizes=(), num_classes=3)
    assert result.spec.output_dim == 3
    assert accuracy(result, x_test, classes_test) > 0.9  # chance is ~1/3


# -- the unbiasedness claim in practice -----------------------------------------------------------------------------

SLOPE_DIRECTION = np.array([0.5, -0.3, 0.2])  # |w|_1 = 1 and x in [-1, 1]^3, so p(x) in [0.2, 0.8]
TRUE_COEFFICIENTS = np.concatenate([[5.0], 10 * 0.3 * SLOPE_DIRECTION])  # E[y | x] = 10 p(x) = 5 + 3 w·x
SMALL_N, LARGE_N = 2_000, 100_000


def recovered_coefficients(result: TrainResult) -> np.ndarray:
    """Intercept and slopes of a trained linear model, on the label scale (read off its predictions)."""
    points = np.vstack([np.zeros(3), np.eye(3)]).astype(np.float32)
    prediction = result.predict(points, no_categorical(4)).astype(np.float64)
    return np.concatenate([[prediction[0]], prediction[1:] - prediction[0]])


def least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    design = np.column_stack([np.ones(len(y)), x.astype(np.float64)])
    return np.linalg.lstsq(design, y, rcond=None)[0]


@pytest.fixture(scope="module")
def binomial_problem():
    """Integer labels 0..10 with an exactly linear conditional mean, privatized with both mechanisms (ε = 1)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, size=(LARGE_N, 3)).astype(np.float32)
    p = 0.5 + 0.3 * x.astype(np.float64) @ SLOPE_DIRECTION
    y = rng.binomial(10, p).astype(np.float64)
    prior = np.bincount(y.astype(int), minlength=11)
    unbiased = solve_optimal_unbiased(np.arange(11.0), prior, 1.0, mesh=22)
    biased = solve_rr_on_bins(np.arange(11.0), prior, 1.0)
    assert unbiased.max_abs_bias < 1e-9 and biased.max_abs_bias > 1.0
    labels = {"unbiased": unbiased.sample(y, np.random.default_rng(1)),
              "rr_on_bins": biased.sample(y, np.random.default_rng(2))}
    # The true labels recover the coefficients well (the problem itself is well posed).
    assert np.max(np.abs(least_squares(x, y) - TRUE_COEFFICIENTS)) < 0.03
    return x, y, labels


def train_linear(x, labels, n: int) -> TrainResult:
    # The same procedure at every n, with a batch size giving enough optimizer steps on the small data set.
    config = TrainConfig(hidden=(), learning_rate=1e-3, l2=0.0, batch_size=64 if n <= 10_000 else 512, epochs=20,
                         patience=20, seed=3)
    return train(config, x[:n], no_categorical(n), labels[:n], vocab_sizes=())


def test_unbiased_labels_recover_the_true_weights_as_n_grows(binomial_problem):
    x, _, labels = binomial_problem
    private = labels["unbiased"]
    assert private.min() < -5 and private.max() > 15  # outputs far outside the label range
    coefficients, errors = {}, {}
    for n in (SMALL_N, LARGE_N):
        coefficients["sgd", n] = recovered_coefficients(train_linear(x, private, n))
        coefficients["ols", n] = least_squares(x[:n], private[:n])
    for key, value in coefficients.items():
        errors[key] = float(np.max(np.abs(value - TRUE_COEFFICIENTS)))
    for method in ("sgd", "ols"):
        assert errors[method, LARGE_N] < 0.2, errors  # the true intercept is 5, the slopes 1.5, -0.9, 0.6
        assert errors[method, LARGE_N] < 0.5 * errors[method, SMALL_N], errors
    # At large n the trained model has converged to the least-squares fit of the private labels.
    np.testing.assert_allclose(coefficients["sgd", LARGE_N], coefficients["ols", LARGE_N], atol=0.08)


def test_rr_on_bins_labels_stay_biased_at_large_n(binomial_problem):
    x, _, labels = binomial_problem
    private = labels["rr_on_bins"]
    sgd = recovered_coefficients(train_linear(x, private, LARGE_N))
    ols = least_squares(x, private)
    for coefficients in (sgd, ols):
        assert np.max(np.abs(coefficients - TRUE_COEFFICIENTS)) > 1.0
        # The slopes are shrunk towards 0 (to well under a third of the truth), not merely noisy.
        ratio = coefficients[1:] / TRUE_COEFFICIENTS[1:]
        assert np.all(ratio > 0) and np.all(ratio < 0.3), coefficients
    np.testing.assert_allclose(sgd[1:], ols[1:], atol=0.05)  # SGD converged: the bias is the labels', not SGD's


# -- data-parallel training -----------------------------------------------------------------------------------------

DATA_PARALLEL_SCRIPT = """
import json
import numpy as np
import jax
from features_party.learn.train import TrainConfig, device_summary, train

placements = set()  # how many devices each array train() places is spread over
_device_put = jax.device_put
def recording_device_put(x, device=None, *args, **kwargs):
    if hasattr(device, "device_set"):
        placements.add((len(device.device_set), tuple(getattr(device, "spec", ("?",)))))
    return _device_put(x, device, *args, **kwargs)
jax.device_put = recording_device_put

rng = np.random.default_rng(0)
w, b = np.array([1.5, -2.0, 0.5, 0.0, 3.0]), 4.0
def data(n):
    x = rng.normal(size=(n, 5)).astype(np.float32)
    return x, x.astype(np.float64) @ w + b + rng.normal(0.0, 1.0, n)
x, y = data(3_000)
x_test, y_test = data(20_000)
config = TrainConfig(hidden=(), learning_rate=1e-2, batch_size=256, epochs=15, patience=5)
result = train(config, x, np.zeros((len(y), 0), np.int32), y, vocab_sizes=())
prediction = result.predict(x_test, np.zeros((len(y_test), 0), np.int32))
print(json.dumps({"devices": len(jax.devices()), "summary": device_summary(), "result_device": result.device,
                  "test_mse": float(np.mean((prediction - y_test) ** 2)), "epochs": len(result.history),
                  "best_epoch": result.best_epoch, "predictions": prediction[:50].tolist(),
                  "placements": sorted(placements)}))
"""


def run_data_parallel_script(device_count: int) -> dict:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={device_count}",
           "JAX_PLATFORMS": "cpu"}
    completed = subprocess.run([sys.executable, "-c", DATA_PARALLEL_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_data_parallel_training_on_two_cpu_devices():
    two = run_data_parallel_script(2)
    assert two["devices"] == 2
    assert two["summary"].startswith("2 x cpu") and two["result_device"] == two["summary"]
    # Batches are split over both devices along the batch axis; parameters are replicated on both.
    assert [2, ["data"]] in two["placements"], two["placements"]
    assert [2, []] in two["placements"], two["placements"]
    assert abs(two["test_mse"] - 1.0) < 0.1  # noise variance 1, as on one device
    # Sharding the batches changes only the order of floating-point reductions: the same run on one device
    # ends at (nearly) the same model.
    one = run_data_parallel_script(1)
    assert one["devices"] == 1 and one["summary"].startswith("1 x cpu")
    assert one["epochs"] == two["epochs"] and one["best_epoch"] == two["best_epoch"]
    np.testing.assert_allclose(two["predictions"], one["predictions"], rtol=1e-3, atol=1e-3)
    assert two["test_mse"] == pytest.approx(one["test_mse"], rel=1e-3)


def test_device_summary_in_process():
    assert device_summary().startswith(f"{len(jax.devices())} x {jax.devices()[0].platform} (")


# -- the pure pieces: step, epoch scan, batches, early stopping -------------------------------------------------------

def small_problem(loss: str, n: int = 240, seed: int = 0):
    """Numeric and categorical features, targets for ``loss`` (labels, or subset weights (n, 3)), a small MLP."""
    rng = np.random.default_rng(seed)
    numeric = rng.normal(size=(n, 3)).astype(np.float32)
    categorical = rng.integers(0, 5, size=(n, 2)).astype(np.int32)
    score = numeric[:, 0] - numeric[:, 1] + (categorical[:, 0] == 2)
    if loss == "subset":
        targets = np.eye(3, dtype=np.float32)[np.digitize(score, [-0.5, 0.5])] * 1.5 - 0.25
    else:
        targets = (score + rng.normal(0.0, 0.3, n)).astype(np.float32)
    spec = models.ModelSpec(3, (5, 5), 2, (8,), losses.output_dim(loss, 3))
    return (numeric, categorical, targets), models.init_params(jax.random.PRNGKey(seed), spec)


@pytest.mark.parametrize("loss", ["squared", "subset"])
def test_epoch_scan_equals_stepping_the_pure_step_by_hand(loss):
    data, params = small_problem(loss)
    optimizer = optax.chain(optax.add_decayed_weights(1e-3), optax.rmsprop(1e-2))
    objective = train_steps.make_objective(losses.LOSSES[loss])
    step = train_steps.make_train_step(objective, optimizer)
    indices = train_steps.epoch_batch_indices(np.random.default_rng(1).permutation(200), 32, 6)
    validation = tuple(column[200:] for column in data)
    start = train_steps.TrainState(params, optimizer.init(params))
    state, total = jax.jit(train_steps.make_steps(step))(start, data, indices)  # an epoch, as the trainer runs it
    train_loss, val_loss = total / indices.shape[1], jax.jit(objective)(state.params, validation)

    by_hand, values = start, []
    for s in range(indices.shape[1]):  # eager, one batch at a time, from the host arrays
        by_hand, value = step(by_hand, tuple(column[indices[:, s]] for column in data))
        values.append(float(value))
    for scanned, stepped in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(by_hand.params),
                                strict=True):
        np.testing.assert_allclose(scanned, stepped, rtol=1e-5, atol=1e-6)
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(state.params),
                                                              jax.tree_util.tree_leaves(params), strict=True))
    assert moved > 0.02  # six steps of rmsprop at 1e-2 really moved the parameters
    assert float(train_loss) == pytest.approx(np.mean(values), rel=1e-5)
    assert float(val_loss) == pytest.approx(float(objective(by_hand.params, validation)), rel=1e-5)


def test_epoch_batch_indices():
    permutation = np.array([7, 3, 9, 0, 5, 1, 8, 2, 6, 4])
    indices = train_steps.epoch_batch_indices(permutation, 3, 3)
    assert indices.shape == (3, 3) and indices.dtype == np.int32  # (examples per step, steps)
    np.testing.assert_array_equal(indices.T, [[7, 3, 9], [0, 5, 1], [8, 2, 6]])  # the incomplete batch [4] is left out
    # Fewer rows than one batch: the permutation repeats, so the one step still has the full shape.
    np.testing.assert_array_equal(train_steps.epoch_batch_indices(np.array([5, 2]), 4, 1)[:, 0], [5, 2, 5, 2])


def test_keep_best_is_early_stopping_with_patience():
    best = train_steps.Best(np.inf, "initial", 0)
    decisions = []
    for epoch, val_loss in enumerate([3.0, 2.0, 2.0, 2.5, 2.1], start=1):
        best, stop = train_steps.keep_best(best, val_loss, f"params {epoch}", epoch, patience=3)
        decisions.append((best.epoch, stop))
    # A tie does not replace the best; the stop comes `patience` epochs after the best one.
    assert decisions == [(1, False), (2, False), (2, False), (2, False), (2, True)]
    assert best == train_steps.Best(2.0, "params 2", 2)
    best, stop = train_steps.keep_best(train_steps.Best(1.0, "kept", 4), float("nan"), "diverged", 5, patience=10)
    assert stop and best.params == "kept"  # a non-finite validation loss stops at once, keeping the best
    best, stop = train_steps.keep_best(train_steps.Best(np.inf, "initial", 0), float("inf"), "p", 1, patience=10)
    assert stop and best.epoch == 0


def reference_train(config: TrainConfig, x: np.ndarray, y: np.ndarray):
    """train() as the plain per-step Python loop it replaced (squared loss, no categorical features, one device):
    (history as (train_loss, val_loss) pairs in label units, best epoch, best parameters)."""
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(y))
    n_val = int(round(config.validation_fraction * len(y)))
    val, fit = order[:n_val], order[n_val:]
    scaled = ((y - np.mean(y[fit])) / np.std(y[fit])).astype(np.float32)
    params = models.init_params(jax.random.PRNGKey(config.seed), models.ModelSpec(x.shape[1], (), config.embed_dim,
                                                                                  config.hidden, 1))
    optimizer = optax.chain(optax.add_decayed_weights(config.l2), optax.rmsprop(config.learning_rate))
    opt_state = optimizer.init(params)

    def objective(p, rows):  # rows: host indices
        return losses.squared(models.apply(p, jnp.asarray(x[rows]), no_categorical(len(rows))), scaled[rows])

    @jax.jit
    def step(p, state, x_batch, y_batch):
        value, grads = jax.value_and_grad(
            lambda q: losses.squared(models.apply(q, x_batch, no_categorical(len(y_batch))), y_batch))(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    batch = min(config.batch_size, len(fit))
    history, best = [], (np.inf, 0, params)
    for epoch in range(1, config.epochs + 1):
        permutation, total = rng.permutation(fit), 0.0
        for s in range(len(fit) // batch):
            rows = permutation[s * batch:(s + 1) * batch]
            params, opt_state, value = step(params, opt_state, x[rows], scaled[rows])
            total += float(value)
        unit = float(np.std(y[fit])) ** 2  # losses are reported in label units
        history.append((total / (len(fit) // batch) * unit, float(objective(params, val)) * unit))
        if history[-1][1] < best[0]:
            best = (history[-1][1], epoch, params)
        elif epoch - best[1] >= config.patience:
            break
    return history, best[1], best[2]


def test_train_is_the_per_step_loop_it_replaced():
    config, x, y = overfitting_problem()
    history, best_epoch, best_params = reference_train(config, x, y)
    result = train(config, x, no_categorical(len(y)), y, vocab_sizes=())
    assert result.best_epoch == best_epoch and len(result.history) == len(history) > best_epoch
    np.testing.assert_allclose([(r["train_loss"], r["val_loss"]) for r in result.history], history, rtol=1e-5)
    for ours, theirs in zip(jax.tree_util.tree_leaves(result.params), jax.tree_util.tree_leaves(best_params),
                            strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


EPOCH_SHARDING_SCRIPT = """
import json, sys
import numpy as np
import jax, optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from features_party.learn import losses, train_steps
from shared import models

mesh = Mesh(np.array(jax.devices()), ("data",))
replicated, by_example = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
params = models.init_params(jax.random.PRNGKey(0), models.ModelSpec(3, (), 4, (24,), 1))
optimizer = optax.sgd(0.1)
objective = train_steps.make_objective(losses.squared)
epoch = jax.jit(train_steps.make_steps(train_steps.make_train_step(objective, optimizer), by_example))
rng = np.random.default_rng(0)
data = (rng.normal(size=(500, 3)).astype(np.float32), np.zeros((500, 0), np.int32),
        rng.normal(size=500).astype(np.float32))
state = jax.device_put(train_steps.TrainState(params, optimizer.init(params)), replicated)
indices = jax.device_put(train_steps.epoch_batch_indices(rng.permutation(500), 64, 7), by_example)
data = jax.device_put(data, replicated)
hlo = epoch.lower(state, data, indices).compile().as_text()
print(json.dumps({"devices": len(jax.devices()), "all_reduce": hlo.count("all-reduce"),
                  "whole_batch": "f32[64,24]" in hlo, "half_batch": "f32[32,24]" in hlo}))
"""


def test_a_compiled_epoch_splits_each_batch_over_the_devices():
    """What each device computes, read off the compiled epoch: on two devices the hidden layer is evaluated for 32
    of each step's 64 examples and the gradients are summed across devices; on one, for all 64 with no
    collective."""
    def compiled(device_count: int) -> dict:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={device_count}",
               "JAX_PLATFORMS": "cpu"}
        completed = subprocess.run([sys.executable, "-c", EPOCH_SHARDING_SCRIPT], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=120)
        assert completed.returncode == 0, completed.stderr[-3000:]
        return json.loads(completed.stdout.strip().splitlines()[-1])

    two, one = compiled(2), compiled(1)
    assert two["devices"] == 2 and two["half_batch"] and not two["whole_batch"] and two["all_reduce"] > 0
    assert one["devices"] == 1 and one["whole_batch"] and not one["half_batch"] and one["all_reduce"] == 0


# -- models -----------------------------------------------------------------------------------------------------

def test_linear_model_is_affine_in_the_features_and_embeddings():
    spec = models.ModelSpec(num_numeric=2, vocab_sizes=(4,), embed_dim=3, hidden=(), output_dim=1)
    params = models.init_params(jax.random.PRNGKey(0), spec)
    assert float(jnp.abs(params["layers"][0]["w"]).max()) == 0.0  # a GLM starts at zero
    rng = np.random.default_rng(0)
    params["layers"][0]["w"] = jnp.asarray(rng.normal(size=(5, 1)), dtype=jnp.float32)
    params["layers"][0]["b"] = jnp.asarray([0.7], dtype=jnp.float32)
    numeric = rng.normal(size=(6, 2)).astype(np.float32)
    categorical = np.array([[0], [1], [2], [3], [1], [0]], dtype=np.int32)
    out = np.asarray(models.apply(params, jnp.asarray(numeric), jnp.asarray(categorical)))
    features = np.concatenate([numeric, np.asarray(params["embeddings"][0])[categorical[:, 0]]], axis=1)
    expected = features @ np.asarray(params["layers"][0]["w"]) + 0.7
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.predict("squared", jnp.asarray(out))), expected[:, 0], rtol=1e-5)


@pytest.mark.parametrize("loss", ["squared", "cross_entropy"])
def test_predictions_in_batches_equal_one_pass(monkeypatch, loss):
    """The MLP predicts a features table in batches (its activations are bounded by the batch, not the table):
    the same numbers as one pass, with a last batch shorter than the others, and none for an empty table."""
    x, y, _ = linear_data(500, seed=3)
    labels = (y > np.median(y)).astype(float) if loss == "cross_entropy" else y
    config = TrainConfig(loss=loss, hidden=(8,), epochs=2, batch_size=64)
    result = train(config, x, no_categorical(len(y)), labels, vocab_sizes=(), num_classes=2 if loss != "squared"
                   else None)
    whole = result.predict(x, no_categorical(len(y)))
    monkeypatch.setattr(train_module, "PREDICT_ROWS", 7)  # 500 = 71 x 7 + 3
    batched = result.predict(x, no_categorical(len(y)))
    assert batched.shape == whole.shape == ((500,) if loss == "squared" else (500, 2))
    # float32 layers summed in another order per batch shape: equal to float32 rounding of the largest output
    np.testing.assert_allclose(batched, whole, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(whole).max())))
    assert result.predict(x[:0], no_categorical(0)).shape[0] == 0
