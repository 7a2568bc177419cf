"""What a process lends to one kind of work done in requests — memory to decode bodies, disk to spool them —
shared by every request that does it, with a share per organization."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterator

import anyio

from shared.errors import ErrorCode, LabelDPError, RetryLater


class ByteBudget:
    """The bytes a process lends to one kind of work in requests — memory to decode JSON bodies
    (:class:`shared.service.gate.JsonCost`) or to read a features table to plan a job, disk to spool bodies
    (:class:`shared.service.scratch.Scratch`): at most ``per_request`` bytes for one request, ``total`` for all of
    them at once; a request waits up to ``wait_seconds`` for its share. A :class:`Reservation` grows ``grain`` bytes
    at a time. Thread-safe and free of any event loop (requests poll): one budget serves every loop and thread."""

    POLL_SECONDS = 0.02

    def __init__(self, total: int, per_request: int, wait_seconds: float = 10.0, per_owner: int | None = None,
                 grain: int = 16 << 20):
        if per_request > total:
            raise ValueError(f"a request's budget ({per_request:,}) exceeds the process's ({total:,})")
        self.total, self.per_request, self.wait_seconds, self.grain = total, per_request, wait_seconds, grain
        # what the requests of one owner (an organization: Reservation.owner) may hold at once
        self.per_owner = total if per_owner is None else per_owner
        self.used = 0
        self.owners: dict[Hashable, int] = {}
        # the one request that waits while it holds part of the budget (slot None), and one per owner waiting for
        # its own share (slot: the owner)
        self._waiters: dict[Hashable, object] = {}
        self._lock = threading.Lock()

    def try_take(self, amount: int, owner: Hashable = None) -> bool:
        with self._lock:
            mine = self.owners.get(owner, 0)
            if self.used + amount > self.total or (owner is not None and mine + amount > self.per_owner):
                return False
            self.used += amount
            if owner is not None:
                self.owners[owner] = mine + amount
            return True

    def give(self, amount: int, owner: Hashable = None) -> None:
        with self._lock:
            self.used -= amount
            if owner is not None:
                left = self.owners.pop(owner, 0) - amount
                if left:
                    self.owners[owner] = left

    def owner_full(self, amount: int, owner: Hashable) -> bool:
        """Whether ``owner``'s own share (not the whole budget) leaves no room for ``amount`` more now."""
        with self._lock:
            return owner is not None and self.owners.get(owner, 0) + amount > self.per_owner

    def claim_waiter(self, request: object, slot: Hashable = None) -> bool:
        """Whether ``request`` may wait while it holds part of the budget: one at a time for the budget (``slot``
        None) and one per owner for its own share (``slot``: the owner). A waiter waits for requests that never
        wait holding anything, or for a waiter of another slot that gives up at once when it would wait for it
        (:meth:`Reservation.hold`), so no two wait for each other."""
        with self._lock:
            return self._waiters.setdefault(slot, request) is request

    def release_waiter(self, request: object, slot: Hashable = None) -> None:
        with self._lock:
            if self._waiters.get(slot) is request:
                del self._waiters[slot]

    async def take(self, amount: int, owner: Hashable = None) -> None:
        """``amount`` more for ``owner`` from an event loop, by a request that holds nothing of the budget (so it
        may wait: it holds up no one), up to ``wait_seconds``; then 503 server_busy."""
        deadline = time.monotonic() + self.wait_seconds
        while not self.try_take(amount, owner):
            if time.monotonic() >= deadline:
                raise self.busy(amount, owner)
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
        while not self.try_take(amount):  # holding nothing of this budget, it may wait
            if time.monotonic() >= deadline:
                raise self.busy(amount)
            time.sleep(self.POLL_SECONDS)
        try:
            yield
        finally:
            self.give(amount)

    @contextlib.contextmanager
    def reservation(self, owner: Hashable = None) -> Iterator[Reservation]:
        """A request's share of the budget (``owner``'s: an organization), taken as its work counts what it holds
        (:meth:`Reservation.hold`) and given back whole when the block ends."""
        taken = Reservation(self, owner)
        try:
            yield taken
        finally:
            self.give(taken.held, owner)

    def busy(self, amount: int, owner: Hashable = None) -> RetryLater:
        """503 server_busy for ``amount`` more; naming the owner's share when it is ``owner``'s that is full."""
        share = (f" (this organization's requests hold their share, at most {self.per_owner:,} of it at once)"
                 if owner is not None and self.owner_full(amount, owner) else "")
        return RetryLater(f"the server is busy: {amount:,} bytes more of its {self.total:,}-byte budget for this "
                          f"work are not free{share}; retry", code=ErrorCode.SERVER_BUSY,
                          retry_after=math.ceil(self.wait_seconds))


