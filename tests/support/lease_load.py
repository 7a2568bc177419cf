"""Two job runners on one database under CPU load (tests/shared/service/test_lease_load.py): the tables, a job that
records each execution before it works, and the runner process (``python -m tests.support.lease_load URL …``).

A job writes one ``load_runs`` row when it starts — in its own transaction, not fenced: every execution is counted,
also one that would later find its lease gone — then works (pure-Python arithmetic, in short C calls that hold the
interpreter lock too, checking ``lost`` between them), then records its outcome fenced by its lease. A job executed
twice (its lease expired under a live worker and another claimed it) shows as two runs."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import ForeignKey, Integer, MetaData, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from shared.service.database import UtcDateTime, make_engine, new_id, utcnow
from shared.service.leases import JobRunner, Lease, LeaseColumns, LeaseTable


class Base(DeclarativeBase):
    metadata = MetaData()


class LoadJob(LeaseColumns, Base):
    __tablename__ = "load_jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    state: Mapped[str] = mapped_column(String(20), default="queued")
    done_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class LoadRun(Base):
    """One execution of a job: who ran it, which attempt."""

    __tablename__ = "load_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("load_jobs.id"))
    owner: Mapped[str] = mapped_column(String(80))
    attempt: Mapped[int] = mapped_column(Integer)


def _exhausted(_session, row) -> None:
    row.state = "failed"


TABLE = LeaseTable(LoadJob, "state", ("queued",), "running", max_attempts=5, exhausted=_exhausted)

# Work per job: CHUNKS calls of sum(range(CHUNK)) — a C loop that keeps the interpreter lock for its whole call
# (a few ms each on an idle core) — between pure-Python steps; about 0.3 s of one idle core in all.
CHUNKS, CHUNK = 60, 100_000


def work(lost: threading.Event) -> bool:
    """The job's computation; False if it stopped because its lease was lost."""
    total = 0
    for i in range(CHUNKS):
        if lost.is_set():
            return False
        total += sum(range(CHUNK)) + sum(j * j for j in range(2_000)) + i
    return total > 0


def run_job(sessions: sessionmaker, name: str):
    def run(lease: Lease, lost: threading.Event) -> None:
        with sessions() as session, session.begin():
            session.add(LoadRun(job_id=lease.job_id, owner=lease.owner, attempt=lease.attempt))
        if not work(lost):
            return
        with sessions() as session, session.begin():
            row = TABLE.held(session, lease)
            if row is not None:
                row.done_by = name
                TABLE.finish(row, "done")
    return run


def remaining(sessions: sessionmaker) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(LoadJob).where(LoadJob.state.in_(("queued",
                                                                                                 "running")))) or 0


def serve(url: str, name: str, threads: int, lease_seconds: float) -> None:
    """A runner process: its workers and heartbeat run until no job is left, then it stops."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    engine = make_engine(url)
    sessions = sessionmaker(engine, expire_on_commit=False)
    runner = JobRunner(name, sessions, TABLE, run_job(sessions, name), threads=threads, lease_seconds=lease_seconds,
                       poll_seconds=0.1, retry_seconds=0.5).start()
    print("started", flush=True)
    try:
        while remaining(sessions):
            time.sleep(0.2)
    finally:
        runner.stop(timeout=60)
        engine.dispose()


@contextmanager
def cpu_hogs(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` processes that spin on a core each until the block ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lease-seconds", type=float, default=3.0)
    args = parser.parse_args()
    serve(args.url, args.name, args.threads, args.lease_seconds)
