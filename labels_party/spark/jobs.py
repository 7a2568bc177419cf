"""The data plane of a release from a Parquet dataset (columns ``example_id`` and numeric ``label``): two Spark jobs.

:func:`label_histogram` counts every support value exactly (the noisy prior is drawn from these counts on the
driver) and refuses a source the release cannot take: missing columns, missing ids or labels, labels outside the
support, repeated example ids, no rows. :func:`privatize` then runs the mechanism built on the driver over every
label, in the Python workers, and writes the released ``(example_id, label)`` rows as Parquet.

Why each partition draws from a key derived from the partition's number. Spark runs a partition's task again when
an attempt fails, when its executor is lost, or speculatively next to a slow attempt — and an attempt may have
written part of its output before it died. If every attempt drew fresh noise, the released dataset could end up
holding, or an observer of the output store could see, two independent noisy copies of one label: each a full
ε-DP release of it, so together 2ε, twice what the ledger charged. Here an attempt's generator is
:func:`shared.randomness.derived_rng` of the release's secret and the partition's number, and it draws through
the partition's labels batch after batch in their order, so any attempt of the partition publishes exactly the same
values: re-execution reveals nothing new. That holds because an attempt sees the same rows in the same order and in
the same Arrow batches (the sampler's draws depend on where batches start), which is why the job reads the source
with no shuffle — a partition is a fixed set of byte ranges of the source's files — and pins the settings that
decide the partitioning (``spark.sql.files.maxPartitionBytes``, ``openCostInBytes``, ``minPartitionNum``) and the
batch size; the result records them. Running the whole job again with the same secret, source files and settings
reproduces the same output too (a driver that crashed mid-job can rerun it without a second charge). Different
partitions' keys are independent, and each release has a fresh secret (:func:`shared.randomness.new_release_secret`).

The secret is as sensitive as the labels: with it and the output, the noise can be recomputed. It travels to the
executors inside the task closure, so on a shared cluster enable Spark's RPC authentication and encryption
(``spark.authenticate``, ``spark.network.crypto.enabled``) and local-disk I/O encryption, and never log it.

The workers get the rows through ``mapInArrow``: Arrow record batches go to numpy without a copy, where
``mapInPandas`` would build a pandas DataFrame per batch (and ``labels_party`` does not depend on pandas; PySpark's
``sql`` extra brings it for its own use).

Only mechanisms that release one number per label run here (label-set mechanisms such as ``subset`` release a
row of booleans per label): others are refused before the job starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType, NumericType, StringType

from shared.errors import ErrorCode, LabelDPError, known_code
from shared.randomness import derived_rng
from shared.spark.session import ARROW_BATCH_ROWS, execution

DEFAULT_MAX_PARTITION_BYTES = 128 << 20  # Spark's default split size, pinned so the partitioning is the source's
DEFAULT_MIN_PARTITIONS = 64  # smaller splits (not below openCostInBytes) for sources under 64 x 128 MB
OPEN_COST_BYTES = 4 << 20  # Spark's default estimated cost of opening a file, pinned for the same reason
OUTPUT_SCHEMA = "example_id string, label double"
_WORKER_REFUSAL = re.compile(r"\[labeldp:([a-z_]+)\] ([^\n]*)")  # a worker's LabelDPError inside Spark's error


@dataclass(frozen=True, eq=False)
class HistogramResult:
    support_values: np.ndarray  # float64, as given
    counts: np.ndarray  # int64, counts[i] = rows whose label equals support_values[i]
    num_examples: int
    # Σ of the example ids' UTF-8 bytes, as a release writes them (strings): what its output holds whatever the
    # source's compression (None: counts read back from a registration that did not measure them)
    id_bytes: int | None = None


@dataclass(frozen=True)
class PrivatizeResult:
    output: str
    rows_written: int
    partitions: int  # the source's input splits: one task, one derived key each
    max_partition_bytes: int
    min_partitions: int
    batch_rows: int  # Arrow batch size the samplers saw
    execution: dict[str, str | int]  # where the write ran (shared.spark.session.execution)


def label_histogram(spark: SparkSession, source: str, support_values: np.ndarray) -> HistogramResult:
    """Exact counts of each support value in ``source`` (labels compared exactly, as doubles), after refusing a
    source that is empty, has missing ids or labels, labels outside the support or a repeated example_id."""
    support = _support(support_values)
    session = _pinned_session(spark)
    labels = _read_labels(session, source)
    # A broadcast left join marks each label with its support value (null when it has none): an `isin` over a
    # 50,000-value support costs a Py4J call per value, the join one small DataFrame.
    values = session.createDataFrame([(float(value),) for value in support], "value double")
    marked = labels.join(F.broadcast(values), labels["label"] == values["value"], "left")
    groups = marked.groupBy("value").agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_if(F.col("example_id").isNull() | (F.col("example_id") == "")).alias("missing_ids"),
        F.count_if(F.col("label").isNull()).alias("missing_labels"),
        F.sum(F.octet_length("example_id")).alias("id_bytes"),
    ).collect()  # at most |support| + 1 rows: the support values found, and everything else under null
    total = sum(row["rows"] for row in groups)
    if total == 0:
        raise LabelDPError(f"the source {source!r} holds no labels", code=ErrorCode.EMPTY_LABELS)
    if sum(row["missing_ids"] for row in groups):
        raise LabelDPError(f"{sum(row['missing_ids'] for row in groups):,} example_ids are missing or empty",
                           code=ErrorCode.MALFORMED_FILE)
    missing_labels = sum(row["missing_labels"] for row in groups)
    if missing_labels:
        raise LabelDPError(f"{missing_labels:,} labels are missing", code=ErrorCode.MALFORMED_FILE)
    outside = sum(row["rows"] for row in groups if row["value"] is None)
    if outside:
        raise LabelDPError(f"{outside:,} of {total:,} labels are not in the domain's {support.size} values",
                           code=ErrorCode.LABEL_OUT_OF_DOMAIN)
    # On the column as stored: casting integers to strings is injective, and the cast costs a third of the job.
    counted = labels.agg(F.count_distinct("stored_id")).first()
    assert counted is not None  # an aggregate has one row
    distinct = counted[0]
    if distinct != total:
        raise LabelDPError(f"{total - distinct:,} rows repeat an example_id of another row",
                           code=ErrorCode.DUPLICATE_EXAMPLE_ID)
    row_of = {float(value): index for index, value in enumerate(support)}
    counts = np.zeros(support.size, dtype=np.int64)
    for row in groups:
        counts[row_of[row["value"]]] = row["rows"]
    return HistogramResult(support, counts, int(total), sum(int(row["id_bytes"] or 0) for row in groups))


def privatize(spark: SparkSession, source: str, output: str, sampler, secret: bytes, *, support_values: np.ndarray,
              max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
              min_partitions: int = DEFAULT_MIN_PARTITIONS) -> PrivatizeResult:
    """Write ``sampler.sample(labels, rng)`` for every row of ``source`` to ``output`` (Parquet, zstd, replaced if
    present), each partition drawing from ``derived_rng(secret, "partition", partition id)``.

    ``sampler`` is the mechanism built on the driver (picklable, one output per label); ``support_values`` are the
    labels it was built for — a label outside them is refused in the workers, so a source that changed after its
    histogram cannot be released under a prior and mechanism made for other labels."""
    support = _support(support_values)
    check_one_output_per_label(sampler, support)
    if output.rstrip("/") == source.rstrip("/"):
        raise LabelDPError("the released labels cannot overwrite their source", code=ErrorCode.INVALID_INPUT)
    session = _pinned_session(spark, max_partition_bytes, min_partitions)
    labels = _read_labels(session, source).select("example_id", "label")
    partitions = labels.rdd.getNumPartitions()
    released = labels.mapInArrow(_partition_sampler(sampler, secret, support), OUTPUT_SCHEMA)
    try:
        released.write.mode("overwrite").option("compression", "zstd").parquet(output)
    except Exception as err:  # a worker's refusal arrives wrapped in Spark's task-failure error
        refusal = _WORKER_REFUSAL.search(str(err))
        if refusal is None:
            raise
        raise LabelDPError(refusal.group(2), code=known_code(refusal.group(1), ErrorCode.RELEASE_FAILED)) from err
    ran = execution(session)
    rows = session.read.parquet(output).count()  # from the files' footers
    return PrivatizeResult(output, int(rows), partitions, max_partition_bytes, min_partitions, ARROW_BATCH_ROWS, ran)


def _partition_sampler(sampler, secret: bytes, support: np.ndarray
                       ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs on its partition's Arrow batches (shipped to the workers by pickling)."""
    ordered = np.sort(support)

    def sample_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            task = TaskContext.get()
            assert task is not None  # this runs in a Spark task
            rng = derived_rng(secret, "partition", task.partitionId())  # once: one stream per partition
            for batch in batches:
                yield _sample_batch(batch, sampler, rng, ordered)
        except LabelDPError as err:  # marked, so the driver can raise it again with its code
            raise LabelDPError(f"[labeldp:{err.code}] {err}", code=err.code) from None

    return sample_partition


