"""A release from a Parquet source, in process and as Spark jobs: N integer labels 1..52 (drawn from the PSID weeks
worked prior) with int64 example ids, written as a Parquet dataset of ``--files`` files in a temporary directory,
then released with the same mechanism — the optimal unbiased randomizer at ε = 1, built from the exact histogram
(the service builds it from a noisy one; the solve is timed apart, it is the same for both paths).

(a) In process, as a labels service does with uploaded labels: read the Parquet dataset, ``np.bincount``
    histogram, ``sample`` with the AES-128-CTR generator, write ``(example_id, label)`` Parquet (zstd).
(b) Spark in local mode: :func:`labels_party.spark.jobs.label_histogram` (exact counts and every refusal check,
    duplicate ids included) and :func:`labels_party.spark.jobs.privatize` (per-partition derived keys, zstd).

Spark's session start is reported apart, and a warm-up job on 1,000 labels runs before the timed ones (a service's
session stays up; the first job's JIT and Python-worker start are not a release's cost).

Run: `.venv/bin/python bench/spark_release.py [--n 10000000] [--files 8] [--master 'local[*]'] [--json]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from realistic_priors import psid_weeks_worked

from labels_party.core.registry import build
from labels_party.spark.jobs import label_histogram, privatize
from shared.domains import integer_range
from shared.randomness import new_release_secret, secure_rng
from shared.spark.session import spark_session

DOMAIN = integer_range(1, 52)


def write_source(directory: Path, n: int, files: int, seed: int = 0) -> Path:
    """``files`` Parquet files of consecutive rows: example_id int64, label int64 in 1..52."""
    values, counts, _ = psid_weeks_worked()
    labels = np.random.default_rng(seed).choice(values.astype(np.int64), size=n, p=counts / counts.sum())
    directory.mkdir(parents=True)
    bounds = np.linspace(0, n, files + 1).astype(np.int64)
    for index, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        table = pa.table({"example_id": np.arange(start, stop), "label": labels[start:stop]})
        pq.write_table(table, directory / f"part-{index:03d}.parquet")
    return directory


def in_process(source: Path, output: Path, mechanism) -> dict:
    """Phase timings of the one-machine path; the released file is a single zstd Parquet file."""
    times = {}
    started = time.perf_counter()
    table = pq.read_table(source)
    ids = pc.cast(table.column("example_id"), pa.string())
    labels = table.column("label").to_numpy().astype(np.float64)
    times["read"] = time.perf_counter() - started
    started = time.perf_counter()
    counts = np.bincount(DOMAIN.index_of(labels), minlength=DOMAIN.size)
    times["histogram"] = time.perf_counter() - started
    started = time.perf_counter()
    released = mechanism.sample(labels, secure_rng())
    times["sample"] = time.perf_counter() - started
    started = time.perf_counter()
    output.mkdir(parents=True)
    pq.write_table(pa.table({"example_id": ids, "label": released}), output / "part-0.parquet", compression="zstd")
    times["write"] = time.perf_counter() - started
    assert counts.sum() == labels.size
    return times


def spark_release(spark, source: Path, output: Path, mechanism) -> tuple[dict, object, object]:
    times = {}
    started = time.perf_counter()
    histogram = label_histogram(spark, str(source), DOMAIN.values)
    times["histogram"] = time.perf_counter() - started
    started = time.perf_counter()
    result = privatize(spark, str(source), str(output), mechanism, new_release_secret(),
                       support_values=DOMAIN.values)
    times["privatize"] = time.perf_counter() - started
    return times, histogram, result


def _rates(times: dict, n: int) -> dict:
    phases = {name: {"seconds": round(seconds, 3), "labels_per_second": round(n / seconds)}
              for name, seconds in times.items()}
    total = sum(times.values())
    return {**phases, "total": {"seconds": round(total, 3), "labels_per_second": round(n / total)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")  # pandas 3 notice
    load_at_start = [round(load, 2) for load in os.getloadavg()]  # other processes on these cores skew the timings
    work = Path(tempfile.mkdtemp(prefix="labeldp-spark-bench-"))
    try:
        source = write_source(work / "source", args.n, args.files)
        source_mb = sum(path.stat().st_size for path in source.iterdir()) / 2**20
        labels = pq.read_table(source, columns=["label"]).column("label").to_numpy().astype(np.float64)
        counts = np.bincount(DOMAIN.index_of(labels), minlength=DOMAIN.size)
        del labels
        started = time.perf_counter()
        built = build("opt-unbiased", DOMAIN, 1.0, counts)
        solve_seconds = time.perf_counter() - started
        mechanism = built.mechanism
        mechanism.sample(DOMAIN.values, np.random.default_rng(0))  # its alias table, outside the timings
        local = in_process(source, work / "in-process", mechanism)
        in_process_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started = time.perf_counter()
        spark = spark_session(args.master, app_name="labeldp-spark-bench", conf={"spark.ui.enabled": "false"})
        session_seconds = time.perf_counter() - started
        warm = write_source(work / "warm-up", 1000, 2, seed=1)
        spark_release(spark, warm, work / "warm-up-out", mechanism)
        timed, histogram, result = spark_release(spark, source, work / "spark", mechanism)
        assert np.array_equal(histogram.counts, counts) and result.rows_written == args.n
        parallelism = spark.sparkContext.defaultParallelism
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "spark_release", "command": "python " + " ".join(sys.argv), "labels": args.n,
        "domain": "integers 1..52 (PSID weeks worked prior)", "source_files": args.files,
        "source_mb": round(source_mb, 1), "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "mechanism": {"name": "opt-unbiased", "epsilon": 1.0, "outputs": int(mechanism.num_outputs),
                      "solve_seconds": round(solve_seconds, 3)},
        "in_process": {**_rates(local, args.n), "peak_rss_mb": round(in_process_rss, 1),
                       "generator": "aes-128-ctr (secure_rng)"},
        "spark": {**_rates(timed, args.n), "master": args.master, "default_parallelism": parallelism,
                  "session_start_seconds": round(session_seconds, 2), "partitions": result.partitions,
                  "max_partition_bytes": result.max_partition_bytes, "min_partitions": result.min_partitions,
                  "batch_rows": result.batch_rows, "generator": "aes-128-ctr (derived_rng per partition)",
                  "warm_up": "one histogram + privatize of 1,000 labels before the timed jobs"},
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"{args.n:,} labels, {args.files} Parquet files ({report['source_mb']} MB); opt-unbiased at eps = 1, "
          f"{report['mechanism']['outputs']} outputs (solved in {solve_seconds:.2f} s)")
    for path in ("in_process", "spark"):
        for phase, row in report[path].items():
            if isinstance(row, dict) and "seconds" in row:
                print(f"{path:<11} {phase:<10} {row['seconds']:>8.2f} s  {row['labels_per_second']:>13,} labels/s")
    print(f"spark: session start {session_seconds:.1f} s (not counted), {result.partitions} partitions, "
          f"master {args.master} ({parallelism} cores)")


if __name__ == "__main__":
    main()
