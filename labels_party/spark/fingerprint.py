"""A source's identity: what its releases' per-row budgets assume does not change.

A source dataset's budget is kept per row position (its releases cover ``range:0:n``), so the rows must be the
same rows at every release; and a release's job must sample the labels its histogram (and prior) saw. The
fingerprint is the SHA-256 of the source's files as Spark lists them — path, length and modification time — taken
before the histogram and checked again before the labels are sampled and at every later release.
"""

from __future__ import annotations

import hashlib

from pyspark.sql import SparkSession


def source_fingerprint(spark: SparkSession, source: str) -> str:
    files = sorted(spark.read.parquet(source).inputFiles())
    hadoop = spark.sparkContext._jvm.org.apache.hadoop.fs  # the file systems Spark reads with (s3a, hdfs, file)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    digest = hashlib.sha256()
    for file in files:
        path = hadoop.Path(file)
        status = path.getFileSystem(conf).getFileStatus(path)
        digest.update(f"{file}\t{status.getLen()}\t{status.getModificationTime()}\n".encode())
    return digest.hexdigest()
