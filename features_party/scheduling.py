"""Fair scheduling of queued training jobs across organizations.

The trainer's executor has ``workers`` threads; each queued job submits one *turn* to it, and a turn runs whichever
queued job is next in fairness order, not the one that submitted it: the job of the organization served longest
ago (never served first; among equals, the one queued first). One organization's backlog therefore delays another
organization's job by at most the jobs already running, not by its whole queue. Queued jobs live in memory only:
a restart marks them interrupted (:func:`features_party.context.mark_interrupted`).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

Work = Callable[[], None]


class FairQueue:
    """Per-organization FIFO queues, taken round-robin by the organization served least recently."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[int, deque[Work]] = {}  # insertion order: the order organizations started waiting
        self._served: dict[int, int] = {}  # organization -> the turn it was last served in
        self._turns = itertools.count()

    def put(self, org_id: int, work: Work) -> None:
        with self._lock:
            self._queued.setdefault(org_id, deque()).append(work)

    def take(self) -> Work | None:
        """The next job in fairness order, removed from the queue (None when nothing is queued)."""
        with self._lock:
            if not self._queued:
                return None
            org_id = min(self._queued, key=lambda org: self._served.get(org, -1))  # min keeps the first of equals
            waiting = self._queued[org_id]
            work = waiting.popleft()
            if not waiting:
                del self._queued[org_id]
            self._served[org_id] = next(self._turns)
            return work

    def run_next(self) -> None:
        """One turn of an executor thread (one is submitted per :meth:`put`)."""
        work = self.take()
        if work is not None:
            work()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(waiting) for waiting in self._queued.values())
