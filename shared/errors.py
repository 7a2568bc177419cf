"""Exceptions with a stable machine-readable code, shared by the CLI and both services (an `ErrorCode` member each)."""


class LabelDPError(ValueError):
    """Bad input or a refused operation. ``code`` is stable; ``str(err)`` is a one-line message."""

    code = "invalid_input"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class CertificationError(LabelDPError):
    """A mechanism could not be certified within the requested ε; it must not be sampled."""

    code = "certification_failed"
