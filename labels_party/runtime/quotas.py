"""Per-organization quotas on release computation: concurrent releases, and release-seconds per window.

Every release (label, per-example prior, group, evaluation, central training) is computed in the request that
asked for it, in a worker thread: without a limit, one organization's concurrent solves took the server's CPU
for minutes. :meth:`ReleaseQuotas.slot` is entered by the release transaction after the refusals that cost
nothing and **before the charge** — a quota refusal is a refusal on public information (the organization's own
load), so nothing is charged and nothing private has been drawn (:mod:`labels_party.releases.transaction`):

* **concurrency** — an organization computes at most ``release_slots_per_org`` releases at once; at most as many
  more of its requests wait, each at most ``release_queue_seconds``, for one to finish; beyond that, 429
  ``release_quota_exceeded`` with ``Retry-After``;
* **time** — the wall-clock time each release holds its slot (from the slot to the answer: the lookup, the
  charge, the solve, the sampling, the file) is debited to its organization afterwards from a bucket of
  ``release_seconds`` that refills continuously over ``release_window_seconds``; an organization whose bucket is
  empty is refused (429 ``release_quota_exceeded``, ``Retry-After``: until it is no longer empty). A release is
  admitted while its organization's bucket is not empty, so the bucket can go below zero by what the releases
  already admitted cost; they are bounded by the solver limit (``solver_seconds``) and the concurrency limit.
  Why wall-clock time and not the worker thread's CPU time: the debit shows in ``Retry-After``, so it must carry
  nothing its requester has not seen — the release's duration it has (its response time), but the CPU time of a
  computation whose running time depends on the labels it has not: a DP quantile's exact sampler is padded to a
  floor in wall-clock time (:mod:`labels_party.core.quantiles`), its CPU time is not, and Retry-After told concentrated
  labels from spread ones. Wall-clock time also bounds the worker thread's CPU time and counts what a padded
  release holds its slot for;
* **capacity** — the process computes at most ``release_slots`` releases at once, whichever organizations ask.
  This is the one place another organization's load can show: when every slot is taken a request waits (at most
  ``release_queue_seconds``), then gets 503 ``release_capacity_exhausted`` with ``Retry-After``. Below that
  capacity an organization's answers depend on its own releases only — and on how fast the machine runs them: a
  release's duration, so its debit, grows with the machine's load, as its response time does (nothing the
  requester has not already seen).

The state is this process's (in the service context; no module state): replicas each count their own.
Not counted: a source dataset's Spark job (the process's job workers run it, ``job_threads`` at a time) and native
threads a solver library may start besides the worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import BaseModel, Field, model_validator

from shared.errors import ErrorCode, RetryLater


class QuotaSettings(BaseModel):
    """The quotas' deployment settings (part of :class:`labels_party.runtime.settings.LabelsSettings`)."""

    release_slots_per_org: int = Field(default=2, ge=1)
    release_slots: int = Field(default=4, ge=1)
    release_queue_seconds: float = Field(default=10.0, ge=0, le=300)
    release_seconds: float = Field(default=1800.0, gt=0)
    release_window_seconds: float = Field(default=3600.0, gt=0)

    def describe(self) -> str:
        """The quotas as the OpenAPI description states them (this deployment's values)."""
        return (f"Release quotas per organization: {self.release_slots_per_org} releases computed at once (as many "
                f"more wait up to {self.release_queue_seconds:g} s) and {self.release_seconds:g} seconds of release "
                f"computation per {self.release_window_seconds:g} s, refilled continuously (429 "
                f"release_quota_exceeded, Retry-After); {self.release_slots} releases computed at once by the service "
                f"(503 release_capacity_exhausted, Retry-After). Checked before the charge: nothing is charged.")

    @model_validator(mode="after")
    def _per_org_within_total(self) -> QuotaSettings:
        if self.release_slots_per_org > self.release_slots:
            raise ValueError("release_slots_per_org must not exceed release_slots")
        return self


@dataclass
class _Bucket:
    balance: float  # release-seconds an organization may still start releases with (below 0: in debt)
    updated: float


