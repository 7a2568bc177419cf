"""Both learners trained from disk (issue 43): a job's training rows — its features joined with its release's
privatized labels, in a seeded random order (:mod:`features_party.joined`) — are Parquet row groups, read one at a
time on a background thread while the learner works on the one before. Memory is a few row groups and the model,
whatever the table's size.

* The MLP (:func:`fit_mlp`): an epoch visits the row groups in a fresh random order and runs each as the in-memory
  trainer runs a whole epoch (:mod:`features_party.learn.train_steps`: one compiled scan of shuffled batches per
  slice of :data:`~features_party.learn.train.WORK_PER_CALL`); validation streams the validation rows' groups. The
  steps, the optimizer, early stopping and the model file are the in-memory trainer's.
* The trees (:func:`fit_gbdt`): XGBoost's external memory — an ``ExtMemQuantileDMatrix`` over a ``DataIter`` of the
  row groups, its pages cached under the job's directory — with the in-memory learner's parameters, objectives,
  metrics (in label units, summed a slice at a time) and early stopping.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pyarrow.parquet as pq
import xgboost as xgb

from features_party.features import Preprocessor
from features_party.learn import gbdt, losses, train_steps
from features_party.learn.gbdt import GbdtConfig, GbdtResult
from features_party.learn.train import (
    Deadline,
    TrainConfig,
    TrainResult,
    batch_shape,
    check_deadline,
    device_summary,
    epoch_record,
    steps_per_call,
)
from shared import models

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # numeric (n, p) float32, categorical (n, c) int32, targets (n,)


@dataclass(frozen=True)
class Rows:
    """Rows on disk: a Parquet file of features and a ``target`` column, read a row group at a time and
    preprocessed by ``preprocessor`` (fitted on the training rows)."""

    path: Path
    preprocessor: Preprocessor
    target: str = "label"

    @cached_property
    def _metadata(self) -> pq.FileMetaData:
        return pq.read_metadata(self.path)

    @property
    def groups(self) -> int:
        return self._metadata.num_row_groups

    @property
    def rows(self) -> int:
        return self._metadata.num_rows

    def read(self, group: int) -> Chunk:
        columns = list(dict.fromkeys((*self.preprocessor.numeric, *self.preprocessor.categorical, self.target)))
        frame = pq.ParquetFile(self.path).read_row_group(group, columns=columns).to_pandas()
        numeric, categorical = self.preprocessor.transform(frame)
        return numeric, categorical, frame[self.target].to_numpy(np.float32)

    def chunks(self, order: Sequence[int] | None = None) -> Iterator[Chunk]:
        """The row groups in ``order`` (default: as stored), the next one read on a background thread while the
        caller works on this one: two in memory at most."""
        order = list(range(self.groups)) if order is None else list(order)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rows") as reader:
            pending = reader.submit(self.read, order[0]) if order else None
            for following in [*order[1:], None]:
                assert pending is not None
                chunk = pending.result()
                pending = reader.submit(self.read, following) if following is not None else None
                yield chunk


# -- the MLP --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scaling:
    """The squared loss's target standardization, from the training rows (:mod:`features_party.joined`)."""

    shift: float = 0.0
    scale: float = 1.0


