"""Key certificates: the audit key vouches for every API key the service issued (issue 40's review: a key row
inserted into the database was put on the chains by the service itself, and an expiry or a revocation undone by a
row edit was honoured).

A key's row holds its certificate: the canonical JSON of what the key is — its id, organization, role, public
prefix, its secret's digest (:func:`~.records.secret_digest`), when it was made and until when it works, and, once
revoked, from when it is refused and by whom — with the audit key's Ed25519 signature over it. The service honours
a key only when its row says exactly what its certificate says and the signature verifies (:func:`agrees`): a row
that a database writer inserted (no certificate, or another key's) or edited (organization, role, secret, expiry,
revocation cleared) is an unknown key. A revocation goes to the chains of the organization the certificate names,
whatever the row says now (:func:`statement`).

A certificate proves what a row was, not that it still is: a database writer can put back a certificate copied
before the key was revoked, with the row as it then was. Revocations are therefore also kept outside the database
(:mod:`.revocations`), which refuse such a key whatever its row and certificate say.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from labels_party.ledger.records import canonical, secret_digest
from labels_party.ledger.signing import key_id
from labels_party.store import db

# Signed bytes start with this: a key certificate's signature is never a head's (signing.CONTEXT), nor the reverse.
CONTEXT = b"labeldp key certificate v1\n"


def fields(key: db.ApiKey, org: str) -> dict[str, Any]:
    """What a certificate states of ``key`` (of organization ``org``), as its row now says."""
    def when(value: datetime | None) -> str | None:  # as the database reads it back: aware, UTC
        if value is None:
            return None
        aware = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        return aware.isoformat()

    return {"key_id": int(key.id), "org": org, "role": key.role, "prefix": key.prefix,
            "secret_digest": secret_digest(key.key_hash), "created_at": when(key.created_at),
            "expires_at": when(key.expires_at), "revoked_at": when(key.revoked_at), "revoked_by": key.revoked_by}


def issue(signing_key: Ed25519PrivateKey, key: db.ApiKey, org: str) -> str:
    """The certificate of ``key`` as its row now stands (made, or revoked)."""
    body = fields(key, org)
    return canonical({"key": body, "signer": key_id(signing_key.public_key()),
                      "signature": signing_key.sign(CONTEXT + canonical(body).encode()).hex()})


def signer(certificate: str | None) -> str | None:
    """The id of the audit key a certificate says signed it (unverified: for telling an operator which key)."""
    try:
        return str(json.loads(certificate or "")["signer"])
    except (ValueError, KeyError, TypeError):
        return None


def statement(public: Ed25519PublicKey, key: db.ApiKey) -> dict[str, Any] | None:
    """What ``key``'s certificate states, if the audit key signed it (else None)."""
    if not key.certificate:
        return None
    try:
        parsed = json.loads(key.certificate)
        body, signature = parsed["key"], bytes.fromhex(parsed["signature"])
        public.verify(signature, CONTEXT + canonical(body).encode())
    except (ValueError, KeyError, TypeError, InvalidSignature):
        return None
    return body if isinstance(body, dict) else None


def agrees(public: Ed25519PublicKey, key: db.ApiKey, org: str) -> bool:
    """Whether ``key``'s row (of organization ``org``) is exactly what its signed certificate states."""
    body = statement(public, key)
    return body is not None and body == fields(key, org)


def agreed_before_revocation(stated: dict[str, Any] | None, key: db.ApiKey, org: str) -> bool:
    """Whether ``key``'s row, but for the revocation just recorded on it, is what its certificate ``stated`` (its
    :func:`statement`) — so that a revocation certifies only a row the service issued (re-certifying an edited row
    would bless the edit)."""
    if stated is None or stated["revoked_at"] is not None:
        return False
    unrevoked = {"revoked_at": None, "revoked_by": None}
    return {**stated, **unrevoked} == {**fields(key, org), **unrevoked}
