"""API keys: 256-bit random secrets, stored as SHA-256 hashes (a fast hash is right for high-entropy secrets)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party.db import ApiKey, Organization
from shared.errors import LabelDPError

ROLES = ("admin", "consumer")


@dataclass(frozen=True)
class Principal:
    org_id: int
    org_name: str
    role: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, org_name: str, role: str) -> str:
    """Create the organization if needed and return a new key (shown once, stored hashed)."""
    if role not in ROLES:
        raise LabelDPError(f"role must be one of {', '.join(ROLES)}", code="invalid_role")
    if not org_name or len(org_name) > 200:
        raise LabelDPError("organization name must be 1-200 characters", code="invalid_org")
    org = session.scalar(select(Organization).where(Organization.name == org_name))
    if org is None:
        org = Organization(name=org_name)
        session.add(org)
        session.flush()
    prefix = secrets.token_hex(4)
    key = f"ldp_{prefix}_{secrets.token_urlsafe(32)}"
    session.add(ApiKey(org_id=org.id, role=role, key_hash=hash_key(key), prefix=prefix))
    return key


def authenticate(session: Session, authorization: str | None) -> Principal:
    if not authorization or not authorization.startswith("Bearer "):
        raise LabelDPError("missing bearer API key", code="unauthorized")
    row = session.execute(
        select(ApiKey, Organization).join(Organization, Organization.id == ApiKey.org_id)
        .where(ApiKey.key_hash == hash_key(authorization[len("Bearer "):].strip()))
    ).first()
    if row is None or row.ApiKey.revoked:
        raise LabelDPError("invalid API key", code="unauthorized")
    return Principal(row.Organization.id, row.Organization.name, row.ApiKey.role)
