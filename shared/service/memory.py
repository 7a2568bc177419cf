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
                raise self.busy(amount)
            await anyio.sleep(self.POLL_SECONDS)

    @contextlib.contextmanager
    def held(self, amount: int, what: str, too_large: ErrorCode) -> Iterator[None]:
        """``amount`` of the budget while the block runs, from a worker thread: ``too_large`` (the caller's code)
        for more than ``per_request`` (``what`` says what needs it), 503 ``server_busy`` when it is not free in
        time."""
        if amount > self.per_request:
            raise LabelDPError(f"{what} takes {amount:,} bytes, over this server's {self.per_request:,} for one "
                               "request", code=too_large)
        self.take_blocking(amount)
        try:
            yield
        finally:
            self.give(amount)

    def take_blocking(self, amount: int) -> None:
        """``amount`` more from a worker thread, waiting up to ``wait_seconds``; then 503 server_busy."""
        deadline = time.monotonic() + self.wait_seconds
        while not self.try_take(amount):
            if time.monotonic() >= deadline:
                raise self.busy(amount)
            time.sleep(self.POLL_SECONDS)

    @contextlib.contextmanager
    def reservation(self) -> Iterator[Reservation]:
        """A request's share of the budget, taken as its work counts what it holds (:meth:`Reservation.hold`) and
        given back whole when the block ends."""
        taken = Reservation(self)
        try:
            yield taken
        finally:
            self.give(taken.held)

    def busy(self, amount: int) -> RetryLater:
        return RetryLater(f"the server is busy: {amount:,} bytes more of its {self.total:,}-byte budget for this "
                          "work are not free; retry", code=ErrorCode.SERVER_BUSY,
                          retry_after=math.ceil(self.wait_seconds))


class Reservation:
    """What one request holds of a :class:`MemoryBudget` (:meth:`MemoryBudget.reservation`): it grows as the
    request's work counts more (a body decoded batch by batch, :class:`labels_party.store.uploads.Decoded`), from a
    worker thread. Bytes are taken :data:`GRAIN` at a time: a count that grows by a few bytes a batch does not take the
    lock each time.

    A request waits for the budget only while it holds none of it: requests that each held part and waited for the
    rest would wait for one another (four honest bodies at the limit each took 256 MiB of 1 GiB, and all four were
    503 after the wait). So a request's first share is taken with a wait — its work holds at once what it expects
    to need (:meth:`labels_party.store.uploads.Decoded.expect`) — and any more only if free now, else 503 at once."""

    GRAIN = 16 << 20

    def __init__(self, budget: MemoryBudget):
        self.budget, self.held = budget, 0

    @property
    def limit(self) -> int:
        """The most one request may hold: past it, the work's own refusal (413), never a wait."""
        return self.budget.per_request

    def hold(self, amount: int) -> None:
        """Hold at least ``amount`` bytes (capped at :attr:`limit`, which the caller enforces): the first share
        waits up to the budget's ``wait_seconds``, any later one is taken only if free now; else 503
        ``server_busy`` with Retry-After (the request is refused as a whole; what it held is given back when its
        reservation ends)."""
        amount = min(amount, self.limit)
        if amount <= self.held:
            return
        more = min(max(amount - self.held, self.GRAIN), self.limit - self.held)
        if not self.held:
            self.budget.take_blocking(more)
        elif not self.budget.try_take(more):
            raise self.budget.busy(more)
        self.held += more
