"""The SparkSession a service's Spark jobs run in (the labels party's releases, the trainer's trees).

The settings pinned here are the ones the jobs' results depend on or that keep a service's logs readable: Arrow
transfer between the JVM and Python workers with a fixed batch size (the batches a task's sampler sees, hence which
random draws go to which label — see :mod:`labels_party.spark.jobs`), UTC session time, and WARN-level logs without
the console progress bar. The master is the caller's: ``local[*]`` by default, any cluster URL otherwise.

Every session is secured (:func:`security_conf`), because a release's secret travels to the executors inside its
tasks and Spark keeps it on the driver as a broadcast block: an outside review fetched it, with no credentials,
from an unauthenticated local driver that listened on the host's external address, and recovered every true label
from the released ones. So: RPC authentication and AES encryption between driver and executors, encrypted local
spill and shuffle files, no driver web UI (it listed every organization's jobs and the data directory), and in
local mode a driver bound to loopback (Spark generates the authentication secret itself there). On a cluster the
shared secret is the deployment's (``LABELDP_SPARK_SECRET_FILE``, the same one the master and workers read); a
cluster master without one is refused.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from shared.spark.security import security_conf

ARROW_BATCH_ROWS = 1 << 16  # labels per Arrow batch handed to a Python worker (the samplers' own chunk size)

SESSION_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS),
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(master: str = "local[*]", app_name: str = "labeldp-release",
                  conf: Mapping[str, object] | None = None, secret: str | None = None) -> SparkSession:
    """The active session, or a new one on ``master`` with :data:`SESSION_CONF` and ``conf`` (``conf`` wins),
    secured by :func:`security_conf` (nothing overrides that).

    Like :meth:`SparkSession.Builder.getOrCreate`, an already running SparkContext is reused whatever ``master``
    says. Python workers run ``PYSPARK_PYTHON``; for a local master, where the workers are this machine's
    processes, it defaults to this interpreter (labeldp and numpy are installed there). On a cluster the deployment
    sets it to the executors' interpreter, which must have labeldp installed."""
    if master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = sys.executable  # read once, when the SparkContext starts
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SESSION_CONF, **(conf or {}), **security_conf(master, secret)}.items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def execution(spark: SparkSession) -> dict[str, str | int]:
    """Where ``spark``'s jobs run, as a job records it (no path, nothing about the data): the engine, the
    SparkContext's master URL and application id, and the executors registered besides the driver. Read it right
    after the job: a cluster's executors register asynchronously (before the first job there may be none yet), and
    one lost mid-job and not replaced is no longer counted."""
    java = spark.sparkContext._jsc
    assert java is not None  # a stopped context ran nothing
    context = java.sc()  # the JVM's SparkContext
    # Its status tracker lists the live executors and always the driver, whose block manager registers as the
    # SparkContext starts (PySpark's StatusTracker does not expose this list). In local mode the driver is the only
    # entry and runs every task: 0. On a standalone cluster, one entry per worker's executor besides it.
    listed = context.statusTracker().getExecutorInfos()
    return {"engine": "spark", "master": str(context.master()), "application_id": str(context.applicationId()),
            "executors": len(listed) - 1}


def collect_scratch(spark: SparkSession) -> None:
    """Let go of a finished job's shuffle files now: Spark's ContextCleaner removes them once the driver's JVM has
    collected their datasets, which an idle driver may not do for half an hour (issue 40's 33rd review: 318 MB of
    registrations' shuffles under the scratch directory). Best effort: a failure here fails no job."""
    import gc

    gc.collect()  # the Python side's handles on the job's datasets first
    with contextlib.suppress(Exception):
        spark.sparkContext._jvm.System.gc()  # type: ignore[union-attr]