def _sample_batch(batch: pa.RecordBatch, sampler, rng: np.random.Generator, ordered: np.ndarray) -> pa.RecordBatch:
    ids, labels = batch.column("example_id"), batch.column("label")
    if ids.null_count or labels.null_count:
        raise LabelDPError("an example_id or label is missing", code=ErrorCode.MALFORMED_FILE)
    values = labels.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if not _all_in(ordered, values):
        raise LabelDPError("a label outside the domain reached the release job (did the source change after its "
                           "histogram?)", code=ErrorCode.LABEL_OUT_OF_DOMAIN)
    noisy = np.asarray(sampler.sample(values, rng))
    if noisy.shape != values.shape:
        raise _not_one_output_per_label(sampler, noisy)
    return pa.RecordBatch.from_arrays([ids, pa.array(noisy.astype(np.float64, copy=False))],
                                      names=["example_id", "label"])


def _all_in(ordered: np.ndarray, values: np.ndarray) -> bool:
    at = np.minimum(np.searchsorted(ordered, values), ordered.size - 1)
    return bool(np.all(ordered[at] == values))


def check_one_output_per_label(sampler, support: np.ndarray) -> None:
    """Refuse before any job runs a sampler whose output is not one number per label. The probe samples one
    support value with a throwaway seeded generator and discards the result: it touches no label."""
    probe = np.asarray(sampler.sample(support[:1].copy(), np.random.default_rng(0)))
    if probe.shape != (1,):
        raise _not_one_output_per_label(sampler, probe)


