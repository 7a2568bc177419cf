"""The API's documentation pages, whole from this installation: Swagger UI at ``/docs`` (and its OAuth2 redirect
page) and ReDoc at ``/redoc``, built by FastAPI's own page functions but with their scripts, style sheet and icon
served at :data:`ASSETS` from the ``fastapi-offline`` package, which ships Swagger UI's and ReDoc's standalone
bundles. FastAPI's default pages load them from a public CDN (and ReDoc its fonts from Google), so on a network
without internet access — where a labels party often runs — they were blank.

The pages are public like ``/openapi.json`` (:data:`shared.service.gate.PUBLIC_PATHS`: the gate guards only the
routes under ``/v1``), so the assets are too: nothing in them is the deployment's own. ``StaticFiles`` serves only
the files of that package directory (no listing of it; a path that leaves it is a 404).

Each page carries a Content-Security-Policy that lets it load from its own origin only: ReDoc's bundle draws its
sidebar's Redocly logo from the vendor's CDN whatever its options (a request that would tell that CDN the docs were
opened, and from where); the policy stops the browser before it asks (the logo's fallback is its text).
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"
SWAGGER_UI, REDOC = "/docs", "/redoc"
# the package and its directory that hold swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png
_PACKAGE = ("fastapi_offline", "static")
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)  # FastAPI's pages start Swagger UI inline


def _confined(page: HTMLResponse) -> HTMLResponse:
    """``page`` with a policy that lets it load scripts, styles, images, fonts, workers and data from its own origin
    only, and run no inline script but its own (by hash): nothing from another host, even what a bundle hard-codes.
    Styles may be inline (ReDoc writes its own), workers and images may be ``blob:``/``data:`` (ReDoc's search
    worker, Swagger UI's icons)."""
    hashes = "".join(f" 'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"
                     for script in _INLINE_SCRIPT.findall(bytes(page.body).decode()))
    page.headers["Content-Security-Policy"] = (
        f"default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "worker-src 'self' blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
    return page


def install(app: FastAPI) -> None:
    """Serve the two pages and their assets on ``app``, made with ``docs_url=None, redoc_url=None`` (FastAPI's own
    pages would point at the CDN)."""
    if app.docs_url is not None or app.redoc_url is not None or app.openapi_url is None:
        raise ValueError("the documentation pages need an OpenAPI document and FastAPI's own pages off")
    spec_url, redirect_url = app.openapi_url, app.swagger_ui_oauth2_redirect_url
    app.mount(ASSETS, StaticFiles(packages=[_PACKAGE]), name="docs-assets")

    def root(request: Request) -> str:  # behind a proxy that strips a prefix, every URL the page loads keeps it
        return request.scope.get("root_path", "").rstrip("/")

    async def swagger_ui(request: Request) -> HTMLResponse:
        prefix = root(request)
        return _confined(get_swagger_ui_html(
            openapi_url=prefix + spec_url, title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{prefix}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{prefix}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{prefix}{ASSETS}/favicon.png",
            oauth2_redirect_url=prefix + redirect_url if redirect_url else None,
            init_oauth=app.swagger_ui_init_oauth, swagger_ui_parameters=app.swagger_ui_parameters))

    async def redoc(request: Request) -> HTMLResponse:
        prefix = root(request)
        return _confined(get_redoc_html(openapi_url=prefix + spec_url, title=f"{app.title} - ReDoc",
                                       redoc_js_url=f"{prefix}{ASSETS}/redoc.standalone.js",
                                       redoc_favicon_url=f"{prefix}{ASSETS}/favicon.png", with_google_fonts=False))

    async def oauth2_redirect(_request: Request) -> HTMLResponse:
        return _confined(get_swagger_ui_oauth2_redirect_html())

    app.add_route(SWAGGER_UI, swagger_ui, include_in_schema=False)
    if redirect_url:
        app.add_route(redirect_url, oauth2_redirect, include_in_schema=False)
    app.add_route(REDOC, redoc, include_in_schema=False)
