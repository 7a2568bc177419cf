"""Exceptions with a stable machine-readable code, shared by the CLI and both services (an `ErrorCode` member each)."""

import math
import re


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
