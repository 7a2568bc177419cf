"""Spark as both parties run it: a secured session per process (:mod:`shared.spark.session`: authenticated and
encrypted RPC and spill, no driver UI, a local driver on loopback, a cluster only with the deployment's shared
secret), started on first use by a :class:`~shared.spark.runner.SparkJobs`. The labels party releases source datasets
on its cluster (:mod:`labels_party.spark`); the features party trains trees on its own
(:mod:`features_party.learn.spark_trees`) — two clusters, two secrets: the labels party's executors read true labels.

PySpark and a Java runtime are the ``spark`` extra's: nothing here imports PySpark until a session is made.
"""
