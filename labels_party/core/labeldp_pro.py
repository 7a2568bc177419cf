"""LabelDP-Pro (Algorithm 1 of "LabelDP-Pro: Learning with Label Differential Privacy via Projections"):
DP-SGD whose noisy gradient is denoised by projecting it onto the span or the convex hull of per-example,
per-class gradients — which depend on features only, so the projection costs no privacy.

Denoisers: ``noop`` (plain DP-SGD), ``selfspan`` (span of the batch's per-class gradients), ``selfconv`` (their
convex hull), ``altconv`` (convex hull of an independent alternative batch: keeps amplification by subsampling).
The d × nK matrix G of per-class gradients is never materialized: G u is a vector-Jacobian product and Gᵀ v a
Jacobian-vector product of θ ↦ [ℓ(θ, (x_i, κ))]_{i, κ} (jax.vjp / jax.jvp). Convex-hull projection runs projected
gradient descent on simplex coefficients, then smooths them towards uniform (λ, default 0.75).

Randomness: every draw comes from the generator passed in — a cryptographic one for releases — and the Gaussian
noise is drawn on the host as Opacus's secure mode draws it (:func:`secure_gaussian`); see the README's "Privacy,
as implemented" for what floating-point Gaussian noise does and does not guarantee.

Privacy: a label change moves one example's clipped gradient by at most 2C (L2), so accounting uses the Gaussian
noise multiplier σ/2 (sensitivity 2C) in dp-accounting's RDP accountant: Poisson-subsampled for ``noop`` and
``altconv``, without amplification for ``selfspan``/``selfconv`` (their projection depends on which examples
were sampled). σ is calibrated to the target (ε, δ) with dp-accounting's ``calibrate_dp_mechanism``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import dp_accounting
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
from dp_accounting import rdp

from shared import models

DENOISERS = ("noop", "selfspan", "selfconv", "altconv")


@dataclass(frozen=True)
class ProConfig:
    denoiser: str = "altconv"
    epsilon: float = 1.0
    delta: float = 1e-5
    steps: int = 300
    batch_size: int = 128  # expected Poisson batch size n₁
    alt_batch_size: int = 64  # n₂ for altconv
    clip: float = 1.0
    learning_rate: float = 1.0
    momentum: float = 0.9  # SGD with momentum on the (denoised) gradient, as DP-SGD usually runs
    smoothing: float = 0.75  # λ
    projection_steps: int = 50
    projection_learning_rate: float = 0.5  # × 1/||G||² (power iteration): the 1/L step of PGD
    hidden: tuple[int, ...] = (64,)


def batch_capacity(expected: float) -> int:
    """The padded batch a step computes per-example gradients for (a fixed shape for jit): the expected Poisson
    batch size plus four standard deviations, plus one (a larger draw grows it, :func:`draw_step_inputs`)."""
    return int(np.ceil(expected + 4 * np.sqrt(expected) + 1))


def model_spec(num_features: int, hidden, num_classes: int) -> models.ModelSpec:
    """The classifier central training trains (numeric features only), which its size limit also counts."""
    return models.ModelSpec(num_features, (), 4, tuple(hidden), num_classes)


def training_size(config: ProConfig, num_examples: int, num_params: int) -> tuple[int, int]:
    """(per step, whole run) of the work a run does, in example-rows × model parameters, from public inputs only:
    each step takes per-example gradients on the padded batch (their memory is rows × parameters floats) and the
    denoiser differentiates the model on its hull rows (``altconv``: an alternative batch; ``selfspan``/``selfconv``:
    the batch again). ``config.batch_size`` is already at most ``num_examples``."""
    hull = {"noop": 0, "altconv": min(config.alt_batch_size, num_examples)}.get(config.denoiser, config.batch_size)
    per_step = (batch_capacity(min(1.0, config.batch_size / num_examples) * num_examples) + hull) * num_params
    return per_step, per_step * config.steps


def amplified(denoiser: str) -> bool:
    return denoiser in ("noop", "altconv")


def dp_event(sigma: float, sampling_probability: float, steps: int, denoiser: str) -> dp_accounting.DpEvent:
    """The DP event of a training run; the noise multiplier is σ/2 because a label change moves a clipped
    gradient by up to 2C."""
    gaussian = dp_accounting.GaussianDpEvent(sigma / 2)
    step = dp_accounting.PoissonSampledDpEvent(sampling_probability, gaussian) if amplified(denoiser) else gaussian
    return dp_accounting.SelfComposedDpEvent(step, steps)


def epsilon_of(sigma: float, sampling_probability: float, steps: int, denoiser: str, delta: float) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event(sigma, sampling_probability, steps, denoiser))
    return accountant.get_epsilon(delta)


def calibrate_sigma(epsilon: float, delta: float, sampling_probability: float, steps: int, denoiser: str) -> float:
    """Smallest noise multiplier σ whose run is (ε, δ)-label-DP (dp-accounting's calibration, RDP accountant)."""
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant, lambda s: dp_event(s, sampling_probability, steps, denoiser), epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(0.01, 5000.0), tol=1e-4))


