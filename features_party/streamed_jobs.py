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
``lp-mst``, label-set and ALIBI releases (their targets are not one label a row), ``release.example_ids`` (the
job trains on every labelled row that has features and is not held out), and a holdout estimate of the model's
error (the report says so). A release of a dataset whose labels were uploaded covers the whole dataset: a request
cannot name 10⁸ ids, so its rows without features are charged too (a job on an in-memory table names its ids).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb

from features_party import id_lists, joined
from features_party import schemas as trainer_schemas
from features_party.attempt import Attempt, release_summary, save_model_file, succeed
from features_party.client import LabelsPartyClient
from features_party.context import TrainerContext
from features_party.learn import gbdt, streamed
from features_party.learn.gbdt import GbdtConfig, GbdtResult, threads_per_job
from features_party.learn.output import Output
from features_party.learn.train import Deadline, TrainResult
from features_party.planning import JobPlan
from features_party.reports import JobReport
from shared import schemas as shared_schemas
from shared.errors import ErrorCode, LabelDPError

NO_ESTIMATE = "no private estimate of the model's error: jobs trained from disk keep no estimate rows yet"


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
    rule = holdout_uniform("CAST(example_id AS VARCHAR)", split.seed)
    with joined.connection(work, ctx.settings.table_read_budget_bytes, 1) as con:
        con.execute(f"COPY (SELECT CAST(example_id AS VARCHAR) AS example_id FROM read_parquet({files}) "
                    f"WHERE {rule} < {float(split.holdout_fraction)!r}) TO '{joined.literal(out)}' (FORMAT parquet)")
    return out


def holdout_uniform(expression: str, seed: int) -> str:
    """SQL for :func:`shared.splits.holdout_uniforms` of an id: the top 53 bits of SHA-256("{seed}:{id}") / 2^53."""
    return (f"(('0x' || substr(sha256('{int(seed)}:' || {expression}), 1, 16))::UBIGINT >> 11)::DOUBLE "
            "/ 9007199254740992.0")


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
        attempt.update(release_json=json.dumps(release_summary(release)), num_train_examples=rows.fit.rows,
                       epochs=plan.config.n_estimators if isinstance(plan.config, GbdtConfig) else plan.config.epochs)
        result = _train(plan, rows, work, deadline, on_epoch, threads_per_job(settings.workers))
        output = Output()
        model_file = save_model_file(attempt.workdir, result, rows.fit.preprocessor,
                                     {"release_id": release.id, "mechanism": release.mechanism,
                                      "epsilon": release.epsilon, "trained_from": "disk"}, output)
        joined.predict_table(features, rows.fit.preprocessor, lambda n, c: output.apply(result.predict(n, c)),
                             attempt.workdir / "predictions.parquet", held_out=held, workdir=work,
                             memory_bytes=settings.table_read_budget_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the labels, the joined rows, DuckDB's and XGBoost's spill
    report.warnings.append(NO_ESTIMATE)
    succeed(attempt, result, model_file, report, epoch=len(result.history), metrics_json=json.dumps(result.history))


def _joined(plan: JobPlan, features: Path, labels: Path, held: Path | None, work: Path, settings) -> joined.Joined:
    request = plan.request
    try:
        rows = joined.join(features, labels, work, numeric=request.numeric, categorical=request.categorical,
                           seed=request.train.seed, validation_fraction=request.train.validation_fraction,
                           held_out=held, max_levels=gbdt.MAX_CATEGORIES, memory_bytes=settings.table_read_budget_bytes,
                           threads=threads_per_job(settings.workers))
    except duckdb.Error as err:
        raise LabelDPError(f"the features table cannot be joined with the labels: {str(err).splitlines()[0]}",
                           code=ErrorCode.MALFORMED_FILE) from None
    if rows.fit.rows < settings.min_train_examples:
        raise LabelDPError(f"{rows.fit.rows} of the released example ids have features and are neither held out nor "
                           f"kept for validation; this trainer trains on at least {settings.min_train_examples} "
                           "(min_train_examples)", code=ErrorCode.TOO_FEW_EXAMPLES if rows.matched
                           else ErrorCode.NO_OVERLAP)
    return rows


def _train(plan: JobPlan, rows: joined.Joined, work: Path, deadline: Deadline, on_epoch,
           threads: int) -> TrainResult | GbdtResult:
    config = plan.config
    if isinstance(config, GbdtConfig):
        base = rows.scaling.shift if config.loss == "poisson" else None
        return streamed.fit_gbdt(config, rows.fit, rows.validation, work / "xgb", num_classes=plan.num_classes,
                                 base_score=base, on_epoch=on_epoch, deadline=deadline, threads=threads)
    return streamed.fit_mlp(config, rows.fit, rows.validation, num_classes=plan.num_classes, scaling=rows.scaling,
                            on_epoch=on_epoch, deadline=deadline)
