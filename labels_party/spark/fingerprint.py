"""A source's identity and extent: what its releases' per-row budgets assume does not change, and where its files
really are.

A source dataset's budget is kept per row position (its releases cover ``range:0:n``), so the rows must be the
same rows at every release; and a release's job must sample the labels its histogram (and prior) saw. The
fingerprint is the SHA-256 of the source's files as Spark lists them — path, length and modification time — taken
before the histogram and checked again before the labels are sampled and at every later release. Every file must
also lie under a location the operator allowed the owner (checked at every release, on the files themselves:
a registered directory may hold symbolic links).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from urllib.parse import urlparse

from pyspark.sql import SparkSession


def source_files(spark: SparkSession, source: str) -> list[tuple[str, int, int]]:
    """(path, length, modification time) of every file Spark reads for ``source``, sorted."""
    files = sorted(spark.read.option("ignoreMetadata", "true").parquet(source).inputFiles())
    hadoop = spark.sparkContext._jvm.org.apache.hadoop.fs  # the file systems Spark reads with (s3a, hdfs, file)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    listed = []
    for file in files:
        path = hadoop.Path(file)
        status = path.getFileSystem(conf).getFileStatus(path)
        listed.append((file, int(status.getLen()), int(status.getModificationTime())))
    return listed


def fingerprint(files: Sequence[tuple[str, int, int]]) -> str:
    digest = hashlib.sha256()
    for file, length, modified in files:
        digest.update(f"{file}\t{length}\t{modified}\n".encode())
    return digest.hexdigest()


def outside(files: Sequence[tuple[str, int, int]], prefixes: Sequence[str]) -> list[str]:
    """The files not under any of ``prefixes`` (local files by their real path: links are followed)."""
    allowed = [_real(prefix).rstrip("/") for prefix in prefixes]
    return [file for file, _, _ in files
            if not any(_real(file) == p or _real(file).startswith(p + "/") for p in allowed)]


def _real(location: str) -> str:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return os.path.realpath(parsed.path if parsed.scheme else location)
    return location