def project_simplex(v: jax.Array) -> jax.Array:
    """Euclidean projection onto the probability simplex (Wang & Carreira-Perpiñán, 2013)."""
    u = jnp.sort(v)[::-1]
    cumulative = jnp.cumsum(u) - 1.0
    index = jnp.arange(1, v.size + 1)
    rho = jnp.max(jnp.where(u - cumulative / index > 0, index, 0))
    theta = cumulative[rho - 1] / rho
    return jnp.maximum(v - theta, 0.0)


def per_class_losses(params, x, num_classes):
    """θ ↦ [ℓ(θ, (x_i, κ))] for all i and κ, flattened (the columns of G are their gradients)."""
    log_probs = jax.nn.log_softmax(models.apply(params, x, jnp.zeros((x.shape[0], 0), jnp.int32)), axis=-1)
    return -log_probs.reshape(-1)[: x.shape[0] * num_classes]


def denoise(params, noisy_grad, x_hull, num_classes: int, config: ProConfig):
    """Project the noisy gradient (a pytree) onto span/conv of the per-class gradients at the rows of x_hull."""
    flat_noisy, unravel = jax.flatten_util.ravel_pytree(noisy_grad)
    losses = lambda p: per_class_losses(p, x_hull, num_classes)  # noqa: E731
    _, vjp = jax.vjp(losses, params)

    def g_times(u):  # G u
        return jax.flatten_util.ravel_pytree(vjp(u)[0])[0]

    def gt_times(v):  # Gᵀ v
        return jax.jvp(losses, (params,), (unravel(v),))[1]

    m = x_hull.shape[0] * num_classes
    target = gt_times(flat_noisy)
    if config.denoiser == "selfspan":  # least squares on the span: conjugate gradient on Gᵀ G c = Gᵀ g̃
        def cg(state, _):
            c, r, p, rr = state
            gp = gt_times(g_times(p))
            alpha = rr / jnp.maximum(p @ gp, 1e-30)
            c, r = c + alpha * p, r - alpha * gp
            new_rr = r @ r
            return (c, r, r + new_rr / jnp.maximum(rr, 1e-30) * p, new_rr), None

        (c, *_), _ = jax.lax.scan(cg, (jnp.zeros(m), target, target, target @ target), None,
                                  length=config.projection_steps)
        return unravel(g_times(c))

    def power(v, _):  # ||G||² by power iteration, for a stable step size
        w = gt_times(g_times(v))
        return w / jnp.maximum(jnp.linalg.norm(w), 1e-30), jnp.linalg.norm(w)

    _, norms = jax.lax.scan(power, jnp.ones(m) / jnp.sqrt(m), None, length=8)
    step = config.projection_learning_rate / jnp.maximum(norms[-1], 1e-12)

    def pgd(state, _):  # α ← Proj_Δ(β − 2η Gᵀ(Gβ − g̃)) with Nesterov/FISTA momentum β
        alpha, beta, t = state
        new = project_simplex(beta - 2 * step * (gt_times(g_times(beta)) - target))
        t_next = 0.5 * (1 + jnp.sqrt(1 + 4 * t * t))
        return (new, new + (t - 1) / t_next * (new - alpha), t_next), None

    start = jnp.full(m, 1.0 / m)
    (alpha, _, _), _ = jax.lax.scan(pgd, (start, start, 1.0), None, length=config.projection_steps)
    alpha = config.smoothing * alpha + (1 - config.smoothing) / m  # coefficient smoothing towards uniform
    return unravel(g_times(alpha))


@dataclass
class ProResult:
    params: dict
    sigma: float
    epsilon: float  # what the accountant certifies for the run (≤ the target)
    delta: float
    sampling_probability: float
    steps: int
    denoiser: str
    history: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def certified_epsilon(self) -> float:
        return self.epsilon

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_event(self.sigma, self.sampling_probability, self.steps, self.denoiser)

    def predict(self, x) -> np.ndarray:
        return np.asarray(jax.nn.softmax(models.apply(self.params, jnp.asarray(x),
                                                      jnp.zeros((len(x), 0), jnp.int32))))


def secure_gaussian(rng: np.random.Generator, size: int, std: float) -> np.ndarray:
    """N(0, std²) noise as Opacus's secure mode draws it: the mean of four independent Gaussians, scaled back to
    std (Holohan & Braghin, "Secure Random Sampling in Differential Privacy", 2021, show that summing several
    floating-point Gaussian samples defeats the least-significant-bit reconstruction of a single one). With a
    cryptographic ``rng`` (:func:`shared.randomness.secure_rng`) the bits themselves are unpredictable too."""
    return rng.standard_normal((4, size)).sum(axis=0) * (std / 2.0)


