"""The gate: authentication, authorization and body limits, all before a route reads a byte of the body.

Each route under ``/v1`` declares what it needs with a :class:`Guard` among its dependencies (``who: Annotated[
Admission, Depends(SOME_GUARD)]``) and is a :class:`GuardedRoute` (its router's ``route_class``). Before FastAPI's
handler reads the body or solves any dependency, the route calls the party's ``admit(guard, path_params,
authorization)`` (``app.state.admit``, in a worker thread: it may use the database), which returns the admission
(the principal, what it may touch, the body limit) or raises the 401/403/404 ``LabelDPError``. The body is then
limited to the admission's limit — on the declared length and while it streams. The route reads the admission
through the same dependency: access is decided once per request. A guarded route without exactly one guard is
refused when it is defined.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.responses import Response

from shared.errors import LabelDPError

PUBLIC_PATHS = ("/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")


class Guard:
    """What a route needs before its body is read; a party's guards subclass it (frozen dataclasses). As a FastAPI
    dependency it returns the admission the route made for the request."""

    def __call__(self, request: Request) -> Any:
        return request.scope["state"]["admission"]

    def check_route(self, path: str) -> None:
        """Refuse (TypeError) a route this guard cannot decide, when the route is defined."""


class Admitted(Protocol):
    """What a party's ``admit`` returns: anything with the request's body limit."""

    @property
    def body_limit(self) -> int: ...


Admit = Callable[[Guard, dict[str, str], str], Admitted]


def declared_guard(route: APIRoute) -> Guard:
    """The one guard among a route's dependencies (a route with none, or several, is a programming error)."""
    guards = [d.call for d in _dependencies(route.dependant) if isinstance(d.call, Guard)]
    if len(guards) != 1:
        raise TypeError(f"route {sorted(route.methods or ())} {route.path} declares {len(guards)} guards, not one")
    return guards[0]


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dependency in dependant.dependencies:
        yield dependency
        yield from _dependencies(dependency)


class GuardedRoute(APIRoute):
    """A route that admits its request by its guard before FastAPI reads the body (the ``route_class`` of every
    router under ``/v1``)."""

    guard: Guard

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        guard = self.guard = declared_guard(self)  # APIRoute.__init__ calls this once, after the dependant
        guard.check_route(self.path)
        handle = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            admit: Admit = request.app.state.admit
            admission = await anyio.to_thread.run_sync(admit, guard, dict(request.path_params),
                                                       request.headers.get("authorization", ""))
            state = request.scope.setdefault("state", {})
            state["admission"] = admission
            limit = admission.body_limit
            if declared_too_large(dict(request.scope["headers"]), limit):
                raise LabelDPError(f"request body over {limit} bytes", code="body_too_large")

            def flag() -> None:  # routes that parse JSON wrap the error in a generic 400: the flag lets it say 413
                state["body_too_large"] = True

            return await handle(CheckedRequest(request.scope, limited(request.receive, limit, flag)))

        return guarded


class CheckedRequest(Request):
    """A request whose JSON body holds valid Unicode only. JSON may escape a lone surrogate (``"\\ud800"``), which
    Python decodes to a string that no UTF-8 encoder takes — hashing it, storing it or logging it raised deep in a
    route (a 500, some after the release was charged). Refused here, before any route sees the body: a 400."""

    async def json(self) -> Any:
        value = await super().json()
        bad = _first_invalid_string(value)
        if bad is not None:
            self.scope.setdefault("state", {})["invalid_unicode"] = True
            raise ValueError(f"a string of the body is not valid Unicode (a lone surrogate at {bad})")
        return value


def _first_invalid_string(value: Any, where: str = "body") -> str | None:
    """Where the first string (key or value) holding a lone surrogate is, or None."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(item, dict):
            for key, inner in item.items():
                if _first_invalid_string(key, path) is not None:
                    return f"{path} (a key)"
                stack.append((inner, f"{path}.{key}" if len(path) < 200 else path))
        elif isinstance(item, list):
            stack.extend((inner, f"{path}[{i}]" if len(path) < 200 else path) for i, inner in enumerate(item))
    return None


def declared_too_large(headers: Mapping[bytes, bytes], limit: int) -> bool:
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
