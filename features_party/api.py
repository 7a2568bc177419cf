"""The features-party trainer service (FastAPI): upload a features table, start training jobs against a labels
party, follow their progress, download models and predictions."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from features_party.client import LabelsPartyClient, LabelsPartyError
from features_party.features import Preprocessor, read_features
from features_party.jobs import Job, predictions_frame, run_job, run_multistage_job
from shared import schemas
from shared.errors import LabelDPError
from shared.http_errors import install_error_handlers

log = logging.getLogger("labeldp.features")
MAX_FEATURES_BYTES = 1 << 30


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    features: str
    labels_url: str
    api_key: str
    dataset_id: str
    release: schemas.ReleaseRequest
    numeric: list[str] = Field(default_factory=list)
    categorical: list[str] = Field(default_factory=list)
    num_classes: int | None = None
    train: dict[str, Any] = Field(default_factory=dict)
    protocol: Literal["single", "lp-mst"] = "single"  # lp-mst: multi-stage RRWithPrior (classes only)
    stages: int = Field(default=2, ge=1, le=5)
    temperature: float = Field(default=1.0, gt=0)


class TrainerState:
    """Jobs and their executor live on the app, not in module globals."""

    def __init__(self, data_dir: Path, workers: int = 1):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, Job] = {}
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="train")

    def features_path(self, name: str) -> Path:
        if not name.replace("-", "").replace("_", "").isalnum() or len(name) > 100:
            raise LabelDPError("feature table names are letters, digits, '-' and '_'", code="invalid_name")
        return self.data_dir / "features" / f"{name}.csv"

    def load_features(self, name: str) -> pd.DataFrame:
        path = self.features_path(name)
        if not path.exists():
            raise LabelDPError(f"no feature table {name!r}; upload it first", code="not_found")
        return read_features(path)

    def job(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise LabelDPError(f"no job {job_id!r}", code="not_found")
        return self.jobs[job_id]


STATUS = {"labels_party_unreachable": 502, "job_not_ready": 409}


def create_app(data_dir: str | Path) -> FastAPI:
    state = TrainerState(Path(data_dir))

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        state.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="labeldp features party (trainer)", version="1", lifespan=lifespan)
    app.state.trainer = state

    install_error_handlers(app, STATUS, log)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.put("/v1/features/{name}")
    async def upload_features(name: str, request: Request) -> dict:
        target = state.features_path(name)
        with tempfile.NamedTemporaryFile(dir=state.data_dir, delete=False, suffix=".csv") as handle:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_FEATURES_BYTES:
                    Path(handle.name).unlink()
                    raise LabelDPError("features file too large", code="body_too_large")
                handle.write(chunk)
        try:
            frame = await run_in_threadpool(read_features, handle.name)
        except LabelDPError:
            Path(handle.name).unlink()
            raise
        target.parent.mkdir(parents=True, exist_ok=True)
        Path(handle.name).replace(target)
        return {"name": name, "num_examples": len(frame), "columns": list(frame.columns)}

    @app.post("/v1/jobs", status_code=202)
    def create_job(body: JobRequest) -> dict:
        features = state.load_features(body.features)
        preprocessor = Preprocessor.fit(features, body.numeric, body.categorical)  # 400 on bad columns/values
        if body.release.example_ids is not None:
            missing = pd.Index(body.release.example_ids).difference(features.index)
            if len(missing):
                raise LabelDPError(f"{len(missing)} requested example id(s) have no features, e.g. "
                                   f"{list(missing[:3])}", code="unknown_example_ids")
        job = Job(id=uuid.uuid4().hex, request=body.model_dump())
        client = LabelsPartyClient(body.labels_url, body.api_key)
        if body.protocol == "lp-mst":
            if not body.num_classes:
                raise LabelDPError("lp-mst needs num_classes", code="invalid_request")
            state.jobs[job.id] = job

            def multistage():
                try:
                    run_multistage_job(job, features, preprocessor, client, body.dataset_id, body.release,
                                       body.num_classes, body.stages, body.temperature,
                                       state.data_dir / "jobs" / job.id)
                finally:
                    client.close()

            state.executor.submit(multistage)
            return job.view()
        try:  # refused releases (unknown ids at the labels party, budget, mechanism) surface as 4xx here
            release = client.request_release(body.dataset_id, body.release, idempotency_key=job.id)
        except LabelsPartyError as err:
            client.close()
            raise LabelDPError(f"labels party refused the release: {err.message}", code=err.code) from None
        except httpx.TransportError as err:
            client.close()
            raise LabelDPError(f"labels party unreachable: {err}", code="labels_party_unreachable") from None
        job.release = release.model_dump(mode="json", exclude={"description"}) | {
            "num_outputs": release.description.get("num_outputs")}
        state.jobs[job.id] = job

        def work():
            try:
                run_job(job, features, preprocessor, client, release, state.data_dir / "jobs" / job.id,
                        body.num_classes)
            finally:
                client.close()

        state.executor.submit(work)
        return job.view()

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str) -> dict:
        return state.job(job_id).view()

    @app.get("/v1/jobs/{job_id}/model")
    def get_model(job_id: str):
        job = state.job(job_id)
        if job.status != "succeeded":
            raise LabelDPError(f"job is {job.status}, no model", code="job_not_ready")
        return FileResponse(job.model_path, media_type="application/octet-stream", filename=f"{job_id}.npz")

    @app.get("/v1/jobs/{job_id}/predictions")
    def predictions(job_id: str) -> dict:
        job = state.job(job_id)
        if job.status != "succeeded":
            raise LabelDPError(f"job is {job.status}, no model", code="job_not_ready")
        frame = predictions_frame(job.model_path, state.load_features(job.request["features"]))
        return {"example_ids": frame["example_id"].tolist(), "predictions": frame["prediction"].tolist()}

    return app