def poisson_sample(rng: np.random.Generator, n: int, q: float) -> np.ndarray:
    """Indices kept independently with probability q' = floor(q·2**53)/2**53 <= q (integer draws; amplification by
    subsampling only improves as q' shrinks, so accounting at q stays valid)."""
    threshold = int(q * (1 << 53))
    return np.flatnonzero(rng.integers(0, 1 << 53, size=n, dtype=np.int64) < threshold)


# -- the private gradient as optax transformations ---------------------------------------------------------------
# optax's own DP-SGD aggregate (optax.contrib.differentially_private_aggregate) draws its noise on the device from
# a jax key and divides by the realized batch size; here the noise comes from the host's generator and the divisor
# is the expected batch size n₁ (what the accountant's Poisson subsampling assumes), so the steps are spelled out.

def clip_and_sum_per_example(clip: float) -> optax.GradientTransformationExtraArgs:
    """Per-example gradients (leading batch axis) → Σᵢ maskᵢ · gᵢ · min(1, C/‖gᵢ‖): each sampled example moves the
    sum by at most C (L2). Extra argument ``mask``: 1 for a sampled example, 0 for padding.

    The bound must hold for *every* gradient, or the run is not DP: an example whose gradient is not finite (a
    loss that overflowed — whether it does depends on the label) contributes 0, and norms are taken of the
    gradient scaled by its largest entry, so squares never overflow (inf · 0 would be NaN, and NaN parameters
    were a label-dependent failure, issue 26). Both are functions of one example's gradient with norm ≤ C: the
    sensitivity analysis is unchanged."""
    def update_fn(updates, state, params=None, *, mask, **extra_args):
        # optax.per_example_global_norm_clip sums the same clipped gradients (up to rounding) but takes no mask
        # and is not overflow-safe.
        del params, extra_args
        leaves = [g.reshape(g.shape[0], -1) for g in jax.tree_util.tree_leaves(updates)]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g), axis=1) for g in leaves]), axis=0)
        safe = jax.tree_util.tree_map(
            lambda g: jnp.where(finite.reshape((-1,) + (1,) * (g.ndim - 1)), g, 0.0), updates)
        largest = jnp.max(jnp.stack([jnp.max(jnp.abs(jnp.where(finite[:, None], g, 0.0)), axis=1)
                                     for g in leaves]), axis=0)
        unit = jnp.where(largest > 0, largest, 1.0)
        norms = largest * jnp.sqrt(sum(jnp.sum((jnp.where(finite[:, None], g, 0.0) / unit[:, None]) ** 2, axis=1)
                                       for g in leaves))
        scale = mask / jnp.maximum(1.0, norms / clip)  # an infinite norm gives scale 0 (and 0 · finite = 0)
        return jax.tree_util.tree_map(lambda g: jnp.tensordot(scale, g, axes=1), safe), state
    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def add_host_noise() -> optax.GradientTransformationExtraArgs:
    """Adds ``noise`` (extra argument: a flat vector drawn on the host, N(0, σ²C²) per coordinate, in the order of
    ``jax.flatten_util.ravel_pytree``) to the gradient."""
    def update_fn(updates, state, params=None, *, noise, **extra_args):
        del params, extra_args
        unravel = jax.flatten_util.ravel_pytree(updates)[1]
        return jax.tree_util.tree_map(jnp.add, updates, unravel(noise)), state
    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def project_onto_per_class_gradients(num_classes: int, config: ProConfig) -> optax.GradientTransformationExtraArgs:
    """:func:`denoise` at the current parameters: extra argument ``x_hull``, the rows whose per-class gradients
    span (``selfspan``) or whose convex hull (``selfconv``, ``altconv``) the gradient is projected onto."""
    def update_fn(updates, state, params=None, *, x_hull, **extra_args):
        del extra_args
        return denoise(params, updates, x_hull, num_classes, config), state
    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def private_optimizer(config: ProConfig, num_classes: int) -> optax.GradientTransformationExtraArgs:
    """Clip and sum, add the host's noise σC, divide by the expected batch size n₁, denoise, SGD with momentum.
    ``update`` takes per-example gradients and the extra arguments ``mask``, ``noise`` and ``x_hull``."""
    denoiser = optax.identity() if config.denoiser == "noop" else project_onto_per_class_gradients(num_classes,
                                                                                                   config)
    return optax.chain(clip_and_sum_per_example(config.clip), add_host_noise(), optax.scale(1.0 / config.batch_size),
                       denoiser, optax.sgd(config.learning_rate, momentum=config.momentum))


