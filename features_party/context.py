"""The trainer's context: its settings, database sessions, job executor and the fair queue it takes jobs from
(:mod:`.scheduling`), and spool directory, built once per process.

At start, jobs a previous process left queued or running become ``interrupted`` and leftovers are collected."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from features_party import db, migrations
from features_party.scheduling import FairQueue
from features_party.settings import TrainerSettings
from shared.service.database import make_engine
from shared.service.scratch import Scratch

log = logging.getLogger("labeldp.features")


@dataclass(frozen=True)
class TrainerContext:
    settings: TrainerSettings
    sessions: sessionmaker
    executor: ThreadPoolExecutor
    scratch: Scratch = field(kw_only=True)  # this process's spool directory under the data directory
    queue: FairQueue = field(default_factory=FairQueue, kw_only=True)  # queued jobs, taken fairly by organization

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir)

    def org_dir(self, org_id: int) -> Path:
        return self.data_dir / "orgs" / str(int(org_id))

    def close(self) -> None:
        """Let go of the job threads, the spool directory and the database (a context that is done)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.scratch.close()
        self.sessions.kw["bind"].dispose()


def make_context(settings: TrainerSettings | None = None, *, upgrade: bool = False) -> TrainerContext:
    settings = settings or TrainerSettings()
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    ctx = TrainerContext(settings, migrations.make_sessionmaker(make_engine(settings.database_url), upgrade=upgrade),
                         ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="train"),
                         scratch=Scratch(settings.data_dir))
    mark_interrupted(ctx)
    collect_leftovers(ctx)
    return ctx


def collect_leftovers(ctx: TrainerContext) -> int:
    """What a crashed process left: spooled bodies of dead processes (removed by :class:`Scratch` itself) and,
    when no other process uses the data directory, its ``.tmp`` temporaries (features tables being written)."""
    with ctx.scratch.alone() as alone:
        removed = ctx.scratch.remove_leftovers() if alone else 0
    if removed:
        log.info("removed %d leftover file(s) of earlier processes from the data directory", removed)
    return removed


def mark_interrupted(ctx: TrainerContext) -> int:
    """Jobs a previous process left queued or running cannot continue on their own: the labels-party key they
    ran with was never stored. They become ``interrupted``; ``POST /v1/jobs/{id}/resume`` with the key continues
    them, reusing their releases (same Idempotency-Keys: no second draw, no second charge)."""
    with ctx.sessions() as session, session.begin():
        jobs = list(session.scalars(select(db.Job).where(db.Job.status.in_(("queued", "running")))))
        for job in jobs:
            job.status, job.updated_at = "interrupted", db.utcnow()
            job.error = "interrupted by a restart of the trainer: resume it with the labels-party api_key"
        return len(jobs)
