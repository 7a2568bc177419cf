"""Gradient-boosted trees on privatized labels, with XGBoost (a job's ``train.model: "gbdt"``).

Why XGBoost rather than LightGBM: the same wheel from PyPI trains on CUDA (``device="cuda"``), which the mission's
"on GPU" asks for, while LightGBM's GPU build is a separate compile; its model formats (JSON, UBJSON) are documented,
safe to load and readable by every XGBoost binding, with string attributes that carry our preprocessing; it takes
categorical features natively; and a custom objective keeps the Poisson loss finite on the negative labels that
unbiased randomizers deliberately output (XGBoost's own ``count:poisson`` refuses labels below 0).

* Losses (features_party/learn/losses.py defines them, and the metrics here are computed with those functions, in label
  units): ``squared`` (``reg:squarederror``: its gradient is affine in the label, so unbiased noisy labels give
  unbiased gradients, as for the MLP), ``poisson`` (the gradient e^η − y and hessian e^η of e^η − y·η, under
  ``count:poisson``'s log link, so the saved model predicts the rate), ``cross_entropy`` (``multi:softprob`` on
  class releases). The subset loss has no tree objective: refused at planning.
* Early stopping on the job's validation split of its *released* labels (:func:`features_party.learn.train.
  validation_split`, the MLP's split for the same seed): the trainer never has true labels. The best round's model
  is kept.
* Features: the MLP's preprocessing (:class:`features_party.features.Preprocessor`, fitted on the training rows):
  standardized numeric columns, then categorical codes 1..V (0 = unseen), given to XGBoost as native categorical
  features — one vocabulary and one saved preprocessing for both learners.
* Device: chosen as for JAX — CUDA when JAX sees a GPU, else the CPU, where a job takes its worker's share of the
  cores (:func:`threads_per_job`): XGBoost's threads spin at their barriers, so two jobs each on every core run
  several times slower than on half of them each (bench/train_throughput_gbdt.py ``--threads``).
* A deadline is checked before every boosting round (:class:`features_party.learn.train.TimeLimitExceeded`, or
  ``Stopped``), as the MLP checks it between device calls.
* The model is XGBoost's JSON (never pickle); the preprocessing, loss and history ride in its ``labeldp`` attribute,
  so one file serves ``xgboost.Booster(model_file=...)`` and ``labeldp predict``, which checks it first
  (:mod:`features_party.learn.gbdt_file`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import xgboost as xgb

from features_party.learn import losses
from features_party.learn.train import Deadline, check_deadline, in_batches, validation_split

log = logging.getLogger("labeldp.gbdt")

OBJECTIVES = {"squared": "reg:squarederror", "poisson": "count:poisson", "cross_entropy": "multi:softprob"}
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
    """XGBoost's device, as JAX chose: CUDA when JAX sees an NVIDIA GPU and this XGBoost build has CUDA (a CPU-only
    build, or a ROCm GPU, trains on the CPU rather than fail after the job's release was drawn)."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return "cpu"
    platform = str(getattr(gpus[0].client, "platform_version", "")).lower()
    if not xgb.build_info().get("USE_CUDA") or "rocm" in platform:
        log.warning("JAX sees a GPU (%s) that this XGBoost build cannot train on: trees train on the CPU", platform)
        return "cpu"
    return "cuda"


