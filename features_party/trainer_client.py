"""Typed httpx client for the features party's own trainer service: features tables, id lists, training jobs and
their predictions. The demo and the benchmarks drive the trainer through it, as a publisher's scripts would."""

from __future__ import annotations

import io
import ssl
import time
import uuid
import warnings

import httpx
import pandas as pd

from features_party import schemas
from features_party.client import LabelDPWarning, LabelsPartyError, _raise_for, _segment

IN_PROGRESS_SECONDS = 300.0  # how long a resent job request waits for the first send's outcome


class TrainerClient:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 600.0, verify: bool | str = True):
        self._http = httpx.Client(
            base_url=base_url, timeout=timeout, headers={"Authorization": f"Bearer {api_key}"},
            verify=ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, url: str, **kwargs) -> httpx.Response:
        response = self._http.request(method, url, **kwargs)
        _raise_for(response)
        return response

    def put_features(self, name: str, frame: pd.DataFrame) -> schemas.FeatureTableView:
        """Create or replace a features table (an ``example_id`` column and feature columns), sent as CSV."""
        response = self._call("PUT", f"/v1/features/{_segment(name)}", content=frame.to_csv(index=False),
                              headers={"Content-Type": "text/csv"})
        return schemas.FeatureTableView(**response.json())

    def put_id_list(self, name: str, ids) -> schemas.IdListView:
        """Create or replace the id list ``name`` (any iterable of example ids, unique), sent as a one-column CSV;
        jobs name it as ``split={"holdout_ids": name}``."""
        frame = pd.DataFrame({"example_id": pd.Series(list(ids), dtype=str)})
        response = self._call("PUT", f"/v1/id-lists/{_segment(name)}", content=frame.to_csv(index=False),
                              headers={"Content-Type": "text/csv"})
        return schemas.IdListView(**response.json())

    def id_lists(self) -> list[schemas.IdListView]:
        return [schemas.IdListView(**item) for item in self._call("GET", "/v1/id-lists").json()]

    def delete_id_list(self, name: str) -> None:
        """Remove the id list ``name`` (``NotFound`` if the organization has none of that name)."""
        self._call("DELETE", f"/v1/id-lists/{_segment(name)}")

    def create_job(self, request: schemas.JobRequest | dict, *, idempotency_key: str | None = None,
                   retries: int = 2) -> schemas.JobView:
        """A new job; sent again up to ``retries`` times when the answer does not come, with one Idempotency-Key
        (``idempotency_key``, else a random one), so a lost answer never makes a second job or a second charge."""
        body = request if isinstance(request, schemas.JobRequest) else schemas.JobRequest(**request)
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        attempt, deadline = 0, time.monotonic() + IN_PROGRESS_SECONDS
        while True:
            try:
                response = self._call("POST", "/v1/jobs", json=body.model_dump(mode="json", exclude_none=True),
                                      headers=headers)
                return schemas.JobView(**response.json())
            except LabelsPartyError as err:  # an earlier send with this key still creating the job: its outcome
                if err.code != "release_in_progress" or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
            except httpx.TransportError:
                if attempt >= retries:
                    raise
                time.sleep(0.5 * 2 ** attempt)
                attempt += 1

    def job(self, job_id: str) -> schemas.JobView:
        return schemas.JobView(**self._call("GET", f"/v1/jobs/{_segment(job_id)}").json())

    def wait(self, job_id: str, *, poll_seconds: float = 0.2) -> schemas.JobView:
        """The job once it has succeeded or failed."""
        while True:
            job = self.job(job_id)
            if job.status in ("succeeded", "failed"):
                return job
            time.sleep(poll_seconds)

    def train(self, request: schemas.JobRequest | dict) -> schemas.JobView:
        """Create a job and wait for it; a failed job raises with its error, and each of a finished job's warnings
        (its model not shown to be better than the constant predictor, or no estimate) is a
        :class:`~features_party.client.LabelDPWarning`."""
        job = self.wait(self.create_job(request).id)
        if job.status != "succeeded":
            raise RuntimeError(f"training job {job.id} failed: {job.error}")
        for warning in job.warnings:
            warnings.warn(f"job {job.id}: {warning}", LabelDPWarning, stacklevel=2)
        return job

    def predictions(self, job_id: str) -> pd.DataFrame:
        """``example_id, prediction[, p_class_k…], holdout`` for every row of the job's features table; ``holdout``
        (bool) marks the rows the job's split held out of training."""
        response = self._call("GET", f"/v1/jobs/{_segment(job_id)}/predictions",
                              headers={"Accept": "application/vnd.apache.parquet"})
        return pd.read_parquet(io.BytesIO(response.content))
