"""Files that hold a deployment's private keys (the audit signing key, the sealing key): created once, mode 0600,
never overwritten; refused when others may read them. Messages never show a key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shared.errors import ErrorCode, LabelDPError


def create_private_file(path: Path, data: bytes, *, exists: str) -> None:
    """``data`` in a new file at ``path`` (0600, flushed to disk); ``exists`` is the refusal when it is there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise LabelDPError(exists, code=ErrorCode.USAGE) from None
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def read_private_file(path: Path, *, what: str, code: ErrorCode, hint: str = "") -> bytes | None:
    """The bytes of ``what`` at ``path``; None if there is no such file. Refused (with ``code``) when it cannot be
    read or others may read it."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        raise LabelDPError(f"{what} cannot be read{hint}", code=code) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LabelDPError(f"{what} may be read by others: chmod 600 it", code=code)
    return data
