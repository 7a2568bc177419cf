"""Exceptions with a stable machine-readable code, shared by the CLI and both services (an `ErrorCode` member each)."""

import errno
import math
import os
import re
from typing import NamedTuple


class LabelDPError(ValueError):
    """Bad input or a refused operation. ``code`` is stable; ``str(err)`` is a one-line message."""

    code = "invalid_input"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class RetryLater(LabelDPError):
    """A refusal for now, on the caller's own load or the service's capacity: answered with ``Retry-After``."""

    def __init__(self, message: str, *, code: str, retry_after: float):
        super().__init__(message, code=code)
        self.retry_after: int = max(1, math.ceil(retry_after))  # whole seconds (RFC 9110), never 0


class CertificationError(LabelDPError):
    """A mechanism could not be certified within the requested ε; it must not be sampled."""

    code = "certification_failed"


class InvalidMechanismDocument(LabelDPError):
    """A mechanism document (a ``describe()`` output) that does not state a certified mechanism exactly: malformed,
    or inconsistent with the mechanism it rebuilds to (:mod:`shared.described`)."""

    code = "invalid_mechanism_document"


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
    code: str


_FULL = _Refusal("the service's storage is full; nothing was changed, try again later", code="insufficient_storage")
_QUOTA = _Refusal("the service's storage quota is exhausted; nothing was changed, try again later",
                  code="insufficient_storage")
_FILES = _Refusal("the service has too many open files; nothing was changed, try again later",
                  code="resource_exhausted")
_MEMORY = _Refusal("the service is out of memory; nothing was changed, try again later", code="resource_exhausted")
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
