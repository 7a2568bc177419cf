"""Training beyond memory (issue 43): N rows × F features through real trainer jobs, release → join → train →
predict, with the trainer's peak memory watched.

* The table: F float32 features in Parquet files of a million rows, written before any clock starts; integer labels
  0..30 (y = 10 + 3·x0 − 2·x1 + noise, clipped) uploaded to a labels party (``labeldp labels serve``) as one
  Parquet body; a consumer organization granted ε on it.
* The trainer (``labeldp features serve``, its own process): the operator imports the files
  (``labeldp features import-features``, timed), then one job per learner asks for an ``opt-unbiased`` release at
  ε = 1 of the whole dataset and trains on it from disk (:mod:`features_party.streamed_jobs`): the MLP (hidden
  64, 32; ``--epochs``) and the trees (``--rounds`` rounds of depth 6).
* Measured: each phase's seconds, each job's seconds per 10⁶ rows, the trainer's peak resident memory during each
  job (sampled every 0.1 s; VmRSS, anonymous and file-backed) and the labels party's; the jobs' validation losses
  against the labels' variance (what a constant would score).

Run: ``.venv/bin/python bench/train_at_scale.py --rows 100000000 [--features 20] [--learners gbdt,mlp] [--json]``.
The issue's goal: 10⁸ rows × 20 features with the trainer's peak RSS ≤ 4 GB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.service_e2e import MemoryWatch, file_body, labels_server  # noqa: E402
from labeldp.local_services import free_port, serve_process  # noqa: E402
from labels_party.http.auth import create_key  # noqa: E402

FILE_ROWS = 1_000_000
GOAL_RSS_MB = 4000


def write_table(work: Path, rows: int, features: int) -> tuple[Path, Path, float]:
    """The features files and the labels file; the labels' variance."""
    rng = np.random.default_rng(0)
    table_dir, labels_path = work / "features", work / "labels.parquet"
    table_dir.mkdir()
    total, squares = 0.0, 0.0
    with pq.ParquetWriter(labels_path, pa.schema([("example_id", pa.string()), ("label", pa.int64())])) as labels:
        for number, start in enumerate(range(0, rows, FILE_ROWS)):
            stop = min(rows, start + FILE_ROWS)
            ids = pc.binary_join_element_wise("e", pc.cast(pa.array(np.arange(start, stop)), pa.string()), "")
            x = rng.standard_normal((stop - start, features), dtype=np.float32)
            pq.write_table(pa.table({"example_id": ids, **{f"x{j}": x[:, j] for j in range(features)}}),
                           table_dir / f"part-{number:05d}.parquet")
            y = np.clip(np.rint(10 + 3 * x[:, 0] - 2 * x[:, 1] + rng.standard_normal(stop - start)), 0, 30)
            total, squares = total + float(y.sum()), squares + float((y * y).sum())
            labels.write_table(pa.table({"example_id": ids, "label": y.astype(np.int64)}))
    mean = total / rows
    return table_dir, labels_path, squares / rows - mean * mean


@contextlib.contextmanager
def trainer(work: Path, labels_url: str):
    """``labeldp features serve`` on its own storage, told of the labels party; limits raised for the bench's
    sizes (the defaults refuse a job of 10⁸ rows: max_job_size, max_tree_bytes, max_job_seconds)."""
    env = {**os.environ, "LABELDP_TRAINER_DATABASE_URL": f"sqlite:///{work}/trainer.db",
           "LABELDP_TRAINER_DATA_DIR": str(work / "trainer"),
           "LABELDP_TRAINER_LABELS_PARTIES": json.dumps({"office": labels_url}),
           "LABELDP_TRAINER_MAX_JOB_SIZE": "1e16", "LABELDP_TRAINER_MAX_TREE_BYTES": "8e9",
           "LABELDP_TRAINER_MAX_JOB_SECONDS": "36000", "LABELDP_TRAINER_UPSTREAM_TIMEOUT_SECONDS": "600",
           "LABELDP_TRAINER_MAX_PREDICTION_CELLS": "1e10",
           # the table (8 GB at 10⁸ rows × 20 float32) and two jobs' outputs: over the default quarter of the free disk
           "LABELDP_TRAINER_MAX_STORED_BYTES_PER_ORG": str(1 << 40),
           # DuckDB's memory for the join: at 10⁸ rows its hash join could not allocate a block within the default
           # 512 MiB (out of memory at 406.9 of 488.2 MiB); planning asks 16 bytes a released label (1.6 GB at 10⁸),
           # and with 3 GiB the join's peak was 3.7 GB of the 4 GB goal
           "LABELDP_TRAINER_TABLE_READ_BUDGET_BYTES": str(2 << 30)}
    cli = [sys.executable, "-m", "labeldp", "features"]
    key = subprocess.run(cli + ["create-key", "--org", "publisher", "--role", "admin"], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serve_process(cli + ["serve", "--port", str(port)], base, env=env, log=work / "trainer.log") as server, \
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=600) as client:
        yield server, client, cli, env


def run_job(client: httpx.Client, request: dict, watch: MemoryWatch, phase: str) -> tuple[dict, float, float]:
    """The job, its creation's seconds (the release is asked for then) and its seconds in all."""
    watch.phase = phase
    started = time.perf_counter()
    created = client.post("/v1/jobs", json=request)
    created.raise_for_status()
    creation = time.perf_counter() - started
    job_id = created.json()["id"]
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            return job, creation, time.perf_counter() - started
        watch.phase = f"{phase}: {stage(job)}"
        time.sleep(1.0)


