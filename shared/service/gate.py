"""The gate: authentication, authorization and body limits, all before a route reads a byte of the body.

Each route under ``/v1`` declares what it needs with a :class:`Guard` among its dependencies (``who: Annotated[
Admission, Depends(SOME_GUARD)]``) and is a :class:`GuardedRoute` (its router's ``route_class``). Before FastAPI's
handler reads the body or solves any dependency, the route calls the party's ``admit(guard, path_params,
authorization)`` (``app.state.admit``, in a worker thread: it may use the database), which returns the admission
(the principal, what it may touch, the body limit) or raises the 401/403/404 ``LabelDPError``. The body is then
limited to the admission's limit — on the declared length and while it streams. The route reads the admission
through the same dependency: access is decided once per request. A guarded route without exactly one guard is
refused when it is defined.

A route whose body is JSON has it read here too, before FastAPI parses it, and bounded by what it **decodes to**
(issue 40: a 60 MB body of ``[[0], [0], …]`` within the 64 MiB limit took the server from 683 MB to 4.2 GB): as the
body streams in, :class:`JsonCost` counts what it can decode to (its bytes, values and containers — C-speed byte
counts, no parsing), and the request takes that much of the process's :class:`ByteBudget` before any of it is
parsed. A body whose cost is over the per-request limit is 413 ``body_too_large`` at once; one the budget cannot
cover within its wait is 503 ``server_busy`` with Retry-After. The budget is held until the answer is sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.responses import Response

from shared.errors import ErrorCode, LabelDPError
from shared.service import spool
from shared.service.budgets import ByteBudget

if TYPE_CHECKING:
    from shared.service.keys import Principal
    from shared.service.scratch import Scratch

PUBLIC_PATHS = ("/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")


class Guard:
    """What a route needs before its body is read; a party's guards subclass it (frozen dataclasses). As a FastAPI
    dependency it returns the admission the route made for the request."""

    def __call__(self, request: Request) -> Any:
        return request.scope["state"]["admission"]

    def check_route(self, path: str) -> None:
        """Refuse (TypeError) a route this guard cannot decide, when the route is defined."""


class Admitted(Protocol):
    """What a party's ``admit`` returns: anything with the request's body limit and who sends it."""

    @property
    def body_limit(self) -> int: ...

    @property
    def principal(self) -> Principal: ...


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
                raise LabelDPError(f"request body over {limit} bytes", code=ErrorCode.BODY_TOO_LARGE)

            def flag() -> None:  # routes that parse JSON wrap the error in a generic 400: the flag lets it say 413
                state["body_too_large"] = True

            receive = limited(request.receive, limit, flag)
            checked = CheckedRequest(request.scope, receive)
            if self.body_field is None:  # no JSON body (none, or a file the route streams itself)
                return await handle(checked)
            budget: ByteBudget = getattr(request.app.state, "decode_budget", None) or DEFAULT_BUDGET
            scratch = getattr(getattr(request.app.state, "ctx", None), "scratch", None)
            body, held = await read_json_body(receive, budget, admission.principal.org_id, scratch)
            checked._body = body  # FastAPI's request.body() returns it: nothing is read twice
            try:
                return await handle(checked)
            finally:
                budget.give(held, admission.principal.org_id)

        return guarded


class CheckedRequest(Request):
    """A request whose JSON body holds valid Unicode only, and objects of at most :data:`MAX_OBJECT_KEYS` keys.
    JSON may escape a lone surrogate (``"\\ud800"``), which Python decodes to a string that no UTF-8 encoder takes —
    hashing it, storing it or logging it raised deep in a route (a 500, some after the release was charged). An
    object of many keys is one validation error per key (extra keys are refused): ~700 bytes each, more than the
    keys weigh. Both refused here, before any route or validation sees the body: a 400."""

    async def json(self) -> Any:
        value = await super().json()
        body = getattr(self, "_body", None)
        if isinstance(body, bytes) and body.count(b":") <= MAX_OBJECT_KEYS and not (
                (b"\\u" in body or b"\xed" in body) and _SURROGATE.search(body)):
            return value  # no escape or byte that makes a surrogate, and too few keys: nothing to walk
        state = self.scope.setdefault("state", {})
        bad = _first_invalid_string(value)
        if bad is None:
            return value
        if bad.startswith(_WIDE):
            state["invalid_body"] = f"{bad[len(_WIDE):]}: request bodies' objects have at most {MAX_OBJECT_KEYS} keys"
            raise ValueError(state["invalid_body"])
        state["invalid_unicode"] = True
        raise ValueError(f"a string of the body is not valid Unicode (a lone surrogate at {bad})")


MAX_OBJECT_KEYS = 64  # keys of a JSON object in a request body (the widest request model has about 20 fields)
_WIDE = "wide:"
# what a surrogate in a JSON text is made of: an escape \uD800-\uDFFF, or its UTF-8 bytes (0xED 0xA0-0xBF), which
# json.loads decodes with surrogatepass
_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")


def _first_invalid_string(value: Any, where: str = "body") -> str | None:
    """Where the first string (key or value) holding a lone surrogate is (or, prefixed ``wide:``, the first object
    of more than :data:`MAX_OBJECT_KEYS` keys), or None: a walk whose memory is the nesting depth (a stack of
    iterators; the path is made only for what it reports), not one path per element (~120 bytes per value)."""
    if isinstance(value, str):
        return None if _valid(value) else where
    if not isinstance(value, (dict, list)):
        return None
    if isinstance(value, dict) and len(value) > MAX_OBJECT_KEYS:
        return f"{_WIDE}{where} has {len(value):,} keys"
    stack: list[tuple[Any, Iterator[tuple[Any, Any]]]] = [(None, _items(value))]

    def path(key: Any = None) -> str:
        at = where
        for parent, _ in stack[1:]:
            at = _path(at, parent)
        return at if key is None else _path(at, key)

    while stack:
        for key, inner in stack[-1][1]:
            kind = type(inner)
            if type(key) is str and not _valid(key):
                return f"{path()} (a key)"
            if kind is str:
                if not _valid(inner):
                    return path(key)
            elif kind is list or kind is dict:
                if kind is dict and len(inner) > MAX_OBJECT_KEYS:
                    return f"{_WIDE}{path(key)} has {len(inner):,} keys"
                stack.append((key, _items(inner)))
                break
        else:
            stack.pop()
    return None


def _items(container: dict | list) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _path(path: str, key: Any) -> str:
    if len(path) >= 200:
        return path
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{str(key)[:50]}"


def _valid(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# What decoding a JSON body can take, per unit JsonCost counts, measured with tracemalloc over json.loads, the
# surrogate check, pydantic's validation, model_dump and a canonical json.dumps (the ledger's record) of hostile
# bodies (tests/shared/service/test_decode_budget.py checks every shape against these): a value (number, string,
# literal; its pointers, its object and its copies), a container (list or object, and pydantic's copies of it),
# a byte of the body (the body itself, strings' characters — up to 4 bytes each once one needs UCS-4 — and the
# canonical dump).
VALUE_BYTES = 128
CONTAINER_BYTES = 160
BODY_BYTE_BYTES = 8


@dataclass
class JsonCost:
    """An upper bound on the memory a JSON body decodes to, counted on its bytes as they arrive (no parsing):
    every value follows a comma, a colon, an opening bracket or starts the body; every container opens with one."""

    size: int = 0
    separators: int = 0
    containers: int = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.separators += chunk.count(b",") + chunk.count(b":")
        self.containers += chunk.count(b"[") + chunk.count(b"{")

    @property
    def total(self) -> int:
        values = self.separators + self.containers + 1
        return VALUE_BYTES * values + CONTAINER_BYTES * self.containers + BODY_BYTE_BYTES * self.size

    def describe(self) -> str:
        return (f"about {self.total:,} bytes ({self.size:,} bytes of JSON, up to "
                f"{self.separators + self.containers + 1:,} values, {self.containers:,} arrays or objects)")


DEFAULT_BUDGET = ByteBudget(total=768 << 20, per_request=192 << 20)  # HttpSettings' defaults


async def read_json_body(receive, budget: ByteBudget, owner: Hashable = None,
                         scratch: Scratch | None = None) -> tuple[bytes, int]:
    """The whole body and the share of ``budget`` taken for it for ``owner`` (the request's organization; the caller
    gives it back). As each chunk arrives its cost is counted and refused past ``budget.per_request`` (413
    body_too_large, before the rest is read) and the chunk is kept — in memory while the body is small, else in an
    unnamed file in the process's spool directory (``scratch``; in memory without one), paid from its spool budget
    (:mod:`shared.service.spool`); once the body is complete, what it costs is taken from the budget — waiting up to
    ``wait_seconds``, then 503 server_busy — and only then is it read back to be parsed. One organization's bodies
    hold at most ``budget.per_owner``.

    A body holds no memory share while it streams in: bodies that held their share as they came let slow senders
    hold the budget (two organizations' four connections, each sending 677,900 bytes of brackets, 192 MiB counted,
    then a byte every 15 s, held it for minutes while every other organization was 503: the twenty-third and
    twenty-fourth reviews), and bodies that kept their bytes in memory let one organization's 240 slow connections
    of 22 MB each grow the trainer by 5.2 GB (the twenty-fifth). A request that waits holds nothing of this budget,
    so no two wait for each other."""
    cost = JsonCost()

    def count(chunk: bytes) -> None:
        cost.add(chunk)
        if cost.total + cost.size > budget.per_request:  # the body's bytes are read back whole: counted
            raise LabelDPError(f"the JSON body decodes to {cost.describe()}, over this endpoint's limit of "
                               f"{budget.per_request:,} (max_json_decoded_bytes): send fewer or shorter values",
                               code=ErrorCode.BODY_TOO_LARGE)

    with spool.JsonSpool(scratch, owner) as body:
        await spool.receive_all(receive, body, count)
        need = cost.total + cost.size
        await budget.take(need, owner)
        try:
            return body.read(), need
        except BaseException:
            budget.give(need, owner)
            raise


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
                raise LabelDPError(f"request body over {limit} bytes", code=ErrorCode.BODY_TOO_LARGE)
        return message

    return limited_receive
