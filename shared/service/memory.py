"""A process's memory for one kind of work done in requests, shared by every request that does it."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator

import anyio

from shared.errors import ErrorCode, LabelDPError, RetryLater


class MemoryBudget:
    """The memory a process lends to one kind of work in requests — decoding JSON bodies
    (:class:`shared.service.gate.JsonCost`), reading a features table to plan a job: at most ``per_request``
    bytes for one request, ``total`` for all of them at once; a request waits up to ``wait_seconds`` for its
    share. Thread-safe and free of any event loop (requests poll): one budget serves every loop and thread."""

    POLL_SECONDS = 0.02

    def __init__(self, total: int, per_request: int, wait_seconds: float = 10.0):
        if per_request > total:
            raise ValueError(f"a request's decoding budget ({per_request:,}) exceeds the process's ({total:,})")
        self.total, self.per_request, self.wait_seconds = total, per_request, wait_seconds
        self.used = 0
        self._lock = threading.Lock()

    def try_take(self, amount: int) -> bool:
        with self._lock:
            if self.used + amount > self.total:
                return False
            self.used += amount
            return True

    def give(self, amount: int) -> None:
        with self._lock:
            self.used -= amount

    async def take(self, amount: int, deadline: float) -> None:
        """``amount`` more, waiting until ``deadline`` (monotonic); then 503 server_busy with Retry-After."""
        while not self.try_take(amount):
            if time.monotonic() >= deadline:
                raise self._busy(amount)
            await anyio.sleep(self.POLL_SECONDS)

    @contextlib.contextmanager
    def held(self, amount: int, what: str, too_large: ErrorCode) -> Iterator[None]:
        """``amount`` of the budget while the block runs, from a worker thread: ``too_large`` (the caller's code)
        for more than ``per_request`` (``what`` says what needs it), 503 ``server_busy`` when it is not free in
        time."""
        if amount > self.per_request:
            raise LabelDPError(f"{what} takes {amount:,} bytes, over this server's {self.per_request:,} for one "
                               "request", code=too_large)
        deadline = time.monotonic() + self.wait_seconds
        while not self.try_take(amount):
            if time.monotonic() >= deadline:
                raise self._busy(amount)
            time.sleep(self.POLL_SECONDS)
        try:
            yield
        finally:
            self.give(amount)

    def _busy(self, amount: int) -> RetryLater:
        return RetryLater(f"the server is busy: {amount:,} bytes more of its {self.total:,}-byte budget for this "
                          "work are not free; retry", code=ErrorCode.SERVER_BUSY,
                          retry_after=math.ceil(self.wait_seconds))
