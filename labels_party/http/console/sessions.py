"""Console sessions: an admin signs in with an API key once; the console then carries a random session token in
a cookie instead of the key.

* The token is the id of the key the session acts as and 256 random bits (``<key id>.<random>``); the database
  keeps only its digest keyed by the audit key (``console_sessions``;
  :meth:`~labels_party.ledger.signing.HeadSigner.digest`), so a copy of the database opens no session and a database
  writer cannot insert one of their own. A session row acts only as the key its token names: a writer who points
  their own session's row at another owner's key gets no session (issue 40's sixth review; the key's id is on its
  signed certificate, so renumbering keys does not help either). The raw API key is checked against the key table
  and then forgotten: it is never stored, put in a cookie, logged or rendered.
* A session acts as the admin key it was opened with: a key revoked or expired (or no longer an admin's) ends
  every session opened with it at its next request (the key's row is read on every request). Sessions expire
  (``lifetime``); signing out deletes the row.
* The CSRF token of a session is derived from its token (SHA-256 with a label), so it needs no storage and
  reveals nothing about the cookie; forms carry it and state-changing requests must echo it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import sessionmaker

from labels_party.http.auth import Principal, authenticate
from labels_party.ledger import Ledger
from labels_party.store import db
from shared.errors import ErrorCode, LabelDPError
from shared.service.keys import hash_key

COOKIE = "labeldp_console"
PATH = "/console"
LIFETIME = timedelta(hours=8)


def csrf_token(token: str) -> str:
    """The CSRF token of the session whose cookie holds ``token``."""
    return hashlib.sha256(b"labeldp-console-csrf\0" + token.encode()).hexdigest()


def csrf_matches(token: str, submitted: str | None) -> bool:
    return submitted is not None and bool(submitted) and hmac.compare_digest(csrf_token(token), submitted)


def cookie_header(token: str, *, secure: bool, max_age: int) -> str:
    """``Set-Cookie``: HttpOnly (no script reads it), SameSite=Strict (no other site sends it), only for the
    console's paths, Secure on HTTPS. ``max_age=0`` clears it."""
    return (f"{COOKIE}={token}; Path={PATH}; Max-Age={max_age}; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


@dataclass(frozen=True)
class Sessions:
    """Console sessions over the service's database sessions."""

    sessions: sessionmaker
    ledger: Ledger  # whose audit key certified the keys it honours
    lifetime: timedelta = LIFETIME

    def token_hash(self, token: str) -> str:
        """What the database stores of a session's token (a ledger without an audit key — the ledger's own tests —
        keeps its SHA-256)."""
        signer = self.ledger.signer
        return signer.digest("console session", token) if signer is not None else \
            hashlib.sha256(token.encode()).hexdigest()

    def sign_in(self, api_key: str) -> tuple[str, Principal]:
        """A new session for an admin key: (token for the cookie, principal). A key that is not valid is a 401
        ``unauthorized``, a consumer key a 403 ``forbidden``. Expired sessions are swept on the way."""
        api_key = api_key.strip()
        with self.sessions() as session, session.begin():
            principal = authenticate(session, f"Bearer {api_key}", self.ledger)
            if principal.role != "admin":
                raise LabelDPError("the console is for admin keys of a dataset owner", code=ErrorCode.FORBIDDEN)
            key_id = session.scalar(select(db.ApiKey.id).where(db.ApiKey.key_hash == hash_key(api_key)))
            now = db.utcnow()
            session.execute(delete(db.ConsoleSession).where(db.ConsoleSession.expires_at <= now))
            token = f"{key_id}.{secrets.token_urlsafe(32)}"
            session.add(db.ConsoleSession(token_hash=self.token_hash(token), api_key_id=key_id, created_at=now,
                                          expires_at=now + self.lifetime))
            return token, principal

    def principal(self, token: str | None) -> Principal | None:
        """Who the session is, or None (no such session, expired, key revoked or expired or no longer an admin's)."""
        if not token or len(token) > 100:
            return None
        named, _, random_part = token.partition(".")
        if not named.isdecimal() or not random_part:
            return None
        with self.sessions() as session, session.begin():
            row = session.execute(
                select(db.ConsoleSession, db.ApiKey, db.Organization)
                .join(db.ApiKey, db.ApiKey.id == db.ConsoleSession.api_key_id)
                .join(db.Organization, db.Organization.id == db.ApiKey.org_id)
                .where(db.ConsoleSession.token_hash == self.token_hash(token))).first()
            if row is None:
                return None
            console_session, key, org = row
            now = db.utcnow()
            if key.id != int(named) or console_session.expires_at <= now or not key.in_force(now) or \
                    key.role != "admin" or not self.ledger.key_honoured(key, org.name):
                return None
            return Principal(org.id, org.name, key.role, key.id, key.prefix)

    def sign_out(self, token: str) -> None:
        with self.sessions() as session, session.begin():
            session.execute(delete(db.ConsoleSession).where(db.ConsoleSession.token_hash == self.token_hash(token)))
