"""Jobs on a features table imported as Parquet files (issue 43: :mod:`features_party.feature_datasets`), which may
be larger than memory: planned from the table's schema and DuckDB's scans (:func:`features_party.planning.plan_job`),
trained from disk.

What such a job does, in order: its release is requested as any fixed job's (its Idempotency-Key the job id, so
every attempt gets back what the first was charged for); the privatized labels are downloaded to a file; DuckDB
joins them with the table (:mod:`features_party.joined`), leaving out the rows the split holds out; the MLP or the
trees train from the joined rows' row groups (:mod:`features_party.learn.streamed`); the model is saved as an
in-memory job's is, and predictions for every row of the table stream to the predictions file. The job's
directory holds the labels, the joined rows and the learners' spill while it runs, and only the model and the
predictions once it is done.

What it does not do yet (refused when the job is created, before anything is requested): ``auto`` releases,
``lp-mst``, label-set and ALIBI releases (their targets are not one label a row) and ``release.example_ids``
(the job trains on every labelled row that has features and is not held out). Its estimate of the model's error
comes from estimate rows of its own release when that is unbiased (as an in-memory job's); a biased release's job
has none (an in-memory job asks for a release of its estimate rows, naming them). A release of a dataset whose
labels were uploaded covers the whole dataset: a request cannot name 10⁸ ids, so its rows without features are
charged too (a job on an in-memory table names its ids).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq

from features_party import id_lists, joined
from features_party import schemas as trainer_schemas
from features_party.attempt import Attempt, release_summary, save_model_file, succeed
from features_party.client import LabelsPartyClient
from features_party.context import TrainerContext
from features_party.learn import gbdt, spark_trees, streamed
from features_party.learn.gbdt import GbdtConfig, GbdtResult, threads_per_job
from features_party.learn.output import Output
from features_party.learn.train import Deadline, TrainResult
from features_party.planning import JobPlan
from features_party.reports import JobReport, estimate
from shared import schemas as shared_schemas
from shared.errors import ErrorCode, LabelDPError


def held_out_file(ctx: TrainerContext, org_id: int, split: trainer_schemas.HoldoutIds |
                  trainer_schemas.HoldoutFraction | None, work: Path, features: Path) -> Path | None:
    """The ids the job's split holds out, as a Parquet file DuckDB anti-joins: an id list's pinned file, or the
    table's ids under a holdout fraction (the rule of :func:`shared.splits.holdout_mask`, computed by DuckDB)."""
    if split is None:
        return None
    if isinstance(split, trainer_schemas.HoldoutIds):
        return Path(id_lists.pinned_file(ctx, org_id, split, stored=True)[0])
    out = work / "held-out.parquet"
    files = joined.files_literal(joined.parquet_files(features))
    rule = joined.uniform_sql("CAST(example_id AS VARCHAR)", f"{int(split.seed)}:")
    with joined.connection(work, ctx.settings.table_read_budget_bytes, 1) as con:
        con.execute(f"COPY (SELECT CAST(example_id AS VARCHAR) AS example_id FROM read_parquet({files}) "
                    f"WHERE {rule} < {float(split.holdout_fraction)!r}) TO '{joined.literal(out)}' (FORMAT parquet)")
    return out


def run(attempt: Attempt, org_id: int, plan: JobPlan, client: LabelsPartyClient, release: shared_schemas.Release,
        report: JobReport, deadline: Deadline, on_epoch) -> None:
    """Train a planned job from disk on its release and record its outcome (``on_epoch``: its progress)."""
    settings, request = attempt.ctx.settings, plan.request
    work = attempt.workdir / "rows"
    work.mkdir(parents=True, exist_ok=True)
    features = Path(plan.features_file)
    try:
        labels = client.download_labels_to(release.id, work / "labels.parquet")
        held = held_out_file(attempt.ctx, org_id, request.split, work, features)
        rows = _joined(plan, features, labels, held, work, settings)
        attempt.update(release_json=json.dumps(release_summary(release)),
                       num_train_examples=rows.fit.rows + rows.validation.rows,
                       epochs=plan.config.n_estimators if isinstance(plan.config, GbdtConfig) else plan.config.epochs)
        result = _train(attempt, plan, rows, work, deadline, on_epoch)
        output = Output()
        model_file = save_model_file(attempt.workdir, result, rows.fit.preprocessor,
                                     {"release_id": release.id, "mechanism": release.mechanism,
                                      "epsilon": release.epsilon, "trained_from": "disk"}, output)
        joined.predict_table(features, rows.fit.preprocessor, lambda n, c: output.apply(result.predict(n, c)),
                             attempt.workdir / "predictions.parquet", held_out=held, workdir=work,
                             memory_bytes=settings.table_read_budget_bytes)
        _estimate(report, plan, client, release, rows.estimate, lambda n, c: output.apply(result.predict(n, c)))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the labels, the joined rows, DuckDB's and XGBoost's spill
    succeed(attempt, result, model_file, report, epoch=len(result.history), metrics_json=json.dumps(result.history))


