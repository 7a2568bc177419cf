"""Exceptions with a stable machine-readable code, shared by the CLI and both services (an `ErrorCode` member each)."""

from __future__ import annotations

import errno
import math
import os
import re
from enum import StrEnum
from typing import NamedTuple, overload


class ErrorCode(StrEnum):
    """Every error code either service answers with, and its HTTP status: every raise names a member (a code is
    a member's value, the same text in JSON, logs and f-strings), so a code means one status everywhere and the
    OpenAPI can list them."""

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
    # 429: this organization's own quota (labels_party.runtime.quotas), never another's use; Retry-After says when
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
    # a Spark cluster master without the deployment's shared authentication secret (shared/spark/session.py)
    SPARK_NOT_SECURED = ("spark_not_secured", 503)
    SEALED_SECRET_DAMAGED = ("sealed_secret_damaged", 503)
    # the audit key in use is not the one that signs this data directory's accounts (labels_party/runtime/context.py): a
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
    INSUFFICIENT_STORAGE = ("insufficient_storage", 507)  # the service's disk is full; nothing changed
    # what the organization stores (its label versions and releases; its features tables, id lists and job outputs)
    # is at its quota (shared.service.storage_quota); nothing changed or charged
    STORAGE_QUOTA_EXCEEDED = ("storage_quota_exceeded", 507)
    # the command line's compose demo (labeldp/compose_stack.py), answered by no route: Docker absent or refusing
    DOCKER_UNAVAILABLE = ("docker_unavailable", 503)
    COMPOSE_FAILED = ("compose_failed", 503)


def known_code(code: str, default: ErrorCode) -> ErrorCode:
    """The member of a code that came from elsewhere (another service's answer, a Spark worker's message), or
    ``default`` for one this code base does not declare."""
    member = ErrorCode._value2member_map_.get(code)
    return member if isinstance(member, ErrorCode) else default


def status_of(code: str) -> int:
    try:
        return ErrorCode(code).status
    except ValueError:  # a code not declared here is a bug (tests/shared/service/test_skeleton.py checks every raise)
        return 400



class LabelDPError(ValueError):
    """Bad input or a refused operation. ``code`` is stable; ``str(err)`` is a one-line message."""

    code: ErrorCode = ErrorCode.INVALID_INPUT

    def __init__(self, message: str, *, code: ErrorCode | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class RetryLater(LabelDPError):
    """A refusal for now, on the caller's own load or the service's capacity: answered with ``Retry-After``."""

    def __init__(self, message: str, *, code: ErrorCode, retry_after: float):
        super().__init__(message, code=code)
        self.retry_after: int = max(1, math.ceil(retry_after))  # whole seconds (RFC 9110), never 0


class CertificationError(LabelDPError):
    """A mechanism could not be certified within the requested ε; it must not be sampled."""

    code = ErrorCode.CERTIFICATION_FAILED


class InvalidMechanismDocument(LabelDPError):
    """A mechanism document (a ``describe()`` output) that does not state a certified mechanism exactly: malformed,
    or inconsistent with the mechanism it rebuilds to (:mod:`shared.described`)."""

    code = ErrorCode.INVALID_MECHANISM_DOCUMENT


# pyarrow's preamble naming what it read (a path, or '<Buffer>' for a handle): says nothing about the file.
_OPENING = re.compile(r"^Could not open Parquet input source '[^']*': ")
# An absolute path (or file:// URI) in a library's message: at the start, after a blank, a quote, '=' or ':'.
_PATH = re.compile(r"""(?:file://|(?<![^\s'"=:]))/[^\s'"]+/[^\s'":,]*""")


def library_message(err: BaseException) -> str:
    """What a parsing library said was wrong with a file, fit for a client: its first line, at most 300
    characters, with any file path replaced by ``<file>``. Bodies are read through open handles so that libraries
    do not know their paths; this covers a message that names a file anyway (the client must learn what is wrong
    with its file, never where the server keeps it)."""
    lines = str(err).strip().splitlines()
    first = _OPENING.sub("", lines[0]) if lines else type(err).__name__
    return _PATH.sub("<file>", first)[:300]


# A resource the service ran out of, and what the client is told: its request was not at fault and nothing was
# changed. The text is fixed (it says which resource, never which file or how much data).
class _Refusal(NamedTuple):
    message: str
    code: ErrorCode


_FULL = _Refusal("the service's storage is full; nothing was changed, try again later",
                 code=ErrorCode.INSUFFICIENT_STORAGE)
_QUOTA = _Refusal("the service's storage quota is exhausted; nothing was changed, try again later",
                  code=ErrorCode.INSUFFICIENT_STORAGE)
_FILES = _Refusal("the service has too many open files; nothing was changed, try again later",
                  code=ErrorCode.RESOURCE_EXHAUSTED)
_MEMORY = _Refusal("the service is out of memory; nothing was changed, try again later",
                   code=ErrorCode.RESOURCE_EXHAUSTED)
_BY_ERRNO = {errno.ENOSPC: _FULL, errno.EDQUOT: _QUOTA, errno.EMFILE: _FILES, errno.ENFILE: _FILES,
             errno.ENOMEM: _MEMORY}
# Libraries that flatten errno into text (DuckDB, Java under Spark, SQLite, PostgreSQL) are recognized by it.
_BY_TEXT = [(os.strerror(number), refusal) for number, refusal in _BY_ERRNO.items()] + [
    ("database or disk is full", _FULL), ("Out of Memory Error", _MEMORY), ("java.lang.OutOfMemoryError", _MEMORY)]
_BY_SQLSTATE = {"53100": _FULL, "53200": _MEMORY}  # PostgreSQL's disk_full, out_of_memory


class ResourceExhausted(LabelDPError):
    """The service ran out of storage (507 ``insufficient_storage``) or of memory or file descriptors (503
    ``resource_exhausted``): never the client's file, never a 500."""


def resource_error(err: BaseException) -> ResourceExhausted | None:
    """The resource ``err`` (or an exception it was raised from) says ran out, as the refusal to answer; None
    for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        refusal = _refusal_of(current)
        if refusal is not None:
            return ResourceExhausted(refusal.message, code=refusal.code)
        current = current.__cause__ or current.__context__
    return None


def _refusal_of(err: BaseException) -> _Refusal | None:
    if isinstance(err, ResourceExhausted):
        return _Refusal(str(err), code=err.code)
    if isinstance(err, MemoryError):  # pyarrow's ArrowMemoryError too
        return _MEMORY
    number = getattr(err, "errno", None)
    if isinstance(err, OSError) and number in _BY_ERRNO:
        return _BY_ERRNO[number]
    original = getattr(err, "orig", None)  # a SQLAlchemy DBAPIError's driver exception
    state = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
    if state in _BY_SQLSTATE:
        return _BY_SQLSTATE[state]
    if not _flattens_errno(err):
        return None
    text = str(err)
    return next((refusal for marker, refusal in _BY_TEXT if marker in text), None)


# Exceptions whose text says which resource ran out but that carry no errno: DuckDB's I/O and memory errors,
# SQLite's and the drivers' operational errors (SQLAlchemy wraps them), Java's under Spark. Never a ValueError: a
# parser's message quotes the client's data, which may hold any words.
_FLATTENING = {"IOException", "OutOfMemoryException", "OperationalError", "Py4JJavaError"}


def _flattens_errno(err: BaseException) -> bool:
    if isinstance(err, ValueError):
        return False
    return (isinstance(err, OSError) or type(err).__name__ in _FLATTENING
            or type(err).__module__.startswith(("pyspark", "py4j")))
