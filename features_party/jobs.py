"""A training job of the features party: request a release, download it, join by example id, train, save.

``start_job`` does everything that can be refused (features and columns, the release itself: unknown ids,
budget, mechanism) synchronously, so the caller can answer 4xx; ``run_job`` does the slow part.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from features_party.client import LabelsPartyClient
from features_party.features import ID, Preprocessor
from features_party.train import TrainConfig, save_model, train
from shared import schemas
from shared.errors import LabelDPError

log = logging.getLogger("labeldp.jobs")


@dataclass
class Job:
    id: str
    request: dict
    status: str = "queued"  # queued | running | succeeded | failed
    epoch: int = 0
    epochs: int = 0
    history: list = field(default_factory=list)
    release: dict | None = None
    error: str | None = None
    model_path: str | None = None
    num_train_examples: int = 0
    seconds: float = 0.0
    device: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def view(self) -> dict:
        with self.lock:
            return {"id": self.id, "status": self.status, "progress": {"epoch": self.epoch, "epochs": self.epochs},
                    "metrics": list(self.history), "release": self.release, "error": self.error,
                    "num_train_examples": self.num_train_examples, "seconds": self.seconds,
                    "device": self.device, "request": {k: v for k, v in self.request.items() if k != "api_key"}}


def training_targets(table, release: schemas.Release) -> tuple[np.ndarray, str]:
    """Targets and default loss from a downloaded release: labels, or unbiased weights for label sets."""
    names = table.schema.names
    if "label" in names:
        return table.column("label").to_numpy(), "squared"
    sets = np.stack([table.column(n).to_numpy(zero_copy_only=False) for n in names if n.startswith("in_class_")],
                    axis=1).astype(np.float64)
    p, q = release.description["p_true"], release.description["p_other"]
    return (sets - q) / (p - q), "subset"


@contextlib.contextmanager
def job_running(job: Job, workdir: Path):
    """Marks the job running; on any error records it as failed (the service stays up); always records the
    duration and writes job.json."""
    started = time.perf_counter()
    with job.lock:
        job.status = "running"
    try:
        yield
    except Exception as err:
        log.exception("job %s failed", job.id)
        with job.lock:
            job.status, job.error = "failed", f"{type(err).__name__}: {err}"
    finally:
        with job.lock:
            job.seconds = time.perf_counter() - started
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "job.json").write_text(json.dumps(job.view(), default=str))


def run_job(job: Job, features: pd.DataFrame, preprocessor: Preprocessor, client: LabelsPartyClient,
            release: schemas.Release, workdir: Path, num_classes: int | None) -> None:
    with job_running(job, workdir):
        table = client.download_labels(release.id)
        ids = table.column("example_id").to_pylist()
        present = features.index.intersection(pd.Index(ids))
        if len(present) == 0:
            raise LabelDPError("no released example id has features", code="no_overlap")
        position = pd.Series(np.arange(len(ids)), index=ids)[present].to_numpy()
        targets, default_loss = training_targets(table, release)
        targets = targets[position]
        config = TrainConfig.from_dict({"loss": default_loss, **job.request.get("train", {})})
        if config.loss == "cross_entropy":
            targets = np.rint(targets).astype(np.int32)
        numeric, categorical = preprocessor.transform(features.loc[present])
        with job.lock:
            job.epochs, job.num_train_examples = config.epochs, len(present)

        def progress(record):
            with job.lock:
                job.epoch = record["epoch"]
                job.history.append(record)

        workdir.mkdir(parents=True, exist_ok=True)
        result = train(config, numeric, categorical, targets, vocab_sizes=preprocessor.vocab_sizes,
                       num_classes=num_classes, metrics_path=workdir / "metrics.json", on_epoch=progress)
        save_model(workdir / "model.npz", result, preprocessor.to_dict(),
                   {"release_id": release.id, "mechanism": release.mechanism, "epsilon": release.epsilon})
        with job.lock:
            job.status, job.model_path, job.device = "succeeded", str(workdir / "model.npz"), result.device


def run_multistage_job(job: Job, features: pd.DataFrame, preprocessor: Preprocessor, client: LabelsPartyClient,
                       dataset_id: str, release: schemas.ReleaseRequest, num_classes: int, stages: int,
                       temperature: float, workdir: Path) -> None:
    """LP-MST as a trainer job: the stages' releases happen inside the job (each stage needs the last model)."""
    from features_party.multistage import train_multistage

    with job_running(job, workdir):
        ids = pd.Index(release.example_ids) if release.example_ids else features.index
        frame = features.loc[ids]
        numeric, categorical = preprocessor.transform(frame)
        config = TrainConfig.from_dict({**job.request.get("train", {}), "loss": "cross_entropy"})
        with job.lock:
            job.epochs, job.num_train_examples = config.epochs * stages, len(frame)
        result, reports = train_multistage(client, dataset_id, frame.index.to_numpy(), numeric, categorical,
                                           vocab_sizes=preprocessor.vocab_sizes, num_classes=num_classes,
                                           epsilon=release.epsilon, stages=stages, config=config,
                                           temperature=temperature, seed=config.seed)
        workdir.mkdir(parents=True, exist_ok=True)
        save_model(workdir / "model.npz", result, preprocessor.to_dict(),
                   {"protocol": "lp-mst", "stages": [r.__dict__ for r in reports], "epsilon": release.epsilon})
        with job.lock:
            job.status, job.model_path, job.device = "succeeded", str(workdir / "model.npz"), result.device
            job.history = [dict(r.__dict__) for r in reports]
            job.release = {"stages": [dict(r.__dict__) for r in reports], "epsilon": release.epsilon,
                           "certified_epsilon": max(r.certified_epsilon for r in reports)}


def predictions_frame(model_path: str, features: pd.DataFrame) -> pd.DataFrame:
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