def _not_one_output_per_label(sampler, output: np.ndarray) -> LabelDPError:
    name = getattr(sampler, "name", type(sampler).__name__)
    return LabelDPError(f"{name} releases an array of shape "
                        f"{output.shape[1:]} per label; Spark releases write one number per label",
                        code=ErrorCode.MECHANISM_NOT_SUPPORTED_ON_SPARK)


def _pinned_session(spark: SparkSession, max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
                    min_partitions: int = DEFAULT_MIN_PARTITIONS) -> SparkSession:
    """A session on the same SparkContext whose SQL settings pin the input splits and Arrow batches, and make an
    unreadable or vanished file fail the job instead of being skipped (every row counted is a row released, and a
    retried task cannot read fewer rows than its first attempt). A new session: the caller's are left as they were.
    """
    if max_partition_bytes < 1 or min_partitions < 1:
        raise LabelDPError("max_partition_bytes and min_partitions must be positive", code=ErrorCode.INVALID_INPUT)
    session = spark.newSession()
    for key, value in {"spark.sql.files.maxPartitionBytes": max_partition_bytes,
                       "spark.sql.files.openCostInBytes": OPEN_COST_BYTES,
                       "spark.sql.files.minPartitionNum": min_partitions,
                       "spark.sql.execution.arrow.maxRecordsPerBatch": ARROW_BATCH_ROWS,
                       "spark.sql.execution.arrow.maxBytesPerBatch": 2**31 - 1,
                       "spark.sql.files.ignoreCorruptFiles": "false",
                       "spark.sql.files.ignoreMissingFiles": "false",
                       # a source directory's _spark_metadata log could list files anywhere: read the directory
                       "spark.sql.streaming.fileStreamSink.ignoreMetadata": "true"}.items():
        session.conf.set(key, str(value))
    session.conf.unset("spark.sql.files.maxPartitionNum")  # would merge the splits into fewer partitions
    return session


def _read_labels(spark: SparkSession, source: str) -> DataFrame:
    """``source``'s example_id as string, label as double and example_id as stored (``stored_id``), or a refusal
    naming what is wrong."""
    try:
        frame = spark.read.parquet(source)
    except AnalysisException as err:
        raise LabelDPError(f"cannot read a Parquet dataset at {source!r}: {str(err).splitlines()[0][:300]}",
                           code=ErrorCode.MALFORMED_FILE) from None
    types = {field.name: field.dataType for field in frame.schema.fields}
    missing = [name for name in ("example_id", "label") if name not in types]
    if missing:
        raise LabelDPError(f"labels need columns example_id and label; {source!r} lacks {', '.join(missing)}",
                           code=ErrorCode.MALFORMED_FILE)
    if not isinstance(types["label"], NumericType):
        raise LabelDPError(f"label must be a numeric column, not {types['label'].simpleString()}",
                           code=ErrorCode.MALFORMED_FILE)
    if not isinstance(types["example_id"], (StringType, IntegralType)):
        raise LabelDPError(f"example_id must be a string or integer column, not "
                           f"{types['example_id'].simpleString()}", code=ErrorCode.MALFORMED_FILE)
    return frame.select(F.col("example_id").cast("string").alias("example_id"),
                        F.col("label").cast("double").alias("label"), F.col("example_id").alias("stored_id"))


def _support(values) -> np.ndarray:
    support = np.asarray(values, dtype=np.float64)
    if support.ndim != 1 or support.size == 0 or not np.all(np.isfinite(support)) \
            or np.unique(support).size != support.size:
        raise LabelDPError("support_values must be distinct finite numbers", code=ErrorCode.INVALID_DOMAIN)
    return support
