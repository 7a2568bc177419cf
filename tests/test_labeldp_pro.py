"""LabelDP-Pro: dp-accounting calibration, simplex/hull projection properties, denoising, and a short run."""

from __future__ import annotations

import dp_accounting
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp
from sklearn.datasets import load_digits

from labels_party.labeldp_pro import (
    ProConfig,
    calibrate_sigma,
    denoise,
    dp_event,
    epsilon_of,
    project_simplex,
    train_labeldp_pro,
)
from shared import models


def test_accounting_is_dp_accounting_with_the_label_change_sensitivity():
    # the event is the Poisson-subsampled Gaussian with noise multiplier σ/2 (a label change moves 2C)
    event = dp_event(2.0, 0.01, 1000, "altconv")
    assert event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 1000)
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    assert epsilon_of(2.0, 0.01, 1000, "altconv", 1e-5) == pytest.approx(accountant.get_epsilon(1e-5))
    # no amplification for the SELF* denoisers: much more noise for the same ε
    sigma_amp = calibrate_sigma(1.0, 1e-5, 0.05, 200, "altconv")
    sigma_self = calibrate_sigma(1.0, 1e-5, 0.05, 200, "selfconv")
    assert sigma_self > 3 * sigma_amp
    for sigma, denoiser in ((sigma_amp, "altconv"), (sigma_self, "selfconv")):
        achieved = epsilon_of(sigma, 0.05, 200, denoiser, 1e-5)
        assert achieved <= 1.0 + 1e-3 and achieved > 0.97  # calibrated, not wastefully


def test_simplex_projection():
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = jnp.asarray(rng.normal(size=12) * 3)
        p = project_simplex(v)
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-6) and float(p.min()) >= 0
        # optimality: no other simplex point is closer (check random ones)
        others = rng.dirichlet(np.ones(12), size=200)
        assert float(jnp.linalg.norm(p - v)) <= np.min(np.linalg.norm(others - np.asarray(v), axis=1)) + 1e-6
    inside = jnp.asarray(rng.dirichlet(np.ones(12)))
    np.testing.assert_allclose(project_simplex(inside), inside, atol=1e-6)  # a no-op inside


@pytest.fixture(scope="module")
def setup():
    digits = load_digits()
    x = jnp.asarray((digits.data / 16).astype(np.float32))
    y = jnp.asarray(digits.target)
    params = models.init_params(jax.random.PRNGKey(0), models.ModelSpec(64, (), 4, (32,), 10))
    return x, y, params


def _batch_gradient(params, x, y):
    def loss(p):
        logits = models.apply(p, x, jnp.zeros((x.shape[0], 0), jnp.int32))
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(x.shape[0]), y])
    return jax.grad(loss)(params)


def test_hull_projection_returns_a_hull_point_and_keeps_hull_points(setup):
    x, y, params = setup
    config = ProConfig(projection_steps=400, smoothing=1.0)
    xb, yb = x[:32], y[:32]
    gradient = _batch_gradient(params, xb, yb)  # an average of per-class gradients: inside the hull
    flat = jax.flatten_util.ravel_pytree(gradient)[0]
    projected = jax.flatten_util.ravel_pytree(denoise(params, gradient, xb, 10, config))[0]
    assert float(jnp.linalg.norm(projected - flat) / jnp.linalg.norm(flat)) < 0.05
    far = jax.flatten_util.ravel_pytree(gradient)[1](flat * 0 + 10.0)  # far outside
    out = jax.flatten_util.ravel_pytree(denoise(params, far, xb, 10, config))[0]
    # a hull point has norm at most the largest per-class gradient norm
    per_class = jax.jacrev(lambda p: -jax.nn.log_softmax(models.apply(
        p, xb, jnp.zeros((32, 0), jnp.int32))).reshape(-1))(params)
    columns = jax.vmap(lambda i: jax.flatten_util.ravel_pytree(jax.tree_util.tree_map(lambda g: g[i], per_class))[0])(
        jnp.arange(320))
    assert float(jnp.linalg.norm(out)) <= float(jnp.max(jnp.linalg.norm(columns, axis=1))) + 1e-4


@pytest.mark.parametrize("denoiser", ["selfspan", "selfconv"])
def test_denoised_gradient_is_closer_to_the_true_gradient(setup, denoiser):
    x, y, params = setup
    xb, yb = x[:48], y[:48]
    gradient = _batch_gradient(params, xb, yb)
    flat, unravel = jax.flatten_util.ravel_pytree(gradient)
    config = ProConfig(denoiser=denoiser, projection_steps=100)
    noisy_errors, denoised_errors = [], []
    for seed in range(8):
        noise = 0.05 * jax.random.normal(jax.random.PRNGKey(seed), flat.shape)
        denoised = jax.flatten_util.ravel_pytree(denoise(params, unravel(flat + noise), xb, 10, config))[0]
        noisy_errors.append(float(jnp.linalg.norm(noise)))
        denoised_errors.append(float(jnp.linalg.norm(denoised - flat)))
    assert np.mean(denoised_errors) < 0.5 * np.mean(noisy_errors)


def test_a_short_private_run_learns_and_reports_its_privacy():
    digits = load_digits()
    x = (digits.data / 16).astype(np.float32)
    result = train_labeldp_pro(ProConfig(denoiser="noop", epsilon=4.0, steps=150, batch_size=256,
                                         learning_rate=0.5), x[:1400], digits.target[:1400], 10,
                               np.random.default_rng(0))
    assert result.epsilon <= 4.0 + 1e-3 and result.sigma > 0
    accuracy = np.mean(np.argmax(result.predict(x[1400:]), axis=1) == digits.target[1400:])
    assert accuracy > 0.5  # chance is 0.1
