"""Durable jobs under leases, for services run as several processes on one database.

A job is a row (each party's own table, with :class:`LeaseColumns`). A worker *claims* one with
``SELECT … FOR UPDATE SKIP LOCKED`` (PostgreSQL: replicas never block on, or take, each other's rows; SQLite has
one writer at a time and its ``BEGIN IMMEDIATE`` serializes claims — run one process there): a row in a claimable
state whose lease is free or expired, not before its ``run_after``. The claim writes the worker's id as
``lease_owner``, an expiry ``lease_seconds`` ahead and one more ``attempts``; the runner's heartbeat renews the
expiry of every job it holds every ``lease_seconds / 10``. A worker that dies stops renewing, and once the lease has
expired any replica's worker claims the job again — no client action needed.

**The heartbeat is not starved by the work.** It is a thread of its own that does nothing else, on a database
connection of its own (an engine with one connection, :func:`heartbeat_engine`): not the pool that requests and
jobs share, which a burst of requests can exhaust, so a renewal never queues behind them. It renews every tenth
of the lease, so nine renewals in a row must be late or fail before a lease can expire under a live process —
an outside review's loaded machine (load average 10–17 on 2 cores) made the services log lost leases with renewals
every third. (Python threads share one interpreter lock: a single C call that held it for ``0.9 × lease_seconds``
would still starve the heartbeat — the default lease, 30 s, is far longer than any such call here.) A runner never
claims a job it holds itself (its heartbeat late), and a job its own worker just finished is not reported lost.

At most one live lease: a claim takes only a free or expired lease, under the row lock. A worker that lost its
lease (paused past the expiry, or cut from the database) may still be computing; what it *finishes* is fenced:
:meth:`LeaseTable.held` locks the row and checks that the owner and attempt are still its own, and a worker that
does not hold the lease changes nothing. Jobs are written to be re-run from the start (a source release re-derives
the same noise from its sealed secret; a trainer job gets its release back by its Idempotency-Key), so a takeover
repeats work but never its effect.

Attempts are bounded: a job claimed ``max_attempts`` times that comes back once more (its worker died, or it asked
to be retried) is finished by its table's ``exhausted`` callback (the party's ``failed`` with a code).

Work a request does itself can be leased too (:meth:`JobRunner.lease_new`): its row is inserted already claimed by
the process (attempt 1) in the transaction that creates the work, and the process's runner renews it while the
request works (:meth:`JobRunner.adopted`). If the process dies, the lease expires and any worker claims the row —
whose job is then to clean up after the request — like any other. The heartbeat runs whenever the runner holds a
lease: a runner whose workers were not started (tests, commands) starts it on demand for adopted leases and stops
it once they are let go, so such a lease is valid exactly as long as its process lives and reaches the database.

Times are the workers' clocks (UTC): replicas need synchronized clocks (NTP), far tighter than a lease of seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Integer, String, event, or_, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from shared.service.database import UtcDateTime, make_engine, utcnow

log = logging.getLogger("labeldp.jobs")


class LeaseColumns:
    """Columns of a job table's rows that workers lease (mixed into a party's declarative table)."""

    if TYPE_CHECKING:
        id: Mapped[str]

    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(80), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    run_after: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)


@dataclass(frozen=True)
class Lease:
    """One claim of one job: its owner and attempt number are the fencing token."""

    job_id: str
    owner: str
    attempt: int


def worker_id() -> str:
    """This process's id as a lease owner: readable (host and pid, for operators) and unique (a reused pid)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def heartbeat_engine(sessions: sessionmaker) -> Engine | None:
    """An engine of its own, one connection, on the database ``sessions`` is bound to: what a heartbeat renews
    leases through. None where a second engine would not see the same database (an in-memory SQLite)."""
    bound = sessions.kw.get("bind")
    if not isinstance(bound, Engine):
        return None
    url = bound.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return None
    return make_engine(url.render_as_string(hide_password=False), pool_size=1)


