"""Training with JAX + optax: jit-compiled steps, data-parallel over all local devices (jax.sharding), early
stopping on a validation split of the *privatized* labels (keeping the best parameters), metrics per epoch.

State is explicit: ``train`` takes data and a config and returns parameters and history; nothing is global.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from features_party import losses
from shared import models

log = logging.getLogger("labeldp.train")


@dataclass(frozen=True)
class TrainConfig:
    loss: str = "squared"  # squared | poisson | cross_entropy | subset
    hidden: tuple[int, ...] = (64, 32)
    embed_dim: int = 4
    learning_rate: float = 1e-3
    l2: float = 1e-4
    batch_size: int = 1024
    epochs: int = 50
    patience: int = 8
    validation_fraction: float = 0.2
    seed: int = 0
    standardize_targets: bool = True  # squared loss: fit (y - mean) / std of the privatized labels

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        data = dict(data)
        if "hidden" in data:
            data["hidden"] = tuple(data["hidden"])
        return cls(**data)


@dataclass
class TrainResult:
    params: dict
    spec: models.ModelSpec
    config: TrainConfig
    target_shift: float
    target_scale: float
    best_epoch: int
    history: list[dict] = field(default_factory=list)
    device: str = ""

    def predict(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        outputs = models.apply(self.params, jnp.asarray(numeric), jnp.asarray(categorical))
        if self.config.loss == "squared":
            return np.asarray(outputs[:, 0]) * self.target_scale + self.target_shift
        return np.asarray(losses.predict(self.config.loss, outputs))


def device_summary() -> str:
    devices = jax.devices()
    return f"{len(devices)} x {devices[0].platform} ({devices[0].device_kind})"


def train(config: TrainConfig, numeric: np.ndarray, categorical: np.ndarray, targets: np.ndarray, *,
          vocab_sizes: tuple[int, ...], num_classes: int | None = None, metrics_path: str | Path | None = None,
          progress: bool = False, on_epoch=None, init_params: dict | None = None) -> TrainResult:
    """Fit on (features, privatized targets); ``targets`` are labels, class ids, or subset weights (n, K).
    ``init_params`` continues from an earlier model (multi-stage training)."""
    if config.loss not in losses.LOSSES:
        raise ValueError(f"unknown loss {config.loss!r}")
    rng = np.random.default_rng(config.seed)
    n = numeric.shape[0]
    order = rng.permutation(n)
    n_val = int(round(config.validation_fraction * n)) if n >= 10 else 0
    val, fit = order[:n_val], order[n_val:]
    shift, scale = 0.0, 1.0
    if config.loss == "squared" and config.standardize_targets:
        shift, scale = float(np.mean(targets[fit])), float(np.std(targets[fit]) or 1.0)
    scaled = ((targets - shift) / scale).astype(np.float32)

    spec = models.ModelSpec(numeric.shape[1], tuple(vocab_sizes), config.embed_dim, tuple(config.hidden),
                            losses.output_dim(config.loss, num_classes))
    loss_fn = losses.LOSSES[config.loss]
    optimizer = optax.chain(optax.add_decayed_weights(config.l2), optax.rmsprop(config.learning_rate))

    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    start = init_params if init_params is not None else models.init_params(jax.random.PRNGKey(config.seed), spec)
    params = jax.device_put(start, replicated)
    opt_state = jax.device_put(optimizer.init(params), replicated)

    def objective(p, x_num, x_cat, y):
        return loss_fn(models.apply(p, x_num, x_cat), y)

    @jax.jit
    def step(p, state, x_num, x_cat, y):
        value, grads = jax.value_and_grad(objective)(p, x_num, x_cat, y)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    evaluate = jax.jit(objective)

    batch = max(len(devices), (min(config.batch_size, max(len(fit), 1)) // len(devices)) * len(devices))
    steps = max(1, len(fit) // batch)
    eval_set = val if n_val else fit
    eval_args = (jnp.asarray(numeric[eval_set]), jnp.asarray(categorical[eval_set]), jnp.asarray(scaled[eval_set]))

    best = (np.inf, params, 0)
    history: list[dict] = []
    bar = tqdm(range(1, config.epochs + 1), desc=f"train {config.loss}", disable=not progress, leave=False)
    for epoch in bar:
        started = time.perf_counter()
        permutation = rng.permutation(fit)
        total = 0.0
        for s in range(steps):
            idx = permutation[s * batch:(s + 1) * batch]
            if idx.size < batch:  # keep every step's shape (and its sharding) identical
                idx = np.concatenate([idx, permutation[: batch - idx.size]])
            x_num = jax.device_put(numeric[idx], sharded)
            x_cat = jax.device_put(categorical[idx], sharded)
            y = jax.device_put(scaled[idx], sharded)
            params, opt_state, value = step(params, opt_state, x_num, x_cat, y)
            total += float(value)
        val_loss = float(evaluate(params, *eval_args))
        record = {"epoch": epoch, "train_loss": total / steps, "val_loss": val_loss,
                  "seconds": time.perf_counter() - started}
        history.append(record)
        bar.set_postfix(val=f"{val_loss:.4g}")
        if on_epoch is not None:
            on_epoch(record)
        if np.isfinite(val_loss) and val_loss < best[0]:
            best = (val_loss, params, epoch)
        elif not np.isfinite(val_loss) or epoch - best[2] >= config.patience:
            break
    if metrics_path is not None:
        Path(metrics_path).write_text(json.dumps(history, indent=1))
    result = TrainResult(jax.device_get(best[1]), spec, config, shift, scale, best[2], history, device_summary())
    log.info("trained on %s: best epoch %d of %d, val loss %.4g", result.device, best[2], len(history), best[0])
    return result


def save_model(path: str | Path, result: TrainResult, preprocessing: dict, extra: dict | None = None) -> None:
    """One .npz: flattened parameters plus a JSON header (spec, config, preprocessing, target scaling)."""
    leaves, _ = jax.tree_util.tree_flatten(result.params)
    header = {"spec": result.spec.to_dict(), "config": asdict(result.config), "preprocessing": preprocessing,
              "target_shift": result.target_shift, "target_scale": result.target_scale,
              "best_epoch": result.best_epoch, "history": result.history, **(extra or {})}
    arrays = {f"leaf_{i:04d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    with open(path, "wb") as handle:
        np.savez(handle, header=np.array(json.dumps(header)), **arrays)


def load_model(path: str | Path) -> tuple[TrainResult, dict]:
    with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        leaves = [data[k] for k in sorted(k for k in data.files if k.startswith("leaf_"))]
    spec = models.ModelSpec.from_dict(header["spec"])
    template = models.init_params(jax.random.PRNGKey(0), spec)
    params = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), [jnp.asarray(x) for x in leaves])
    result = TrainResult(params, spec, TrainConfig.from_dict(header["config"]), header["target_shift"],
                         header["target_scale"], header["best_epoch"], header["history"])
    return result, header
