"""API keys: 256-bit random secrets shown once and stored as SHA-256 hashes (a fast hash is right for
high-entropy secrets), read from ``Authorization: Bearer <key>``."""

from __future__ import annotations

import hashlib
import re
import secrets

from shared.errors import LabelDPError

_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")


def new_key(kind: str) -> tuple[str, str]:
    """(key, its stored hash); ``kind`` ('ldp', 'trn') tells which service a leaked key belongs to."""
    key = f"{kind}_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
    return key, hash_key(key)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str:
    """The key of a bearer header; anything else (missing, another scheme, non-ASCII) is a 401."""
    if not authorization or not authorization.startswith("Bearer "):
        raise LabelDPError("missing bearer API key", code="unauthorized")
    key = authorization[len("Bearer "):].strip()
    if not _KEY.match(key):
        raise LabelDPError("invalid API key", code="unauthorized")
    return key
