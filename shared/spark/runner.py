"""Where a service runs its Spark work: one session per process, started on first use and shared by the process's
job workers (the labels party's source registrations and releases, the trainer's jobs on its cluster). PySpark is
imported only when a job uses it."""

from __future__ import annotations

import threading


class SparkJobs:
    """This process's Spark session (started on first use: seconds), shared by its job workers."""

    def __init__(self, master: str, local_dir: str | None = None, secret: str | None = None,
                 app_name: str = "labeldp-release"):
        """``local_dir``: where Spark keeps its scratch (shuffle blocks hold per-partition label counts, example
        ids, a job's rows): under the service's data directory, which a starting service cleans, never ``/tmp``.
        ``secret``: the cluster's shared authentication secret (none needed in local mode)."""
        self.master, self.local_dir, self._secret, self.app_name = master, local_dir, secret, app_name
        self._session = None
        self._lock = threading.Lock()

    def session(self):
        from shared.spark.session import spark_session  # PySpark only where a job uses Spark

        with self._lock:
            if self._session is None or self._session.sparkContext._jsc is None:  # none yet, or it was stopped
                conf = {"spark.local.dir": self.local_dir} if self.local_dir else None
                self._session = spark_session(self.master, self.app_name, conf=conf, secret=self._secret)
            return self._session
