"""Gradient-boosted trees on privatized labels, with XGBoost (a job's ``train.model: "gbdt"``).

Why XGBoost rather than LightGBM: the same wheel from PyPI trains on CUDA (``device="cuda"``), which the mission's
"on GPU" asks for, while LightGBM's GPU build is a separate compile; its model formats (JSON, UBJSON) are documented,
safe to load and readable by every XGBoost binding, with string attributes that carry our preprocessing; it takes
categorical features natively; and a custom objective keeps the Poisson loss finite on the negative labels that
unbiased randomizers deliberately output (XGBoost's own ``count:poisson`` refuses labels below 0).

* Losses (features_party/losses.py defines them, and the metrics here are computed with those functions, in label
  units): ``squared`` (``reg:squarederror``: its gradient is affine in the label, so unbiased noisy labels give
  unbiased gradients, as for the MLP), ``poisson`` (the gradient e^η − y and hessian e^η of e^η − y·η, under
  ``count:poisson``'s log link, so the saved model predicts the rate), ``cross_entropy`` (``multi:softprob`` on
  class releases). The subset loss has no tree objective: refused at planning.
* Early stopping on the job's validation split of its *released* labels (:func:`features_party.train.
  validation_split`, the MLP's split for the same seed): the trainer never has true labels. The best round's model
  is kept.
* Features: the MLP's preprocessing (:class:`features_party.features.Preprocessor`, fitted on the training rows):
  standardized numeric columns, then categorical codes 1..V (0 = unseen), given to XGBoost as native categorical
  features — one vocabulary and one saved preprocessing for both learners.
* Device: chosen as for JAX — CUDA when JAX sees a GPU, else the CPU, where a job takes its worker's share of the
  cores (:func:`threads_per_job`): XGBoost's threads spin at their barriers, so two jobs each on every core run
  several times slower than on half of them each (bench/train_throughput_gbdt.py ``--threads``).
* A deadline is checked before every boosting round (:class:`features_party.train.TimeLimitExceeded`, or
  ``Stopped``), as the MLP checks it between device calls.
* The model is XGBoost's JSON (never pickle); the preprocessing, loss and history ride in its ``labeldp`` attribute,
  so one file serves ``xgboost.Booster(model_file=...)`` and ``labeldp predict``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import xgboost as xgb

from features_party import losses
from features_party.train import Deadline, check_deadline, validation_split
from shared.errors import LabelDPError

log = logging.getLogger("labeldp.gbdt")

OBJECTIVES = {"squared": "reg:squarederror", "poisson": "count:poisson", "cross_entropy": "multi:softprob"}
ATTRIBUTE = "labeldp"  # the model's string attribute holding our header (JSON)
MIN_PROBABILITY = 1e-16  # a class probability's floor before its log (XGBoost may round one to 0)


@dataclass(frozen=True)
class GbdtConfig:
    """A job's tree options (features_party/schemas.py:GbdtOptions) plus what both learners share."""

    loss: str = "squared"  # squared | poisson | cross_entropy
    n_estimators: int = 500
    learning_rate: float = 0.05
    max_depth: int = 6
    min_child_weight: float = 10.0
    subsample: float = 0.8
    colsample: float = 1.0
    reg_lambda: float = 1.0
    early_stopping_rounds: int = 20
    validation_fraction: float = 0.2
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict) -> GbdtConfig:
        return cls(**data)


def device() -> str:
    """XGBoost's device, as JAX chose: CUDA when JAX sees a GPU."""
    return "cuda" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"


# What one unit of :func:`work` (a row's feature binned into a histogram at one depth) costs in the MLP's unit (one
# parameter updated for one example), so that ``max_job_size`` bounds both learners' time alike: on the 2-core
# development machine bench/train_throughput_gbdt.py measured 2.8–3.4·10⁸ tree units/s on one thread against
# 5.7–7.1·10⁹ MLP units/s (a ratio of 17–25; docs/results/train-throughput-gbdt.json).
UNIT_COST = 16


