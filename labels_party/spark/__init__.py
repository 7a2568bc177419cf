"""Label releases whose labels live in a Parquet dataset too large for one machine, computed as Spark jobs.

:mod:`labels_party.spark.jobs` holds the data plane — the exact histogram the noisy prior is drawn from, and the
per-partition sampling of a built mechanism — and :mod:`shared.spark.session` the session they run in. The
service computes everything else (the noisy prior, the mechanism, the ledger) on the driver, as for uploaded labels.

Nothing here is imported by the rest of ``labels_party``: PySpark and a Java runtime are the ``spark`` extra's, needed
only by deployments that release from such sources, so the service imports this package where it uses it.
"""
