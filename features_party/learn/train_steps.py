"""The trainer's pure pieces, in the optax style: builders that return pure functions of explicit state, composed
and jit-compiled by the caller (features_party/learn/train.py). Nothing here touches the host, a device or a global.

* ``make_objective(loss_fn)``: ``objective(params, batch) -> loss``, a batch being (numeric, categorical, targets).
* ``make_train_step(objective, optimizer)``: ``step(state, batch) -> (state, loss)``, one optimizer update.
* ``make_steps(step, batch_sharding)``: ``steps(state, data, batch_indices) -> (state, summed training loss)``:
  the steps of the columns of ``batch_indices`` as one ``lax.scan``, each gathering its batch from ``data`` already
  on the device, the loss summed on the device (an epoch, or a slice of one: a compiled scan cannot be stopped, so
  the trainer runs a long epoch in slices and checks a job's deadline between them).
* ``epoch_batch_indices(permutation, batch_size, steps)``: the (batch, steps) index matrix of an epoch.
* ``keep_best(best, val_loss, params, epoch, patience)``: early stopping as a pure update of the best so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from shared import models

Batch = tuple[jax.Array, jax.Array, jax.Array]  # numeric (b, p), categorical (b, c), targets (b,) or (b, K)


class TrainState(NamedTuple):
    params: Any
    opt_state: optax.OptState


class Best(NamedTuple):
    """The best epoch so far: its validation loss, its parameters, its number (0: the initial parameters)."""
    loss: float
    params: Any
    epoch: int


def make_objective(loss_fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[[Any, Batch], jax.Array]:
    def objective(params, batch: Batch) -> jax.Array:
        numeric, categorical, targets = batch
        return loss_fn(models.apply(params, numeric, categorical), targets)
    return objective


def make_train_step(objective: Callable, optimizer: optax.GradientTransformation) -> Callable:
    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, jax.Array]:
        value, grads = jax.value_and_grad(objective)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), opt_state), value
    return train_step


def make_steps(train_step: Callable, batch_sharding: jax.sharding.Sharding | None = None):
    """``batch_indices[:, s]`` are the rows of ``data`` that step s trains on. Its leading (example) axis is the one
    to split over devices: each device then gathers and differentiates its share of every batch, and the gradient
    is summed across devices (data parallelism; ``batch_sharding`` pins each gathered batch to that split)."""
    def steps(state: TrainState, data: Batch, batch_indices: jax.Array) -> tuple[TrainState, jax.Array]:
        def step(carry, indices):
            state, total = carry
            batch = jax.tree_util.tree_map(lambda column: column[indices], data)
            if batch_sharding is not None:
                batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
            state, value = train_step(state, batch)
            return (state, total + value), None

        (state, total), _ = jax.lax.scan(step, (state, jnp.zeros((), jnp.float32)), batch_indices.T)
        return state, total
    return steps


def epoch_batch_indices(permutation: np.ndarray, batch_size: int, steps: int) -> np.ndarray:
    """Step s trains on ``permutation[s * batch_size:(s + 1) * batch_size]`` (the incomplete last batch is left
    out; a permutation shorter than one batch is repeated, so every step has the same shape), as columns."""
    return np.resize(permutation.astype(np.int32), steps * batch_size).reshape(steps, batch_size).T


def keep_best(best: Best, val_loss: float, params: Any, epoch: int, patience: int) -> tuple[Best, bool]:
    """(the best epoch so far, whether to stop): stop on a non-finite validation loss, or ``patience`` epochs after
    the best one."""
    if np.isfinite(val_loss) and val_loss < best.loss:
        return Best(val_loss, params, epoch), False
    return best, bool(not np.isfinite(val_loss) or epoch - best.epoch >= patience)