def fit_mlp(config: TrainConfig, fit: Rows, validation: Rows, *, num_classes: int | None = None,
            scaling: Scaling = Scaling(), on_epoch: Callable | None = None,
            deadline: float | Deadline | None = None) -> TrainResult:
    """Epochs over ``fit``'s row groups until ``config.epochs`` or early stopping on ``validation`` (its mean loss
    in label units); the best epoch's parameters are kept. Past ``deadline`` it raises as :func:`train` does."""
    if config.loss not in losses.LOSSES:
        raise ValueError(f"unknown loss {config.loss!r}")
    preprocessor = fit.preprocessor
    spec = models.ModelSpec(len(preprocessor.numeric), preprocessor.vocab_sizes, config.embed_dim,
                            tuple(config.hidden), losses.output_dim(config.loss, num_classes))
    if config.loss != "squared" or not config.standardize_targets:
        scaling = Scaling()
    optimizer = optax.chain(optax.add_decayed_weights(config.l2), optax.rmsprop(config.learning_rate))
    objective = train_steps.make_objective(losses.LOSSES[config.loss])
    run_steps = jax.jit(train_steps.make_steps(train_steps.make_train_step(objective, optimizer)))
    validate = jax.jit(objective)
    params = models.init_params(jax.random.PRNGKey(config.seed), spec)
    state = train_steps.TrainState(params, optimizer.init(params))
    rng = np.random.default_rng(config.seed)
    unit = scaling.scale ** 2  # losses in label units, as the in-memory trainer reports them

    def on_device(chunk: Chunk):
        numeric, categorical, targets = chunk
        if config.loss == "cross_entropy":
            targets = np.rint(targets).astype(np.int32)
        elif scaling != Scaling():
            targets = ((targets - scaling.shift) / scaling.scale).astype(np.float32)
        return jax.device_put((numeric, categorical, targets))

    def epoch(state: train_steps.TrainState) -> tuple[train_steps.TrainState, float]:
        total, steps_run = 0.0, 0
        for chunk in fit.chunks(rng.permutation(fit.groups).tolist()):
            data = on_device(chunk)
            batch, steps = batch_shape(config.batch_size, len(chunk[2]), 1)
            indices = train_steps.epoch_batch_indices(rng.permutation(len(chunk[2])), batch, steps)
            per_call = steps_per_call(models.num_params(spec), batch)
            for start in range(0, steps, per_call):
                check_deadline(deadline)
                state, summed = run_steps(state, data, jnp.asarray(indices[:, start:start + per_call]))
                total += float(summed)
            steps_run += steps
        return state, total / max(steps_run, 1) * unit

    def validation_loss(params) -> float:
        summed = sum(float(validate(params, on_device(chunk))) * len(chunk[2]) for chunk in validation.chunks())
        return summed / max(validation.rows, 1) * unit

    best, history = _epochs(config, state, epoch, validation_loss, on_epoch, deadline)
    return TrainResult(jax.device_get(best.params), spec, config, scaling.shift, scaling.scale, best.epoch, history,
                       device_summary())


def _epochs(config: TrainConfig, state: train_steps.TrainState, epoch: Callable, validation_loss: Callable,
            on_epoch: Callable | None, deadline: float | Deadline | None) -> tuple[train_steps.Best, list[dict]]:
    """Epochs until ``config.epochs`` or early stopping (the in-memory trainer's records and rule)."""
    best, history = train_steps.Best(np.inf, state.params, 0), []
    for number in range(1, config.epochs + 1):
        check_deadline(deadline)
        started = time.perf_counter()
        state, train_loss = epoch(state)
        val_loss = validation_loss(state.params)
        record = epoch_record(config, number, train_loss, val_loss, started)
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)
        best, stop = train_steps.keep_best(best, val_loss, state.params, number, config.patience)
        if stop:
            break
    return best, history


# -- the trees ------------------------------------------------------------------------------------------------------

class _RowGroups(xgb.DataIter):
    """XGBoost's external-memory iterator over :class:`Rows`: one row group per batch; its pages are cached as
    files under ``cache``."""

    def __init__(self, rows: Rows, cache: Path, groups: int | None = None):
        self.rows, self.at, self.groups = rows, 0, rows.groups if groups is None else min(groups, rows.groups)
        cache.mkdir(parents=True, exist_ok=True)
        super().__init__(cache_prefix=str(cache / "pages"), release_data=True)

    def next(self, input_data: Callable) -> bool:
        if self.at >= self.groups:
            return False
        numeric, categorical, targets = self.rows.read(self.at)
        data, feature_types = gbdt.columns(numeric, categorical)
        input_data(data=data, label=targets, feature_types=feature_types)
        self.at += 1
        return True

    def reset(self) -> None:
        self.at = 0


