"""The gatekeeper: authentication, authorization and body limits, all before a route reads a byte of the body.

It is ASGI middleware in front of every route under ``/v1``: ``authorize(method, path, authorization)`` (run in
a worker thread, it may use the database) returns the principal or raises the 401/403/404 ``LabelDPError``;
``limit(method, path)`` gives the endpoint's body limit, enforced on the declared length and while streaming.
Routes read the principal with :func:`shared.service.dependencies.principal`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from fastapi import Request

from shared.errors import LabelDPError
from shared.service.errors import error_response

PUBLIC_PATHS = ("/healthz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")


class Gatekeeper:
    def __init__(self, app, *, authorize: Callable[[str, str, str], Any], limit: Callable[[str, str], int]):
        self.app, self.authorize, self.limit = app, authorize, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            principal = await anyio.to_thread.run_sync(self.authorize, scope["method"], scope["path"],
                                                       headers.get(b"authorization", b"").decode("latin-1"))
        except LabelDPError as err:
            return await error_response(err.code, str(err))(scope, receive, send)
        scope.setdefault("state", {})["principal"] = principal
        limit = self.limit(scope["method"], scope["path"])
        if declared_too_large(headers, limit):
            return await error_response("body_too_large", f"request body over {limit} bytes")(scope, receive, send)

        def flag():  # routes that parse JSON wrap the error in a generic 400; the flag lets the handler say 413
            scope["state"]["body_too_large"] = True

        return await self.app(scope, limited(receive, limit, flag), send)


def declared_too_large(headers: dict[bytes, bytes], limit: int) -> bool:
    """A Content-Length that is not a number or is over ``limit``: refused before a byte is read."""
    declared = headers.get(b"content-length")
    return declared is not None and (not declared.isdigit() or int(declared) > limit)


def limited(receive, limit: int, on_exceeded: Callable[[], None] = lambda: None):
    """``receive`` that raises body_too_large once more than ``limit`` bytes have streamed (a body may come without
    a Content-Length, or lie about it)."""
    received = 0

    async def limited_receive():
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                on_exceeded()
                raise LabelDPError(f"request body over {limit} bytes", code="body_too_large")
        return message

    return limited_receive


@dataclass(frozen=True)
class SpooledBody:
    """A request body streamed to a temporary file, hashed while it streamed."""

    path: Path
    media_type: str
    sha256: str
    size: int


async def spool(request: Request, limit: int, directory: Path) -> tuple[tempfile.TemporaryDirectory, SpooledBody]:
    """Stream the body to a file in a new subdirectory of ``directory`` (the process's spool directory under the
    service's data directory: :class:`shared.service.scratch.Scratch`), hashing it on the way (bounded memory
    whatever its size); the caller owns the subdirectory."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    spooled = tempfile.TemporaryDirectory(prefix="body-", dir=directory)  # mode 0700
    path = Path(spooled.name) / "body"
    digest, size = hashlib.sha256(), 0
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise LabelDPError(f"request body over {limit} bytes", code="body_too_large")
                digest.update(chunk)
                handle.write(chunk)
    except BaseException:
        spooled.cleanup()
        raise
    return spooled, SpooledBody(path, media, digest.hexdigest(), size)
