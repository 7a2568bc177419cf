"""The demo's source-dataset round, where the deployment takes source datasets (the compose stack with its Spark
cluster): the office writes its training labels as Parquet where the labels party may read them, registers them as
a source dataset (202: copied and counted by a durable job), and grants the publisher, who asks for one
opt-unbiased release — a Spark job on the cluster's executors. Reported: where it ran (the release's execution
record, shown to the owner's admins, and the Spark master's own list of applications), how long registering and
releasing took, and the released labels scored against the truth (the demo plays both parties)."""

from __future__ import annotations

import io
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from features_party.client import LabelsPartyClient
from labeldp.benchmarks.parties import CONSUMER, Parties
from shared import schemas
from shared.errors import ErrorCode, LabelDPError, known_code

EPSILON = 2.0
REGISTRATION_SECONDS = 600.0


class SourceStore(Protocol):
    """Where a deployment's labels party reads sources from, and its Spark cluster as the cluster reports itself."""

    def put(self, name: str, parquet: bytes) -> str:
        """Store ``parquet`` as ``name`` where the office's sources live; the location to register."""
        ...

    def spark_master(self) -> dict:
        """The Spark master's own status (its ``/json/``: workers, active and completed applications)."""
        ...


@dataclass(frozen=True)
class SourceRound:
    dataset_id: str
    release: schemas.Release  # as the owner's admin sees it: with its execution record
    num_examples: int
    register_seconds: float
    release_seconds: float
    noisy_label_mse: float
    true_mean: float
    released_mean: float
    master_applications: tuple[str, ...]  # every application the Spark master lists, active or completed
    alive_workers: int


def run_round(parties: Parties, sources: SourceStore, train_part: pd.DataFrame, *, label: str, maximum: int,
              dataset_name: str = "hours-worked-source") -> SourceRound:
    truth = train_part.set_index("example_id")[label].astype(float)
    location = sources.put(f"labels-{uuid.uuid4().hex[:8]}.parquet", _parquet(truth))
    with LabelsPartyClient(parties.labels_url, parties.owner_key) as office, \
            LabelsPartyClient(parties.labels_url, parties.consumer_key) as publisher:
        started = time.perf_counter()
        dataset = office.create_dataset(name=dataset_name, label_kind="integer", min=0, max=maximum,
                                        epsilon_total=EPSILON, source=location)
        dataset = _registered(office, dataset)
        registered = time.perf_counter()
        office.grant(dataset.id, CONSUMER, EPSILON)
        released = publisher.request_release(dataset.id, {"mechanism": "opt-unbiased", "epsilon": EPSILON},
                                             poll_seconds=1.0)
        release_seconds = time.perf_counter() - registered
        noisy = publisher.download_labels(released.id).to_pandas().set_index("example_id")["label"]
        seen_by_owner = office.get_release(released.id)
    master = sources.spark_master()
    applications = tuple(app["id"] for key in ("activeapps", "completedapps") for app in master.get(key, []))
    print(f"  source release {released.id}: {len(noisy):,} labels released by Spark in {release_seconds:.0f} s "
          f"(registered in {registered - started:.0f} s)", flush=True)
    return SourceRound(dataset.id, seen_by_owner, len(noisy), registered - started, release_seconds,
                       float(np.mean((noisy[truth.index] - truth) ** 2)), float(truth.mean()),
                       float(noisy[truth.index].mean()), applications, int(master.get("aliveworkers", 0)))


def report_lines(result: SourceRound, out: Path) -> list[str]:
    execution = result.release.execution
    where = "not recorded" if execution is None else (
        f"application `{execution.application_id}` on `{execution.master}`, {execution.executors} executors, "
        f"{execution.partitions} partitions")
    listed = execution is not None and execution.application_id in result.master_applications
    return ["## A source dataset released by Spark", "",
            f"The office's {result.num_examples:,} training labels as a Parquet source, registered as dataset "
            f"`{result.dataset_id}` in {result.register_seconds:.0f} s (copied and counted by a job), then one "
            f"opt-unbiased release at ε = {EPSILON:g} (`{result.release.id}`, certified ε "
            f"{result.release.certified_epsilon:.6f}) in {result.release_seconds:.0f} s: {where}. The Spark "
            f"master lists it: {'yes' if listed else 'NO'} ({result.alive_workers} workers alive).",
            f"Released labels: noisy-label MSE {result.noisy_label_mse:.1f}; mean {result.released_mean:.2f} "
            f"against the true mean {result.true_mean:.2f} (the randomizer is unbiased)."]


def _parquet(labels: pd.Series) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"example_id": pa.array(labels.index.astype(str)),
                             "label": pa.array(labels.to_numpy(), pa.float64())}), sink)
    return sink.getvalue()


def _registered(office: LabelsPartyClient, dataset: schemas.Dataset) -> schemas.Dataset:
    deadline = time.monotonic() + REGISTRATION_SECONDS
    while dataset.state == "registering":
        if time.monotonic() > deadline:
            raise TimeoutError(f"dataset {dataset.id} still registering after {REGISTRATION_SECONDS:g} s")
        time.sleep(1.0)
        dataset = office.get_dataset(dataset.id)
    if dataset.state != "ready":
        error = dataset.error or {}
        raise LabelDPError(f"the source dataset was not registered: {error.get('message', dataset.state)}",
                           code=known_code(error.get("code", ""), ErrorCode.SOURCE_DATASET))
    return dataset
