"""A training job of the features party: request a release, download it, join by example id, fit the
preprocessing on the rows it trains on, train, save the model and the predictions.

:func:`start` requests the release synchronously (its refusals become 4xx for the caller) and queues the rest in
the trainer's fair queue (:mod:`.scheduling`: organizations take turns on the executor's workers). A running job
has a deadline (``max_job_seconds``): training checks it between device calls and stops, freeing its worker, and
the job fails with ``job_time_limit``. Progress goes to the job's database row as it happens; the labels-party API
key lives only in this process's memory for the job's duration.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from features_party import db
from features_party.client import LabelsPartyClient, LabelsPartyError
from features_party.context import TrainerContext
from features_party.features import ID, Preprocessor
from features_party.planning import JobPlan, labels_party_client, load_frame, upstream_error
from features_party.train import TimeLimitExceeded, TrainConfig, save_model, train
from shared import schemas
from shared.errors import LabelDPError
from shared.mechanisms.subset import SubsetSelectionRandomizer
from shared.service.errors import ErrorCode

log = logging.getLogger("labeldp.jobs")


def fail_unexpectedly(ctx: TrainerContext, job_id: str) -> None:
    """A job whose start or resume failed on something other than a refusal: failed, so that it does not hold its
    organization's slot for ever."""
    _update(ctx, job_id, status="failed", error="internal error while starting the job",
            error_code=ErrorCode.INTERNAL_ERROR.value)


def _update(ctx: TrainerContext, job_id: str, **fields) -> None:
    with ctx.sessions() as session, session.begin():
        row = session.get(db.Job, job_id)
        for name, value in fields.items():
            setattr(row, name, value)
        row.updated_at = db.utcnow()


def release_summary(release: schemas.Release) -> dict:
    return {"id": release.id, "mechanism": release.mechanism, "epsilon": release.epsilon,
            "charged_epsilon": release.charged_epsilon, "certified_epsilon": release.certified_epsilon,
            "prior_epsilon": release.prior_epsilon,
            "num_examples": release.num_examples, "mechanism_hash": release.mechanism_hash,
            "num_outputs": release.description.get("num_outputs")}


def start(ctx: TrainerContext, job_id: str, org_id: int, plan: JobPlan, *, resume: bool = False) -> None:
    """Request the release (single protocol; the job id is its Idempotency-Key, so a resume gets the same one),
    or take the existing one the job names, and queue the training. Raises the 4xx of a refused release; nothing
    is queued then."""
    client = labels_party_client(ctx, plan.url, plan.request.api_key)
    release = plan.existing_release
    try:
        if release is None and plan.request.protocol == "single":
            requested = plan.request.release
            assert requested is not None  # plan_job: a job without an existing release gives the one to request
            try:
                release = client.request_release(plan.request.dataset_id, requested, idempotency_key=job_id)
            except (LabelsPartyError, httpx.HTTPError) as err:
                raise upstream_error(err, plan.labels_party) from None
        if release is not None:
            _update(ctx, job_id, release_json=json.dumps(release_summary(release)))
    except BaseException:
        client.close()
        raise

    def work():
        try:
            if release is not None:
                run_single(ctx, job_id, plan, client, release)
            else:
                run_multistage(ctx, job_id, plan, client)
        finally:
            client.close()

    ctx.queue.put(org_id, work)
    ctx.executor.submit(ctx.queue.run_next)  # a turn: it runs the job whose organization's turn it is
    log.info("job %s %s (labels party %s)", job_id, "resumed" if resume else "queued", plan.labels_party)


@contextlib.contextmanager
def _running(ctx: TrainerContext, job_id: str):
    """Marks the job running and yields its deadline (``time.monotonic()``); on any error records it as failed
    with an error code (the service stays up); records the duration."""
    started, limit = time.perf_counter(), ctx.settings.max_job_seconds
    _update(ctx, job_id, status="running")
    try:
        yield time.monotonic() + limit
    except TimeLimitExceeded:
        log.warning("job %s stopped at the time limit of %g s", job_id, limit)
        _update(ctx, job_id, status="failed", error_code=ErrorCode.JOB_TIME_LIMIT.value,
                error=f"stopped after {time.perf_counter() - started:.0f} s: over this trainer's limit of {limit:g} "
                      "s per job (max_job_seconds)")
    except (LabelsPartyError, httpx.HTTPError) as err:
        log.warning("job %s: labels party failed: %s", job_id, type(err).__name__)
        failure = upstream_error(err, "of this job")
        _update(ctx, job_id, status="failed", error=str(failure), error_code=failure.code)
    except Exception as err:
        log.exception("job %s failed", job_id)
        if isinstance(err, LabelDPError):
            _update(ctx, job_id, status="failed", error=str(err), error_code=err.code)
        else:
            _update(ctx, job_id, status="failed", error=f"{type(err).__name__} while training",
                    error_code=ErrorCode.TRAINING_FAILED.value)
    finally:
        _update(ctx, job_id, seconds=time.perf_counter() - started)


def _progress(ctx: TrainerContext, job_id: str):
    history: list[dict] = []

    def on_epoch(record: dict) -> None:
        history.append(record)
        _update(ctx, job_id, epoch=record["epoch"], metrics_json=json.dumps(history))

    return on_epoch


def training_targets(table: pa.Table, release: schemas.Release) -> np.ndarray:
    """Targets from a downloaded release: labels, or unbiased weights for label sets (subset selection)."""
    names = table.schema.names
    if "label" in names:
        return table.column("label").to_numpy()
    sets = np.stack([table.column(n).to_numpy(zero_copy_only=False) for n in names if n.startswith("in_class_")],
                    axis=1)
    return SubsetSelectionRandomizer.from_description(release.description).unbiased_weights(sets)


