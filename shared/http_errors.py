"""One error format for both services: ``{"error": {"code", "message"}}`` with a 4xx status for bad input and a
plain 500 (logged, no stack trace in the body) for bugs."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import LabelDPError

COMMON_STATUS = {"unauthorized": 401, "forbidden": 403, "not_found": 404, "budget_exceeded": 409,
                 "idempotency_conflict": 409, "body_too_large": 413, "unsupported_media_type": 415,
                 "not_acceptable": 406, "invalid_request": 422}


def error_response(status: int, code: str, message: str, **extra) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status,
                        headers=headers)


def install_error_handlers(app: FastAPI, status_by_code: dict[str, int], log: logging.Logger) -> None:
    status_by_code = {**COMMON_STATUS, **status_by_code}

    @app.exception_handler(LabelDPError)
    async def _labeldp_error(_request, err: LabelDPError):
        extra = {"epsilon_remaining": err.remaining} if hasattr(err, "remaining") else {}
        return error_response(status_by_code.get(err.code, 400), err.code, str(err), **extra)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {"msg": "invalid request", "loc": ()}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return error_response(422, "invalid_request", message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        if getattr(request.state, "body_too_large", False):  # set by a body-size limit (labels party)
            return error_response(413, "body_too_large", "request body too large")
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return error_response(err.status_code, code, str(err.detail))

    @app.exception_handler(Exception)
    async def _internal_error(_request, _err: Exception):
        log.exception("internal error")
        return error_response(500, "internal_error", "internal error; the operation did not complete")