def stage(job: dict) -> str:
    """What a running job is doing, as far as its progress tells (a phase of the memory watch, polled each second):
    the download and join before its first round, each round or epoch, then the predictions and the estimate."""
    done, total = job["progress"]["epoch"], job["progress"]["epochs"]
    if done == 0:
        return "release, download and join"
    return f"after round {done}" if done < total else "predictions and estimate"


SAMPLE_ROWS = 1_000_000


def accuracy(client: httpx.Client, job_id: str, labels_path: Path, work: Path) -> dict:
    """The job's predictions against the true labels of the table's first :data:`SAMPLE_ROWS` rows (the bench
    knows them; the trainer never does), and the best constant's error on them (their variance)."""
    path = work / "predictions.parquet"
    with client.stream("GET", f"/v1/jobs/{job_id}/predictions",
                       headers={"Accept": "application/vnd.apache.parquet"}) as response, open(path, "wb") as out:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            out.write(chunk)
    truth = pq.ParquetFile(labels_path).iter_batches(batch_size=SAMPLE_ROWS)
    labels = next(truth).to_pandas().set_index("example_id")["label"]
    predicted = []
    for batch in pq.ParquetFile(path).iter_batches(columns=["example_id", "prediction"], batch_size=1 << 20):
        frame = batch.to_pandas()
        predicted.append(frame[frame["example_id"].isin(labels.index)])
    sample = pd.concat(predicted).set_index("example_id")["prediction"]
    error = float(np.mean((sample.to_numpy() - labels[sample.index].to_numpy()) ** 2))
    path.unlink()
    return {"mse_vs_true_labels": error, "constant_mse": float(labels.var(ddof=0)), "sampled_rows": len(sample)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--learners", default="gbdt,mlp")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="labeldp-scale-", dir=os.environ.get("LABELDP_BENCH_DIR")))
    result: dict = {"bench": "train_at_scale", "rows": args.rows, "features": args.features, "cpus": os.cpu_count(),
                    "goal_trainer_rss_mb": GOAL_RSS_MB, "seconds": {}, "jobs": {}}
    try:
        started = time.perf_counter()
        table_dir, labels_path, variance = write_table(work, args.rows, args.features)
        result["seconds"]["write_table"] = time.perf_counter() - started
        result["labels_variance"] = variance
        with labels_server(work, f"sqlite:///{work}/labels.db", {"LABELDP_MAX_STORED_BYTES_PER_ORG": str(1 << 40)}) \
            as (labels, owner, labels_ctx), \
                trainer(work, str(owner.base_url).rstrip("/")) as (server, client, cli, env):
            labels_watch = MemoryWatch(labels.pid)
            dataset = owner.post("/v1/datasets", json={"name": "scale", "label_kind": "integer", "min": 0,
                                                       "max": 30, "epsilon_total": 10}).json()["id"]
            started = time.perf_counter()
            owner.put(f"/v1/datasets/{dataset}/labels", content=file_body(labels_path),
                      headers={"Content-Type": "application/vnd.apache.parquet"}).raise_for_status()
            result["seconds"]["upload_labels"] = time.perf_counter() - started
            with labels_ctx.sessions() as session, session.begin():
                consumer = create_key(labels_ctx.ledger, session, "publisher", "consumer")
            owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 10}).raise_for_status()
            started = time.perf_counter()
            imported = subprocess.run(cli + ["import-features", "--org", "publisher", "--name", "big", str(table_dir)],
                                      env=env, capture_output=True, text=True)
            if imported.returncode != 0:
                raise RuntimeError(f"import-features failed: {imported.stderr.strip()[-2000:]}")
            result["seconds"]["import_features"] = time.perf_counter() - started
            watch = MemoryWatch(server.pid)
            for learner in args.learners.split(","):
                train = ({"model": "gbdt", "gbdt": {"n_estimators": args.rounds, "learning_rate": 0.3,
                                                    "early_stopping_rounds": args.rounds}}
                         if learner == "gbdt" else {"hidden": [64, 32], "epochs": args.epochs, "batch_size": 4096,
                                                    "learning_rate": 3e-3, "patience": args.epochs})
                request = {"features": "big", "api_key": consumer, "dataset_id": dataset,
                           "release": {"mechanism": "opt-unbiased", "epsilon": 1.0},
                           "numeric": [f"x{j}" for j in range(args.features)], "train": train}
                job, creation, seconds = run_job(client, request, watch, learner)
                losses = [m["val_loss"] for m in job.get("metrics", [])]
                result["jobs"][learner] = {
                    "status": job["status"], "error": job.get("error"), "seconds": seconds,
                    "creation_seconds": creation, "seconds_per_million_rows": seconds / (args.rows / 1e6),
                    "trained_rows": job.get("num_train_examples"), "epochs_or_rounds": len(losses),
                    "best_val_mse_on_privatized_labels": 2 * min(losses) if losses else None,
                    **(accuracy(client, job["id"], labels_path, work) if job["status"] == "succeeded" else {})}
            phases = watch.stop()
            result["trainer_peak_rss_mb"] = {phase: peak.get("VmRSS") for phase, peak in phases.items()}
            result["trainer_peak_anonymous_and_file_mb"] = {phase: [peak.get("RssAnon"), peak.get("RssFile")]
                                                            for phase, peak in phases.items()}
            result["labels_peak_rss_mb"] = max((p.get("VmRSS", 0) for p in labels_watch.stop().values()), default=0)
        result["trainer_within_goal"] = all(v is not None and v <= GOAL_RSS_MB
                                            for v in result["trainer_peak_rss_mb"].values())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2 if args.json else 1))


if __name__ == "__main__":
    main()
