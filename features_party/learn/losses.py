"""Training losses (pure JAX functions of model outputs and targets, averaged over the batch).

* ``squared``: ½ (f − y)². Its gradient is affine in y, so unbiased noisy labels give unbiased gradients.
* ``poisson``: the model outputs η = log rate; loss = e^η − y·η (Poisson negative log-likelihood up to a term
  free of η). Also affine in y and finite for any real y — unbiased randomizers deliberately output labels below 0
  and above the label range, and that must not crash or bias training.
* ``cross_entropy``: softmax cross-entropy against integer classes.
* ``subset``: Σ_k w_k · (−log softmax_k) with the subset randomizer's unbiased weights w (E[w | y] = one_hot(y)),
  an unbiased estimate of the cross-entropy on the true label (Chua et al., Algorithm 1).
* ``alibi``: cross-entropy against ALIBI's soft label, the posterior of the class given the released noisy vector
  (its log-likelihoods are the targets) under the model's own current prediction as the prior, recomputed at every
  step and held constant in the gradient — the paper's default ("mapwithprior"); post-processing of the release.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def squared(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    return jnp.mean(0.5 * (outputs[:, 0] - targets) ** 2)


def poisson(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    eta = outputs[:, 0]
    return jnp.mean(jnp.exp(eta) - targets * eta)


def cross_entropy(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(outputs, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets.astype(jnp.int32)[:, None], axis=-1))


def subset(outputs: jax.Array, weights: jax.Array) -> jax.Array:
    return -jnp.mean(jnp.sum(weights * jax.nn.log_softmax(outputs, axis=-1), axis=-1))


def alibi(outputs: jax.Array, log_likelihoods: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(outputs, axis=-1)
    soft = jax.nn.softmax(jax.lax.stop_gradient(log_probs) + log_likelihoods, axis=-1)
    return -jnp.mean(jnp.sum(soft * log_probs, axis=-1))


LOSSES = {"squared": squared, "poisson": poisson, "cross_entropy": cross_entropy, "subset": subset, "alibi": alibi}
CLASS_LOSSES = ("cross_entropy", "subset", "alibi")  # a score per class


def output_dim(loss: str, num_classes: int | None) -> int:
    if loss not in CLASS_LOSSES:
        return 1
    if num_classes is None:
        raise TypeError(f"the {loss} loss needs num_classes")
    return int(num_classes)


def predict(loss: str, outputs: jax.Array) -> jax.Array:
    """Point prediction on the label scale: f for squared, the rate e^η for Poisson, class probabilities."""
    if loss == "squared":
        return outputs[:, 0]
    if loss == "poisson":
        return jnp.exp(outputs[:, 0])
    return jax.nn.softmax(outputs, axis=-1)
