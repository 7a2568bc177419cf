"""Where a labels service runs its Spark work: one session per process, started on first use. The jobs that use it
— a source's registration, a source release's privatization — are durable rows run by the process's job workers
(:mod:`labels_party.runtime.jobs`). PySpark is imported only when a source dataset is used."""

from __future__ import annotations

import threading


class SparkJobs:
    """This process's Spark session (started on first use: seconds), shared by its job workers."""

    def __init__(self, master: str, local_dir: str | None = None, secret: str | None = None):
        """``local_dir``: where Spark keeps its scratch (shuffle blocks hold per-partition label counts and example
        ids): under the service's data directory, which a starting service cleans, never ``/tmp``. ``secret``: the
        cluster's shared authentication secret (none needed in local mode)."""
        self.master, self.local_dir, self._secret = master, local_dir, secret
        self._session = None
        self._lock = threading.Lock()

    def session(self):
        from labels_party.spark.session import spark_session  # PySpark only where source datasets are used

        with self._lock:
            if self._session is None or self._session.sparkContext._jsc is None:  # none yet, or it was stopped
                conf = {"spark.local.dir": self.local_dir} if self.local_dir else None
                self._session = spark_session(self.master, conf=conf, secret=self._secret)
            return self._session
