"""Trees boosted on the trainer's Spark cluster (issue 43: a job's ``"engine": "spark"``).

XGBoost's PySpark estimator trains on the cluster's executors — ``workers`` of them at once, a barrier stage whose
tasks form XGBoost's collective — from the job's training and validation rows as :mod:`features_party.joined` wrote
them under the job's directory, which the executors read at the same path (the trainer's data volume is mounted on
every worker). Each executor preprocesses its rows with the job's preprocessor (fitted on the training rows by the
join), so the booster sees the columns an in-process fit sees: the numeric ones standardized, then the categorical
codes as native categorical features. It comes back to the driver, which saves it and predicts as for any tree job.

Only privatized labels reach these executors: the trainer's cluster is its own, apart from the labels party's,
whose executors read true labels (``docker-compose.yml`` gives each its own master, workers and secret).

What differs from an in-process fit (:func:`features_party.learn.streamed.fit_gbdt`): the squared and cross-entropy
losses only (the Poisson loss's gradient is the trainer's own function, which the estimator does not take); early
stopping on XGBoost's own validation metric (RMSE, which stops where the squared loss does; multi-class log loss,
which is the cross-entropy); the rounds' losses reported when boosting ends, not as it goes; the deadline and a
stop request cancel the job's Spark jobs (their group) rather than being checked between rounds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import xgboost as xgb

from features_party.learn import gbdt
from features_party.learn.gbdt import GbdtConfig, GbdtResult
from features_party.learn.streamed import Rows
from features_party.learn.train import Deadline, Stopped, TimeLimitExceeded, check_deadline

LOSSES = {"squared": "rmse", "cross_entropy": "mlogloss"}  # the losses trained on a cluster, and their stopping metric
VALIDATION = "validation"  # the column marking the validation rows (the estimator's validation indicator)
TARGET = "label"


def feature_columns(rows: Rows) -> list[str]:
    """The preprocessed features' columns, in the order :func:`features_party.learn.gbdt.columns` stacks them."""
    count = len(rows.preprocessor.numeric) + len(rows.preprocessor.categorical)
    return [f"f{i}" for i in range(count)]


def fit(spark, config: GbdtConfig, fit_rows: Rows, validation_rows: Rows, *, workers: int, job: str,
        num_classes: int | None = None, on_epoch: Callable | None = None,
        deadline: float | Deadline | None = None, threads: int | None = None) -> tuple[GbdtResult, dict]:
    """Boost on the cluster of ``spark`` (a session of :class:`shared.spark.runner.SparkJobs`) with ``workers``
    executor tasks; ``job``: the Spark job group its work runs in (cancelled past the deadline or on a stop);
    ``threads``: the driver's CPU threads for the model's predictions. Returns the result and where it ran
    (:func:`shared.spark.session.execution`)."""
    from shared.spark.session import execution

    if config.loss not in LOSSES:
        raise ValueError(f"loss {config.loss!r} is not trained on a cluster")
    check_deadline(deadline)
    rows = _prepared(spark, fit_rows, validation_rows)
    estimator = _estimator(config, fit_rows, workers, num_classes)
    with _cancelled_past(spark, deadline, job):
        model = estimator.fit(rows)
    ran = execution(spark)
    booster = model.get_booster()
    history = _history(config, model)
    best = int(booster.attr("best_iteration") or len(history) - 1)
    booster = booster[: best + 1]  # the round early stopping kept, as an in-process fit saves it
    booster.feature_names = None  # the driver predicts from arrays, as for every tree model
    for record in history:
        if on_epoch is not None:
            on_epoch(record)
    outputs = num_classes if config.loss == "cross_entropy" else None
    summary = (f"xgboost {xgb.__version__} on Spark ({ran['application_id']}: {ran['executors']} executors, "
               f"{workers} workers)")
    return GbdtResult(booster, config, best + 1, history, summary, threads, outputs), ran


