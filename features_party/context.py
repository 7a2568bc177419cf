"""The trainer's context, built once per process: its settings, database sessions, the sealer of jobs' labels-party
API keys (:mod:`shared.service.sealing`), the process's job workers (``jobs``: a
:class:`~shared.service.leases.JobRunner` on the jobs table, :func:`features_party.jobs.make_runner`; ``serve``
starts it, ``ctx.jobs.alive()`` says whether it runs) and its spool directory.

Nothing is done at start to jobs other processes may be running: a job whose process died is taken over by any
process's workers once its lease expires. Leftover files of dead processes are collected."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from features_party import db, migrations
from features_party.settings import TrainerSettings
from shared.service.budgets import ByteBudget
from shared.service.database import make_engine
from shared.service.leases import JobRunner
from shared.service.scratch import Scratch
from shared.service.sealing import Sealer, sealer
from shared.service.storage_quota import check_room, org_quota, tree_bytes
from shared.spark.runner import SparkJobs
from shared.spark.security import spark_secret

log = logging.getLogger("labeldp.features")

ENDED = ("succeeded", "failed")  # a job that will write nothing more


@dataclass(frozen=True)
class TrainerContext:
    settings: TrainerSettings
    sessions: sessionmaker
    sealer: Sealer = field(kw_only=True)  # seals and opens jobs' labels-party API keys
    # this process's session on the trainer's Spark cluster (settings.spark_master; None: jobs train in process)
    spark_jobs: SparkJobs | None = field(default=None, kw_only=True)
    scratch: Scratch = field(kw_only=True)  # this process's spool directory under the data directory
    # this process's job workers (not started: `serve` starts them), bound by features_party.process.make_context:
    # the jobs module works on this context, so the context cannot import it (no import circles)
    jobs: JobRunner = field(init=False, repr=False)
    table_reads: ByteBudget = field(init=False, repr=False)  # see TrainerSettings.table_read_budget_bytes
    storage_quota: int = field(init=False, repr=False)  # what one organization may store (its directory)
    _storing_lock: threading.Lock = field(init=False, repr=False)
    _storing_locks: dict[int, threading.Lock] = field(init=False, repr=False)  # an organization's uploads, in turn

    def __post_init__(self) -> None:
        budget = self.settings.table_read_budget_bytes
        object.__setattr__(self, "table_reads", ByteBudget(budget, budget))
        object.__setattr__(self, "storage_quota", org_quota(self.settings.max_stored_bytes_per_org, self.data_dir))
        object.__setattr__(self, "_storing_lock", threading.Lock())
        object.__setattr__(self, "_storing_locks", {})

    @contextlib.contextmanager
    def storing(self, org_id: int, more: int, what: str) -> Iterator[None]:
        """:meth:`check_storage`, and the block that stores, one at a time per organization in this process: an
        organization's concurrent uploads each passed the check on what the others had not written yet (the
        twenty-ninth review: eight features tables at once went 2.02 times over its quota)."""
        with self._storing_lock:
            lock = self._storing_locks.setdefault(org_id, threading.Lock())
        with lock:
            self.check_storage(org_id, more, what)
            yield

    def check_storage(self, org_id: int, more: int, what: str) -> None:
        """Refuse ``what`` (507 storage_quota_exceeded) when what the organization stores (:meth:`_stored`) with
        ``more`` bytes would be over its quota."""
        with self.sessions() as session:
            check_room(self._stored(session, org_id), more, self.storage_quota, what)

    def reserve_output(self, org_id: int, job_id: str, more: int, what: str) -> None:
        """:meth:`check_storage` for a job's outputs, and ``more`` recorded as the job's estimate, in one
        transaction that locks the organization's row: its jobs created or resumed at once, on any replica, are
        checked one at a time, each on the others' estimates (the job's own is replaced)."""
        with self.sessions() as session, session.begin():
            session.get(db.Organization, org_id, with_for_update=True)
            check_room(self._stored(session, org_id, job_id), more, self.storage_quota, what)
            job = session.get(db.Job, job_id)
            if job is not None:
                job.output_bytes = more

    def _stored(self, session: Session, org_id: int, instead_of: str | None = None) -> int:
        """What the organization stores: its directory (features tables, id lists) and its jobs' directories
        (models, predictions) — a job that has not ended at least at its plan's estimate (issue 40's
        thirty-second review: jobs waiting to run counted nothing until they wrote, and ``max_jobs_per_org`` of
        them passed one check), except the job ``instead_of``, whose estimate is being replaced."""
        jobs = session.execute(select(db.Job.id, db.Job.status, db.Job.output_bytes)
                               .where(db.Job.org_id == org_id)).all()
        return tree_bytes(self.org_dir(org_id)) + sum(
            max(tree_bytes(self.data_dir / "jobs" / job),
                0 if status in ENDED or job == instead_of else int(estimate or 0))
            for job, status, estimate in jobs)

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir)

    def org_dir(self, org_id: int) -> Path:
        return self.data_dir / "orgs" / str(int(org_id))

    def close(self) -> None:
        """Let go of the job workers, the spool directory and the database (a context that is done)."""
        self.jobs.stop()
        self.scratch.close()
        self.sessions.kw["bind"].dispose()


def build_context(settings: TrainerSettings | None = None, *, upgrade: bool = False) -> TrainerContext:
    """The context without its job workers (:func:`features_party.process.make_context` binds them)."""
    settings = settings or TrainerSettings()
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    spark = None if settings.spark_master is None else SparkJobs(
        settings.spark_master, str(Path(settings.data_dir).resolve() / "spark"),
        spark_secret(settings.spark_master, settings.spark_secret_file), app_name="labeldp-trainer")
    ctx = TrainerContext(settings, migrations.make_sessionmaker(make_engine(settings.database_url), upgrade=upgrade),
                         sealer=sealer(settings), scratch=Scratch(settings.data_dir, settings.spool_budget_bytes,
                                                                   settings.json_decode_wait_seconds),
                         spark_jobs=spark)
    collect_leftovers(ctx)
    return ctx


def collect_leftovers(ctx: TrainerContext) -> int:
    """What a crashed process left: spooled bodies of dead processes (removed by :class:`Scratch` itself) and,
    when no other process uses the data directory, its ``.tmp`` temporaries (features tables being written), id
    list files and imported tables no row points at."""
    with ctx.scratch.alone() as alone:
        removed = (ctx.scratch.remove_leftovers() + _unreferenced_id_lists(ctx) + _unreferenced_tables(ctx)
                   if alone else 0)
    if removed:
        log.info("removed %d leftover file(s) of earlier processes from the data directory", removed)
    return removed


def _unreferenced_id_lists(ctx: TrainerContext) -> int:
    """Id-list files (each upload writes its own, :mod:`features_party.id_lists`) that no row names: an upload that
    died before its row was written, or after, before it removed the file its row named until then."""
    with ctx.sessions() as session, session.begin():
        kept = {Path(file).resolve() for file in session.scalars(select(db.IdList.file))}
    stray = [f for f in ctx.data_dir.glob("orgs/*/id-lists/*.parquet") if f.resolve() not in kept]
    for file in stray:
        file.unlink(missing_ok=True)
    return len(stray)


DATASET_SUFFIX = ".dataset"  # an imported table's directory (features_party.feature_datasets): <name>.<uuid>.dataset


def _unreferenced_tables(ctx: TrainerContext) -> int:
    """Imported tables' directories no row names (an import that died before its row was written, or after,
    before it removed the table it replaced)."""
    with ctx.sessions() as session, session.begin():
        kept = {Path(file).resolve() for file in session.scalars(select(db.FeatureTable.file))}
    stray = [d for d in ctx.data_dir.glob(f"orgs/*/features/*{DATASET_SUFFIX}") if d.resolve() not in kept]
    for directory in stray:
        shutil.rmtree(directory, ignore_errors=True)
    return len(stray)
