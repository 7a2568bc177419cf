"""Training with JAX + optax: data-parallel over all local devices (jax.sharding), early stopping on a validation
split of the *privatized* labels (keeping the best parameters), metrics per epoch in label units (``train_loss``,
``val_loss``; ``val_mse`` for the squared loss), whatever scaling the targets were fitted with.

``train`` is prepare → fit → report: ``prepare`` splits and scales on the host, ``fit`` places the data on the
devices once and runs each epoch as one compiled scan of the pure step built in features_party/learn/train_steps.py (one
host round trip per epoch, the same code on CPU and GPU; an epoch longer than about a second of work runs as several
scans, so that a deadline stops it between them), ``report`` writes the metrics and builds the result.
State is explicit: ``train`` takes data and a config and returns parameters and history; nothing is global.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from features_party.learn import losses, train_steps
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
        """In batches of :data:`PREDICT_ROWS`: the hidden layers' activations of a whole features table (rows ×
        the widest layer) are bounded by nothing a job declares, a batch's are."""
        return in_batches(self._predict, numeric, categorical, PREDICT_ROWS)

    def _predict(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        outputs = models.apply(self.params, jnp.asarray(numeric), jnp.asarray(categorical))
        if self.config.loss == "squared":
            return np.asarray(outputs[:, 0]) * self.target_scale + self.target_shift
        return np.asarray(losses.predict(self.config.loss, outputs))


PREDICT_ROWS = 16_384  # rows per prediction batch: 4096-wide layers take 256 MiB of float32 activations each


def in_batches(predict, numeric: np.ndarray, categorical: np.ndarray, rows: int) -> np.ndarray:
    """``predict`` (either learner's) on ``rows`` rows of the features at a time, concatenated (one empty batch
    for an empty table, so that the result keeps its shape)."""
    parts = [predict(numeric[start:start + rows], categorical[start:start + rows])
             for start in range(0, max(numeric.shape[0], 1), rows)]
    return np.concatenate(parts, axis=0)


def device_summary() -> str:
    devices = jax.devices()
    return f"{len(devices)} x {devices[0].platform} ({devices[0].device_kind})"


@dataclass(frozen=True)
class Prepared:
    """What ``fit`` needs, on the host: the model, the starting parameters, the data (targets standardized), the
    rows to fit on and the validation batch, and the generator that shuffles each epoch."""
    spec: models.ModelSpec
    params: dict
    data: tuple[np.ndarray, np.ndarray, np.ndarray]
    fit_rows: np.ndarray
    validation: tuple[np.ndarray, np.ndarray, np.ndarray]
    target_shift: float
    target_scale: float
    rng: np.random.Generator


# A device call runs at most about this many parameter-example updates (~1 s on one CPU core at batch ≥ 64,
# measured with bench/train_throughput.py's model and larger ones): a compiled scan cannot be interrupted, so a long
# epoch runs as several calls and a deadline is checked between them.
WORK_PER_CALL = 1 << 32
MEMORY_BOUND_BATCH = 64  # a step of a smaller batch costs about as much as one of this size (it reads every weight)


class TimeLimitExceeded(Exception):
    """Training passed its ``deadline``: raised between device calls, so the thread that ran it is free again."""


class Stopped(Exception):
    """Training was told to stop (its job's lease went to another worker): raised between device calls."""


@dataclass(frozen=True)
class Deadline:
    """When training stops: past ``at`` (a ``time.monotonic()`` value: :class:`TimeLimitExceeded`), or as soon as
    ``stop`` is set (:class:`Stopped`), each checked between device calls."""

    at: float
    stop: threading.Event | None = None


def check_deadline(deadline: float | Deadline | None) -> None:
    if deadline is None:
        return
    if isinstance(deadline, Deadline):
        if deadline.stop is not None and deadline.stop.is_set():
            raise Stopped
        deadline = deadline.at
    if time.monotonic() > deadline:
        raise TimeLimitExceeded


def train(config: TrainConfig, numeric: np.ndarray, categorical: np.ndarray, targets: np.ndarray, *,
          vocab_sizes: tuple[int, ...], num_classes: int | None = None, metrics_path: str | Path | None = None,
          progress: bool = False, on_epoch=None, init_params: dict | None = None,
          deadline: float | Deadline | None = None, validate_on: np.ndarray | None = None) -> TrainResult:
    """Fit on (features, privatized targets); ``targets`` are labels, class ids, or subset weights (n, K).
    ``init_params`` continues from an earlier model (multi-stage training); ``validate_on`` the rows that may
    validate (:func:`validation_split`). Past ``deadline`` (a ``time.monotonic()`` value, or a :class:`Deadline`) it
    raises :class:`TimeLimitExceeded` at the next device call (or :class:`Stopped`, its stop event set)."""
    prepared = prepare(config, numeric, categorical, targets, vocab_sizes, num_classes, init_params, validate_on)
    best, history = fit(config, prepared, on_epoch=on_epoch, progress=progress, deadline=deadline)
    return report(config, prepared, best, history, metrics_path)


def validation_split(n: int, fraction: float, rng: np.random.Generator,
                     validate_on: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(validation rows, rows to fit on) of ``n`` training rows: a permutation drawn from ``rng`` (the job's seed),
    its first round(``fraction`` × m) rows among the m that may validate (``validate_on``, a mask; default all) for
    validation (none below 10), every other row to fit on. Every learner splits this way, so the MLP and the trees
    of one job's seed validate on the same rows of its privatized labels. LP-MST validates a stage's model on that
    stage's released labels only: the earlier stages' were fitted by the model it starts from, and the examples
    labelled by the model's own prediction would reward agreeing with it."""
    order = rng.permutation(n)
    candidates = order if validate_on is None else order[np.asarray(validate_on, dtype=bool)[order]]
    n_val = int(round(fraction * candidates.size)) if candidates.size >= 10 else 0
    return candidates[:n_val], order[~np.isin(order, candidates[:n_val])]


def prepare(config: TrainConfig, numeric: np.ndarray, categorical: np.ndarray, targets: np.ndarray,
            vocab_sizes: tuple[int, ...], num_classes: int | None, init_params: dict | None,
            validate_on: np.ndarray | None = None) -> Prepared:
    """The validation split (from ``config.seed``), the target standardization of the squared loss (fitted on the
    training rows only), the model and its starting parameters."""
    if config.loss not in losses.LOSSES:
        raise ValueError(f"unknown loss {config.loss!r}")
    rng = np.random.default_rng(config.seed)
    val, fit_rows = validation_split(numeric.shape[0], config.validation_fraction, rng, validate_on)
    shift, scale = 0.0, 1.0
    if config.loss == "squared" and config.standardize_targets:
        shift, scale = float(np.mean(targets[fit_rows])), float(np.std(targets[fit_rows]) or 1.0)
    data = (np.asarray(numeric, np.float32), np.asarray(categorical, np.int32),
            ((targets - shift) / scale).astype(np.float32))
    eval_rows = val if val.size else fit_rows
    validation = (data[0][eval_rows], data[1][eval_rows], data[2][eval_rows])
    spec = models.ModelSpec(numeric.shape[1], tuple(vocab_sizes), config.embed_dim, tuple(config.hidden),
                            losses.output_dim(config.loss, num_classes))
    params = init_params if init_params is not None else models.init_params(jax.random.PRNGKey(config.seed), spec)
    return Prepared(spec, params, data, fit_rows, validation, shift, scale, rng)


def fit(config: TrainConfig, prepared: Prepared, *, on_epoch=None, progress: bool = False,
        deadline: float | Deadline | None = None) -> tuple[train_steps.Best, list[dict]]:
    """Epochs until ``config.epochs`` or early stopping. The data go to the devices once (replicated); each epoch
    sends only its batch indices, split over the devices along the batch axis, runs as compiled scans (one, unless
    the epoch is longer than :data:`WORK_PER_CALL`), and brings back two numbers (the mean training loss and the
    validation loss). ``deadline`` is checked before each epoch and between the calls of one."""
    optimizer = optax.chain(optax.add_decayed_weights(config.l2), optax.rmsprop(config.learning_rate))
    objective = train_steps.make_objective(losses.LOSSES[config.loss])
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_example = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
    run_steps = jax.jit(train_steps.make_steps(train_steps.make_train_step(objective, optimizer), by_example))
    validate = jax.jit(objective)
    data, validation = jax.device_put((prepared.data, prepared.validation), replicated)
    params = jax.device_put(prepared.params, replicated)
    state = train_steps.TrainState(params, jax.device_put(optimizer.init(params), replicated))
    batch_size, steps = batch_shape(config.batch_size, prepared.fit_rows.size, mesh.size)
    per_call = steps_per_call(models.num_params(prepared.spec), batch_size)

    def shuffled_batches():  # an epoch's batches, drawn from the generator of the validation split, per call
        permutation = prepared.rng.permutation(prepared.fit_rows)
        indices = train_steps.epoch_batch_indices(permutation, batch_size, steps)
        return [jax.device_put(indices[:, s:s + per_call], by_example) for s in range(0, steps, per_call)]

    # Losses are reported in label units: the squared loss of standardized targets times the scale² (the only loss
    # fitted on rescaled targets); a constant factor, so early stopping picks the same epoch either way.
    unit = prepared.target_scale ** 2
    best, history = train_steps.Best(np.inf, params, 0), []
    calls = shuffled_batches()
    bar = tqdm(range(1, config.epochs + 1), desc=f"train {config.loss}", disable=not progress, leave=False)
    for epoch in bar:
        check_deadline(deadline)
        started = time.perf_counter()
        totals = []
        for call, indices in enumerate(calls, start=1):
            state, total = run_steps(state, data, indices)
            totals.append(total)
            if call < len(calls):  # wait for this call (dispatch is asynchronous) to stop in time
                total.block_until_ready()
                check_deadline(deadline)
        val_loss = validate(state.params, validation)
        calls = shuffled_batches()  # the host shuffles the next epoch while the device runs this one
        totals, val_loss = jax.device_get((totals, val_loss))
        train_loss, val_loss = float(np.sum(totals)) / steps * unit, float(val_loss) * unit
        record = epoch_record(config, epoch, train_loss, val_loss, started)
        history.append(record)
        bar.set_postfix(val=f"{val_loss:.4g}")
        if on_epoch is not None:
            on_epoch(record)
        best, stop = train_steps.keep_best(best, val_loss, state.params, epoch, config.patience)
        if stop:
            break
    return best, history


def epoch_record(config: TrainConfig, epoch: int, train_loss: float, val_loss: float, started: float) -> dict:
    """An epoch's metrics as a job reports them (label units; ``val_mse`` for the squared loss), ``started`` its
    ``time.perf_counter()``."""
    return {"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss,
            **({"val_mse": 2.0 * val_loss} if config.loss == "squared" else {}),
            "seconds": time.perf_counter() - started}


def steps_per_call(num_params: int, batch_size: int) -> int:
    """How many steps one device call runs: about :data:`WORK_PER_CALL` parameter-example updates, at least one."""
    return max(1, WORK_PER_CALL // (num_params * max(batch_size, MEMORY_BOUND_BATCH)))


def batch_shape(batch_size: int, fit_size: int, num_devices: int) -> tuple[int, int]:
    """(examples per step, steps per epoch): at most ``batch_size``, a multiple of the device count, at least one
    step."""
    batch = max(num_devices, (min(batch_size, max(fit_size, 1)) // num_devices) * num_devices)
    return batch, max(1, fit_size // batch)


def report(config: TrainConfig, prepared: Prepared, best: train_steps.Best, history: list[dict],
           metrics_path: str | Path | None) -> TrainResult:
    if metrics_path is not None:
        Path(metrics_path).write_text(json.dumps(history, indent=1))
    result = TrainResult(jax.device_get(best.params), prepared.spec, config, prepared.target_shift,
                         prepared.target_scale, best.epoch, history, device_summary())
    log.info("trained on %s: best epoch %d of %d, val loss %.4g", result.device, best.epoch, len(history), best.loss)
    return result


def save_model(path: str | Path, result: TrainResult, preprocessing: dict, extra: dict | None = None) -> None:
    """One .npz: flattened parameters plus a JSON header (spec, config, preprocessing, target scaling)."""
    leaves, _ = jax.tree_util.tree_flatten(result.params)
    header = {"spec": result.spec.to_dict(), "config": asdict(result.config), "preprocessing": preprocessing,
              "target_shift": result.target_shift, "target_scale": result.target_scale,
              "best_epoch": result.best_epoch, "history": result.history, **(extra or {})}
    arrays = {f"leaf_{i:04d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    with open(path, "wb") as handle:  # allow_pickle (numpy's default) given, so no key of `arrays` is taken for it
        np.savez(handle, allow_pickle=True, header=np.array(json.dumps(header)), **arrays)
