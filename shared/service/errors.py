"""One error envelope for both services: ``{"error": {"code", "message"}}``; every code is an :class:`ErrorCode`
member that carries its HTTP status, so a code means the same status everywhere and the OpenAPI can list them.
Unexpected failures answer 500 ``internal_error`` (logged, no stack trace) and close the connection."""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from shared.errors import ErrorCode, LabelDPError, RetryLater, resource_error


def error_response(code: str | ErrorCode, message: str, **extra) -> JSONResponse:
    code = ErrorCode(code)
    headers = {}
    if code.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if code.status >= 500:
        headers["Connection"] = "close"  # a failed request must not poison a kept-alive connection
    return JSONResponse({"error": {"code": code.value, "message": message, **extra}}, status_code=code.status,
                        headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        route_methods = getattr(route, "methods", None)
        if match is not Match.NONE and route_methods:
            methods |= route_methods
    return sorted(methods)


def path_redactor(private_dirs: Iterable[str | Path]) -> Callable[[str], str]:
    """Replaces any path under ``private_dirs`` or the system's temporary directory with ``<file>``.

    Messages are made path-free where they are written (files are parsed through handles, library messages pass
    through :func:`shared.errors.library_message`); this last line in the envelope keeps a message written later
    from telling a client where the service keeps its files."""
    prefixes = {tempfile.gettempdir()}
    for directory in private_dirs:
        prefixes |= {str(Path(directory)), str(Path(directory).resolve())}
    alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True) if p not in ("", "."))
    pattern = re.compile(rf"""(?<![\w.-])(?:{alternatives})(?:/[^\s'":,]*)?(?![\w.-])""")
    return lambda message: pattern.sub("<file>", message)


def install_error_handlers(app: FastAPI, log: logging.Logger, private_dirs: Iterable[str | Path] = ()) -> None:
    redact = path_redactor(private_dirs)

    @app.exception_handler(LabelDPError)
    async def _labeldp_error(_request, err: LabelDPError):
        code = err.code if err.code in ErrorCode._value2member_map_ else ErrorCode.INVALID_INPUT
        response = error_response(code, redact(str(err)))
        if isinstance(err, RetryLater):
            response.headers["Retry-After"] = str(err.retry_after)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {"msg": "invalid request", "loc": ()}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return error_response(ErrorCode.INVALID_REQUEST, message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        if request.scope.get("state", {}).get("body_too_large"):  # set by the gatekeeper's body limit
            return error_response(ErrorCode.BODY_TOO_LARGE, "request body too large")
        if request.scope.get("state", {}).get("invalid_body"):  # set by the gate's CheckedRequest
            return error_response(ErrorCode.INVALID_INPUT, request.scope["state"]["invalid_body"])
        if request.scope.get("state", {}).get("invalid_unicode"):  # set by the gate's CheckedRequest
            return error_response(ErrorCode.INVALID_INPUT, "a string of the body is not valid Unicode (a lone "
                                  "surrogate): send UTF-8 text")
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED,
                408: ErrorCode.BODY_TIMEOUT}.get(err.status_code, ErrorCode.INVALID_INPUT)
        response = error_response(code, redact(str(err.detail)))
        if err.headers:
            response.headers.update(err.headers)
        if err.status_code == 405:  # Starlette lists only the first matching route's methods
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    async def _resource_or_internal(_request, err: Exception):
        """Running out of disk, memory or descriptors wherever it happens (a library's error, the database's) is
        the service's condition, answered as such; anything else is a bug."""
        resource = resource_error(err)
        if resource is not None:
            log.warning("refused: %s (%s)", resource, type(err).__name__)  # one line: no stack to flood the log
            return error_response(resource.code, str(resource))
        log.exception("internal error")
        return error_response(ErrorCode.INTERNAL_ERROR, "internal error; the operation did not complete")

    # Registered by type, not only under Exception (which Starlette answers and then raises again to the server)
    for kind in (OSError, MemoryError, SQLAlchemyError):
        app.add_exception_handler(kind, _resource_or_internal)

    @app.exception_handler(ClientDisconnect)
    async def _disconnected(_request, _err: ClientDisconnect):
        """A client gone before its body was complete: nothing was done, and nobody reads the answer. One line,
        not a stack (the twenty-sixth review: each disconnect mid-upload logged ~120 lines as an internal error)."""
        log.info("a client disconnected before its request body was complete")
        return error_response(ErrorCode.INVALID_INPUT, "the client disconnected before the request body was complete")

    @app.exception_handler(Exception)
    async def _internal_error(request, err: Exception):
        return await _resource_or_internal(request, err)
