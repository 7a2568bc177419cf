"""A training job of the features party: request a release, download it, join by example id, fit the
preprocessing on the rows it trains on, train, save the model and the predictions — run by whichever replica's
worker claims it.

**The jobs table is the queue.** ``POST /v1/jobs`` (:mod:`.service`) plans a job and requests its release while
holding the new row under its own lease (:func:`creating`), then leaves it ``queued``; the workers of every trainer
process (:func:`make_runner`, a :class:`~shared.service.leases.JobRunner` per process, started by ``serve``) claim
queued and ``interrupted`` jobs that are due, fairly across organizations (:func:`_fair_order`: the organization
whose last job started longest ago first, never started first, then the oldest job), and run them
(:class:`Attempt`). The labels-party API key a job runs with is stored sealed under the deployment's secret key
(``sealed_api_key``, :mod:`shared.service.sealing`), so any replica can run it, and cleared when the job ends.

**Charged once.** Every attempt requests the job's release again with the same Idempotency-Key, the job id: the
labels party answers the release it already committed (no second draw, no second charge), so a job may be redone
from the start whenever its outcome is in doubt — the answer to the release request lost (a transport error, a
5xx: the job is ``interrupted`` and retried after ``upstream_retry_seconds``), its worker's process dead (its lease
expires and another worker takes it over), or its worker cut off (it lost its lease: the ``lost`` event stops its
training at the next deadline check, and it records nothing — every write of an attempt is fenced by
:meth:`~shared.service.leases.LeaseTable.held`). LP-MST stage keys start with the job id. Attempts are bounded
(``job_max_attempts``; then ``failed``, ``job_attempts_exhausted``). A sealed key that cannot be opened (no secret
key, or another one) leaves the job ``interrupted`` with ``secret_key_missing``; ``POST /v1/jobs/{id}/resume``
with the API key seals it again.

A running job has a deadline (``max_job_seconds``): training checks it between device calls and stops, freeing its
worker, and the job fails with ``job_time_limit``. Each attempt writes its files in its own directory, recorded
only by the attempt that finishes holding the lease.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Collection, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import xgboost as xgb
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, aliased

from features_party import db, streamed_jobs
from features_party import schemas as trainer_schemas
from features_party.attempt import Attempt, LeaseLost, finish, release_summary
from features_party.auto import run_auto
from features_party.client import LabelsPartyClient, LabelsPartyError, ReleaseFailed
from features_party.context import TrainerContext
from features_party.features import ID, Preprocessor
from features_party.learn import shrinkage
from features_party.learn.gbdt import GbdtConfig, GbdtResult, threads_per_job, train_gbdt
from features_party.learn.gbdt_file import is_model_file as is_gbdt_model
from features_party.learn.gbdt_file import load_model as load_gbdt
from features_party.learn.output import Output
from features_party.learn.targets import training_targets
from features_party.learn.train import Deadline, Stopped, TimeLimitExceeded, TrainResult, train
from features_party.parts import VALIDATION_FALLBACK
from features_party.planning import (
    ESTIMATE_KEY,
    MECHANISM_REFUSALS,
    JobPlan,
    labels_party_client,
    load_frame,
    plan_job,
    upstream_error,
)
from features_party.reports import JobReport, estimate, labels_by_id, privatized
from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.service.leases import JobRunner, Lease, LeaseTable

log = logging.getLogger("labeldp.jobs")

CLAIMABLE = ("queued", "interrupted")  # an interrupted job is claimed once due (run_after) and holding its key
RUNNING = "running"
# plan_job's codes for a labels party that could not be read: the job may be retried (nothing was charged)
UPSTREAM_TRANSIENT = (ErrorCode.LABELS_PARTY_UNREACHABLE.value, ErrorCode.LABELS_PARTY_FAILED.value)


def api_key_context(job_id: str) -> str:
    """What a job's sealed API key is bound to: it opens for this job's row only."""
    return f"labels-api-key:{job_id}"


def seal_api_key(ctx: TrainerContext, job_id: str, api_key: str) -> bytes:
    return ctx.sealer.seal(api_key.encode(), api_key_context(job_id))


# -- the queue -------------------------------------------------------------------------------------------------

class JobTable(LeaseTable):
    """The jobs table as leased: a claim also records when the job started (its organization's turn)."""

    def claim(self, session: Session, owner: str, lease_seconds: float, *,
              holding: Collection[str] = ()) -> Lease | None:
        lease = super().claim(session, owner, lease_seconds, holding=holding)
        if lease is not None:
            row = session.get(db.Job, lease.job_id)  # the row claim locked, from the session
            assert row is not None
            row.started_at = row.updated_at = db.utcnow()
        return lease


def _fair_order() -> tuple[Any, ...]:
    """Claim order before the oldest job first: the organization whose last job started longest ago (one that
    never started a job first), so one organization's backlog waits behind another's next job."""
    earlier = aliased(db.Job)
    last_started = (select(func.max(earlier.started_at)).where(earlier.org_id == db.Job.org_id)
                    .correlate(db.Job).scalar_subquery())
    return (last_started.asc().nulls_first(),)


def _exhausted(_session: Session, row: db.Job) -> None:
    row.status, row.error_code, row.sealed_api_key = "failed", ErrorCode.JOB_ATTEMPTS_EXHAUSTED.value, None
    row.error = (f"the job was started {row.attempts} times without finishing (its workers stopped, or its labels "
                 "party kept failing): this trainer's limit (job_max_attempts)")
    row.updated_at = db.utcnow()


def job_table(ctx: TrainerContext) -> JobTable:
    return JobTable(db.Job, "status", CLAIMABLE, RUNNING, max_attempts=ctx.settings.job_max_attempts,
                    exhausted=_exhausted, order_by=_fair_order,
                    where=lambda: (db.Job.sealed_api_key.is_not(None),))  # else only a resume runs it


def make_runner(ctx: TrainerContext) -> JobRunner:
    """A process's job workers (``workers`` threads) on the jobs table; ``serve`` starts them, tests call
    ``run_pending()`` or start them. Each runner is its own lease owner (host:pid:random)."""
    settings, table = ctx.settings, job_table(ctx)
    return JobRunner("train", ctx.sessions, table, lambda lease, lost: run(ctx, table, lease, lost),
                     threads=settings.workers, lease_seconds=settings.job_lease_seconds,
                     poll_seconds=settings.job_poll_seconds, retry_seconds=settings.upstream_retry_seconds,
                     retry_state="queued")


# -- a job being created ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def creating(ctx: TrainerContext, job_id: str) -> Iterator[None]:
    """While ``POST /v1/jobs`` plans the job it inserted (``queued``, leased to this process, attempt 0) and
    requests its release, its lease is renewed here; if the process dies, the lease expires and a worker takes the
    job from the start (its release requested with the same key)."""
    settings, owner, stop = ctx.settings, ctx.jobs.owner, threading.Event()

    def renew() -> None:  # a thread of its own, every tenth of the lease, like the workers' heartbeat
        while not stop.wait(ctx.jobs.renew_seconds):
            try:
                with ctx.sessions() as session, session.begin():
                    session.execute(update(db.Job).where(*created_by(owner, job_id)).values(
                        lease_expires_at=db.utcnow() + timedelta(seconds=settings.job_lease_seconds)))
            except Exception:  # the database is away: the lease may expire, and a worker then does the job
                log.warning("job %s: cannot renew the lease of its creation", job_id, exc_info=True)

    renewer = threading.Thread(target=renew, name=f"create-{job_id[:8]}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()


def created_by(owner: str, job_id: str) -> tuple[Any, ...]:
    """A job still held by the request that created it (no worker has claimed it)."""
    return (db.Job.id == job_id, db.Job.lease_owner == owner, db.Job.status == "queued", db.Job.attempts == 0)


@contextlib.contextmanager
def created_row(ctx: TrainerContext, job_id: str) -> Iterator[db.Job | None]:
    """The job's row, locked, while the creating request still holds it; None once a worker has it (the worker's
    outcome is the job's: the request then answers the job as it is)."""
    with ctx.sessions() as session, session.begin():
        row = session.scalar(select(db.Job).where(*created_by(ctx.jobs.owner, job_id)).with_for_update())
        yield row
        if row is not None:
            row.updated_at = db.utcnow()


def upstream_outcome(err: BaseException) -> str:
    """What a failed call to the labels party means for a job: ``"refused"`` (a 4xx: nothing was charged),
    ``"failed"`` (a release charged whose computation failed for good: the job fails) or ``"retry"`` (anything
    else — unreachable, a 5xx, an answer lost or unreadable, still being computed: the release may have been
    charged, so the job keeps its key and asks again later, getting the same release back)."""
    if isinstance(err, ReleaseFailed):
        return "failed"
    if isinstance(err, LabelsPartyError) and 400 <= err.status < 500 and err.code != "release_in_progress":
        return "refused"
    if isinstance(err, LabelDPError):  # plan_job's own reading of the labels party
        return "retry" if err.code in UPSTREAM_TRANSIENT else "refused"
    return "retry"


def retry_error(err: BaseException, party: str) -> LabelDPError:
    """The error a job waiting to ask its labels party again shows (never the upstream body)."""
    if isinstance(err, LabelDPError):
        return err
    if isinstance(err, LabelsPartyError | httpx.HTTPError):
        return upstream_error(err, party)
    return LabelDPError(f"labels party {party!r} answered what the trainer could not read",
                        code=ErrorCode.LABELS_PARTY_FAILED)


def run(ctx: TrainerContext, table: LeaseTable, lease: Lease, lost: threading.Event) -> None:
    """A worker's run of a job it claimed (the JobRunner's callback)."""
    attempt = Attempt(ctx, table, lease, lost)
    try:
        _execute(attempt)
    except LeaseLost:
        log.warning("job %s: attempt %d lost its lease to another worker and recorded nothing", lease.job_id,
                    lease.attempt)
    finally:
        if not attempt.succeeded:
            shutil.rmtree(attempt.workdir, ignore_errors=True)


def _execute(attempt: Attempt) -> None:
    ctx, job_id = attempt.ctx, attempt.job_id
    with attempt.holding() as row:
        org_id, stored, sealed = row.org_id, json.loads(row.request_json), row.sealed_api_key
        labels_party = row.labels_party
        row.epoch, row.metrics_json, row.error, row.error_code = 0, "[]", None, None
    log.info("job %s: attempt %d by %s", job_id, attempt.lease.attempt, attempt.lease.owner)
    try:
        assert sealed is not None  # claims take jobs holding a sealed key only
        api_key = ctx.sealer.open(sealed, api_key_context(job_id)).decode()
    except LabelDPError as err:  # secret_key_missing, sealed_secret_damaged: the key must be given again
        log.warning("job %s: its labels-party API key cannot be opened (%s)", job_id, err.code)
        attempt.interrupt(LabelDPError(f"{err} — resume the job with the labels-party api_key", code=err.code),
                          retry_seconds=None)
        return
    limit = ctx.settings.max_job_seconds
    deadline = Deadline(time.monotonic() + limit, attempt.lost)

    def took() -> float:
        return time.perf_counter() - attempt.started

    try:
        plan = plan_job(ctx, org_id, trainer_schemas.JobRequest(**stored, api_key=api_key), stored=True)
        with labels_party_client(ctx, plan.url, api_key) as client:
            if plan.auto is not None:
                run_auto(attempt, plan, client, deadline)
            else:
                _run_fixed(attempt, org_id, plan, client, deadline)
    except (LeaseLost, Stopped):
        raise LeaseLost(job_id) from None
    except TimeLimitExceeded:
        log.warning("job %s stopped at the time limit of %g s", job_id, limit)
        attempt.end("failed", error_code=ErrorCode.JOB_TIME_LIMIT.value, seconds=took(),
                    error=f"stopped after {took():.0f} s: over this trainer's limit of {limit:g} s per job "
                          "(max_job_seconds)")
    except (LabelsPartyError, httpx.HTTPError, TimeoutError, LabelDPError) as err:
        outcome = upstream_outcome(err) if not _own_refusal(err) else "refused"
        if outcome == "retry":
            log.warning("job %s: labels party failed (%s): asking again in %g s", job_id, type(err).__name__,
                        ctx.settings.upstream_retry_seconds)
            attempt.interrupt(retry_error(err, labels_party), retry_seconds=ctx.settings.upstream_retry_seconds,
                              seconds=took())
        elif isinstance(err, LabelDPError):
            log.warning("job %s failed: %s", job_id, err.code)
            attempt.fail(err, seconds=took())
        else:
            log.warning("job %s: labels party refused (%s)", job_id, type(err).__name__)
            attempt.fail(upstream_error(err, labels_party), seconds=took())
    except Exception as err:
        log.exception("job %s failed", job_id)
        attempt.end("failed", error=f"{type(err).__name__} while training", seconds=took(),
                    error_code=ErrorCode.TRAINING_FAILED.value)


def _run_fixed(attempt: Attempt, org_id: int, plan: JobPlan, client: LabelsPartyClient, deadline: Deadline) -> None:
    """A fixed-mechanism job once planned: its releases, then its training — from disk (a table imported as Parquet
    files), on its one release, or by stages (lp-mst)."""
    release, report = plan.existing_release, JobReport()
    estimate = request_releases(plan, client, attempt.job_id, report)
    release = estimate.pop("", release)  # the job's own release, asked for again: the one first charged
    if plan.streamed:
        assert release is not None  # (a streamed job is single: its release, or an existing one)
        streamed_jobs.run(attempt, org_id, plan, client, release, report, deadline,
                          _progress(attempt, every_seconds=1.0))
    elif release is not None:
        attempt.update(release_json=json.dumps(release_summary(release)))
        run_single(attempt, plan, client, release, estimate.get(ESTIMATE_KEY), report, deadline)
    else:
        run_multistage(attempt, plan, client, estimate.get(ESTIMATE_KEY), report, deadline)


def request_releases(plan: JobPlan, client: LabelsPartyClient, job_id: str,
                     report: JobReport) -> dict[str, schemas.Release]:
    """The releases a fixed-mechanism job asks for before it trains (:meth:`JobPlan.releases`), by key suffix, each
    with the job id in its Idempotency-Key — so every attempt gets back what the first was charged for. The
    estimate rows' own release refused (nothing charged for it) leaves the job without an estimate, and a warning."""
    out: dict[str, schemas.Release] = {}
    for suffix, requested in plan.releases():
        key = f"{job_id}-{suffix}" if suffix else job_id
        try:
            out[suffix] = client.request_release(plan.request.dataset_id, requested, idempotency_key=key)
        except LabelsPartyError as err:
            if not suffix or upstream_outcome(err) != "refused":
                raise
            fallback = _estimate_fallback(plan, client, requested, key, err)
            if fallback is not None:
                out[suffix] = fallback
                continue
            report.warnings.append(f"no estimate of the model's test loss: the labels party refused the estimate "
                                   f"rows' release ({err.safe_code}); nothing was charged for it")
    return out


def _estimate_fallback(plan: JobPlan, client: LabelsPartyClient, requested: schemas.ReleaseRequest, key: str,
                       err: LabelsPartyError) -> schemas.Release | None:
    """The estimate rows' release by the validation mechanism's fallback (dbrr for opt-unbiased: unbiased, any
    domain) when the labels party refused the first for what the mechanism cannot take here (more labels than its
    solver takes, ε under its floor) — a refusal before any charge, on public inputs, so every attempt asks the same
    and gets the same release back (its own key); None when there is none, or it is refused too."""
    fallback = VALIDATION_FALLBACK.get(requested.mechanism)
    if fallback is None or err.code not in MECHANISM_REFUSALS:
        return None
    try:
        return client.request_release(plan.request.dataset_id, requested.model_copy(update={"mechanism": fallback}),
                                      idempotency_key=f"{key}-{fallback}")
    except LabelsPartyError as again:
        if upstream_outcome(again) != "refused":
            raise
        return None


def _own_refusal(err: BaseException) -> bool:
    """A refusal of the trainer's own (a LabelDPError that is not about reading the labels party)."""
    return isinstance(err, LabelDPError) and err.code not in UPSTREAM_TRANSIENT


def _progress(attempt: Attempt, every_seconds: float = 0.0):
    """Records each epoch (or boosting round) on the job's row, at most once per ``every_seconds`` (boosting rounds
    may take milliseconds each: the job's final metrics are written when it ends)."""
    history: list[dict] = []
    last = -np.inf

    def on_epoch(record: dict) -> None:
        nonlocal last
        history.append(record)
        if time.monotonic() - last >= every_seconds:
            attempt.update(epoch=record["epoch"], metrics_json=json.dumps(history))
            last = time.monotonic()

    return on_epoch


def run_single(attempt: Attempt, plan: JobPlan, client: LabelsPartyClient, release: schemas.Release,
               estimate_release: schemas.Release | None, report: JobReport, deadline: Deadline) -> None:
    settings = attempt.ctx.settings
    table = client.download_labels(release.id)
    features = load_frame(plan.features_file, plan.columns)
    ids = pd.Index(table.column("example_id").to_pylist())
    present = features.index.intersection(ids)
    overlap = len(present)
    present = present[~present.isin(plan.held_out)]  # a release of the whole dataset covers held-out rows too
    if estimate_release is None and plan.estimate is not None and plan.estimate.mechanism is None:
        estimate_rows = plan.estimate_ids(present)  # from this release: never trained on
    else:
        estimate_rows = present[:0]
    training = present[~present.isin(estimate_rows)]
    if len(training) < settings.min_train_examples:  # an existing release or a source dataset's: planning
        # named every id otherwise, and the labels party refused any it lacks before charging
        raise LabelDPError(f"{len(training)} of the released example ids have features and are neither held out nor "
                           f"kept for the estimate; this trainer trains on at least {settings.min_train_examples} "
                           "(min_train_examples)", code=ErrorCode.TOO_FEW_EXAMPLES if overlap else ErrorCode.NO_OVERLAP)
    position = pd.Series(np.arange(len(ids)), index=ids)
    targets = training_targets(table, release)[position[training].to_numpy()]
    noisy = labels_by_id(table)
    del table
    config = plan.config
    if config.loss == "cross_entropy":
        targets = np.rint(targets).astype(np.int32)
    rows = features.loc[training]
    preprocessor = Preprocessor.fit(rows, plan.request.numeric, plan.request.categorical)  # training rows only
    numeric, categorical = preprocessor.transform(rows)
    result: TrainResult | GbdtResult
    attempt.update(epochs=config.n_estimators if isinstance(config, GbdtConfig) else config.epochs,
                   num_train_examples=len(training), num_holdout_examples=len(plan.held_out))
    if isinstance(config, GbdtConfig):
        result = train_gbdt(config, numeric, categorical, targets, num_classes=plan.num_classes,
                            on_epoch=_progress(attempt, every_seconds=1.0), deadline=deadline,
                            threads=threads_per_job(settings.workers))
    else:
        result = train(config, numeric, categorical, targets, vocab_sizes=preprocessor.vocab_sizes,
                       num_classes=plan.num_classes, on_epoch=_progress(attempt), deadline=deadline)
    output = _shrunk(report, plan, client, release, result, numeric, categorical, targets)
    if estimate_release is not None:
        source, noisy = estimate_release, labels_by_id(client.download_labels(estimate_release.id))
        estimate_rows = features.index.intersection(pd.Index(list(noisy)))
    else:
        source = release
    report_estimate(report, plan, client, source, noisy, estimate_rows, features, preprocessor, result, output)
    finish(attempt, result, preprocessor, features, plan.held_out,
            {"release_id": release.id, "mechanism": release.mechanism, "epsilon": release.epsilon}, report, output,
            epoch=len(result.history), metrics_json=json.dumps(result.history))


def _shrunk(report: JobReport, plan: JobPlan, client: LabelsPartyClient, release: schemas.Release,
            result: TrainResult | GbdtResult, numeric: np.ndarray, categorical: np.ndarray,
            targets: np.ndarray) -> Output:
    """The model shrunk toward the mean of its training labels when they are numeric and unbiased
    (:mod:`features_party.learn.shrinkage`); else as trained."""
    if plan.num_classes is not None:
        return Output()
    try:
        labels = privatized(client, release, targets, None)
    except LabelDPError as err:  # a biased mechanism's labels, or no single mechanism: kept as trained
        if err.code not in ("mechanism_biased", "mechanism_not_estimable", "invalid_input"):
            raise
        return Output()
    chosen = shrinkage.choose(result, numeric, categorical, labels, plan.loss)
    if chosen is None:
        return Output()
    report.shrinkage = chosen.to_dict()
    return chosen.output


def report_estimate(report: JobReport, plan: JobPlan, client: LabelsPartyClient, release: schemas.Release | None,
                    noisy: dict[str, float], rows: pd.Index, features: pd.DataFrame, preprocessor: Preprocessor,
                    result: TrainResult | GbdtResult, output: Output | None = None) -> None:
    """The job's estimate on its estimate ``rows`` (their labels ``noisy`` from ``release``) of the model with its
    ``output`` map, or why it has none."""
    if plan.estimate is None:
        why = ("estimate_fraction is 0" if plan.request.estimate_fraction <= 0 else
               "a source dataset's release covers every row, leaving none to release unbiasedly apart")
        report.warnings.append(f"no estimate of the model's test loss: {why}")
        return
    if len(rows) < 2:
        report.warnings.append(f"no estimate of the model's test loss: {len(rows)} estimate row(s)")
        return
    assert release is not None  # estimate rows come from a release
    predictions = (output or Output()).apply(result.predict(*preprocessor.transform(features.loc[rows])))
    labels = np.array([noisy[i] for i in rows.astype(str)])
    estimate(report, client, release, labels, predictions, plan.loss, plan.num_classes)


def run_multistage(attempt: Attempt, plan: JobPlan, client: LabelsPartyClient,
                   estimate_release: schemas.Release | None, report: JobReport, deadline: Deadline) -> None:
    """LP-MST as a trainer job: the stages' releases happen inside the job (each stage needs the last model);
    their Idempotency-Keys start with the job id, so a job run again gets the same releases back."""
    from features_party.multistage import train_multistage

    request, num_classes = plan.request, plan.num_classes
    release = request.release
    # plan_job: an lp-mst job requests its own releases, of a classes dataset
    assert release is not None and num_classes is not None
    features = load_frame(plan.features_file, plan.columns)
    ids = plan.training_ids(features)
    rows = features.loc[ids[~ids.isin(plan.estimate_ids(ids))]]  # the estimate rows have a release of their own
    preprocessor = Preprocessor.fit(rows, request.numeric, request.categorical)
    numeric, categorical = preprocessor.transform(rows)
    config = plan.config
    rounds = config.n_estimators if isinstance(config, GbdtConfig) else config.epochs
    attempt.update(epochs=rounds * request.stages, num_train_examples=len(rows),
                   num_holdout_examples=len(plan.held_out))
    result, reports, _labels = train_multistage(client, request.dataset_id, rows.index.to_numpy(), numeric, categorical,
                                       vocab_sizes=preprocessor.vocab_sizes, num_classes=num_classes,
                                       epsilon=release.epsilon, stages=request.stages, config=config,
                                       temperature=request.temperature, seed=config.seed,
                                       key_prefix=f"{attempt.job_id}-", deadline=deadline,
                                       threads=threads_per_job(attempt.ctx.settings.workers))
    stages = [dict(r.__dict__) for r in reports]
    attempt.update(metrics_json=json.dumps(stages), release_json=json.dumps({
        "stages": stages, "epsilon": release.epsilon,
        "certified_epsilon": max(r.certified_epsilon for r in reports)}))
    noisy, estimate_rows = {}, features.index[:0]
    if estimate_release is not None:
        noisy = labels_by_id(client.download_labels(estimate_release.id))
        estimate_rows = features.index.intersection(pd.Index(list(noisy)))
    if estimate_release is not None or plan.estimate is None:  # else refused: report.warnings says so
        report_estimate(report, plan, client, estimate_release, noisy, estimate_rows, features, preprocessor,
                        result)
    finish(attempt, result, preprocessor, features, plan.held_out, {"protocol": "lp-mst", "stages": stages,
                                                                     "epsilon": release.epsilon}, report)


def predictions_frame(model_path: str | Path, features: pd.DataFrame) -> pd.DataFrame:
    """Predictions of a saved model, the MLP's or the trees', on a features table (``labeldp predict``)."""
    from features_party.learn.model_file import load_model

    result: TrainResult | GbdtResult
    result, header = load_gbdt(model_path) if is_gbdt_model(model_path) else load_model(model_path)
    outputs = (result.num_classes or 1) if isinstance(result, GbdtResult) else result.spec.output_dim
    output = Output.from_dict(header.get("output"), outputs)
    numeric, categorical = Preprocessor.from_dict(header["preprocessing"]).transform(features)
    try:
        predicted = output.apply(result.predict(numeric, categorical))
    except xgb.core.XGBoostError:  # a checked tree file XGBoost still refuses at prediction: one line, no stack
        raise LabelDPError("the model file's trees cannot predict (a damaged labeldp tree model)",
                           code=ErrorCode.MALFORMED_FILE) from None
    if predicted.ndim == 2:
        frame = pd.DataFrame(predicted, columns=[f"p_class_{k}" for k in range(predicted.shape[1])])
        frame.insert(0, "prediction", predicted.argmax(axis=1))
    else:
        frame = pd.DataFrame({"prediction": predicted})
    frame.insert(0, ID, features.index.to_numpy())
    return frame
