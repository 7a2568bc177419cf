"""One error envelope for both services: ``{"error": {"code", "message"}}``; every code is an :class:`ErrorCode`
member that carries its HTTP status, so a code means the same status everywhere and the OpenAPI can list them.
Unexpected failures answer 500 ``internal_error`` (logged, no stack trace) and close the connection."""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import overload

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from shared.errors import LabelDPError, RetryLater, resource_error


class ErrorCode(str, Enum):
    """Every error code either service answers with, and its HTTP status."""

    status: int  # each member's (an annotation only, so not a member)

    # Once the class exists, Enum's metaclass makes ErrorCode(code) a lookup of the member with that code; the type
    # checker reads calls from __new__, which only the definitions below reach.
    @overload
    def __new__(cls, value: str) -> ErrorCode: ...

    @overload
    def __new__(cls, value: str, status: int) -> ErrorCode: ...

    def __new__(cls, value: str, status: int | None = None) -> ErrorCode:
        if status is None:
            raise TypeError(f"error code {value!r} is defined without its HTTP status")
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        return member

    # 400: the request is understood but refused; nothing changed
    INVALID_INPUT = ("invalid_input", 400)
    INVALID_DOMAIN = ("invalid_domain", 400)
    INVALID_PRIOR = ("invalid_prior", 400)
    INVALID_EPSILON = ("invalid_epsilon", 400)
    EPSILON_OUT_OF_RANGE = ("epsilon_out_of_range", 400)
    INVALID_MESH = ("invalid_mesh", 400)
    INVALID_OPTION = ("invalid_option", 400)
    INVALID_METRIC = ("invalid_metric", 400)
    INVALID_ROLE = ("invalid_role", 400)
    INVALID_ORG = ("invalid_org", 400)
    INVALID_JOB = ("invalid_job", 400)
    MALFORMED_FILE = ("malformed_file", 400)
    LABEL_OUT_OF_DOMAIN = ("label_out_of_domain", 400)
    MECHANISM_DOMAIN_MISMATCH = ("mechanism_domain_mismatch", 400)
    UNINFORMATIVE_RELEASE = ("uninformative_release", 400)
    UNKNOWN_MECHANISM = ("unknown_mechanism", 400)
    UNKNOWN_EXAMPLE_IDS = ("unknown_example_ids", 400)
    DUPLICATE_EXAMPLE_ID = ("duplicate_example_id", 400)
    EMPTY_LABELS = ("empty_labels", 400)
    PRIOR_REQUIRED = ("prior_required", 400)
    LATTICE_TOO_FINE = ("lattice_too_fine", 400)
    DOMAIN_TOO_LARGE = ("domain_too_large", 400)
    TOO_LARGE = ("too_large", 400)
    TOO_MANY_GROUPS = ("too_many_groups", 400)  # a group release beyond the deployment's max_groups_per_release
    # the mechanism documents a request would create, predicted from public inputs, beyond max_document_bytes
    DOCUMENT_TOO_LARGE = ("document_too_large", 400)
    # a central training whose work (steps × rows × model parameters), predicted from public inputs, is beyond
    # max_central_training_size, or one step's beyond max_central_training_step
    TRAINING_TOO_LARGE = ("training_too_large", 400)
    CERTIFICATION_FAILED = ("certification_failed", 400)
    SOLVER_FAILED = ("solver_failed", 400)
    MECHANISM_NOT_SUPPORTED_ON_SPARK = ("mechanism_not_supported_on_spark", 400)  # labels_party.spark
    # a mechanism document that does not state a certified mechanism exactly (shared.mechanisms.documents)
    INVALID_MECHANISM_DOCUMENT = ("invalid_mechanism_document", 400)
    NO_OVERLAP = ("no_overlap", 400)
    # the test-MSE estimate (features_party.client) refused on examples the model was trained on (holdout false)
    NOT_HELD_OUT = ("not_held_out", 400)
    # the unbiased test-MSE estimate (shared.estimates) refused for a biased mechanism, or one whose outputs admit no
    # unbiased correction of their variance (or that releases no number per label)
    MECHANISM_BIASED = ("mechanism_biased", 400)
    MECHANISM_NOT_ESTIMABLE = ("mechanism_not_estimable", 400)
    JOB_TOO_LARGE = ("job_too_large", 400)  # a trainer job's parameters × epochs × rows over its limit
    TOO_FEW_EXAMPLES = ("too_few_examples", 400)  # a trainer job would train on fewer examples than its minimum
    SOURCE_NOT_ALLOWED = ("source_not_allowed", 400)  # a source location the operator did not allow
    SOURCE_NOT_FOUND = ("source_not_found", 400)  # a source location that does not exist or cannot be read
    UNKNOWN_LABELS_PARTY = ("unknown_labels_party", 400)
    LABELS_PARTY_REFUSED = ("labels_party_refused", 400)
    IDEMPOTENCY_KEY_REQUIRED = ("idempotency_key_required", 400)
    USAGE = ("usage", 400)
    # 401 / 403 / 404
    UNAUTHORIZED = ("unauthorized", 401)
    FORBIDDEN = ("forbidden", 403)
    LABELS_PARTY_FORBIDDEN = ("labels_party_forbidden", 403)
    NOT_FOUND = ("not_found", 404)
    LABELS_PARTY_NOT_FOUND = ("labels_party_not_found", 404)
    METHOD_NOT_ALLOWED = ("method_not_allowed", 405)
    NOT_ACCEPTABLE = ("not_acceptable", 406)
    # 409: the state does not allow it
    BUDGET_EXCEEDED = ("budget_exceeded", 409)
    LABELS_PARTY_BUDGET_EXCEEDED = ("labels_party_budget_exceeded", 409)
    IDEMPOTENCY_CONFLICT = ("idempotency_conflict", 409)
    # a trainer job's Idempotency-Key already used by this organization with another request
    IDEMPOTENCY_KEY_REUSED = ("idempotency_key_reused", 409)
    DATASET_EXISTS = ("dataset_exists", 409)
    CENTRAL_TRAINING_DISABLED = ("central_training_disabled", 409)  # the dataset's setting, not the key's rights
    NO_LABELS = ("no_labels", 409)
    JOB_NOT_READY = ("job_not_ready", 409)
    JOB_NOT_RESUMABLE = ("job_not_resumable", 409)
    SOURCE_DATASET = ("source_dataset", 409)  # labels that stay at their source: no uploads, whole releases only
    RELEASE_NOT_READY = ("release_not_ready", 409)
    UPLOAD_CONFLICT = ("upload_conflict", 409)
    ALLOCATION_EXCEEDED = ("allocation_exceeded", 409)  # a grant's allocation beyond what the owner's account holds
    DELTA_NOT_ALLOCATED = ("delta_not_allocated", 409)  # an event with δ > 0 by an organization with no δ allocation
    # a request with this Idempotency-Key is still being computed (its outcome is the first request's, not a new one)
    RELEASE_IN_PROGRESS = ("release_in_progress", 409)
    # a source dataset still being copied and counted (or whose registration failed): nothing is charged
    DATASET_NOT_READY = ("dataset_not_ready", 409)
    # a trainer job's id list (split.holdout_ids) is not the version it pinned: replaced or deleted since
    ID_LIST_CHANGED = ("id_list_changed", 409)
    TOO_MANY_ID_LISTS = ("too_many_id_lists", 409)  # a new id list beyond the trainer's max_id_lists_per_org
    BODY_TIMEOUT = ("body_timeout", 408)  # the body paused too long or came too slowly (shared.service.serving)
    BODY_TOO_LARGE = ("body_too_large", 413)
    UNSUPPORTED_MEDIA_TYPE = ("unsupported_media_type", 415)
    INVALID_REQUEST = ("invalid_request", 422)
    # 429: this organization's own quota (labels_party.quotas), never another's use; Retry-After says when
    RELEASE_QUOTA_EXCEEDED = ("release_quota_exceeded", 429)
    TOO_MANY_JOBS = ("too_many_jobs", 429)  # an organization's queued + running trainer jobs at their limit
    # 5xx: the service, or one it depends on, could not do it now (nothing was charged, but for release_failed)
    INTERNAL_ERROR = ("internal_error", 500)
    TRAINING_FAILED = ("training_failed", 500)  # a trainer job's failure (JobView.error_code): an unexpected error
    DATABASE_OUTDATED = ("database_outdated", 500)
    STORAGE_INCONSISTENT = ("storage_inconsistent", 500)
    LABELS_PARTY_UNREACHABLE = ("labels_party_unreachable", 502)
    LABELS_PARTY_FAILED = ("labels_party_failed", 502)
    SOLVER_TIMEOUT = ("solver_timeout", 503)
    JOB_TIME_LIMIT = ("job_time_limit", 503)  # a trainer job's failure (JobView.error_code): over its wall time
    # a trainer job's failure (JobView.error_code): claimed job_max_attempts times (its workers died, or its labels
    # party kept failing) and due again
    JOB_ATTEMPTS_EXHAUSTED = ("job_attempts_exhausted", 503)
    # a job's sealed secret cannot be opened (shared.service.sealing): no secret key now, or not the one it was
    # sealed with; or the sealed value is damaged
    SECRET_KEY_MISSING = ("secret_key_missing", 503)
    # a Spark cluster master without the deployment's shared authentication secret (labels_party/spark/session.py)
    SPARK_NOT_SECURED = ("spark_not_secured", 503)
    SEALED_SECRET_DAMAGED = ("sealed_secret_damaged", 503)
    # the audit key in use is not the one that signs this data directory's accounts (labels_party/context.py): a
    # command run without LABELDP_AUDIT_KEY_FILE would have made a second key and signed with it
    AUDIT_KEY_MISMATCH = ("audit_key_mismatch", 503)
    # charged before it was computed, then could not be completed (no data-dependent reason: a resource failed)
    RELEASE_FAILED = ("release_failed", 503)
    LEDGER_ROLLBACK = ("ledger_rollback", 503)  # the database is behind the data directory: restore both together
    LEDGER_TAMPERED = ("ledger_tampered", 503)  # a table disagrees with the chain: changed outside the service
    # the service's capacity, shared by every organization (Retry-After): all release slots taken, or too many
    # connections
    RELEASE_CAPACITY_EXHAUSTED = ("release_capacity_exhausted", 503)
    SERVER_BUSY = ("server_busy", 503)
    # a release's labels file is not the one recorded when it became available (size, SHA-256): never served
    RELEASE_FILE_DAMAGED = ("release_file_damaged", 503)
    # the service ran out of memory or file descriptors (shared.errors.resource_error); nothing was changed
    RESOURCE_EXHAUSTED = ("resource_exhausted", 503)
    NOT_READY = ("not_ready", 503)  # GET /readyz: a readiness check failed (shared.service.health)
    # a source release whose job was written (pickled) by a version before jobs were rows: it cannot run again
    JOB_FORMAT_RETIRED = ("job_format_retired", 503)
    REGISTRATION_FAILED = ("registration_failed", 503)  # a source's copy or count failed for the service's reasons
    INSUFFICIENT_STORAGE = ("insufficient_storage", 507)  # the service's disk (or quota) is full; nothing changed


def status_of(code: str) -> int:
    try:
        return ErrorCode(code).status
    except ValueError:  # a code not declared here is a bug (tests/shared/service/test_skeleton.py checks every raise)
        return 400


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

    @app.exception_handler(Exception)
    async def _internal_error(request, err: Exception):
        return await _resource_or_internal(request, err)