def example_loss(params, x: jax.Array, label: jax.Array) -> jax.Array:
    """Cross-entropy of one example (features x, class ``label``)."""
    logits = models.apply(params, x[None, :], jnp.zeros((1, 0), jnp.int32))[0]
    return -jax.nn.log_softmax(logits)[label]


def make_private_step(optimizer: optax.GradientTransformationExtraArgs):
    """``step(params, opt_state, xs, ys, inputs) -> (params, opt_state)``: per-example gradients on the rows
    ``inputs.batch`` of (xs, ys), then ``optimizer`` (:func:`private_optimizer`) with the step's extra arguments."""
    def step(params, opt_state, xs: jax.Array, ys: jax.Array, inputs: StepInputs):
        per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(params, xs[inputs.batch],
                                                                             ys[inputs.batch])
        updates, opt_state = optimizer.update(per_example, opt_state, params, mask=inputs.mask, noise=inputs.noise,
                                              x_hull=xs[inputs.hull])
        return optax.apply_updates(params, updates), opt_state
    return step


class StepInputs(NamedTuple):
    """What the host draws for one step: the Poisson batch padded to a fixed capacity (``batch``, with ``mask``
    1 on sampled rows), the rows whose per-class gradients the denoiser projects onto, and the Gaussian noise."""
    batch: np.ndarray
    mask: np.ndarray
    hull: np.ndarray
    noise: np.ndarray


def draw_step_inputs(rng: np.random.Generator, n: int, q: float, capacity: int, config: ProConfig,
                     noise_size: int, sigma: float) -> StepInputs:
    """In this order: the Poisson batch, the alternative batch (always drawn, so the generator's stream does not
    depend on the denoiser), the noise. A Poisson batch larger than ``capacity`` grows it (to a power of two) —
    never truncated, since truncation would break the subsampling the accountant assumes — at the cost of a
    retrace."""
    chosen = poisson_sample(rng, n, q)
    if chosen.size > capacity:
        capacity = int(2 ** np.ceil(np.log2(chosen.size)))
    batch = np.zeros(capacity, dtype=np.int32)
    batch[: chosen.size] = chosen
    mask = np.zeros(capacity, dtype=np.float32)
    mask[: chosen.size] = 1.0
    alternative = rng.choice(n, size=min(config.alt_batch_size, n), replace=False)  # features only
    noise = secure_gaussian(rng, noise_size, sigma * config.clip).astype(np.float32)
    hull = alternative if config.denoiser == "altconv" else batch[: config.batch_size]
    return StepInputs(batch, mask, hull.astype(np.int32), noise)


def train_labeldp_pro(config: ProConfig, x: np.ndarray, y: np.ndarray, num_classes: int,
                      rng: np.random.Generator, *, sigma: float | None = None) -> ProResult:
    """``rng`` drives everything random: initialization, Poisson sampling, the alternative batches and the
    Gaussian noise. Releases pass :func:`shared.randomness.secure_rng`; tests and benchmarks a seeded one.
    ``sigma``: the noise multiplier a release was charged for (:func:`calibrate_sigma`, computed before any label
    is read); calibrated here when not given."""
    if config.denoiser not in DENOISERS:
        raise ValueError(f"denoiser must be one of {DENOISERS}")
    started = time.perf_counter()
    n = x.shape[0]
    q = min(1.0, config.batch_size / n)
    sigma = sigma if sigma is not None else calibrate_sigma(config.epsilon, config.delta, q, config.steps,
                                                            config.denoiser)
    spec = model_spec(x.shape[1], config.hidden, num_classes)
    params = models.init_params(jax.random.PRNGKey(int(rng.integers(0, 2**63 - 1))), spec)
    noise_size = jax.flatten_util.ravel_pytree(params)[0].size
    optimizer = private_optimizer(config, num_classes)
    opt_state = optimizer.init(params)
    step = jax.jit(make_private_step(optimizer))
    xs, ys = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)
    # Padded batch size (a fixed shape for jit), grown by draw_step_inputs when a Poisson batch exceeds it.
    capacity = batch_capacity(q * n)
    history = []
    for t in range(config.steps):
        inputs = draw_step_inputs(rng, n, q, capacity, config, noise_size, sigma)
        capacity = inputs.batch.size
        params, opt_state = step(params, opt_state, xs, ys, inputs)
        if (t + 1) % max(1, config.steps // 10) == 0:
            history.append({"step": t + 1})
    epsilon = epsilon_of(sigma, q, config.steps, config.denoiser, config.delta)
    return ProResult(params, sigma, epsilon, config.delta, q, config.steps, config.denoiser, history,
                     time.perf_counter() - started)
