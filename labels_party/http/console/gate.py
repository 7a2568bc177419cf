"""The console's gatekeeper, the counterpart of the API's (:mod:`shared.service.gate`): everything is decided from
the request line and headers, before a route reads a byte of the body.

For every request under ``/console`` it

1. adds the security headers to the response (a strict Content-Security-Policy: no script at all, styles and
   images from this origin only, forms posting only here, no framing);
2. bounds the body (the console's forms are a few hundred bytes): on the declared length and while streaming;
3. refuses a state-changing request (anything but GET/HEAD) whose ``Origin`` (or, without one, ``Referer``) is
   not this origin — with the SameSite=Strict cookie and the session's CSRF token, the third CSRF defence;
4. outside the public paths (the sign-in page, the style sheet and the icon), resolves the session cookie to the admin
   principal (in a worker thread: it reads the database) and puts it where the API's routes find theirs
   (``scope["state"]["principal"]``), with the session's token and CSRF token. Without a valid session a GET is
   redirected to the sign-in page and anything else is a 401.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import anyio
from starlette.requests import cookie_parser
from starlette.responses import RedirectResponse, Response

from labels_party.http.console.sessions import COOKIE, PATH, Sessions, csrf_token
from shared.service.gate import declared_too_large, limited

PUBLIC = ("/sign-in", "/static/console.css", "/static/favicon.svg")
SAFE_METHODS = ("GET", "HEAD")
MAX_BODY_BYTES = 4096
SECURITY_HEADERS = (
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                 b"frame-ancestors 'none'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


def same_origin(scope, headers: dict[bytes, bytes]) -> bool:
    """Is the request's Origin (or Referer, when a browser sends no Origin) this service's own origin?"""
    expected = f"{scope['scheme']}://{headers.get(b'host', b'').decode('latin-1')}".lower()
    origin = headers.get(b"origin")
    if origin is not None:
        return origin.decode("latin-1").lower() == expected
    referer = headers.get(b"referer")
    if referer:
        parts = urlsplit(referer.decode("latin-1"))
        return f"{parts.scheme}://{parts.netloc}".lower() == expected
    return False


class ConsoleGate:
    def __init__(self, app, *, sessions: Sessions, page: Callable[[int, str, str], Response],
                 max_body_bytes: int = MAX_BODY_BYTES):
        self.app, self.sessions, self.page, self.max_body_bytes = app, sessions, page, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def secured_send(message):
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((n, v) for n, v in SECURITY_HEADERS if n not in names)]
            await send(message)

        headers = dict(scope["headers"])
        path = scope["path"][len(scope.get("root_path", "")):] or "/"
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await refusal(scope, receive, secured_send)
        token = cookie_parser(headers.get(b"cookie", b"").decode("latin-1")).get(COOKIE)
        if path not in PUBLIC:
            principal = await anyio.to_thread.run_sync(self.sessions.principal, token)
            if principal is None:
                if scope["method"] in SAFE_METHODS:
                    response = RedirectResponse(f"{PATH}/sign-in", status_code=303)
                else:
                    response = self.page(401, "Signed out", "Sign in again with an admin API key.")
                return await response(scope, receive, secured_send)
            scope.setdefault("state", {}).update(principal=principal, console_token=token,
                                                 csrf=csrf_token(token))
        return await self.app(scope, limited(receive, self.max_body_bytes), secured_send)

    def _refusal(self, scope, headers: dict[bytes, bytes]) -> Response | None:
        if declared_too_large(headers, self.max_body_bytes):
            return self.page(413, "Request too large", f"Console forms are under {self.max_body_bytes} bytes.")
        if scope["method"] not in SAFE_METHODS and not same_origin(scope, headers):
            return self.page(403, "Refused", "This form was not sent from this console (cross-origin request).")
        return None
