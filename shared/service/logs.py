"""Log rate limiting for both services: a burst of one repeated error is logged once, then summarized.

Under descriptor exhaustion asyncio logs "socket.accept() out of system resource" with its traceback for every
accept attempt — up to its backlog (2048) times per event-loop pass — and a request that fails the same way logs
the same ``internal error`` each time: the log grew by megabytes a second and filled the disk the service needed
to recover. :class:`RepeatFilter` lets the first of identical records through and drops the repetitions within
``interval`` seconds, counting them; the next identical record after the interval carries the count
("… repeated N times in the last S s"). Only WARNING and above are collapsed: access logs and INFO lines each say
something different on purpose.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_KEYS = 1024  # distinct repeated errors remembered at once (bounded memory whatever is logged)


@dataclass
class _Burst:
    started: float
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    """Collapses identical WARNING+ records: same logger, level, first message line and exception type."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval, self._clock = interval, clock
        self._bursts: dict[tuple, _Burst] = {}
        self._lock = threading.Lock()  # handlers are called from worker threads too

    @staticmethod
    def key(record: logging.LogRecord) -> tuple:
        # The first line: asyncio appends context lines (a handle's repr with its timer) that differ between
        # otherwise identical records; the exception type, not its traceback.
        first_line = record.getMessage().split("\n", 1)[0]
        exc_type = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        return record.name, record.levelno, first_line, exc_type

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        decided = getattr(record, "_labeldp_repeat", None)
        if decided is not None:  # the same record at a second handler: the same answer
            return decided
        record._labeldp_repeat = passed = self._decide(record)
        return passed

    def _decide(self, record: logging.LogRecord) -> bool:
        key, now = self.key(record), self._clock()
        with self._lock:
            burst = self._bursts.get(key)
            if burst is not None and now - burst.started < self.interval:
                burst.suppressed += 1
                return False
            if burst is None and len(self._bursts) >= MAX_KEYS:
                self._forget(now)
            self._bursts[key] = _Burst(now)
        if burst is not None and burst.suppressed:  # the count on the first line, where the message begins
            first, newline, rest = record.getMessage().partition("\n")
            summary = f"(… repeated {burst.suppressed} times in the last {now - burst.started:.0f} s)"
            record.msg, record.args = f"{first} {summary}{newline}{rest}", None
        return True

    def _forget(self, now: float) -> None:
        """Drop the bursts that are over (under the lock); if all are current, the oldest."""
        over = [k for k, b in self._bursts.items() if now - b.started >= self.interval]
        for key in over or [min(self._bursts, key=lambda k: self._bursts[k].started)]:
            del self._bursts[key]


def rate_limit(handlers: Iterable[logging.Handler], interval: float) -> RepeatFilter:
    """One filter on every handler given (a filter on a logger would miss records propagated from its children)."""
    repeat = RepeatFilter(interval)
    for handler in handlers:
        handler.addFilter(repeat)
    return repeat


def service_handlers() -> list[logging.Handler]:
    """The handlers a service's records reach: the root logger's and uvicorn's own (which do not propagate)."""
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
    handlers: list[logging.Handler] = []
    for name in names:
        handlers += [h for h in logging.getLogger(name).handlers if h not in handlers]
    return handlers