def _prepared(spark, fit_rows: Rows, validation_rows: Rows):
    """Both parts' rows as one DataFrame: the preprocessed features, the target and the validation mark, each
    executor transforming its own row groups."""
    from pyspark.sql import functions as F

    preprocessor, columns = fit_rows.preprocessor, feature_columns(fit_rows)
    raw = list(dict.fromkeys((*preprocessor.numeric, *preprocessor.categorical)))

    def part(rows: Rows, validation: bool):
        frame = spark.read.parquet(rows.path.resolve().as_uri()).select(*[F.col(f"`{c}`") for c in raw],
                                                                        F.col(rows.target).alias(TARGET))
        return frame.withColumn(VALIDATION, F.lit(validation))

    def transform(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in batches:
            numeric, categorical = preprocessor.transform(frame)
            data, _types = gbdt.columns(numeric, categorical)
            out = pd.DataFrame(data, columns=columns)
            out[TARGET] = frame[TARGET].to_numpy(np.float32)
            out[VALIDATION] = frame[VALIDATION].to_numpy(bool)
            yield out

    schema = ", ".join([*(f"{c} float" for c in columns), f"{TARGET} float", f"{VALIDATION} boolean"])
    return part(fit_rows, False).unionByName(part(validation_rows, True)).mapInPandas(transform, schema)


def _estimator(config: GbdtConfig, rows: Rows, workers: int, num_classes: int | None):
    from xgboost.spark import SparkXGBRegressor

    numeric, categorical = len(rows.preprocessor.numeric), len(rows.preprocessor.categorical)
    common: dict[str, Any] = dict(
        features_col=feature_columns(rows), label_col=TARGET, validation_indicator_col=VALIDATION,
        num_workers=workers, n_estimators=config.n_estimators, max_depth=config.max_depth,
        learning_rate=config.learning_rate, min_child_weight=config.min_child_weight, subsample=config.subsample,
        colsample_bytree=config.colsample, reg_lambda=config.reg_lambda, random_state=config.seed,
        max_bin=gbdt.MAX_BIN, tree_method="hist", device="cpu", early_stopping_rounds=config.early_stopping_rounds,
        eval_metric=LOSSES[config.loss], feature_types=["q"] * numeric + ["c"] * categorical,
        max_cached_hist_node=gbdt.HISTOGRAM_NODES, force_repartition=True)
    if config.loss == "cross_entropy":  # the regressor's estimator with the class objective: K outputs whatever
        # classes the rows hold (the classifier's would infer K from them, and two classes as one logistic output)
        return SparkXGBRegressor(**common, objective=gbdt.OBJECTIVES["cross_entropy"], num_class=num_classes)
    return SparkXGBRegressor(**common, objective=gbdt.OBJECTIVES["squared"])


def _history(config: GbdtConfig, model) -> list[dict]:
    """Each round's mean losses in label units, as an in-process fit records them (no time a round: the cluster's
    rounds are not timed one by one)."""
    summary = model.training_summary
    metric = LOSSES[config.loss]
    train = list(summary.train_objective_history.get(metric, []))
    validation = list(summary.validation_objective_history.get(metric, []))

    def loss(value: float) -> float:
        return value * value / 2.0 if config.loss == "squared" else value  # ½ MSE, as losses.LOSSES' squared

    return [{"epoch": i + 1, "train_loss": loss(t), "val_loss": loss(v),
             **({"val_mse": v * v} if config.loss == "squared" else {}), "seconds": 0.0}
            for i, (t, v) in enumerate(zip(train, validation, strict=False))]


@contextlib.contextmanager
def _cancelled_past(spark, deadline: float | Deadline | None, job: str) -> Iterator[None]:
    """The block's Spark jobs in group ``job``, cancelled once ``deadline`` passes or its stop is set: then the
    block's failure is :class:`TimeLimitExceeded` (or :class:`Stopped`)."""
    context = spark.sparkContext
    context.setJobGroup(job, "a labeldp trainer job", interruptOnCancel=True)
    done = threading.Event()
    reason: list[TimeLimitExceeded | Stopped] = []

    def watch() -> None:
        while not done.wait(0.5):
            if not reason:
                try:
                    check_deadline(deadline)
                except (TimeLimitExceeded, Stopped) as stopped:
                    reason.append(stopped)
            if reason:  # each tick until the block ends: a job submitted after a cancel is cancelled too (under
                # load the first cancel came before the block's job started, which then ran its course)
                context.cancelJobGroup(job)

    watcher = threading.Thread(target=watch, name=f"deadline-{job}", daemon=True)
    watcher.start()
    try:
        yield
    except Exception:
        if reason:
            raise reason[0] from None
        raise
    finally:
        done.set()
        watcher.join()
        context.setLocalProperty("spark.jobGroup.id", None)
