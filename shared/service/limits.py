"""The HTTP limits of both parties' ``serve`` (their settings) and the request-body deadline; the server side is
:mod:`shared.service.serving`. Kept apart from uvicorn so that settings import no server."""

from __future__ import annotations

import asyncio
import math
import time

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.service.budgets import ByteBudget


class HttpSettings(BaseSettings):
    """The HTTP limits of a party's ``serve`` (each party's settings class inherits them with its own prefix:
    ``LABELDP_HEADER_TIMEOUT_SECONDS``, ``LABELDP_TRAINER_HEADER_TIMEOUT_SECONDS``, …)."""

    header_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    min_body_bytes_per_second: int = Field(default=1024, ge=0)
    max_connections: int = Field(default=256, ge=1)
    log_repeat_seconds: float = Field(default=10.0, gt=0)
    # What JSON bodies may decode to (shared.service.gate.JsonCost, an upper bound counted on the bytes before they
    # are parsed): one body at most max_json_decoded_bytes (else 413 body_too_large), all bodies being decoded or
    # answered at once at most json_decode_budget_bytes (a body waits up to json_decode_wait_seconds for its share,
    # else 503 server_busy with Retry-After). 192 MiB is ~10⁶ example ids of 10 characters, or ~10⁶ numbers.
    max_json_decoded_bytes: int = Field(default=192 << 20, gt=0)
    json_decode_budget_bytes: int = Field(default=768 << 20, gt=0)
    json_decode_wait_seconds: float = Field(default=10.0, ge=0, le=600)
    # The disk bodies being spooled may hold (shared.service.spool): unset, half the spool disk's free space when the
    # process starts; one organization's bodies at most half of it. A body waits json_decode_wait_seconds for its
    # share (503 server_busy). And no body streams longer than max_body_seconds in all (408 body_timeout), however
    # steadily it comes: holding the spool disk ends.
    spool_budget_bytes: int | None = Field(default=None, gt=0)
    max_body_seconds: float = Field(default=1800.0, gt=0, le=86400)
    # What one organization may store on the service's disk (shared.service.storage_quota): unset, a quarter of the
    # data disk's free space when the process starts. At it, requests that would store more are 507
    # storage_quota_exceeded.
    max_stored_bytes_per_org: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _a_body_fits_the_budget(self) -> HttpSettings:
        if self.max_json_decoded_bytes > self.json_decode_budget_bytes:
            raise ValueError("max_json_decoded_bytes must be at most json_decode_budget_bytes")
        return self


def json_budget(settings: HttpSettings) -> ByteBudget:
    """The process's memory for JSON bodies: one organization's requests hold at most half of it (or one body's
    limit, if more), so that its bodies never hold it all (the twenty-third review: four slow connections of one
    organization held the whole budget for 11 minutes)."""
    total, one = settings.json_decode_budget_bytes, settings.max_json_decoded_bytes
    return ByteBudget(total, one, settings.json_decode_wait_seconds, per_owner=max(one, total // 2))


def describe(settings: HttpSettings) -> str:
    """The limits as the OpenAPI description states them (this deployment's values)."""
    return (f"HTTP limits: a request head must be complete within {settings.header_timeout_seconds:g} s of the "
            f"connection, else the connection is closed; a request body must not pause longer than "
            f"{settings.body_timeout_seconds:g} s nor, after that long, arrive slower than "
            f"{settings.min_body_bytes_per_second} bytes/s on average, nor take longer than "
            f"{settings.max_body_seconds:g} s in all (408 body_timeout); at most "
            f"{settings.max_connections} connections and requests in progress (503 server_busy, Retry-After). A JSON "
            f"body may decode to at most {settings.max_json_decoded_bytes:,} bytes, counted on its bytes before it "
            f"is parsed (413 body_too_large); bodies being decoded share {settings.json_decode_budget_bytes:,} bytes, "
            "one organization's at most half "
            f"(a body waits up to {settings.json_decode_wait_seconds:g} s for its share: 503 server_busy, "
            "Retry-After). Bodies being received take the server's spool disk, one organization's at most half of "
            "what this server lends them (503 server_busy while its share is taken; 507 insufficient_storage for "
            "a body over that half).")


class BodyDeadline:
    """ASGI middleware: the request body must keep coming while the application waits for it: a pause over
    ``idle_seconds``, or, after a grace of ``idle_seconds`` of waiting, a body slower than ``min_bytes_per_second``
    on average over the waiting time, or more than ``max_seconds`` of waiting in all, raises 408 ``body_timeout``
    (with ``Connection: close``) where the application reads. Only the time spent waiting in ``receive`` counts.
    Without ``max_seconds`` a body's allowance grew with what it had sent — 30 s and a second a KiB: a 380 MiB
    upload kept its spool disk for 4.5 days (the twenty-sixth review)."""

    def __init__(self, app: ASGIApp, *, idle_seconds: float, min_bytes_per_second: int,
                 max_seconds: float = math.inf, clock=time.monotonic) -> None:
        self.app, self.idle_seconds, self.min_rate, self.clock = app, idle_seconds, min_bytes_per_second, clock
        self.max_seconds = max_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        waited, received, complete = 0.0, 0, False

        async def timed_receive() -> Message:
            nonlocal waited, received, complete
            if complete:  # the body is in; later calls wait for a disconnect (a streamed answer): not timed
                return await receive()
            # Allowed waiting so far: a grace of idle_seconds, then received/min_rate more for what has come.
            allowed = min(self.idle_seconds + (received / self.min_rate if self.min_rate else math.inf),
                          self.max_seconds)
            timeout = min(self.idle_seconds, allowed - waited)
            started = self.clock()
            try:
                message = await asyncio.wait_for(receive(), timeout) if timeout > 0 else None
            except TimeoutError:
                message = None
            waited += self.clock() - started
            if message is None:
                raise HTTPException(408, "the request body did not arrive in time",
                                    headers={"Connection": "close"})
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        await self.app(scope, timed_receive, send)