def _estimate(report: JobReport, plan: JobPlan, client: LabelsPartyClient, release: shared_schemas.Release,
              rows: streamed.Rows | None, predict) -> None:
    """The model's estimate on the job's estimate rows (their privatized labels from its own release, which must be
    unbiased: :func:`features_party.reports.estimate`), or why it has none. Their predictions and labels are held
    at once: 16 bytes a row, a tenth of the rows by default."""
    if rows is None:
        why = ("estimate_fraction is 0" if plan.request.estimate_fraction <= 0 else
               "the job's release is not unbiased, and jobs trained from disk cannot name estimate rows for a "
               "release of their own")
        report.warnings.append(f"no estimate of the model's test loss: {why}")
        return
    if rows.rows < 2:
        report.warnings.append(f"no estimate of the model's test loss: {rows.rows} estimate row(s)")
        return
    predictions = np.concatenate([predict(numeric, categorical) for numeric, categorical, _ in rows.chunks()])
    # the labels as released (float64: the learners' float32 copies are not the mechanism's outputs)
    labels = pq.read_table(rows.path, columns=[rows.target]).column(rows.target).to_numpy()
    estimate(report, client, release, np.asarray(labels, dtype=np.float64), predictions, plan.loss, plan.num_classes)


def _joined(plan: JobPlan, features: Path, labels: Path, held: Path | None, work: Path, settings) -> joined.Joined:
    request = plan.request
    try:
        rows = joined.join(features, labels, work, numeric=request.numeric, categorical=request.categorical,
                           seed=request.train.seed, validation_fraction=request.train.validation_fraction,
                           held_out=held, estimate_fraction=plan.estimate.fraction if plan.estimate else 0.0,
                           max_levels=gbdt.MAX_CATEGORIES, memory_bytes=settings.table_read_budget_bytes)
    except duckdb.Error as err:
        raise LabelDPError(f"the features table cannot be joined with the labels: {str(err).splitlines()[0]}",
                           code=ErrorCode.MALFORMED_FILE) from None
    if rows.fit.rows < settings.min_train_examples:
        raise LabelDPError(f"{rows.fit.rows} of the released example ids have features and are neither held out nor "
                           f"kept for validation; this trainer trains on at least {settings.min_train_examples} "
                           "(min_train_examples)", code=ErrorCode.TOO_FEW_EXAMPLES if rows.matched
                           else ErrorCode.NO_OVERLAP)
    return rows


def _train(attempt: Attempt, plan: JobPlan, rows: joined.Joined, work: Path, deadline: Deadline,
           on_epoch) -> TrainResult | GbdtResult:
    config, ctx = plan.config, attempt.ctx
    threads = threads_per_job(ctx.settings.workers)
    if plan.request.engine == "spark":  # planned only with a cluster, for trees of the losses it takes
        assert ctx.spark_jobs is not None and isinstance(config, GbdtConfig)
        result, _ran = spark_trees.fit(ctx.spark_jobs.session(), config, rows.fit, rows.validation,
                                       workers=ctx.settings.spark_workers, job=f"job-{attempt.job_id}",
                                       num_classes=plan.num_classes, on_epoch=on_epoch, deadline=deadline,
                                       threads=threads)
        return result
    if isinstance(config, GbdtConfig):
        base = rows.scaling.shift if config.loss == "poisson" else None
        return streamed.fit_gbdt(config, rows.fit, rows.validation, work / "xgb", num_classes=plan.num_classes,
                                 base_score=base, on_epoch=on_epoch, deadline=deadline, threads=threads)
    return streamed.fit_mlp(config, rows.fit, rows.validation, num_classes=plan.num_classes, scaling=rows.scaling,
                            on_epoch=on_epoch, deadline=deadline)
