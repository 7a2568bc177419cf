"""Training losses of the features party (features_party/learn/losses.py): gradients against central finite differences
and closed forms, finiteness on the out-of-range labels unbiased randomizers emit, unbiasedness of the gradients
under an unbiased randomizer (exact expectation over its outputs), the subset loss as an unbiased estimate of the
cross-entropy, and the point predictions."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from features_party.learn import losses
from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased
from labels_party.core.solvers.rr_on_bins import solve_rr_on_bins
from shared.mechanisms.subset import SubsetSelectionRandomizer

N, K = 7, 4
LABELS = np.arange(0, 6.0)
PRIOR = np.array([0.3, 0.25, 0.2, 0.12, 0.08, 0.05])


@pytest.fixture(autouse=True)
def float64():
    """Float64 inside every test of this file (restored afterwards: the trainer tests run in float32)."""
    with jax.enable_x64(True):
        yield


def _inputs(loss: str, seed: int = 0):
    """Model outputs and targets of a batch of N examples for each loss (float64)."""
    rng = np.random.default_rng(seed)
    if loss in ("squared", "poisson"):
        outputs = rng.normal(0.0, 1.0, (N, 1))
        targets = rng.normal(2.0, 3.0, N)  # real-valued, some negative: privatized labels
    elif loss == "cross_entropy":
        outputs = rng.normal(0.0, 2.0, (N, K))
        targets = rng.integers(0, K, N).astype(np.float64)
    else:  # subset: weights (1[k∈S] - q)/(p - q), some negative
        randomizer = SubsetSelectionRandomizer.build(K, 1.0)
        outputs = rng.normal(0.0, 2.0, (N, K))
        targets = randomizer.unbiased_weights(randomizer.sample(rng.integers(0, K, N), rng))
    return jnp.asarray(outputs, dtype=jnp.float64), jnp.asarray(targets, dtype=jnp.float64)


def _central_differences(fn, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += h
        down[index] -= h
        grad[index] = (float(fn(jnp.asarray(up))) - float(fn(jnp.asarray(down)))) / (2 * h)
    return grad


# -- gradients ---------------------------------------------------------------------------------------------------

def test_float64_is_active_in_this_file():
    assert jnp.asarray(1.0).dtype == jnp.float64
    outputs, targets = _inputs("squared")
    assert losses.squared(outputs, targets).dtype == jnp.float64


@pytest.mark.parametrize("loss", ["squared", "poisson", "cross_entropy", "subset"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_matches_central_finite_differences(loss, seed):
    outputs, targets = _inputs(loss, seed)
    fn = lambda o: losses.LOSSES[loss](o, targets)  # noqa: E731
    analytic = np.asarray(jax.grad(fn)(outputs))
    numeric = _central_differences(fn, np.asarray(outputs))
    assert analytic.shape == outputs.shape
    assert np.all(np.isfinite(analytic))
    assert np.max(np.abs(analytic)) > 1e-3  # a non-trivial gradient
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def test_squared_loss_value_and_closed_form_gradient():
    outputs, targets = _inputs("squared")
    f, y = np.asarray(outputs)[:, 0], np.asarray(targets)
    assert float(losses.squared(outputs, targets)) == pytest.approx(np.mean(0.5 * (f - y) ** 2), rel=1e-12)
    grad = np.asarray(jax.grad(losses.squared)(outputs, targets))
    np.testing.assert_allclose(grad[:, 0], (f - y) / N, rtol=1e-12, atol=1e-15)


def test_poisson_loss_value_and_closed_form_gradient():
    outputs, targets = _inputs("poisson")
    eta, y = np.asarray(outputs)[:, 0], np.asarray(targets)
    assert float(losses.poisson(outputs, targets)) == pytest.approx(np.mean(np.exp(eta) - y * eta), rel=1e-12)
    grad = np.asarray(jax.grad(losses.poisson)(outputs, targets))
    np.testing.assert_allclose(grad[:, 0], (np.exp(eta) - y) / N, rtol=1e-12, atol=1e-15)


def test_cross_entropy_value_and_closed_form_gradient():
    outputs, targets = _inputs("cross_entropy")
    o, y = np.asarray(outputs), np.asarray(targets).astype(int)
    probs = np.exp(o - o.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    assert float(losses.cross_entropy(outputs, targets)) == pytest.approx(
        -np.mean(np.log(probs[np.arange(N), y])), rel=1e-12)
    grad = np.asarray(jax.grad(losses.cross_entropy)(outputs, targets))
    np.testing.assert_allclose(grad, (probs - np.eye(K)[y]) / N, rtol=1e-10, atol=1e-14)


def test_subset_loss_with_one_hot_weights_is_cross_entropy():
    outputs, _ = _inputs("subset")
    classes = np.array([0, 3, 1, 2, 2, 0, 3])
    one_hot = jnp.asarray(np.eye(K)[classes])
    assert float(losses.subset(outputs, one_hot)) == pytest.approx(
        float(losses.cross_entropy(outputs, jnp.asarray(classes, dtype=jnp.float64))), rel=1e-12)


# -- finiteness on out-of-range labels ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_poisson_is_finite_for_negative_and_huge_targets(dtype):
    outputs = jnp.asarray([[-3.0], [0.0], [2.5], [-1.0], [5.0]], dtype=dtype)
    targets = jnp.asarray([-500.0, 1e4, -0.75, 0.0, 37.0], dtype=dtype)
    value, grad = jax.value_and_grad(losses.poisson)(outputs, targets)
    assert np.isfinite(float(value))
    assert np.all(np.isfinite(np.asarray(grad)))
    eta, y = np.asarray(outputs, dtype=np.float64)[:, 0], np.asarray(targets, dtype=np.float64)
    rtol = 1e-5 if dtype == jnp.float32 else 1e-12
    assert float(value) == pytest.approx(np.mean(np.exp(eta) - y * eta), rel=rtol)
    np.testing.assert_allclose(np.asarray(grad)[:, 0], (np.exp(eta) - y) / 5, rtol=rtol)
    # A negative target pushes the rate down and a huge one pushes it up: the gradient signs say so.
    assert grad[0, 0] > 0 and grad[1, 0] < 0


# -- unbiased gradients under an unbiased randomizer ---------------------------------------------------------------

def _expected_gradient(loss_fn, randomizer, f: jax.Array, row: int) -> np.ndarray:
    """Σ_j M[y, j] ∇_f loss(f, ŷ_j): the exact expectation over the randomizer's outputs for the label of row."""
    grad = jax.grad(loss_fn)
    total = np.zeros(f.shape)
    for probability, output in zip(randomizer.matrix[row], randomizer.output_values, strict=True):
        if probability > 0:
            total += probability * np.asarray(grad(f, jnp.full(f.shape[0], output)))
    return total


