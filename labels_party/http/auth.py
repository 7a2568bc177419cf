"""Labels-party API keys (the skeleton's :mod:`shared.service.keys`), one role per key: admin (the dataset
owner's) or consumer (a granted organization's). Every key is issued with the audit key's certificate and honoured
only as it states (:mod:`labels_party.ledger.key_certificates`)."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from sqlalchemy.orm import Session

from labels_party.ledger import Ledger, key_certificates
from labels_party.ledger.signing import key_id
from labels_party.store.db import ApiKey, Organization
from shared.errors import ErrorCode, LabelDPError
from shared.service.keys import UNAUTHORIZED_MESSAGE, KeyRing, Principal

__all__ = ["KEYS", "Principal", "authenticate", "create_key", "key_ring"]

KEYS = KeyRing(Organization, ApiKey, roles=("admin", "consumer"), kind="ldp")
log = logging.getLogger("labeldp.labels")


def key_ring(ledger: Ledger) -> KeyRing:
    """The key ring whose every key made or revoked is certified and chained by ``ledger``."""
    return dataclasses.replace(KEYS, audit=ledger.key_changed, vouch=ledger.check_key_row,
                               revocation_confirmed=ledger.revocation_confirmed)


def create_key(ledger: Ledger, session: Session, org_name: str, role: str, *,
               expires_at: datetime | None = None) -> str:
    """A new key of ``org_name`` (made if new) as ``role``, certified; its secret (shown once, stored hashed)."""
    return key_ring(ledger).create(session, org_name, role, expires_at=expires_at)


def authenticate(session: Session, authorization: str | None, ledger: Ledger) -> Principal:
    """The principal of an in-force key the service issued as its row now stands; any other key is the same 401
    (a row inserted or edited in the database is logged, not told apart)."""
    principal = KEYS.authenticate(session, authorization)
    key = session.get(ApiKey, principal.key_id)
    if key is None or not ledger.key_honoured(key, principal.org_name):
        ours = key_id(ledger.signer.public) if ledger.signer is not None else None
        theirs = key_certificates.signer(key.certificate if key is not None else None)
        if key is not None and ledger.key_revoked(key):
            log.warning("key %s of %s was revoked (the data directory's revocations name it) but its row says it is "
                        "in force — the database was changed outside the service: refused", principal.key_prefix,
                        principal.org_name)
        elif theirs is not None and theirs != ours:  # an operator's mix-up, not a forgery: say which keys
            log.warning("key %s of %s was certified with audit key %s, not this service's %s: run create-key with "
                        "the service's LABELDP_AUDIT_KEY_FILE (and data directory)", principal.key_prefix,
                        principal.org_name, theirs, ours)
        else:
            log.warning("key %s of %s is not as the service issued it (no valid certificate): refused",
                        principal.key_prefix, principal.org_name)
        raise LabelDPError(UNAUTHORIZED_MESSAGE, code=ErrorCode.UNAUTHORIZED)
    return principal
