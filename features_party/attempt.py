"""One claim of one training job by one worker (:class:`Attempt`): every write it makes is fenced by its lease, and
:func:`finish` records its model and predictions. Used by the plain jobs (:mod:`.jobs`) and by ``auto``
(:mod:`.auto`), so neither imports the other's internals."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from features_party import db
from features_party.context import TrainerContext
from features_party.features import Preprocessor
from features_party.learn.gbdt import GbdtResult
from features_party.learn.gbdt_file import save_model as save_gbdt
from features_party.learn.output import Output, predictions_table
from features_party.learn.train import TrainResult, save_model
from features_party.reports import JobReport
from shared import schemas
from shared.errors import LabelDPError
from shared.service.leases import Lease, LeaseTable


def release_summary(release: schemas.Release) -> dict:
    return {"id": release.id, "mechanism": release.mechanism, "epsilon": release.epsilon,
            "charged_epsilon": release.charged_epsilon, "certified_epsilon": release.certified_epsilon,
            "prior_epsilon": release.prior_epsilon,
            "num_examples": release.num_examples, "mechanism_hash": release.mechanism_hash,
            "num_outputs": release.description.get("num_outputs")}




class LeaseLost(Exception):
    """This worker no longer holds the job's lease (another took it over): it stops and records nothing."""


@dataclass
class Attempt:
    """One claim of one job by one worker: every write goes through :meth:`holding`, so a worker that lost the
    lease changes nothing."""

    ctx: TrainerContext
    table: LeaseTable
    lease: Lease
    lost: threading.Event
    started: float = field(default_factory=time.perf_counter)  # its claim
    succeeded: bool = False

    @property
    def job_id(self) -> str:
        return self.lease.job_id

    @property
    def workdir(self) -> Path:
        return self.ctx.data_dir / "jobs" / self.job_id / f"attempt-{self.lease.attempt}"

    @contextlib.contextmanager
    def holding(self) -> Iterator[db.Job]:
        """The job's row, locked, if this attempt still holds its lease; else :class:`LeaseLost`."""
        with self.ctx.sessions() as session, session.begin():
            row = self.table.held(session, self.lease)
            if row is None:
                self.lost.set()
                raise LeaseLost(self.job_id)
            yield row
            row.updated_at = db.utcnow()

    def update(self, **fields: Any) -> None:
        with self.holding() as row:
            for name, value in fields.items():
                setattr(row, name, value)

    def end(self, status: str, **fields: Any) -> None:
        """Succeeded or failed: the lease is released and the sealed API key cleared."""
        with self.holding() as row:
            for name, value in fields.items():
                setattr(row, name, value)
            row.sealed_api_key = None
            self.table.finish(row, status)
        self.succeeded = status == "succeeded"

    def fail(self, error: LabelDPError, **fields: Any) -> None:
        self.end("failed", error=str(error), error_code=error.code, **fields)

    def interrupt(self, error: LabelDPError, *, retry_seconds: float | None, **fields: Any) -> None:
        """``interrupted``: claimed again after ``retry_seconds`` with its sealed key, or (None) only once resumed
        with the API key (its sealed key, which cannot be opened, cleared)."""
        with self.holding() as row:
            row.error, row.error_code = str(error), error.code
            for name, value in fields.items():
                setattr(row, name, value)
            if retry_seconds is None:
                row.sealed_api_key = None
                self.table.finish(row, "interrupted")
            else:
                self.table.retry_later(row, "interrupted", retry_seconds)


def finish(attempt: Attempt, result: TrainResult | GbdtResult, preprocessor: Preprocessor, features: pd.DataFrame,
           held_out: pd.Index, extra: dict, report: JobReport, output: Output | None = None, **fields: Any) -> None:
    """Save the model (:func:`save_model_file`) and the predictions for every row of the features table (Parquet,
    streamed on request; a ``holdout`` column marks the rows the job's split held out) in this attempt's directory,
    and record them with the job's outcome (:func:`succeed`)."""
    output = output or Output()
    model_file = save_model_file(attempt.workdir, result, preprocessor, extra, output)
    numeric, categorical = preprocessor.transform(features)
    predicted = output.apply(result.predict(numeric, categorical))
    table = predictions_table(features.index.astype(str).to_numpy(), predicted,
                              np.asarray(features.index.isin(held_out)))
    pq.write_table(table, attempt.workdir / "predictions.parquet")
    succeed(attempt, result, model_file, report, **fields)


def save_model_file(workdir: Path, result: TrainResult | GbdtResult, preprocessor: Preprocessor, extra: dict,
                    output: Output) -> Path:
    """The model in ``workdir``: the MLP's .npz, or the trees' XGBoost JSON, with its preprocessing and output."""
    workdir.mkdir(parents=True, exist_ok=True)
    extra = {**extra, "output": output.describe()}
    if isinstance(result, GbdtResult):
        model_file = workdir / "model.json"
        save_gbdt(model_file, result, preprocessor.to_dict(), extra)
    else:
        model_file = workdir / "model.npz"
        save_model(model_file, result, preprocessor.to_dict(), extra)
    return model_file


def succeed(attempt: Attempt, result: TrainResult | GbdtResult, model_file: Path, report: JobReport,
            **fields: Any) -> None:
    """Record the attempt's model and predictions (``predictions.parquet`` in its directory) with the job's
    outcome — its status, files, seconds and ``fields`` in one update, so no reader sees a succeeded job without its
    seconds — if the attempt still holds the job; earlier attempts' files go."""
    workdir = attempt.workdir
    attempt.end("succeeded", model_file=str(model_file), device=result.device,
                predictions_file=str(workdir / "predictions.parquet"), seconds=time.perf_counter() - attempt.started,
                report_json=json.dumps(report.to_dict()), **fields)
    for other in workdir.parent.iterdir():  # attempts that never finished (their workers died or lost the lease)
        if other != workdir:
            shutil.rmtree(other, ignore_errors=True)
