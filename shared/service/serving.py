"""How both parties' ``serve`` runs uvicorn: with time limits on what a client sends and a cap on connections.

uvicorn alone keeps a connection open as long as its client trickles a request head (it has a keep-alive timeout
but no header-read timeout) or a body, and answers past ``limit_concurrency`` with a plain-text 503. Here:

* **request head** — :class:`LimitedH11Protocol` closes a connection whose request head is not complete within
  ``header_timeout_seconds`` of the connection being opened (or, on a kept-alive connection, of its next request's
  first byte). A complete head is what the gatekeeper needs to admit a request (:mod:`shared.service.gate`);
* **request body** — :class:`~shared.service.limits.BodyDeadline` (ASGI middleware) times the body while the
  application waits for it: a pause over ``body_timeout_seconds``, or, after the first ``body_timeout_seconds``,
  a body arriving slower than ``min_body_bytes_per_second`` on average, is answered 408 ``body_timeout`` and the
  connection closed. Time the application spends elsewhere (admitting the request, writing what it read) is not
  counted against the client;
* **an unread body** — a request answered before its body was read (a 401, a 413, a 404 …) whose client keeps
  sending is closed ``body_timeout_seconds`` after the answer;
* **connections** — beyond ``max_connections`` open connections (or requests in progress), a request is answered
  503 ``server_busy`` with ``Retry-After`` and its connection closed.

Repeated errors are logged once per ``log_repeat_seconds`` (:mod:`shared.service.logs`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from shared.service import logs
from shared.service.errors import ErrorCode, error_response
from shared.service.limits import BodyDeadline, HttpSettings


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline, a deadline on an unread body after the answer, and a
    connection cap answered in the service's error envelope. ``limits`` is set by :func:`protocol_class`."""

    limits: HttpSettings

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: str | None = None  # "head" or "unread_body": what the armed deadline waits for
        self.limit_concurrency = None  # uvicorn's own check answers in plain text: ours, below, in the envelope
        self._app, self.app = self.app, self._admit_connection

    async def _admit_connection(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = self.limits.max_connections
        if len(self.connections) > cap or len(self.tasks) > cap:  # both count this connection and request
            self.logger.warning("over %d connections: 503 server_busy", cap)
            busy = error_response(ErrorCode.SERVER_BUSY, "the server has too many connections; try again later")
            busy.headers["Retry-After"] = "1"  # and Connection: close, as every 5xx of the envelope
            await busy(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline the connection's state calls for (keeping one already running for the same thing)."""
        if self.transport.is_closing():
            self._disarm()
            return
        waiting_for = None
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            # Fresh, or kept alive: uvicorn's keep-alive timer covers an idle connection; once its next request
            # has begun (data arrived, uvicorn cancelled that timer), the head must complete in time.
            if self.timeout_keep_alive_task is None:
                waiting_for = "head"
        elif self.conn.their_state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_complete:
            waiting_for = "unread_body"
        if waiting_for == self._deadline_for:
            return
        self._disarm()
        if waiting_for is not None:
            seconds = (self.limits.header_timeout_seconds if waiting_for == "head"
                       else self.limits.body_timeout_seconds)
            self._deadline, self._deadline_for = self.loop.call_later(seconds, self._expire), waiting_for

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_for = None

    def _expire(self) -> None:
        self._deadline = self._deadline_for = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(limits: HttpSettings) -> type[LimitedH11Protocol]:
    """The protocol uvicorn instantiates per connection, with these limits."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": limits})


def serve(app: ASGIApp, limits: HttpSettings, *, host: str, port: int, **uvicorn_options: Any) -> None:
    """Run ``app`` (a party's, from its ``serve`` command) with these limits until the process is stopped."""
    import uvicorn

    app = BodyDeadline(app, idle_seconds=limits.body_timeout_seconds,
                       min_bytes_per_second=limits.min_body_bytes_per_second)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", http=protocol_class(limits),
                            **uvicorn_options)  # configures uvicorn's loggers: the filter goes on after
    logs.rate_limit(logs.service_handlers(), limits.log_repeat_seconds)
    uvicorn.Server(config).run()
