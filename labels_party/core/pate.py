"""PATE at the labels party ("pate-fm": Malek, Mironov, Prasad, Shilov & Tramèr, "Antipodes of Label Differential
Privacy: PATE and ALIBI", NeurIPS 2021, after Papernot et al., ICLR 2017 and 2018), on features the features party
sends — central label DP, like LabelDP-Pro.

* **Teachers.** The labelled examples are split at random (a permutation from the release's generator, never from
  the labels) into T disjoint parts of equal size; teacher t is a multinomial logistic regression fitted on part t
  alone (full-batch Adam, L2 on the weights; all teachers at once, vmapped). The paper's teachers and student are
  FixMatch-trained wide ResNets on CIFAR images; the semi-supervised part is a training method for images, not a
  privacy step, and is not reproduced here: teachers are supervised, and the student is whatever the features party
  trains on the released labels (the trainer's MLP or trees).
* **Votes.** Each teacher votes for its arg-max class on every query (features only); the release is, per query,
  the arg-max of the vote histogram plus *discrete* Gaussian noise of integer variance σ² on every bin (GNMax;
  :func:`shared.mechanisms.integer_noise.discrete_gaussian`, exact from uniform integers; ties go to the smaller
  class). All queries are answered: no confident-GNMax threshold, so the accounting is data-independent.
* **Privacy.** A label lives in one teacher's part; changing it can change that teacher's vote on every query, which
  moves the histogram by −1 and +1 in two bins: L2 sensitivity √2 per query, composed over the Q queries. The
  discrete Gaussian is (Δ²/2σ²)-zCDP like the continuous one (Canonne, Kamath & Steinke 2020, Theorem 4), so the
  run's event is ``SelfComposedDpEvent(GaussianDpEvent(σ/√2), Q)``, its RDP curve is what the ledger charges
  (converted at the organization's δ), and σ² is the smallest integer at or above the variance dp-accounting
  calibrates to (ε, δ): more noise than needed, never less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
from dp_accounting import rdp

from shared.mechanisms.integer_noise import discrete_gaussian
from shared.privacy import design_epsilon

MAX_VARIANCE = 1 << 24  # the discrete Gaussian sampler's range (σ up to 4096 votes)
MAX_VOTE_CELLS = 1 << 22  # queries × classes of one request: its vote histogram and noise (32 MB each)
CHUNK_CELLS = 1 << 20  # teachers × queries × classes (or queries × classes) computed at once


@dataclass(frozen=True)
class PateConfig:
    teachers: int
    epsilon: float
    delta: float
    steps: int = 300
    learning_rate: float = 0.1
    l2: float = 1e-3


def dp_event(sigma: float, queries: int) -> dp_accounting.DpEvent:
    """GNMax on ``queries`` queries at noise σ: sensitivity √2 per query (one teacher's vote moves between bins)."""
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2)), queries)


def epsilon_of(sigma: float, queries: int, delta: float) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event(sigma, queries))
    return float(accountant.get_epsilon(delta))


def calibrate_variance(epsilon: float, delta: float, queries: int) -> int:
    """The smallest integer σ² whose run answers ``queries`` queries (ε', δ)-label-DP, ε' a relative 10⁻⁸ below
    ``epsilon`` (:func:`shared.privacy.design_epsilon`: the ledger's conversion of the curve rounds up) —
    ValueError when even ``MAX_VARIANCE`` is not enough."""
    epsilon = design_epsilon(epsilon)
    sigma = float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant, lambda s: dp_event(s, queries), epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(0.01, math.sqrt(MAX_VARIANCE)), tol=1e-6))
    variance = max(1, math.ceil(sigma * sigma))
    while epsilon_of(math.sqrt(variance), queries, delta) > epsilon:  # the calibration's tolerance, on the safe side
        variance += 1
    if variance > MAX_VARIANCE:
        raise ValueError("the noise needed is beyond the sampler's range")
    return variance


def partition(n: int, teachers: int, rng: np.random.Generator) -> np.ndarray:
    """Each example's teacher: a random permutation cut into ``teachers`` parts of ⌊n/T⌋ or ⌈n/T⌉ examples."""
    assignment = np.empty(n, dtype=np.int64)
    assignment[rng.permutation(n)] = np.arange(n) % teachers
    return assignment


