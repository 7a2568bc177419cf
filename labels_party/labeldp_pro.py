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

import dp_accounting
import jax
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


def train_labeldp_pro(config: ProConfig, x: np.ndarray, y: np.ndarray, num_classes: int,
                      rng: np.random.Generator) -> ProResult:
    """``rng`` drives everything random: initialization, Poisson sampling, the alternative batches and the
    Gaussian noise. Releases pass :func:`shared.randomness.secure_rng`; tests and benchmarks a seeded one."""
    if config.denoiser not in DENOISERS:
        raise ValueError(f"denoiser must be one of {DENOISERS}")
    started = time.perf_counter()
    n = x.shape[0]
    q = min(1.0, config.batch_size / n)
    sigma = calibrate_sigma(config.epsilon, config.delta, q, config.steps, config.denoiser)
    spec = models.ModelSpec(x.shape[1], (), 4, tuple(config.hidden), num_classes)
    params = models.init_params(jax.random.PRNGKey(int(rng.integers(0, 2**63 - 1))), spec)
    flat_params, unravel = jax.flatten_util.ravel_pytree(params)
    optimizer = optax.sgd(config.learning_rate, momentum=config.momentum)
    opt_state = optimizer.init(params)
    xs, ys = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)

    def example_loss(p, xi, yi):
        logits = models.apply(p, xi[None, :], jnp.zeros((1, 0), jnp.int32))[0]
        return -jax.nn.log_softmax(logits)[yi]

    @jax.jit
    def step(p, state, idx, mask, alt_idx, noise):
        grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(p, xs[idx], ys[idx])
        norms = jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in jax.tree_util.tree_leaves(grads)))
        scale = mask / jnp.maximum(1.0, norms / config.clip)
        summed = jax.tree_util.tree_map(lambda g: jnp.tensordot(scale, g, axes=1), grads)
        noisy = jax.tree_util.tree_map(lambda g: g / config.batch_size,
                                       jax.tree_util.tree_map(jnp.add, summed, unravel(noise)))
        if config.denoiser in ("selfspan", "selfconv"):
            noisy = denoise(p, noisy, xs[idx][: config.batch_size], num_classes, config)
        elif config.denoiser == "altconv":
            noisy = denoise(p, noisy, xs[alt_idx], num_classes, config)
        updates, state = optimizer.update(noisy, state, p)
        return optax.apply_updates(p, updates), state

    # Padded batch size (a fixed shape for jit). A Poisson batch larger than it grows it — the batch is never
    # truncated, since truncation would break the subsampling the accountant assumes — at the cost of a retrace.
    capacity = int(np.ceil(q * n + 4 * np.sqrt(q * n) + 1))
    history = []
    for t in range(config.steps):
        chosen = poisson_sample(rng, n, q)
        if chosen.size > capacity:
            capacity = int(2 ** np.ceil(np.log2(chosen.size)))
        idx = np.zeros(capacity, dtype=np.int32)
        idx[: chosen.size] = chosen
        mask = np.zeros(capacity, dtype=np.float32)
        mask[: chosen.size] = 1.0
        alt_idx = rng.choice(n, size=min(config.alt_batch_size, n), replace=False)  # features only
        noise = secure_gaussian(rng, flat_params.size, sigma * config.clip).astype(np.float32)
        params, opt_state = step(params, opt_state, jnp.asarray(idx), jnp.asarray(mask), jnp.asarray(alt_idx),
                                 jnp.asarray(noise))
        if (t + 1) % max(1, config.steps // 10) == 0:
            history.append({"step": t + 1})
    epsilon = epsilon_of(sigma, q, config.steps, config.denoiser, config.delta)
    return ProResult(params, sigma, epsilon, config.delta, q, config.steps, config.denoiser, history,
                     time.perf_counter() - started)