def run_single(ctx: TrainerContext, job_id: str, plan: JobPlan, client: LabelsPartyClient,
               release: schemas.Release) -> None:
    with _running(ctx, job_id) as deadline:
        table = client.download_labels(release.id)
        features = load_frame(plan.features_file)
        ids = pd.Index(table.column("example_id").to_pylist())
        present = features.index.intersection(ids)
        if len(present) < ctx.settings.min_train_examples:  # an existing release or a source dataset's: planning
            # named every id otherwise, and the labels party refused any it lacks before charging
            raise LabelDPError(f"{len(present)} of the released example ids have features; this trainer trains on at "
                               f"least {ctx.settings.min_train_examples} (min_train_examples)",
                               code="too_few_examples" if len(present) else "no_overlap")
        position = pd.Series(np.arange(len(ids)), index=ids)[present].to_numpy()
        targets = training_targets(table, release)[position]
        del table
        config = plan.config
        if config.loss == "cross_entropy":
            targets = np.rint(targets).astype(np.int32)
        rows = features.loc[present]
        preprocessor = Preprocessor.fit(rows, plan.request.numeric, plan.request.categorical)  # training rows only
        numeric, categorical = preprocessor.transform(rows)
        _update(ctx, job_id, epochs=config.epochs, num_train_examples=len(present))
        result = train(config, numeric, categorical, targets, vocab_sizes=preprocessor.vocab_sizes,
                       num_classes=plan.num_classes, on_epoch=_progress(ctx, job_id), deadline=deadline)
        _finish(ctx, job_id, result, preprocessor, features,
                {"release_id": release.id, "mechanism": release.mechanism, "epsilon": release.epsilon})


def run_multistage(ctx: TrainerContext, job_id: str, plan: JobPlan, client: LabelsPartyClient) -> None:
    """LP-MST as a trainer job: the stages' releases happen inside the job (each stage needs the last model);
    their Idempotency-Keys start with the job id, so a resumed job gets the same releases back."""
    from features_party.multistage import train_multistage

    request, num_classes = plan.request, plan.num_classes
    release = request.release
    with _running(ctx, job_id) as deadline:
        # plan_job: an lp-mst job requests its own releases, of a classes dataset
        assert release is not None and num_classes is not None
        features = load_frame(plan.features_file)
        ids = pd.Index(release.example_ids) if release.example_ids else features.index
        rows = features.loc[ids]
        preprocessor = Preprocessor.fit(rows, request.numeric, request.categorical)
        numeric, categorical = preprocessor.transform(rows)
        config: TrainConfig = plan.config
        _update(ctx, job_id, epochs=config.epochs * request.stages, num_train_examples=len(rows))
        result, reports = train_multistage(client, request.dataset_id, rows.index.to_numpy(), numeric, categorical,
                                           vocab_sizes=preprocessor.vocab_sizes, num_classes=num_classes,
                                           epsilon=release.epsilon, stages=request.stages, config=config,
                                           temperature=request.temperature, seed=config.seed,
                                           key_prefix=f"{job_id}-", deadline=deadline)
        stages = [dict(r.__dict__) for r in reports]
        _update(ctx, job_id, metrics_json=json.dumps(stages), release_json=json.dumps({
            "stages": stages, "epsilon": release.epsilon,
            "certified_epsilon": max(r.certified_epsilon for r in reports)}))
        _finish(ctx, job_id, result, preprocessor, features, {"protocol": "lp-mst", "stages": stages,
                                                               "epsilon": release.epsilon})


def _finish(ctx: TrainerContext, job_id: str, result, preprocessor: Preprocessor, features: pd.DataFrame,
            extra: dict) -> None:
    """Save the model and the predictions for every row of the features table (Parquet, streamed on request)."""
    workdir = ctx.data_dir / "jobs" / job_id
    workdir.mkdir(parents=True, exist_ok=True)
    save_model(workdir / "model.npz", result, preprocessor.to_dict(), extra)
    numeric, categorical = preprocessor.transform(features)
    predicted = result.predict(numeric, categorical)
    columns = {ID: pa.array(features.index.astype(str).to_numpy())}
    if predicted.ndim == 2:
        columns["prediction"] = pa.array(predicted.argmax(axis=1))
        columns.update({f"p_class_{k}": pa.array(predicted[:, k]) for k in range(predicted.shape[1])})
    else:
        columns["prediction"] = pa.array(predicted)
    pq.write_table(pa.table(columns), workdir / "predictions.parquet")
    _update(ctx, job_id, status="succeeded", model_file=str(workdir / "model.npz"),
            predictions_file=str(workdir / "predictions.parquet"), device=result.device)


def predictions_frame(model_path: str | Path, features: pd.DataFrame) -> pd.DataFrame:
    """Predictions of a saved model on a features table (``labeldp predict``)."""
    from features_party.train import load_model

    result, header = load_model(model_path)
    numeric, categorical = Preprocessor.from_dict(header["preprocessing"]).transform(features)
    predicted = result.predict(numeric, categorical)
    if predicted.ndim == 2:
        frame = pd.DataFrame(predicted, columns=[f"p_class_{k}" for k in range(predicted.shape[1])])
        frame.insert(0, "prediction", predicted.argmax(axis=1))
    else:
        frame = pd.DataFrame({"prediction": predicted})
    frame.insert(0, ID, features.index.to_numpy())
    return frame