def train_teachers(features: np.ndarray, labels: np.ndarray, assignment: np.ndarray, num_classes: int,
                   config: PateConfig) -> tuple[jax.Array, jax.Array]:
    """The teachers' weights (T, d, K) and biases (T, K), each fitted on its own part only."""
    teachers, dim = config.teachers, features.shape[1]
    size = int(np.bincount(assignment, minlength=teachers).max())
    x = np.zeros((teachers, size, dim), np.float32)
    y = np.zeros((teachers, size, num_classes), np.float32)
    mask = np.zeros((teachers, size), np.float32)
    for teacher in range(teachers):
        rows = np.flatnonzero(assignment == teacher)
        x[teacher, :rows.size], mask[teacher, :rows.size] = features[rows], 1.0
        y[teacher, np.arange(rows.size), labels[rows]] = 1.0
    return _fit(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), config.steps, config.learning_rate, config.l2)


def _fit(x, y, mask, steps: int, learning_rate: float, l2: float):
    optimizer = optax.adam(learning_rate)
    params = (jnp.zeros((x.shape[0], x.shape[2], y.shape[2])), jnp.zeros((x.shape[0], y.shape[2])))

    def loss(p):
        logits = jnp.einsum("tmd,tdk->tmk", x, p[0]) + p[1][:, None, :]
        cross_entropy = -(y * jax.nn.log_softmax(logits, axis=-1)).sum(axis=-1)
        per_teacher = (cross_entropy * mask).sum(axis=-1) / jnp.maximum(mask.sum(axis=-1), 1.0)
        return per_teacher.sum() + l2 * jnp.sum(p[0] ** 2)  # the teachers' losses are separable: one gradient

    @jax.jit
    def run(p):
        def step(carry, _):
            p, state = carry
            updates, state = optimizer.update(jax.grad(loss)(p), state, p)
            return (optax.apply_updates(p, updates), state), None

        (p, _), _ = jax.lax.scan(step, (p, optimizer.init(p)), None, length=steps)
        return p

    return run(params)


def votes(weights: jax.Array, biases: jax.Array, queries: np.ndarray) -> np.ndarray:
    """(Q, K) vote counts: each teacher's arg-max class on each query (ties: the smaller class), ``CHUNK_CELLS``
    teacher-query-class logits at a time."""
    teachers, _, classes = weights.shape
    counts = np.zeros((queries.shape[0], classes), dtype=np.int64)
    step = max(1, CHUNK_CELLS // (teachers * classes))
    for start in range(0, queries.shape[0], step):
        part = jnp.asarray(queries[start:start + step], jnp.float32)
        chosen = np.asarray(jnp.argmax(jnp.einsum("qd,tdk->tqk", part, weights) + biases[:, None, :], axis=-1))
        rows = np.broadcast_to(np.arange(part.shape[0]), chosen.shape)  # (T, q): each teacher's vote per query
        counts[start:start + part.shape[0]] = np.bincount(
            (rows * classes + chosen).ravel(), minlength=part.shape[0] * classes).reshape(part.shape[0], classes)
    return counts


def aggregate(counts: np.ndarray, variance: int, rng: np.random.Generator) -> np.ndarray:
    """GNMax: per query, the arg-max of the votes plus discrete Gaussian noise of variance σ² on every bin
    (``CHUNK_CELLS`` bins at a time)."""
    released = np.empty(counts.shape[0], dtype=np.int64)
    step = max(1, CHUNK_CELLS // counts.shape[1])
    for start in range(0, counts.shape[0], step):
        part = counts[start:start + step]
        released[start:start + part.shape[0]] = np.argmax(
            part + discrete_gaussian(variance, part.size, rng).reshape(part.shape), axis=1)
    return released


def training_size(config: PateConfig, num_examples: int, dim: int, num_classes: int,
                  queries: int) -> tuple[int, int]:
    """(one step's, the run's) work in rows × parameters: every teacher's step reads its part once, and every
    teacher votes on every query."""
    per_step = num_examples * (dim + 1) * num_classes
    return per_step, per_step * config.steps + config.teachers * queries * (dim + 1) * num_classes
