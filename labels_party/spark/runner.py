"""Where a labels service runs its Spark work: one session per service (started on first use) and one thread for
release jobs. PySpark is imported only when a source dataset is used."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class SparkJobs:
    """This service's Spark session (started on first use: seconds) and the thread that runs release jobs."""

    def __init__(self, master: str, local_dir: str | None = None):
        """``local_dir``: where Spark keeps its scratch (shuffle blocks hold per-partition label counts and example
        ids): under the service's data directory, which a starting service cleans, never ``/tmp``."""
        self.master, self.local_dir = master, local_dir
        self._session = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-release")
        self._running: set[str] = set()

    def session(self):
        from labels_party.spark.session import spark_session  # PySpark only where source datasets are used

        with self._lock:
            if self._session is None:
                conf = {"spark.local.dir": self.local_dir} if self.local_dir else None
                self._session = spark_session(self.master, conf=conf)
            return self._session

    def running(self, release_id: str) -> bool:
        with self._lock:
            return release_id in self._running

    def submit(self, release_id: str, job) -> None:
        with self._lock:
            if release_id in self._running:
                return
            self._running.add(release_id)

        def run():
            try:
                job()
            finally:
                with self._lock:
                    self._running.discard(release_id)

        self._pool.submit(run)

    def wait(self) -> None:
        """Block until every submitted job has finished (tests, shutdown)."""
        self._pool.submit(lambda: None).result()
