"""Trainer API keys (the skeleton's :mod:`shared.service.keys`), one organization and role per key: ``admin``
(may also create and replace features tables) or ``member`` (runs jobs, reads results)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from features_party.db import ApiKey, Organization
from shared.errors import LabelDPError
from shared.service.keys import bearer_key, hash_key, new_key

ROLES = ("admin", "member")


@dataclass(frozen=True)
class Principal:
    org_id: int
    org_name: str
    role: str


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
    key, digest = new_key("trn")
    session.add(ApiKey(org_id=org.id, role=role, key_hash=digest, prefix=key.split("_")[1]))
    return key


def authenticate(session: Session, authorization: str | None) -> Principal:
    row = session.execute(select(ApiKey, Organization).join(Organization, Organization.id == ApiKey.org_id)
                          .where(ApiKey.key_hash == hash_key(bearer_key(authorization)))).first()
    if row is None or row.ApiKey.revoked:
        raise LabelDPError("invalid API key", code="unauthorized")
    return Principal(row.Organization.id, row.Organization.name, row.ApiKey.role)