# What one unit of :func:`work` (a row's feature binned into a histogram at one depth) costs in the MLP's unit (one
# parameter updated for one example), so that ``max_job_size`` bounds both learners' time alike: on the 2-core
# development machine bench/train_throughput_gbdt.py measured 2.8–4.3·10⁸ tree units/s on one thread against
# 5.7–10·10⁹ MLP units/s (a ratio of 17–25, 24 on the idle machine; docs/results/train-throughput-gbdt.json).
UNIT_COST = 16
# A categorical split sorts and scans its column's levels at every node: measured 4·10⁷ level-nodes/s on one thread
# (10⁵ levels, 40 rounds of depth 6: 6.9 s against 0.6 s for 100 levels), about 7 tree units each.
CATEGORY_UNITS = 8
MAX_CATEGORIES = (1 << 24) - 1  # XGBoost's categorical features take codes below 2^24
# The largest model file `labeldp predict` reads (features_party/learn/gbdt_file.py): checking and loading it take about
# ten times its size in memory (measured: 275 MB took 2.7 GB); planning refuses a job whose model could be larger.
MAX_MODEL_BYTES = 1 << 30
# What a tree job holds (:func:`memory`; ``max_tree_bytes``), measured with XGBoost 3.2 on this machine: a node of the
# saved JSON 56–59 bytes, a depth-1 tree 534 bytes in all; a categorical split lists the levels on one side, up to
# half its column's, ~7 bytes each; XGBoost keeps at most HISTOGRAM_NODES nodes' histograms (max_cached_hist_node,
# set to it: its default of 65536 took 1.9 GB at depth 16 on 10⁵ rows × 40 features, 1024 took 0.29 GB), each
# bin a float64 gradient and hessian sum, MAX_BIN bins a numeric feature, one a level; a training cell is a float32,
# its copy for the validation split and its uint8 bin.
NODE_BYTES, TREE_BYTES, CATEGORY_BYTES = 64, 600, 7
HISTOGRAM_NODES, MAX_BIN, BIN_BYTES = 1024, 256, 16
CELL_BYTES = 13


CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"


