"""OpenAPI declarations the skeleton adds: every error status with the real error body, request bodies that are
not JSON (CSV, NDJSON, Parquet uploads) and downloads in several media types."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from shared import schemas
from shared.errors import ErrorCode
from shared.service.tables import MEDIA_TYPES

_DESCRIPTIONS = {400: "refused: the code names the problem; nothing changed",
                 401: "missing, unknown, revoked or expired API key (one message for the last three)",
                 403: "the key may see this but not do it",
                 404: "no such object for this key (the same answer whether it exists or not)",
                 405: "method not allowed (see Allow)", 406: "cannot produce the Accept'ed media type",
                 408: "body_timeout: the request body paused too long or arrived too slowly; the connection is closed",
                 409: "the current state does not allow it",
                 413: "body_too_large: the body, or what it decodes to (a JSON body's values, a Parquet body's "
                      "decompressed columns, rows beyond the dataset's examples), is over this endpoint's limit; "
                      "nothing changed",
                 415: "unsupported content type", 422: "body or parameters do not match the schema",
                 429: "over this organization's own limit (release_quota_exceeded: concurrent releases or "
                      "release-seconds per window; too_many_jobs: queued and running trainer jobs); nothing charged; "
                      "retry after Retry-After seconds",
                 500: "internal error; nothing was done", 502: "an upstream service failed or is unreachable",
                 503: "out of time or resources (release_failed: charged, then failed; release_file_damaged: a "
                      "release's stored labels file is missing or not the one recorded, never served; any other: "
                      "nothing charged; release_capacity_exhausted and server_busy: the service's shared capacity "
                      "(connections, memory for decoding JSON, prior and group bodies), with Retry-After; "
                      "resource_exhausted: out of memory or file descriptors; not_ready: GET /readyz, a readiness "
                      "check failed)",
                 507: "insufficient_storage: the service's storage is full; storage_quota_exceeded: what the "
                      "organization stores is at its quota; nothing was changed or charged"}


def error_responses() -> dict:
    """Every error status any route can answer, each with the one error body (for FastAPI's ``responses=``)."""
    statuses = sorted({code.status for code in ErrorCode})
    responses: dict = {status: {"model": schemas.ErrorBody, "description": _DESCRIPTIONS.get(status, "error")}
                       for status in statuses}
    for status in (429, 503):  # quotas and shared capacity say when to come back
        responses[status]["headers"] = {"Retry-After": {
            "description": "seconds to wait before sending the request again (quota and capacity refusals)",
            "schema": {"type": "integer", "minimum": 1}}}
    return responses


def columnar_body(required: bool = True) -> dict:
    """``openapi_extra`` for a route whose body is a CSV, NDJSON or Parquet file (read by streaming)."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": required, "content": {
        "text/csv": binary, "application/x-ndjson": binary, "application/vnd.apache.parquet": binary}}}


def table_download() -> dict:
    """``responses=`` for a route that streams a table in the negotiated media type."""
    content: dict[str, dict[str, object]] = {media: {"schema": {"type": "string", "format": "binary"}}
                                             for media in MEDIA_TYPES if media != "application/json"}
    content["application/json"] = {"schema": {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object"}}, "offset": {"type": "integer"},
        "total": {"type": "integer"}, "next_offset": {"type": ["integer", "null"]}}}}
    return {200: {"description": "the table: CSV by default, NDJSON or Parquet by Accept; JSON pages with offset/limit",
                  "content": content}}


def install(app: FastAPI, public_paths: tuple[str, ...], adjust: Callable[[dict], None] | None = None) -> None:
    """Serve the generated OpenAPI with what FastAPI cannot see: the bearer API key the gatekeeper requires on
    every route but ``public_paths`` (a security scheme, so clients and fuzzers send it and know a route without
    it is a 401), and whatever ``adjust`` adds (e.g. a deployment's ε range)."""

    def build() -> dict:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            spec.setdefault("components", {})["securitySchemes"] = {"apiKey": {
                "type": "http", "scheme": "bearer", "description": "an API key: Authorization: Bearer ldp_…"}}
            for path, operations in spec["paths"].items():
                for operation in operations.values():
                    operation["security"] = [] if path in public_paths else [{"apiKey": []}]
            if adjust is not None:
                adjust(spec)
            app.openapi_schema = spec
        return app.openapi_schema

    # FastAPI's documented way to serve a custom schema ("Extending OpenAPI") assigns over the method, which its
    # annotations declare as a plain method
    app.openapi = build  # type: ignore[method-assign]