@dataclass(frozen=True)
class Renewal:
    """What a renewal found: the leases still held (renewed, or locked by their own worker finishing them), and
    those another worker has taken over (a different owner or attempt). The rest were let go by their worker."""

    held: set[str]
    taken: set[str]


@dataclass(frozen=True)
class LeaseTable:
    """How one party's job table is leased: the mapped class, its state column's name, the states a worker may
    claim (a job in ``running_state`` only when its lease expired), and what becomes of a job out of attempts."""

    model: Any  # the mapped class (with LeaseColumns)
    state_column: str
    claimable: tuple[str, ...]
    running_state: str
    max_attempts: int
    exhausted: Callable[[Session, Any], None]  # finish a row out of attempts (locked, in the claim's transaction)
    order_by: Callable[[], Sequence[Any]] = field(default=lambda: ())  # claim order (default: insertion)
    where: Callable[[], Sequence[Any]] = field(default=lambda: ())  # more conditions a claimable row meets

    def claim(self, session: Session, owner: str, lease_seconds: float, *,
              holding: Collection[str] = ()) -> Lease | None:
        """Take the first claimable job (its row locked, others' locked rows skipped), or None. ``holding``: the
        jobs the claimant's process runs now, never claimed again by it even if their leases ran out."""
        model, now = self.model, utcnow()
        state = getattr(model, self.state_column)
        free = or_(model.lease_owner.is_(None), model.lease_expires_at < now)
        due = or_(model.run_after.is_(None), model.run_after <= now)
        mine = (model.id.not_in(list(holding)),) if holding else ()
        query = (select(model).where(state.in_(self.claimable + (self.running_state,)), free, due, *mine,
                                     *self.where())
                 .order_by(*self.order_by(), model.created_at).limit(1).with_for_update(skip_locked=True))
        while True:
            row = session.scalars(query).first()
            if row is None:
                return None
            if row.attempts >= self.max_attempts:
                self.exhausted(session, row)
                self._clear(row)
                session.flush()
                continue
            setattr(row, self.state_column, self.running_state)
            row.attempts += 1
            row.lease_owner, row.heartbeat_at = owner, now
            row.lease_expires_at = now + timedelta(seconds=lease_seconds)
            row.run_after = None
            return Lease(row.id, owner, row.attempts)

    def leased_row(self, owner: str, lease_seconds: float, **columns: Any) -> Any:
        """A new row (``columns`` besides the lease's) already claimed by ``owner``, attempt 1: for work its
        creator does at once, added in the transaction that creates the work."""
        now = utcnow()
        return self.model(**columns, **{self.state_column: self.running_state}, attempts=1, lease_owner=owner,
                          heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_seconds), run_after=None)

    def renew(self, session: Session, leases: Sequence[Lease], lease_seconds: float) -> set[str]:
        """Extend each lease still held; the ids of those held (a lease lost to a takeover is not renewed)."""
        return self.renewal(session, leases, lease_seconds).held

    def renewal(self, session: Session, leases: Sequence[Lease], lease_seconds: float) -> Renewal:
        """Extend each lease still held; which are held, and which another worker took over."""
        if not leases:
            return Renewal(set(), set())
        model, now = self.model, utcnow()
        rows = session.scalars(select(model).where(model.id.in_([lease.job_id for lease in leases]))
                               .with_for_update(skip_locked=True)).all()
        by_id = {row.id: row for row in rows}
        held, taken = set(), set()
        for lease in leases:
            row = by_id.get(lease.job_id)
            if row is not None and self._holds(row, lease):
                row.heartbeat_at, row.lease_expires_at = now, now + timedelta(seconds=lease_seconds)
                held.add(lease.job_id)
            elif row is not None:
                if row.attempts != lease.attempt or row.lease_owner not in (None, lease.owner):
                    taken.add(lease.job_id)  # else its worker finished it or gave it back: let go, not lost
            elif session.get(model, lease.job_id) is not None:
                held.add(lease.job_id)  # locked by its own worker finishing it: not lost
        return Renewal(held, taken)

    def held(self, session: Session, lease: Lease) -> Any | None:
        """The job's row, locked, if ``lease`` still holds it (else None: another worker took it over, or it was
        finished): what a worker checks in the transaction that records its outcome."""
        row = session.get(self.model, lease.job_id, with_for_update=True)
        return row if row is not None and self._holds(row, lease) else None

    def finish(self, row: Any, state: str) -> None:
        """The job done (by the worker holding it, in the transaction of :meth:`held`)."""
        setattr(row, self.state_column, state)
        self._clear(row)

    def retry_later(self, row: Any, state: str, seconds: float) -> None:
        """Give the job back to be claimed again (by any worker) after ``seconds``; attempts stay counted."""
        setattr(row, self.state_column, state)
        self._clear(row)
        row.run_after = utcnow() + timedelta(seconds=seconds)

    def _holds(self, row: Any, lease: Lease) -> bool:
        return (row.lease_owner == lease.owner and row.attempts == lease.attempt
                and getattr(row, self.state_column) == self.running_state)

    @staticmethod
    def _clear(row: Any) -> None:
        row.lease_owner = row.lease_expires_at = None