class ReleaseQuotas:
    """This process's release slots and time buckets, one per organization that used them recently."""

    def __init__(self, settings: QuotaSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self._clock = settings, clock
        self._changed = threading.Condition()
        self._running: Counter[int] = Counter()
        self._waiting: Counter[int] = Counter()
        self._buckets: dict[int, _Bucket] = {}

    @contextmanager
    def slot(self, org_id: int) -> Iterator[None]:
        """Hold one of ``org_id``'s release slots while the body runs, then debit the time it held it; a refusal
        (RetryLater) is raised before the body starts."""
        self._acquire(org_id)
        started = self._clock()
        try:
            yield
        finally:
            self._release(org_id, self._clock() - started)

    def balance(self, org_id: int) -> float:
        """The release-seconds ``org_id`` may still start releases with now (its own figure)."""
        with self._changed:
            return self._refilled(org_id).balance

    def _acquire(self, org_id: int) -> None:
        limits = self.settings
        with self._changed:
            bucket = self._refilled(org_id)
            if bucket.balance <= 0:
                rate = limits.release_seconds / limits.release_window_seconds
                raise RetryLater(
                    f"this organization used its {limits.release_seconds:g} seconds of release computation "
                    f"per {limits.release_window_seconds:g} s; nothing was charged",
                    code=ErrorCode.RELEASE_QUOTA_EXCEEDED, retry_after=-bucket.balance / rate)
            if not self._free(org_id) and self._waiting[org_id] >= limits.release_slots_per_org:
                raise self._busy(org_id)
            self._waiting[org_id] += 1
            try:
                deadline = self._clock() + limits.release_queue_seconds
                while not self._free(org_id):
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        raise self._busy(org_id)
                    self._changed.wait(remaining)
                self._running[org_id] += 1
            finally:
                self._waiting[org_id] -= 1
                if not self._waiting[org_id]:
                    del self._waiting[org_id]

    def _release(self, org_id: int, seconds: float) -> None:
        with self._changed:
            self._running[org_id] -= 1
            if not self._running[org_id]:
                del self._running[org_id]
            self._refilled(org_id).balance -= seconds
            self._forget_full()
            self._changed.notify_all()

    def _free(self, org_id: int) -> bool:
        return (self._running[org_id] < self.settings.release_slots_per_org
                and self._running.total() < self.settings.release_slots)

    def _busy(self, org_id: int) -> RetryLater:
        """The refusal of a request that found no slot: its own organization's limit if that is what it met (its
        own information), else the service's capacity (the documented place other organizations' load shows)."""
        limits, retry = self.settings, max(1.0, self.settings.release_queue_seconds)
        if self._running[org_id] >= limits.release_slots_per_org:
            return RetryLater(f"this organization already has {limits.release_slots_per_org} releases being "
                              f"computed (and more waiting); nothing was charged",
                              code=ErrorCode.RELEASE_QUOTA_EXCEEDED,
                              retry_after=retry)
        return RetryLater(f"the service is computing its maximum of {limits.release_slots} releases; nothing was "
                          f"charged", code=ErrorCode.RELEASE_CAPACITY_EXHAUSTED, retry_after=retry)

    def _refilled(self, org_id: int) -> _Bucket:
        """``org_id``'s bucket, refilled up to now (under the lock)."""
        now = self._clock()
        bucket = self._buckets.setdefault(org_id, _Bucket(self.settings.release_seconds, now))
        bucket.balance, bucket.updated = self._balance(bucket, now), now
        return bucket

    def _balance(self, bucket: _Bucket, now: float) -> float:
        limits = self.settings
        rate = limits.release_seconds / limits.release_window_seconds
        return min(limits.release_seconds, bucket.balance + (now - bucket.updated) * rate)

    def _forget_full(self) -> None:
        """Forget the full buckets of organizations computing nothing (under the lock): the state holds only
        organizations that computed releases within the window."""
        now, full = self._clock(), self.settings.release_seconds
        for org in [o for o, b in self._buckets.items() if self._balance(b, now) >= full and not self._running[o]]:
            del self._buckets[org]