def threads_per_job(job_workers: int) -> int:
    """CPU threads of one tree job: the cores this process may use shared among the trainer's ``job_workers`` job
    threads."""
    return max(1, usable_cores() // max(job_workers, 1))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a container's cpuset), and a cgroup v2
    CPU quota (``docker --cpus``) when one is set — ``os.cpu_count()`` counts the machine's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable: the affinity alone
    return max(1, cores)


def nodes_per_tree(max_depth: int, rows: int) -> int:
    """A tree's most nodes: 2^(depth+1) − 1, and never more than 2·rows − 1 (each leaf holds at least one row)."""
    return min((1 << (max_depth + 1)) - 1, 2 * max(rows, 1) - 1)


def work(n_estimators: int, max_depth: int, trees_per_round: int, rows: int, num_features: int,
         vocab_sizes: Sequence[int] = ()) -> int:
    """The size of a tree job in the MLP's unit (its parameters × epochs × rows): :data:`UNIT_COST` × rounds × trees
    per round × (rows × features × depth — growing a tree bins, at each of its levels, every row's every feature —
    + :data:`CATEGORY_UNITS` × splits per tree × the categorical columns' levels, each split's scan of them)."""
    splits = nodes_per_tree(max_depth, rows) // 2
    return UNIT_COST * n_estimators * trees_per_round * (rows * num_features * max_depth
                                                         + CATEGORY_UNITS * splits * sum(vocab_sizes))


def most_nodes(n_estimators: int, max_depth: int, trees_per_round: int, rows: int) -> int:
    """The most nodes a tree job's model can have: rounds × trees per round × :func:`nodes_per_tree`."""
    return n_estimators * trees_per_round * nodes_per_tree(max_depth, rows)


@dataclass(frozen=True)
class TreeMemory:
    """What a tree job holds at most, in bytes (the constants above): its model (and JSON download), the histograms
    XGBoost caches while growing a tree, and the training matrices."""

    model: int
    histograms: int
    matrices: int

    @property
    def total(self) -> int:
        return self.model + self.histograms + self.matrices

    def describe(self) -> str:
        return (f"{self.total:.3g} bytes = model {self.model:.3g} + histograms {self.histograms:.3g} + training "
                f"matrices {self.matrices:.3g}")


def memory(n_estimators: int, max_depth: int, trees_per_round: int, rows: int, num_numeric: int,
           vocab_sizes: Sequence[int] = ()) -> TreeMemory:
    """:class:`TreeMemory` of a tree job, from public inputs: the request and its features table's vocabularies."""
    trees, nodes = n_estimators * trees_per_round, most_nodes(n_estimators, max_depth, trees_per_round, rows)
    node = NODE_BYTES + CATEGORY_BYTES * (max(vocab_sizes, default=0) // 2)
    bins = MAX_BIN * num_numeric + sum(vocab_sizes)
    cached = min(HISTOGRAM_NODES, nodes_per_tree(max_depth, rows))
    return TreeMemory(trees * TREE_BYTES + nodes * node, cached * bins * BIN_BYTES,
                      rows * (num_numeric + len(vocab_sizes)) * CELL_BYTES)


PREDICT_ROWS = 65_536  # rows per prediction batch: a batch's matrix and outputs, not the whole table's
PREDICT_CELLS = 1 << 22  # outputs per prediction batch (rows × classes)


@dataclass
class GbdtResult:
    booster: xgb.Booster
    config: GbdtConfig
    best_epoch: int  # the round kept (1-based)
    history: list[dict] = field(default_factory=list)
    device: str = ""
    threads: int | None = None  # CPU threads for predictions (None: every core)
    num_classes: int | None = None  # class labels: K (the model's outputs per row); else None

    def predict(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        """On the label scale, like the MLP's: values (squared), rates (poisson), class probabilities (n, K)."""
        return self._batches(numeric, categorical, margins=False)

    def logits(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        """The margins (class logits (n, K) for classes), as the MLP's outputs."""
        return self._batches(numeric, categorical, margins=True)

    def _batches(self, numeric: np.ndarray, categorical: np.ndarray, *, margins: bool) -> np.ndarray:
        """In batches of :data:`PREDICT_ROWS` rows, fewer with many classes (at most :data:`PREDICT_CELLS` outputs):
        a features table's matrix and outputs are bounded by nothing a job declares, a batch's are."""
        rows = max(1, min(PREDICT_ROWS, PREDICT_CELLS // max(self.num_classes or 1, 1)))
        return in_batches(lambda n, c: np.asarray(self.booster.predict(matrix(n, c, threads=self.threads),
                                                                        output_margin=margins)),
                          numeric, categorical, rows)


def matrix(numeric: np.ndarray, categorical: np.ndarray, *, threads: int | None = None) -> xgb.DMatrix:
    """The preprocessed features as XGBoost takes them: numeric columns, then the categorical codes as native
    categorical features."""
    data, feature_types = columns(numeric, categorical)
    return xgb.DMatrix(data, feature_types=feature_types, enable_categorical=True, nthread=threads or -1)


def columns(numeric: np.ndarray, categorical: np.ndarray) -> tuple[np.ndarray, list[str]]:
    data = np.column_stack([np.asarray(numeric, np.float32), np.asarray(categorical, np.float32)])
    return data, ["q"] * numeric.shape[1] + ["c"] * categorical.shape[1]


def model_outputs(loss: str, predictions: jax.Array) -> jax.Array:
    """What XGBoost hands a metric (values, margins under the Poisson objective of ours, class probabilities) as the
    model outputs losses.LOSSES takes (for classes, log-probabilities: their log-softmax is themselves)."""
    if loss == "cross_entropy":
        return jnp.log(jnp.clip(predictions, MIN_PROBABILITY, 1.0))
    return jnp.reshape(predictions, (-1, 1))


def _poisson_gradient(margins: np.ndarray, data: xgb.DMatrix) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and hessian of e^η − y·η in η: finite for any label, negative ones included."""
    rate = np.exp(margins)
    return rate - data.get_label(), rate


class Rounds(xgb.callback.TrainingCallback):
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


def booster_params(config: GbdtConfig, num_classes: int | None, threads: int | None,
                   base_score: float | None) -> tuple[dict, Callable | None, int | None]:
    """XGBoost's parameters for ``config``, the custom objective (None: XGBoost's own) and the outputs per row of a
    class model (None: one). ``base_score``: the Poisson loss's starting rate, the training labels' mean."""
    params = {"objective": OBJECTIVES[config.loss], "device": device(), "tree_method": "hist",
              "eta": config.learning_rate, "max_depth": config.max_depth, "min_child_weight": config.min_child_weight,
              "subsample": config.subsample, "colsample_bytree": config.colsample, "lambda": config.reg_lambda,
              "seed": config.seed, "disable_default_eval_metric": 1, "max_cached_hist_node": HISTOGRAM_NODES,
              **({"nthread": threads} if threads else {})}
    objective = None
    outputs = losses.output_dim(config.loss, num_classes) if config.loss == "cross_entropy" else None
    if outputs is not None:
        params["num_class"] = outputs
    if config.loss == "poisson":
        # our gradient, under count:poisson's log link (kept for predictions); the rate starts at the mean label,
        # given, since XGBoost's own estimate of it refuses labels below 0 (floored: a rate is positive)
        objective = _poisson_gradient
        params["base_score"] = max(base_score or 0.0, 1e-3)
        params["max_delta_step"] = 0.7  # count:poisson's safeguard of the exponential's steps
    return params, objective, outputs


def train_gbdt(config: GbdtConfig, numeric: np.ndarray, categorical: np.ndarray, targets: np.ndarray, *,
               num_classes: int | None = None, on_epoch: Callable | None = None,
               deadline: float | Deadline | None = None, init_model: xgb.Booster | None = None,
               threads: int | None = None, validate_on: np.ndarray | None = None) -> GbdtResult:
    """Boost on (features, privatized targets): labels, or class ids. Validation: the job's split of the same
    privatized targets. ``init_model`` goes on boosting an earlier model (multi-stage training: up to
    ``n_estimators`` more rounds); ``validate_on`` the rows that may validate (:func:`features_party.learn.train.
    validation_split`). ``threads``: CPU threads (default: every core). Past ``deadline`` it raises
    ``TimeLimitExceeded`` (or ``Stopped``) before the next round."""
    if config.loss not in OBJECTIVES:
        raise ValueError(f"loss {config.loss!r} has no tree objective")
    check_deadline(deadline)
    val, fit_rows = validation_split(len(targets), config.validation_fraction, np.random.default_rng(config.seed),
                                     validate_on)
    eval_rows = val if val.size else fit_rows
    targets = np.asarray(targets, np.float32)
    data, feature_types = columns(numeric, categorical)
    fit = xgb.QuantileDMatrix(data[fit_rows], label=targets[fit_rows], feature_types=feature_types,
                              enable_categorical=True, nthread=threads or -1)
    validation = xgb.QuantileDMatrix(data[eval_rows], label=targets[eval_rows], feature_types=feature_types,
                                     enable_categorical=True, ref=fit, nthread=threads or -1)
    base_score = float(np.mean(targets[fit_rows])) if config.loss == "poisson" else None
    params, objective, outputs = booster_params(config, num_classes, threads, base_score)
    # compiled once per shape (the training and the validation rows), run on JAX's CPU device: on a GPU it would
    # take device memory from XGBoost's CUDA training for two numbers a round
    loss_fn = jax.jit(lambda predictions, labels: losses.LOSSES[config.loss](model_outputs(config.loss, predictions),
                                                                               labels))
    cpu = jax.devices("cpu")[0]

    def metric(predictions: np.ndarray, evaluated: xgb.DMatrix) -> tuple[str, float]:
        labels = evaluated.get_label()
        if config.loss == "cross_entropy":
            labels = np.rint(labels).astype(np.int32)
        with jax.default_device(cpu):
            return "loss", float(loss_fn(predictions, labels))

    rounds = Rounds(config, deadline, on_epoch)
    stopping = xgb.callback.EarlyStopping(rounds=config.early_stopping_rounds, metric_name="loss",
                                          data_name="validation", maximize=False, save_best=True)
    booster = xgb.train(params, fit, num_boost_round=config.n_estimators, obj=objective, custom_metric=metric,
                        evals=[(fit, "train"), (validation, "validation")], callbacks=[rounds, stopping],
                        verbose_eval=False, xgb_model=init_model)
    best = booster.num_boosted_rounds()  # save_best: the model ends at the best round
    summary = f"xgboost {xgb.__version__} on {params['device']}"
    log.info("trained on %s: best round %d of %d", summary, best, len(rounds.history))
    return GbdtResult(booster, config, best, rounds.history, summary, threads, outputs)