RunJob = Callable[[Lease, threading.Event], None]


class JobRunner:
    """A process's workers for one job table: ``threads`` threads claim and run jobs, one heartbeat thread renews
    their leases every ``renew_seconds`` (default a tenth of the lease) on its own connection. ``run(lease, lost)``
    does the job and records its outcome through :meth:`LeaseTable.held`; ``lost`` is set when the heartbeat finds
    the lease taken over, so a long job can stop early. A job that raises is given back to be claimed again after
    ``retry_seconds`` (its attempt counted: a crash loop is bounded by ``max_attempts``, and a transient fault such
    as a database restart has passed), never left holding its lease."""

    def __init__(self, name: str, sessions: sessionmaker, table: LeaseTable, run: RunJob, *, threads: int = 1,
                 lease_seconds: float = 30.0, poll_seconds: float = 1.0, retry_seconds: float = 5.0,
                 retry_state: str | None = None, renew_seconds: float | None = None):
        self.name, self.sessions, self.table, self._run = name, sessions, table, run
        self.threads, self.lease_seconds, self.poll_seconds = threads, lease_seconds, poll_seconds
        self.renew_seconds = renew_seconds if renew_seconds is not None else lease_seconds / 10
        # how long a lease taken by lease_new is renewed before it is adopted (its creator failed in between: it
        # then expires, and a worker cleans up after it)
        self.adopt_seconds = max(60.0, 10 * lease_seconds)
        self.retry_seconds, self.retry_state = retry_seconds, retry_state or table.claimable[0]
        self.owner = worker_id()
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._held: dict[str, tuple[Lease, threading.Event]] = {}
        self._provisional: dict[str, float] = {}  # leases of lease_new not adopted yet: renewed until (monotonic)
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []  # the claiming threads, once started
        self._beating: threading.Thread | None = None  # the heartbeat, while it runs
        self._beat_engine: Engine | None = None  # the heartbeat's own connection (heartbeat_engine), while needed
        self._beat_sessions: sessionmaker | None = None
        self._last_beat = utcnow()

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> JobRunner:
        threads = [threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
                   for i in range(self.threads)]
        with self._lock:
            self._workers = threads
            self._start_heartbeat()
        for thread in threads:
            thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming and renewing; wait up to ``timeout`` for running jobs (whose leases then expire if they
        go on)."""
        self._stopping.set()
        self.wake()
        with self._lock:
            threads = [*self._workers, *([self._beating] if self._beating is not None else [])]
        for thread in threads:
            thread.join(timeout)
        with self._lock:
            if self._beating is None or not self._beating.is_alive():
                self._close_heartbeat_engine()

    def alive(self) -> bool:
        """Every thread running and the leases renewed recently (readiness)."""
        fresh = (utcnow() - self._last_beat).total_seconds() < 2 * self.lease_seconds
        with self._lock:
            threads = [*self._workers, self._beating]
        return bool(self._workers) and all(t is not None and t.is_alive() for t in threads) and fresh

    def wake(self) -> None:
        """A job was just queued (here): claim now rather than at the next poll."""
        with self._wake:
            self._wake.notify_all()

    def holding(self) -> list[str]:
        with self._lock:
            return list(self._held)

    # -- leases taken outside a claim ------------------------------------------------------------------------------
    def lease_new(self, session: Session, **columns: Any) -> Lease:
        """Insert, in the caller's transaction, a job already claimed by this runner (attempt 1, a lease of
        ``lease_seconds``): work the caller does itself, then :meth:`adopted`, and claimed by any worker if the
        lease expires.

        The lease is renewed from its insertion, not from its adoption: what runs between the commit and
        :meth:`adopted` may wait (the labels party's ledger confirms a charge's head after the commit, under the
        dataset's lock, behind every concurrent charge of the dataset — under load, longer than a lease of 5 s:
        issue 40's replicas test saw a release failed as abandoned by its own process). Its expiry is set again
        as the transaction commits, and until it is adopted — at most ``adopt_seconds`` — the heartbeat renews it
        (once the commit makes it visible) and this runner's workers never claim it. A rollback lets it go."""
        row = self.table.leased_row(self.owner, self.lease_seconds, **columns)
        session.add(row)
        session.flush()  # its id
        lease = Lease(row.id, self.owner, row.attempts)

        committed = threading.Event()

        def committing(_session: Session) -> None:  # the lease runs from the commit on, however long it waited
            now = utcnow()
            row.heartbeat_at, row.lease_expires_at = now, now + timedelta(seconds=self.lease_seconds)

        def rolled_back(_session: Session) -> None:  # the row was never written: nothing to renew
            with self._lock:
                if not committed.is_set() and self._provisional.pop(lease.job_id, None) is not None:
                    self._held.pop(lease.job_id, None)

        event.listen(session, "before_commit", committing, once=True)
        event.listen(session, "after_commit", lambda _session: committed.set(), once=True)
        event.listen(session, "after_rollback", rolled_back, once=True)
        with self._lock:
            self._held[lease.job_id] = (lease, threading.Event())
            self._provisional[lease.job_id] = time.monotonic() + self.adopt_seconds
            self._start_heartbeat()
        return lease

    def let_go(self, lease: Lease) -> None:
        """Stop renewing a lease of :meth:`lease_new` that will not be adopted (its creator failed before): it
        expires, and a worker cleans up after it."""
        with self._lock:
            self._provisional.pop(lease.job_id, None)
            self._held.pop(lease.job_id, None)

    @contextlib.contextmanager
    def adopted(self, lease: Lease) -> Iterator[threading.Event]:
        """Renew ``lease`` with the others this runner holds while the block runs, then let it go (a lease let go
        expires unless its job was finished). Yields the event set when the heartbeat finds it lost."""
        with self._lock:
            self._provisional.pop(lease.job_id, None)
            held = self._held.get(lease.job_id)
            lost = held[1] if held is not None and held[0] == lease else threading.Event()
            self._held[lease.job_id] = (lease, lost)
            self._start_heartbeat()
        try:
            yield lost
        finally:
            with self._lock:
                self._held.pop(lease.job_id, None)

    def run_pending(self) -> int:
        """Claim and run jobs in the calling thread until none is claimable now; how many ran (tests and commands
        that run a service's jobs without its threads)."""
        ran = 0
        while (lease := self._claim()) is not None:
            self._execute(lease)
            ran += 1
        return ran

    # -- threads -------------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stopping.is_set():
            try:
                lease = self._claim()
            except Exception:  # the database is away: try again at the next poll
                log.warning("%s: cannot claim jobs (database unavailable?)", self.name, exc_info=True)
                lease = None
            if lease is None:
                with self._wake:
                    self._wake.wait(self.poll_seconds)
                continue
            self._execute(lease)

    def _execute(self, lease: Lease) -> None:
        lost = threading.Event()
        with self._lock:
            self._held[lease.job_id] = (lease, lost)
        try:
            self._run(lease, lost)
        except Exception:
            log.exception("%s: job %s failed unexpectedly (attempt %d)", self.name, lease.job_id, lease.attempt)
            self._give_back(lease)
        finally:
            with self._lock:
                self._held.pop(lease.job_id, None)

    def _claim(self) -> Lease | None:
        with self.sessions() as session, session.begin():
            return self.table.claim(session, self.owner, self.lease_seconds, holding=self.holding())

    def _give_back(self, lease: Lease) -> None:
        try:
            with self.sessions() as session, session.begin():
                row = self.table.held(session, lease)
                if row is not None:
                    self.table.retry_later(row, self.retry_state, self.retry_seconds)
        except Exception:  # its lease expires and another attempt claims it
            log.warning("%s: could not give job %s back", self.name, lease.job_id, exc_info=True)

    def _start_heartbeat(self) -> None:
        """The heartbeat, unless it runs (called holding ``_lock``); never once the runner is stopping."""
        if self._beating is None and not self._stopping.is_set():
            self._beating = threading.Thread(target=self._heartbeat, name=f"{self.name}-heartbeat", daemon=True)
            self._beating.start()

    def _heartbeat(self) -> None:
        try:
            while not self._stopping.wait(self.renew_seconds):
                with self._lock:
                    if not self._workers and not self._held:  # started for adopted leases only, and all let go
                        self._beating = None
                        self._close_heartbeat_engine()
                        return
                self.beat()
        finally:
            with self._lock:
                if self._stopping.is_set():
                    self._close_heartbeat_engine()

    def _heartbeat_sessions(self) -> sessionmaker:
        """The heartbeat's sessions: on its own one-connection engine (the shared ones where there is none)."""
        with self._lock:
            if self._beat_sessions is None:
                self._beat_engine = heartbeat_engine(self.sessions)
                self._beat_sessions = (sessionmaker(self._beat_engine, expire_on_commit=False)
                                       if self._beat_engine is not None else self.sessions)
            return self._beat_sessions

    def _close_heartbeat_engine(self) -> None:
        """(Holding ``_lock``.) Close the heartbeat's connection; the next beat opens another."""
        if self._beat_engine is not None:
            self._beat_engine.dispose()
        self._beat_engine = self._beat_sessions = None

    def beat(self) -> None:
        """Renew every lease held; flag those another worker took over (tests call it directly)."""
        with self._lock:
            now = time.monotonic()
            for job_id in [job_id for job_id, until in self._provisional.items() if until < now]:
                log.warning("%s: job %s was leased for its creator, which never adopted it: let go", self.name,
                            job_id)
                self._provisional.pop(job_id)
                self._held.pop(job_id, None)
            held = dict(self._held)
        if not held:
            self._last_beat = utcnow()
            return
        try:
            with self._heartbeat_sessions()() as session, session.begin():
                renewal = self.table.renewal(session, [lease for lease, _ in held.values()], self.lease_seconds)
        except Exception:
            log.warning("%s: cannot renew leases (database unavailable?)", self.name, exc_info=True)
            return
        self._last_beat = utcnow()
        for job_id, (lease, lost) in held.items():
            if job_id in renewal.taken:
                log.warning("%s: lost the lease of job %s (attempt %d): another worker has it", self.name, job_id,
                            lease.attempt)
                lost.set()


def serving(runner: JobRunner | None):
    """A FastAPI lifespan that runs ``runner``'s workers while the application serves — in every ``serve``
    process, one or one of several workers — and stops them at shutdown (a job still running then is taken over
    once its lease expires). None: the jobs are run by the caller (tests: ``run_pending``)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                runner.stop()

    return lifespan
