"""Request bodies on the process's spool disk (:class:`shared.service.scratch.Scratch`), paid for as they arrive.

Every byte a body puts in the spool directory is taken from the scratch's ``spool_budget`` before it is written —
a share per organization (half the budget), the budget itself half the disk's free space by default — and given
back when the body's file is gone. A body that needs more than its share has waits as memory bodies do
(:class:`shared.service.budgets.Reservation`), then 503 ``server_busy``; one over what one body may spool is 507
``insufficient_storage``. Small JSON bodies (:data:`IN_MEMORY_BYTES`) stay in memory and take no disk.

Why (issue 40, the twenty-sixth review): with nothing bounding the bytes being spooled, one organization's label
upload (380 MiB sent of a declared 4 GiB) and 28 slow JSON bodies filled a 400 MB spool disk and kept it full — the
body deadline allowed 30 s plus a second a KiB received, days — while every other organization's creates and
releases were 507. Now one organization's bodies being spooled hold at most a quarter of the free disk (its
releases and datasets, which are small JSON, need none of it), and no body streams longer than
``max_body_seconds`` (:class:`shared.service.limits.BodyDeadline`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import tempfile
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from starlette.requests import ClientDisconnect, Request

from shared.errors import ErrorCode, LabelDPError

if TYPE_CHECKING:
    from shared.service.budgets import Reservation
    from shared.service.scratch import Scratch

# A JSON body up to this size is kept in memory (256 connections: 16 MiB); past it, it moves to the spool disk.
IN_MEMORY_BYTES = 64 << 10


@dataclass(frozen=True)
class SpooledBody:
    """A request body streamed to a temporary file, hashed while it streamed."""

    path: Path
    media_type: str
    sha256: str
    size: int


class SpoolFile:
    """Bytes written to the spool disk, each paid from ``disk`` (the request's reservation of the spool budget)
    before it is written; ``limit`` is the route's limit on the body (413 past it)."""

    def __init__(self, handle: IO[bytes], disk: Reservation, limit: float):
        self.handle, self.disk, self.limit, self.size = handle, disk, limit, 0

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise LabelDPError(f"request body over {self.limit} bytes", code=ErrorCode.BODY_TOO_LARGE)
        if self.size > self.disk.limit:
            raise LabelDPError(f"this server spools at most {self.disk.limit:,} bytes of one request body "
                               "(spool_budget_bytes: half its spool budget); send a smaller body",
                               code=ErrorCode.INSUFFICIENT_STORAGE)
        await self.disk.hold_async(self.size)
        self.handle.write(chunk)


def owner(request: Request) -> Hashable:
    """The organization a request's admission names (:mod:`shared.service.gate`): whose share its body takes."""
    admission = request.scope.get("state", {}).get("admission")
    return None if admission is None else admission.principal.org_id


@contextlib.asynccontextmanager
async def spooled(request: Request, limit: int, scratch: Scratch) -> AsyncIterator[SpooledBody]:
    """The body streamed to a file in a new subdirectory of the process's spool directory, hashed on the way
    (bounded memory whatever its size) and paid for chunk by chunk; the file, and its share of the spool budget,
    are gone when the block ends."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    with tempfile.TemporaryDirectory(prefix="body-", dir=scratch.spools) as directory, \
            scratch.spool_budget.reservation(owner(request)) as disk:  # the directory's mode is 0700
        path = Path(directory) / "body"
        digest = hashlib.sha256()
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            spool = SpoolFile(handle, disk, limit)
            async for chunk in request.stream():
                await spool.write(chunk)
                digest.update(chunk)
        yield SpooledBody(path, media, digest.hexdigest(), spool.size)


class JsonSpool:
    """A JSON body as it arrives: in memory up to :data:`IN_MEMORY_BYTES`, then in an unnamed file in the spool
    directory, paid from the spool budget (a context manager: the file, and its share, go when it ends)."""

    def __init__(self, scratch: Scratch | None, owner: Hashable):
        self.scratch, self.owner = scratch, owner
        self.memory: io.BytesIO | None = io.BytesIO()
        self.file: SpoolFile | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> JsonSpool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stack.close()

    async def write(self, chunk: bytes) -> None:
        if self.file is not None:
            await self.file.write(chunk)
        elif self.memory is not None:
            self.memory.write(chunk)
            if self.scratch is not None and self.memory.tell() > IN_MEMORY_BYTES:
                await self._to_disk(self.scratch)

    async def _to_disk(self, scratch: Scratch) -> None:
        assert self.memory is not None
        disk = self._stack.enter_context(scratch.spool_budget.reservation(self.owner))
        handle = self._stack.enter_context(tempfile.TemporaryFile(dir=scratch.spools))
        # (the route's limit is counted where the body streams in: past the spool's share, 507, not a 413 naming it)
        self.file = SpoolFile(handle, disk, limit=math.inf)
        await self.file.write(self.memory.getvalue())
        self.memory = None

    def read(self) -> bytes:
        if self.file is None:
            assert self.memory is not None
            return self.memory.getvalue()
        self.file.handle.seek(0)
        return self.file.handle.read()


async def receive_all(receive, spool: JsonSpool, each=lambda chunk: None) -> None:
    """Every chunk of a request body into ``spool``, ``each(chunk)`` first (it may refuse the body)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if chunk:
            each(chunk)
            await spool.write(chunk)
        if not message.get("more_body", False):
            return
