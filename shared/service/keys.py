"""Organizations and their API keys, the same on both services: 256-bit random secrets shown once and stored as
SHA-256 hashes (a fast hash is right for high-entropy secrets), read from ``Authorization: Bearer <key>``.

Each service declares its own ``organizations`` and ``api_keys`` tables from the column mixins below (its own
database, its own roles) and one :class:`KeyRing` over them."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Boolean, ForeignKey, Integer, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from shared.errors import LabelDPError
from shared.service.database import UtcDateTime, utcnow

_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")


class OrganizationColumns:
    __tablename__ = "organizations"
    if TYPE_CHECKING:  # the service's declarative base, which the table class also derives from, supplies it
        def __init__(self, **kw: Any) -> None: ...

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class ApiKeyColumns:
    __tablename__ = "api_keys"
    if TYPE_CHECKING:  # as for OrganizationColumns
        def __init__(self, **kw: Any) -> None: ...

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    role: Mapped[str] = mapped_column(String(20))  # one of the service's KeyRing.roles
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the 256-bit secret
    prefix: Mapped[str] = mapped_column(String(16))  # the key's public middle part, to tell keys apart
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


@dataclass(frozen=True)
class Principal:
    """Who a request is: the key's organization and role."""

    org_id: int
    org_name: str
    role: str


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


@dataclass(frozen=True)
class KeyRing:
    """One service's keys: its organization and key tables, the roles a key may have and the key prefix."""

    organization: type[OrganizationColumns]  # the service's table classes built from the mixins
    api_key: type[ApiKeyColumns]
    roles: tuple[str, ...]
    kind: str

    def create(self, session: Session, org_name: str, role: str) -> str:
        """Create the organization if needed and return a new key (shown once, stored hashed)."""
        if role not in self.roles:
            raise LabelDPError(f"role must be one of {', '.join(self.roles)}", code="invalid_role")
        if not org_name or len(org_name) > 200:
            raise LabelDPError("organization name must be 1-200 characters", code="invalid_org")
        org = session.scalar(select(self.organization).where(self.organization.name == org_name))
        if org is None:
            org = self.organization(name=org_name)
            session.add(org)
            session.flush()
        key, digest = new_key(self.kind)
        session.add(self.api_key(org_id=org.id, role=role, key_hash=digest, prefix=key.split("_")[1]))
        return key

    def authenticate(self, session: Session, authorization: str | None) -> Principal:
        organization, api_key = self.organization, self.api_key
        row = session.execute(select(api_key, organization).join(organization, organization.id == api_key.org_id)
                              .where(api_key.key_hash == hash_key(bearer_key(authorization)))).first()
        if row is None or row[0].revoked:
            raise LabelDPError("invalid API key", code="unauthorized")
        return Principal(row[1].id, row[1].name, row[0].role)
