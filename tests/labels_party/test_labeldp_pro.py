"""LabelDP-Pro: dp-accounting calibration, simplex/hull projection properties, denoising, the private gradient as
optax transformations (clipping bounds each example by C, noise and averaging, the denoiser in the chain), the
host's draws and their order, and a short run."""

from __future__ import annotations

import dp_accounting
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting import rdp
from sklearn.datasets import load_digits

from labels_party.core.labeldp_pro import (
    ProConfig,
    add_host_noise,
    calibrate_sigma,
    clip_and_sum_per_example,
    denoise,
    dp_event,
    draw_step_inputs,
    epsilon_of,
    example_loss,
    poisson_sample,
    private_optimizer,
    project_simplex,
    secure_gaussian,
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


# -- the private gradient as optax transformations ------------------------------------------------------------------

def per_example_gradients(batch: int, seed: int = 0) -> dict:
    """A gradient pytree with a leading batch axis; example norms spread from ~0.05 to ~20 around C = 1."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(0.01, 4.0, batch).astype(np.float32)
    return {"w": jnp.asarray(rng.normal(size=(batch, 3, 2)).astype(np.float32) * scales[:, None, None]),
            "b": [jnp.asarray(rng.normal(size=(batch, 2)).astype(np.float32) * scales[:, None])]}


def flat(tree) -> np.ndarray:
    return np.asarray(jax.flatten_util.ravel_pytree(tree)[0], dtype=np.float64)


def example(tree, i: int):
    return jax.tree_util.tree_map(lambda g: g[i], tree)


def test_clipping_bounds_each_examples_contribution_by_c_exactly():
    clip, batch = 1.0, 12
    grads = per_example_gradients(batch)
    norms = np.array([np.linalg.norm(flat(example(grads, i))) for i in range(batch)])
    assert norms.min() < 0.2 * clip and norms.max() > 5 * clip  # both regimes are exercised
    transform = clip_and_sum_per_example(clip)
    state = transform.init(None)
    contributions = []
    for i in range(batch):
        alone, _ = transform.update(grads, state, mask=jnp.asarray(np.eye(batch, dtype=np.float32)[i]))
        contributions.append(flat(alone))
        # Each example contributes itself scaled to norm min(‖g‖, C): the same direction, never more than C.
        np.testing.assert_allclose(contributions[-1], flat(example(grads, i)) * min(1.0, clip / norms[i]), rtol=1e-6,
                                   atol=1e-7)
        assert np.linalg.norm(contributions[-1]) <= clip * (1 + 1e-6)
    clipped = np.array(contributions)
    assert np.allclose(np.linalg.norm(clipped[norms > clip], axis=1), clip, rtol=1e-6)
    mask = np.array([1.0] * 8 + [0.0] * 4, dtype=np.float32)
    summed, _ = transform.update(grads, state, mask=jnp.asarray(mask))
    np.testing.assert_allclose(flat(summed), clipped[:8].sum(axis=0), rtol=1e-5, atol=1e-6)
    # Padding rows contribute nothing, whatever their gradients; the library's per-example clip agrees.
    padded = jax.tree_util.tree_map(lambda g: g.at[8:].set(1e6), grads)
    np.testing.assert_array_equal(flat(transform.update(padded, state, mask=jnp.asarray(mask))[0]), flat(summed))
    reference, _ = optax.per_example_global_norm_clip(jax.tree_util.tree_map(lambda g: g[:8], grads), clip)
    np.testing.assert_allclose(flat(summed), flat(reference), rtol=1e-5, atol=1e-6)
    # A label change replaces one example's gradient: the sum moves by at most 2C (the accounted sensitivity),
    # reached when a clipped gradient turns into its opposite.
    i = int(np.argmax(norms[:8]))
    assert norms[i] > clip
    changed = jax.tree_util.tree_map(lambda g: g.at[i].set(-7.0 * g[i]), grads)
    moved = flat(transform.update(changed, state, mask=jnp.asarray(mask))[0]) - flat(summed)
    assert np.linalg.norm(moved) == pytest.approx(2 * clip, rel=1e-6)


def test_private_optimizer_is_clip_noise_average_then_sgd_with_momentum():
    config = ProConfig(denoiser="noop", batch_size=4, clip=1.0, learning_rate=0.5, momentum=0.9)
    grads = per_example_gradients(6, seed=1)
    params = example(grads, 0)  # any pytree of the gradient's shape
    mask = jnp.asarray([1, 1, 0, 1, 1, 0], jnp.float32)
    optimizer = private_optimizer(config, num_classes=2)
    state = optimizer.init(params)
    clipped_sum = flat(clip_and_sum_per_example(config.clip).update(grads, optax.EmptyState(), mask=mask)[0])
    noises = [np.random.default_rng(s).normal(size=clipped_sum.size).astype(np.float32) for s in (2, 3)]
    first, state = optimizer.update(grads, state, params, mask=mask, noise=jnp.asarray(noises[0]), x_hull=None)
    second, state = optimizer.update(grads, state, params, mask=mask, noise=jnp.asarray(noises[1]), x_hull=None)
    averaged = [(clipped_sum + noise) / config.batch_size for noise in noises]  # ÷ the expected batch size n₁
    np.testing.assert_allclose(flat(first), -0.5 * averaged[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(flat(second), -0.5 * (averaged[1] + 0.9 * averaged[0]), rtol=1e-5, atol=1e-6)
    # The noise enters in ravel_pytree order, the order of the host's flat vector.
    noisy, _ = add_host_noise().update(example(grads, 0), optax.EmptyState(), noise=jnp.arange(8.0))
    np.testing.assert_allclose(flat(noisy), flat(example(grads, 0)) + np.arange(8.0), rtol=1e-6)


def test_the_denoiser_in_the_chain_projects_at_the_current_parameters(setup):
    x, y, params = setup
    config = ProConfig(denoiser="selfconv", batch_size=8, clip=1.0, learning_rate=1.0, momentum=0.0,
                       projection_steps=30)
    rows = jnp.arange(8)
    per_example = jax.vmap(jax.grad(lambda p, xi, yi: -jax.nn.log_softmax(models.apply(
        p, xi[None], jnp.zeros((1, 0), jnp.int32))[0])[yi]), in_axes=(None, 0, 0))(params, x[rows], y[rows])
    noise = 0.5 * jax.random.normal(jax.random.PRNGKey(3), flat(params).shape)
    optimizer = private_optimizer(config, 10)
    update, _ = optimizer.update(per_example, optimizer.init(params), params, mask=jnp.ones(8), noise=noise,
                                 x_hull=x[rows])
    mask = jnp.ones(8)
    clipped = clip_and_sum_per_example(config.clip).update(per_example, optax.EmptyState(), mask=mask)[0]
    noisy = jax.flatten_util.ravel_pytree(clipped)[1]((flat(clipped) + np.asarray(noise)) / 8)
    expected = flat(denoise(params, noisy, x[rows], 10, config))
    np.testing.assert_allclose(flat(update), -expected, rtol=1e-4, atol=1e-6)
    assert np.linalg.norm(expected - flat(noisy)) > 0.1 * np.linalg.norm(flat(noisy))  # the projection did work


@pytest.mark.parametrize("denoiser", ["selfconv", "altconv"])
def test_step_inputs_are_drawn_from_the_generator_in_order(denoiser):
    config = ProConfig(denoiser=denoiser, batch_size=20, alt_batch_size=6, clip=2.0)
    inputs = draw_step_inputs(np.random.default_rng(5), 100, 0.2, 40, config, noise_size=30, sigma=1.5)
    rng = np.random.default_rng(5)  # the same stream, drawn by hand: Poisson batch, alternative batch, noise
    chosen = poisson_sample(rng, 100, 0.2)
    alternative = rng.choice(100, size=6, replace=False)
    noise = secure_gaussian(rng, 30, 1.5 * 2.0).astype(np.float32)
    assert inputs.batch.size == 40 and int(inputs.mask.sum()) == chosen.size
    np.testing.assert_array_equal(inputs.batch[: chosen.size], chosen)
    np.testing.assert_array_equal(inputs.mask, np.arange(40) < chosen.size)
    np.testing.assert_array_equal(inputs.noise, noise)
    np.testing.assert_array_equal(inputs.hull, alternative if denoiser == "altconv" else inputs.batch[:20])


def test_a_poisson_batch_larger_than_the_capacity_grows_it_and_is_never_truncated():
    config = ProConfig(denoiser="noop", batch_size=50)
    inputs = draw_step_inputs(np.random.default_rng(0), 100, 0.5, 8, config, noise_size=3, sigma=1.0)
    chosen = poisson_sample(np.random.default_rng(0), 100, 0.5)
    assert chosen.size > 32 and inputs.batch.size == 64  # the next power of two
    np.testing.assert_array_equal(inputs.batch[: chosen.size], chosen)
    assert int(inputs.mask.sum()) == chosen.size


@pytest.mark.parametrize("label", [0, 1, 2])
def test_clipping_bounds_every_gradient_whatever_the_label(label):
    """Issue 26's review: one example with a feature of 3.4e38 (float32's largest) overflows its gradient for some
    labels and not others; the squares of the norm overflowed too, and inf · 0 made the sum NaN — a failure that
    depended on the label. Now every example's contribution is finite with norm ≤ C, for every label."""
    spec = models.ModelSpec(3, (), 4, (1,), 3)
    params = models.init_params(jax.random.PRNGKey(0), spec)
    xs = jnp.asarray([[3.4e38, 0.0, 0.0], [1.0, -2.0, 0.5]], jnp.float32)
    ys = jnp.asarray([label, 1])
    per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(params, xs, ys)
    for mask in ([1.0, 0.0], [0.0, 1.0], [1.0, 1.0]):
        summed, _ = clip_and_sum_per_example(1.0).update(per_example, None, mask=jnp.asarray(mask))
        flat = jax.flatten_util.ravel_pytree(summed)[0]
        assert bool(jnp.all(jnp.isfinite(flat)))
        assert float(jnp.linalg.norm(flat)) <= sum(mask) * 1.0 + 1e-5