def threads_per_job(job_workers: int) -> int:
    """CPU threads of one tree job: the cores shared among the trainer's ``job_workers`` job threads."""
    return max(1, (os.cpu_count() or 1) // max(job_workers, 1))


def work(n_estimators: int, max_depth: int, trees_per_round: int, rows: int, num_features: int) -> int:
    """The size of a tree job in the MLP's unit (its parameters × epochs × rows): :data:`UNIT_COST` × rounds × trees
    per round × rows × features × depth — growing a tree bins, at each of its levels, every row's every feature."""
    return UNIT_COST * n_estimators * trees_per_round * rows * num_features * max_depth


def most_nodes(n_estimators: int, max_depth: int, trees_per_round: int, rows: int) -> int:
    """The most nodes a tree job's model can have (what its memory and its JSON grow with, about 56 bytes a node in
    the JSON; :func:`work` does not count them): rounds × trees per round × nodes per tree, a tree holding at most
    2^(depth+1) − 1 nodes, and never more than 2·rows − 1 (each leaf holds at least one row)."""
    per_tree = min((1 << (max_depth + 1)) - 1, 2 * max(rows, 1) - 1)
    return n_estimators * trees_per_round * per_tree


@dataclass
class GbdtResult:
    booster: xgb.Booster
    config: GbdtConfig
    best_epoch: int  # the round kept (1-based)
    history: list[dict] = field(default_factory=list)
    device: str = ""

    def predict(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        """On the label scale, like the MLP's: values (squared), rates (poisson), class probabilities (n, K)."""
        return np.asarray(self.booster.predict(matrix(numeric, categorical)))

    def logits(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        """The margins (class logits (n, K) for classes), as the MLP's outputs."""
        return np.asarray(self.booster.predict(matrix(numeric, categorical), output_margin=True))


def matrix(numeric: np.ndarray, categorical: np.ndarray) -> xgb.DMatrix:
    """The preprocessed features as XGBoost takes them: numeric columns, then the categorical codes as native
    categorical features."""
    data, feature_types = _columns(numeric, categorical)
    return xgb.DMatrix(data, feature_types=feature_types, enable_categorical=True)


def _columns(numeric: np.ndarray, categorical: np.ndarray) -> tuple[np.ndarray, list[str]]:
    data = np.column_stack([np.asarray(numeric, np.float32), np.asarray(categorical, np.float32)])
    return data, ["q"] * numeric.shape[1] + ["c"] * categorical.shape[1]


def _outputs(loss: str, predictions: jax.Array) -> jax.Array:
    """What XGBoost hands a metric (values, margins under the Poisson objective of ours, class probabilities) as the
    model outputs losses.LOSSES takes (for classes, log-probabilities: their log-softmax is themselves)."""
    if loss == "cross_entropy":
        return jnp.log(jnp.clip(predictions, MIN_PROBABILITY, 1.0))
    return jnp.reshape(predictions, (-1, 1))


def _poisson_gradient(margins: np.ndarray, data: xgb.DMatrix) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and hessian of e^η − y·η in η: finite for any label, negative ones included."""
    rate = np.exp(margins)
    return rate - data.get_label(), rate


class _Rounds(xgb.callback.TrainingCallback):
    """Checks the deadline before each round; records each round's losses in label units (and ``val_mse``)."""

    def __init__(self, config: GbdtConfig, deadline: float | Deadline | None, on_epoch: Callable | None):
        self.config, self.deadline, self.on_epoch = config, deadline, on_epoch
        self.history: list[dict] = []
        self.started = time.perf_counter()

    def before_iteration(self, model, epoch: int, evals_log) -> bool:
        check_deadline(self.deadline)
        self.started = time.perf_counter()
        return False

    def after_iteration(self, model, epoch: int, evals_log) -> bool:
        train_loss, val_loss = (float(evals_log[name]["loss"][-1]) for name in ("train", "validation"))
        record = {"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val_loss,
                  **({"val_mse": 2.0 * val_loss} if self.config.loss == "squared" else {}),
                  "seconds": time.perf_counter() - self.started}
        self.history.append(record)
        if self.on_epoch is not None:
            self.on_epoch(record)
        return False  # early stopping's to decide (a stop before its first round would leave it no best round)


def train_gbdt(config: GbdtConfig, numeric: np.ndarray, categorical: np.ndarray, targets: np.ndarray, *,
               num_classes: int | None = None, on_epoch: Callable | None = None,
               deadline: float | Deadline | None = None, init_model: xgb.Booster | None = None,
               threads: int | None = None) -> GbdtResult:
    """Boost on (features, privatized targets): labels, or class ids. Validation: the job's split of the same
    privatized targets. ``init_model`` goes on boosting an earlier model (multi-stage training: up to
    ``n_estimators`` more rounds). ``threads``: CPU threads (default: every core). Past ``deadline`` it raises
    ``TimeLimitExceeded`` (or ``Stopped``) before the next round."""
    if config.loss not in OBJECTIVES:
        raise ValueError(f"loss {config.loss!r} has no tree objective")
    check_deadline(deadline)
    val, fit_rows = validation_split(len(targets), config.validation_fraction, np.random.default_rng(config.seed))
    eval_rows = val if val.size else fit_rows
    targets = np.asarray(targets, np.float32)
    data, feature_types = _columns(numeric, categorical)
    fit = xgb.QuantileDMatrix(data[fit_rows], label=targets[fit_rows], feature_types=feature_types,
                              enable_categorical=True)
    validation = xgb.QuantileDMatrix(data[eval_rows], label=targets[eval_rows], feature_types=feature_types,
                                     enable_categorical=True, ref=fit)
    params = {"objective": OBJECTIVES[config.loss], "device": device(), "tree_method": "hist",
              "eta": config.learning_rate, "max_depth": config.max_depth, "min_child_weight": config.min_child_weight,
              "subsample": config.subsample, "colsample_bytree": config.colsample, "lambda": config.reg_lambda,
              "seed": config.seed, "disable_default_eval_metric": 1, **({"nthread": threads} if threads else {})}
    objective = None
    if config.loss == "cross_entropy":
        params["num_class"] = losses.output_dim(config.loss, num_classes)
    if config.loss == "poisson":
        # our gradient, under count:poisson's log link (kept for predictions); the rate starts at the mean label,
        # given, since XGBoost's own estimate of it refuses labels below 0 (floored: a rate is positive)
        objective = _poisson_gradient
        params["base_score"] = max(float(np.mean(targets[fit_rows])), 1e-3)
        params["max_delta_step"] = 0.7  # count:poisson's safeguard of the exponential's steps

    # compiled once per shape (the training and the validation rows)
    loss_fn = jax.jit(lambda predictions, labels: losses.LOSSES[config.loss](_outputs(config.loss, predictions),
                                                                               labels))

    def metric(predictions: np.ndarray, evaluated: xgb.DMatrix) -> tuple[str, float]:
        labels = evaluated.get_label()
        if config.loss == "cross_entropy":
            labels = np.rint(labels).astype(np.int32)
        return "loss", float(loss_fn(predictions, labels))

    rounds = _Rounds(config, deadline, on_epoch)
    stopping = xgb.callback.EarlyStopping(rounds=config.early_stopping_rounds, metric_name="loss",
                                          data_name="validation", maximize=False, save_best=True)
    booster = xgb.train(params, fit, num_boost_round=config.n_estimators, obj=objective, custom_metric=metric,
                        evals=[(fit, "train"), (validation, "validation")], callbacks=[rounds, stopping],
                        verbose_eval=False, xgb_model=init_model)
    best = booster.num_boosted_rounds()  # save_best: the model ends at the best round
    summary = f"xgboost {xgb.__version__} on {params['device']}"
    log.info("trained on %s: best round %d of %d", summary, best, len(rounds.history))
    return GbdtResult(booster, config, best, rounds.history, summary)


def save_model(path: str | Path, result: GbdtResult, preprocessing: dict, extra: dict | None = None) -> None:
    """XGBoost's JSON model, its ``labeldp`` attribute the header (config, preprocessing, best round, history)."""
    header = {"family": "gbdt", "config": asdict(result.config), "preprocessing": preprocessing,
              "best_epoch": result.best_epoch, "history": result.history, **(extra or {})}
    result.booster.set_attr(**{ATTRIBUTE: json.dumps(header)})
    Path(path).write_bytes(bytes(result.booster.save_raw("json")))


def load_model(path: str | Path) -> tuple[GbdtResult, dict]:
    try:
        booster = xgb.Booster(model_file=str(path))
    except xgb.core.XGBoostError:
        raise LabelDPError("the model file is not an XGBoost model", code="malformed_file") from None
    text = booster.attr(ATTRIBUTE)
    if text is None:
        raise LabelDPError("the model file is an XGBoost model but not a labeldp job's (no labeldp attribute)",
                           code="malformed_file")
    try:  # a file from elsewhere: its header is input, not ours
        header = json.loads(text)
        result = GbdtResult(booster, GbdtConfig.from_dict(header["config"]), header["best_epoch"], header["history"])
        if not isinstance(header.get("preprocessing"), dict):  # labeldp predict reads it next
            raise KeyError("preprocessing")
    except (ValueError, KeyError, TypeError):
        raise LabelDPError("the model file's labeldp header is damaged (not a labeldp job's trees)",
                           code="malformed_file") from None
    return result, header


def is_model_file(path: str | Path) -> bool:
    """A tree model (XGBoost JSON, starting with ``{``) rather than the MLP's .npz (a zip, starting with ``PK``)."""
    with open(path, "rb") as handle:
        return handle.read(1) == b"{"