METRIC_ROWS = 1 << 20  # rows of predictions a metric computes on at once
# the training loss each round is measured on the first row groups of the training rows up to this many rows — a
# uniform sample, since the join wrote them in a seeded random order: on the whole table, its labels and
# predictions were copied out every round (800 MB a round at 10⁸ rows, the scale bench's trainer at 5.6 GB)
TRAIN_METRIC_ROWS = 1 << 20


def fit_gbdt(config: GbdtConfig, fit: Rows, validation: Rows, cache: Path, *, num_classes: int | None = None,
             base_score: float | None = None, on_epoch: Callable | None = None,
             deadline: float | Deadline | None = None, threads: int | None = None) -> GbdtResult:
    """Boost on ``fit`` from external memory (pages cached under ``cache``, a directory the caller removes),
    stopping early on ``validation``; ``base_score``: the Poisson loss's starting rate (the training labels'
    mean). Each round's ``train_loss`` is measured on at most :data:`TRAIN_METRIC_ROWS` of the training rows."""
    if config.loss not in gbdt.OBJECTIVES:
        raise ValueError(f"loss {config.loss!r} has no tree objective")
    check_deadline(deadline)
    train_matrix = xgb.ExtMemQuantileDMatrix(_RowGroups(fit, cache / "fit"), max_bin=gbdt.MAX_BIN,
                                             enable_categorical=True, nthread=threads or -1)
    validation_matrix = xgb.ExtMemQuantileDMatrix(_RowGroups(validation, cache / "validation"), ref=train_matrix,
                                                  max_bin=gbdt.MAX_BIN, enable_categorical=True,
                                                  nthread=threads or -1)
    sample_groups = -(-TRAIN_METRIC_ROWS // max(fit.rows // max(fit.groups, 1), 1))
    train_sample = train_matrix if sample_groups >= fit.groups else xgb.ExtMemQuantileDMatrix(
        _RowGroups(fit, cache / "train-sample", sample_groups), ref=train_matrix, max_bin=gbdt.MAX_BIN,
        enable_categorical=True, nthread=threads or -1)
    params, objective, outputs = gbdt.booster_params(config, num_classes, threads, base_score)
    loss = losses.LOSSES[config.loss]
    loss_fn = jax.jit(lambda predictions, labels: loss(gbdt.model_outputs(config.loss, predictions), labels))
    cpu = jax.devices("cpu")[0]

    def metric(predictions: np.ndarray, evaluated: xgb.DMatrix) -> tuple[str, float]:
        """The mean loss, a slice of :data:`METRIC_ROWS` at a time (the whole table's outputs at once would be a
        copy of them per step of the loss)."""
        labels = evaluated.get_label()
        if config.loss == "cross_entropy":
            labels = np.rint(labels).astype(np.int32)
        predictions = predictions.reshape(len(labels), -1) if outputs is not None else predictions
        summed = 0.0
        with jax.default_device(cpu):
            for start in range(0, len(labels), METRIC_ROWS):
                part = slice(start, start + METRIC_ROWS)
                summed += float(loss_fn(predictions[part], labels[part])) * len(labels[part])
        return "loss", summed / max(len(labels), 1)

    rounds = gbdt.Rounds(config, deadline, on_epoch)
    stopping = xgb.callback.EarlyStopping(rounds=config.early_stopping_rounds, metric_name="loss",
                                          data_name="validation", maximize=False, save_best=True)
    booster = xgb.train(params, train_matrix, num_boost_round=config.n_estimators, obj=objective,
                        custom_metric=metric, evals=[(train_sample, "train"), (validation_matrix, "validation")],
                        callbacks=[rounds, stopping], verbose_eval=False)
    summary = f"xgboost {xgb.__version__} on {params['device']}, external memory"
    return GbdtResult(booster, config, booster.num_boosted_rounds(), rounds.history, summary, threads, outputs)
