"""The console as its own small application, mounted at ``/console`` of the labels-party app: its gate, its pages,
and error pages in HTML (the API's JSON envelope stays the API's). Everything it holds — templates, the style
sheet, the session store — lives on its ``app.state``; nothing is a module global."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException

from labels_party.http.console import routes
from labels_party.http.console.gate import ConsoleGate
from labels_party.http.console.sessions import LIFETIME, Sessions
from labels_party.runtime.context import ServiceContext
from shared.errors import LabelDPError, status_of

HERE = Path(__file__).parent
STATIC = {"console.css": "text/css", "favicon.svg": "image/svg+xml"}
log = logging.getLogger("labeldp.labels.console")

_TITLES = {400: "Bad request", 401: "Signed out", 403: "Refused", 404: "Not found", 405: "Method not allowed",
           409: "Not now", 413: "Request too large", 415: "Unsupported form", 422: "Bad request",
           500: "Internal error"}


def create_console(ctx: ServiceContext, *, lifetime: timedelta = LIFETIME) -> FastAPI:
    app = FastAPI(title="labeldp console", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    app.state.sessions = Sessions(ctx.sessions, ctx.ledger, lifetime)
    app.state.templates = Environment(loader=FileSystemLoader(HERE / "templates"), undefined=StrictUndefined,
                                      autoescape=select_autoescape(default=True, default_for_string=True))
    app.state.static = {name: ((HERE / "static" / name).read_bytes(), media) for name, media in STATIC.items()}

    def page(status: int, title: str, message: str) -> HTMLResponse:
        html = app.state.templates.get_template("error.html").render(
            title=title, status=status, message=message, principal=None, csrf="", prefix=routes.PATH)
        return HTMLResponse(html, status_code=status)

    app.add_middleware(ConsoleGate, sessions=app.state.sessions, page=page)

    @app.exception_handler(LabelDPError)
    async def _refused(_request: Request, err: LabelDPError):
        status = status_of(err.code)
        return page(status, _TITLES.get(status, "Refused"), str(err))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, _err: RequestValidationError):
        return page(400, _TITLES[400], "The request does not match this page's parameters.")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, err: StarletteHTTPException):
        status = err.status_code if 400 <= err.status_code < 500 else 400
        response = page(status, _TITLES.get(status, "Refused"), "There is no such page in the console."
                        if status == 404 else _TITLES.get(status, "Refused") + ".")
        if err.headers:
            response.headers.update(err.headers)
        return response

    @app.exception_handler(Exception)
    async def _internal(_request: Request, _err: Exception):
        log.exception("console: internal error")
        return page(500, _TITLES[500], "Something went wrong; nothing was changed.")

    app.include_router(routes.router)
    return app