class Reservation:
    """What one request holds of a :class:`ByteBudget` (:meth:`ByteBudget.reservation`), for its ``owner`` (an
    organization: together its requests hold at most the budget's ``per_owner``): it grows as the request's work
    counts more — a body decoded batch by batch (:class:`labels_party.store.uploads.Decoded`, from a worker
    thread: :meth:`hold`), a body spooled chunk by chunk (from the event loop: :meth:`hold_async`). Bytes are taken
    the budget's ``grain`` at a time: a count that grows by a few bytes a batch does not take the lock each time.

    Requests that each held part of the budget and waited for the rest would wait for one another (with waits at
    every count, four honest bodies at the limit each took 256 MiB of 1 GiB, and all four were 503 after 10 s). So
    a request waits only while it holds nothing, or as the one waiter holding part for what holds it up (its
    owner's share, or the whole budget); any other that needs more than is free is 503 at once, and gives back what
    it held."""

    def __init__(self, budget: ByteBudget, owner: Hashable = None):
        self.budget, self.owner, self.held = budget, owner, 0

    @property
    def limit(self) -> int:
        """The most one request may hold: past it, the work's own refusal (413, 507), never a wait."""
        return self.budget.per_request

    def hold(self, amount: int) -> None:
        """Hold at least ``amount`` bytes (capped at :attr:`limit`, which the caller enforces), waiting up to the
        budget's ``wait_seconds`` as the class says; else 503 ``server_busy`` with Retry-After (the request is
        refused as a whole; what it held is given back when its reservation ends)."""
        more = self._more(amount)
        if more and not self.budget.try_take(more, self.owner):
            with self._waiting(more) as taken:
                while not taken():
                    time.sleep(self.budget.POLL_SECONDS)
        self.held += more

    async def hold_async(self, amount: int) -> None:
        """:meth:`hold` from an event loop (it sleeps without blocking the loop)."""
        more = self._more(amount)
        if more and not self.budget.try_take(more, self.owner):
            with self._waiting(more) as taken:
                while not taken():
                    await anyio.sleep(self.budget.POLL_SECONDS)
        self.held += more

    def _more(self, amount: int) -> int:
        """How much more to take to hold ``amount`` (0: held already)."""
        amount = min(amount, self.limit)
        if amount <= self.held:
            return 0
        return min(max(amount - self.held, self.budget.grain), self.limit - self.held)

    @contextlib.contextmanager
    def _waiting(self, more: int) -> Iterator[Callable[[], bool]]:
        """A try at taking ``more`` to poll until the budget's ``wait_seconds`` have passed: waiting while holding
        nothing freely; holding part, only as the waiter of what holds it up — its owner's share (one waiter per
        owner: two requests of one organization each holding part and waiting for the other were both 503), else
        the whole budget (one waiter) — and 503 at once when that slot is another's (the twenty-second review: a
        waiter on its own share kept the budget's slot from another organization's body that would have got memory
        in time)."""
        budget = self.budget
        slots: list[Hashable] = []
        deadline = time.monotonic() + budget.wait_seconds

        def taken() -> bool:
            if budget.try_take(more, self.owner):
                return True
            if self.held:
                slot = self.owner if budget.owner_full(more, self.owner) else None
                if slot not in slots:
                    if not budget.claim_waiter(self, slot):
                        raise budget.busy(more, self.owner)
                    slots.append(slot)
            if time.monotonic() >= deadline:
                raise budget.busy(more, self.owner)
            return False

        try:
            yield taken
        finally:
            for slot in slots:
                budget.release_waiter(self, slot)


def release_freed_memory() -> None:
    """Give the operating system back what the process freed: Arrow's pool keeps freed buffers, and glibc keeps
    freed heap pages in its arenas — after a body of hundreds of megabytes, a process kept +418 to +743 MiB it no
    longer used, and the next bodies' peaks stacked on it (issue 40's twenty-first review: +1,369 MiB, 1.34 times
    the budget). Called once a large body's work is done; it takes milliseconds."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    if name is not None:
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
            ctypes.CDLL(name).malloc_trim(0)