@pytest.fixture(scope="module")
def unbiased():
    randomizer = solve_optimal_unbiased(LABELS, PRIOR, 1.0, mesh=12)
    # Precondition: exactly unbiased and with outputs outside [0, 5] (the case the losses must handle).
    assert randomizer.max_abs_bias < 1e-9
    assert randomizer.output_values.min() < 0 and randomizer.output_values.max() > 5
    return randomizer


@pytest.fixture(scope="module")
def biased():
    randomizer = solve_rr_on_bins(LABELS, PRIOR, 1.0)
    assert randomizer.max_abs_bias > 0.1
    return randomizer


@pytest.mark.parametrize("loss", ["squared", "poisson"])
def test_unbiased_randomizer_gives_unbiased_gradients(loss, unbiased):
    loss_fn = losses.LOSSES[loss]
    f = jnp.asarray([[-0.4], [0.3], [1.7]], dtype=jnp.float64)
    for row, y in enumerate(unbiased.input_values):
        expected = _expected_gradient(loss_fn, unbiased, f, row)
        clean = np.asarray(jax.grad(loss_fn)(f, jnp.full(3, y)))
        np.testing.assert_allclose(expected, clean, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("loss", ["squared", "poisson"])
def test_biased_randomizer_gives_biased_gradients(loss, biased):
    loss_fn = losses.LOSSES[loss]
    f = jnp.asarray([[-0.4], [0.3], [1.7]], dtype=jnp.float64)
    gaps = []
    for row, y in enumerate(biased.input_values):
        expected = _expected_gradient(loss_fn, biased, f, row)
        clean = np.asarray(jax.grad(loss_fn)(f, jnp.full(3, y)))
        # The gradient bias is exactly -(E[ŷ|y] - y)/n per example for both losses (affine in the target).
        np.testing.assert_allclose(expected - clean, np.full((3, 1), -biased.bias[row] / 3), rtol=1e-6, atol=1e-9)
        gaps.append(np.max(np.abs(expected - clean)))
    assert max(gaps) > 0.1 / 3


# -- the subset loss estimates the cross-entropy without bias -------------------------------------------------------

@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_subset_loss_expectation_over_all_subsets_is_the_cross_entropy(epsilon):
    randomizer = SubsetSelectionRandomizer.build(3, epsilon)
    p, q = randomizer.inclusion_probabilities
    subsets = np.array(list(itertools.product([0, 1], repeat=3)), dtype=bool)
    assert subsets.shape == (8, 3)
    outputs = jnp.asarray([[0.2, -1.3, 0.9]], dtype=jnp.float64)
    value_grad = jax.value_and_grad(losses.subset)
    for y in range(3):
        inclusion = np.full(3, q)
        inclusion[y] = p
        probabilities = np.prod(np.where(subsets, inclusion, 1 - inclusion), axis=1)
        assert probabilities.sum() == pytest.approx(1.0, abs=1e-15)
        expected_value, expected_grad = 0.0, np.zeros((1, 3))
        for probability, subset in zip(probabilities, subsets, strict=True):
            weights = jnp.asarray(randomizer.unbiased_weights(subset[None, :]))
            value, grad = value_grad(outputs, weights)
            expected_value += probability * float(value)
            expected_grad += probability * np.asarray(grad)
        target = jnp.asarray([float(y)])
        assert expected_value == pytest.approx(float(losses.cross_entropy(outputs, target)), rel=1e-10)
        np.testing.assert_allclose(expected_grad, np.asarray(jax.grad(losses.cross_entropy)(outputs, target)),
                                   rtol=1e-9, atol=1e-12)


def test_a_single_subset_loss_is_not_the_cross_entropy():
    """The estimate is noisy per draw (so the expectation test above is not trivially true)."""
    randomizer = SubsetSelectionRandomizer.build(3, 2.0)
    outputs = jnp.asarray([[0.2, -1.3, 0.9]], dtype=jnp.float64)
    weights = jnp.asarray(randomizer.unbiased_weights(np.array([[True, True, False]])))
    assert abs(float(losses.subset(outputs, weights)) - float(losses.cross_entropy(outputs, jnp.asarray([0.0])))) > 0.1


# -- predictions ---------------------------------------------------------------------------------------------------

def test_predict_on_the_label_scale():
    outputs = jnp.asarray([[0.5, 2.0, -1.0], [-2.0, 0.0, 3.0], [1.0, 1.0, 1.0]], dtype=jnp.float64)
    np.testing.assert_allclose(np.asarray(losses.predict("squared", outputs[:, :1])), [0.5, -2.0, 1.0])
    np.testing.assert_allclose(np.asarray(losses.predict("poisson", outputs[:, :1])), np.exp([0.5, -2.0, 1.0]),
                               rtol=1e-12)
    for loss in ("cross_entropy", "subset"):
        probs = np.asarray(losses.predict(loss, outputs))
        assert probs.shape == (3, 3)
        assert np.all(probs > 0)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
        np.testing.assert_array_equal(np.argmax(probs, axis=1), [1, 2, 0])
        np.testing.assert_allclose(probs[2], 1 / 3, rtol=1e-12)


@pytest.mark.parametrize("loss, num_classes, expected", [("squared", None, 1), ("poisson", None, 1),
                                                         ("cross_entropy", 5, 5), ("subset", 3, 3)])
def test_output_dim(loss, num_classes, expected):
    assert losses.output_dim(loss, num_classes) == expected


def test_alibi_loss_is_cross_entropy_against_the_posterior_under_the_models_prediction():
    """ALIBI's default post-processing: the soft label is the posterior of the released vector's log-likelihoods
    under the model's current prediction, held constant in the gradient — so the gradient is softmax − soft."""
    from shared.mechanisms.alibi import AlibiRandomizer

    rng = np.random.default_rng(4)
    mechanism = AlibiRandomizer.build(K, 1.0)
    log_likelihoods = jnp.asarray(mechanism.log_likelihoods(mechanism.sample(rng.integers(0, K, N), rng)))
    outputs = jnp.asarray(rng.normal(0.0, 2.0, (N, K)))
    o = np.asarray(outputs)
    probs = np.exp(o - o.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    soft = mechanism.posterior(np.asarray(mechanism.sample(rng.integers(0, K, 1), rng)))  # shape check only
    assert soft.shape == (1, K)
    soft = probs * np.exp(np.asarray(log_likelihoods))
    soft /= soft.sum(axis=1, keepdims=True)
    assert float(losses.alibi(outputs, log_likelihoods)) == pytest.approx(
        -np.mean(np.sum(soft * np.log(probs), axis=1)), rel=1e-10)
    grad = np.asarray(jax.grad(losses.alibi)(outputs, log_likelihoods))
    np.testing.assert_allclose(grad, (probs - soft) / N, rtol=1e-9, atol=1e-14)
