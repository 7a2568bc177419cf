"""Organizations and their API keys, the same on both services: 256-bit random secrets shown once and stored as
SHA-256 hashes (a fast hash is right for high-entropy secrets), read from ``Authorization: Bearer <key>``.

A key is in force until it expires (``expires_at``, set when it is created) or its revocation takes effect
(``revoked_at``: the moment of ``revoke-key``, or the end of a rotation's grace period). Every request reads its
key's row (no process keeps a copy of a key's validity), so a revocation made by any process — the CLI, another
replica — refuses the very next request everywhere. A key that is unknown, revoked or expired gets the same 401 and
the same message: a caller learns nothing about which; the operator's commands (:class:`KeyRing`) say which.

Each service declares its own ``organizations`` and ``api_keys`` tables from the column mixins below (its own
database, its own roles) and one :class:`KeyRing` over them."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import ForeignKey, Integer, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from shared.errors import ErrorCode, LabelDPError
from shared.service.database import UtcDateTime, utcnow

_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")
_PREFIX = re.compile(r"^(?:[a-z]+_)?([0-9a-f]{8})$")  # a key's public middle part, with or without its kind
# unknown, revoked and expired keys alike; the hint says where keys come from (issue 42: a service started in another
# directory opened another SQLite file, and its bare "invalid API key" did not say why)
UNAUTHORIZED_MESSAGE = ("invalid API key (keys are made by `labeldp labels create-key` or `labeldp features "
                        "create-key` on the database the service opened; its log names it at start)")


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
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)  # None: never
    # When the revocation takes effect (None: not revoked); later than its recording only in a rotation's grace
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(200), nullable=True)  # who revoked it, as the CLI named

    def in_force(self, now: datetime) -> bool:
        """The one validity rule of a key, for the API, the console and the charge alike."""
        return self.status(now) in ("active", "rotating")

    def status(self, now: datetime) -> str:
        if self.revoked_at is not None and now >= self.revoked_at:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active" if self.revoked_at is None else "rotating"  # rotating: in force until its revoked_at


@dataclass(frozen=True)
class Principal:
    """Who a request is: the key's organization and role, and the key itself (its row's id and public prefix —
    never its secret), so that what the request does later can check the key again and name it."""

    org_id: int
    org_name: str
    role: str
    key_id: int
    key_prefix: str


@dataclass(frozen=True)
class KeyInfo:
    """What an operator may see of a key: never its secret or its hash."""

    id: int
    prefix: str
    organization: str
    role: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    status: str

    def to_dict(self) -> dict[str, Any]:
        times = {name: None if value is None else value.isoformat()
                 for name, value in (("created_at", self.created_at), ("expires_at", self.expires_at),
                                     ("revoked_at", self.revoked_at))}
        return {"id": self.id, "prefix": self.prefix, "organization": self.organization, "role": self.role, **times,
                "revoked_by": self.revoked_by, "status": self.status}


@dataclass(frozen=True)
class IssuedKey:
    """A new key: its secret (to show once, never to log) and what the operator may see of it."""

    secret: str
    info: KeyInfo


@dataclass(frozen=True)
class KeyRef:
    """How an operator names a key: by its id or by its public prefix (``1a2b3c4d`` or ``ldp_1a2b3c4d``)."""

    id: int | None = None
    prefix: str | None = None

    def __post_init__(self) -> None:
        if (self.id is None) == (self.prefix is None):
            raise LabelDPError("name a key by its id or by its prefix (one of the two)", code=ErrorCode.USAGE)
        if self.prefix is not None and not _PREFIX.match(self.prefix):
            raise LabelDPError(f"a key prefix is 8 hexadecimal digits (as list-keys shows it), got {self.prefix!r}",
                               code=ErrorCode.USAGE)

    def __str__(self) -> str:
        return f"id {self.id}" if self.id is not None else f"prefix {self.prefix}"


def new_key(kind: str) -> tuple[str, str]:
    """(key, its stored hash); ``kind`` ('ldp', 'trn') tells which service a leaked key belongs to."""
    key = f"{kind}_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
    return key, hash_key(key)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str:
    """The key of a bearer header; anything else (missing, another scheme, non-ASCII) is a 401."""
    if not authorization or not authorization.startswith("Bearer "):
        raise LabelDPError("missing bearer API key", code=ErrorCode.UNAUTHORIZED)
    key = authorization[len("Bearer "):].strip()
    if not _KEY.match(key):
        raise LabelDPError(UNAUTHORIZED_MESSAGE, code=ErrorCode.UNAUTHORIZED)
    return key


def expiry(*, days: float | None = None, at: str | None = None, now: datetime | None = None) -> datetime | None:
    """A key's expiry from ``--expires-in DAYS`` or ``--expires-at`` (an ISO 8601 date or date-time; UTC unless it
    names a zone); None for neither. It must lie in the future."""
    now = now or utcnow()
    if days is not None and at is not None:
        raise LabelDPError("give --expires-in or --expires-at, not both", code=ErrorCode.USAGE)
    if days is not None:
        if not 0 < days <= 36_500:  # also refuses NaN
            raise LabelDPError(f"--expires-in takes a number of days in (0, 36500], got {days}", code=ErrorCode.USAGE)
        return now + timedelta(days=days)
    if at is None:
        return None
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        raise LabelDPError(f"--expires-at takes an ISO 8601 date or date-time, got {at!r}",
                           code=ErrorCode.USAGE) from None
    when = when.replace(tzinfo=now.tzinfo) if when.tzinfo is None else when.astimezone(now.tzinfo)
    if when <= now:
        raise LabelDPError(f"--expires-at {at} is not in the future", code=ErrorCode.USAGE)
    return when


KeyAudit = Callable[[Session, "ApiKeyColumns", Literal["created", "revoked"]], object]


@dataclass(frozen=True)
class KeyRing:
    """One service's keys: its organization and key tables, the roles a key may have and the key prefix."""

    organization: type[OrganizationColumns]  # the service's table classes built from the mixins
    api_key: type[ApiKeyColumns]
    roles: tuple[str, ...]
    kind: str
    # Called in the same transaction whenever a key is made or revoked: a party whose audit covers its keys binds
    # it (the labels party's key commands: its ledger chains the fact); None records nothing beyond the key's row.
    audit: KeyAudit | None = None
    # Called before a key is rotated (its successor takes its organization, role and lifetime from the row): a party
    # whose keys carry certificates refuses a row that is not as it issued it. None: the row is taken as it stands.
    vouch: Callable[[Session, ApiKeyColumns], None] | None = None
    # Whether a row that says "revoked" really was revoked by the service: a party whose keys carry certificates
    # checks them, so that a database writer who marks a leaked key revoked just before the operator revokes it
    # does not turn the operator's revocation into "already revoked" (and then clears the row). None: the row.
    revocation_confirmed: Callable[[Session, ApiKeyColumns], bool] | None = None

    def create(self, session: Session, org_name: str, role: str, *, expires_at: datetime | None = None) -> str:
        """Create the organization if needed and return a new key (shown once, stored hashed)."""
        return self.issue(session, org_name, role, expires_at=expires_at).secret

    def issue(self, session: Session, org_name: str, role: str, *,
              expires_at: datetime | None = None) -> IssuedKey:
        """:meth:`create`, with what the operator may see of the new key."""
        if role not in self.roles:
            raise LabelDPError(f"role must be one of {', '.join(self.roles)}", code=ErrorCode.INVALID_ROLE)
        if not org_name or len(org_name) > 200:
            raise LabelDPError("organization name must be 1-200 characters", code=ErrorCode.INVALID_ORG)
        org = session.scalar(select(self.organization).where(self.organization.name == org_name))
        if org is None:
            org = self.organization(name=org_name)
            session.add(org)
            session.flush()
        while True:  # a prefix names one key (32 bits: a clash is rare, and then the key is drawn again)
            key, digest = new_key(self.kind)
            prefix = key.split("_")[1]
            if session.scalar(select(self.api_key.id).where(self.api_key.prefix == prefix)) is None:
                break
        row = self.api_key(org_id=org.id, role=role, key_hash=digest, prefix=prefix, created_at=utcnow(),
                           expires_at=expires_at)
        session.add(row)
        session.flush()
        if self.audit is not None:
            self.audit(session, row, "created")
        return IssuedKey(key, self._info(row, org.name, utcnow()))

    def authenticate(self, session: Session, authorization: str | None) -> Principal:
        """The principal of an in-force key; any other is the same 401 (read from the database every time)."""
        organization, api_key = self.organization, self.api_key
        row = session.execute(select(api_key, organization).join(organization, organization.id == api_key.org_id)
                              .where(api_key.key_hash == hash_key(bearer_key(authorization)))).first()
        if row is None or not row[0].in_force(utcnow()):
            raise LabelDPError(UNAUTHORIZED_MESSAGE, code=ErrorCode.UNAUTHORIZED)
        return Principal(row[1].id, row[1].name, row[0].role, row[0].id, row[0].prefix)

    def list_keys(self, session: Session, org_name: str | None = None) -> list[KeyInfo]:
        """Every key (or one organization's), oldest first."""
        query = (select(self.api_key, self.organization.name)
                 .join(self.organization, self.organization.id == self.api_key.org_id).order_by(self.api_key.id))
        if org_name is not None:
            if session.scalar(select(self.organization.id).where(self.organization.name == org_name)) is None:
                raise LabelDPError(f"no organization named {org_name!r}", code=ErrorCode.NOT_FOUND)
            query = query.where(self.organization.name == org_name)
        now = utcnow()
        return [self._info(key, name, now) for key, name in session.execute(query).all()]

    def revoke(self, session: Session, ref: KeyRef, *, by: str) -> KeyInfo:
        """Revoke a key now (one whose rotation's grace is running: now, no longer at its end)."""
        key = self._find(session, ref)
        now = utcnow()
        if key.status(now) == "revoked" and (self.revocation_confirmed is None
                                             or self.revocation_confirmed(session, key)):
            raise LabelDPError(f"key {ref} was already revoked at {key.revoked_at:%Y-%m-%d %H:%M:%S} UTC by "
                               f"{key.revoked_by}", code=ErrorCode.INVALID_INPUT)
        self.record_revocation(session, key, by=by, effective_at=now)
        return self._info(key, self._org_name(session, key), now)

    def rotate(self, session: Session, ref: KeyRef, *, by: str, grace: timedelta = timedelta(0),
               expires_at: datetime | None = None) -> tuple[IssuedKey, KeyInfo]:
        """A new key of the same organization and role, and the old one revoked — now, or at the end of ``grace``
        (both work meanwhile, so that clients can switch). The new key expires at ``expires_at``, else after the
        old key's lifetime (if it had one). Returns (the new key, the old key after revocation)."""
        if not timedelta(0) <= grace <= timedelta(days=30):
            raise LabelDPError("a rotation's grace period lies between 0 and 30 days", code=ErrorCode.USAGE)
        key = self._find(session, ref)
        if self.vouch is not None:
            self.vouch(session, key)
        now = utcnow()
        status = key.status(now)
        if status in ("revoked", "rotating"):
            raise LabelDPError(f"key {ref} was already {'revoked' if status == 'revoked' else 'rotated'} by "
                               f"{key.revoked_by}: it is refused from {key.revoked_at:%Y-%m-%d %H:%M:%S} UTC",
                               code=ErrorCode.INVALID_INPUT)
        if expires_at is None and key.expires_at is not None:
            expires_at = now + (key.expires_at - key.created_at)
        org_name = self._org_name(session, key)
        issued = self.issue(session, org_name, key.role, expires_at=expires_at)
        self.record_revocation(session, key, by=by, effective_at=now + grace)
        return issued, self._info(key, org_name, now)

    def record_revocation(self, session: Session, key: ApiKeyColumns, *, by: str, effective_at: datetime) -> None:
        """THE place a key is revoked, inside the caller's transaction (``revoke-key`` and ``rotate-key`` both come
        here): who revoked it and from when it is refused. A party's audit records the revocation here."""
        if not by or len(by) > 200:
            raise LabelDPError("who revokes a key is named in 1-200 characters", code=ErrorCode.USAGE)
        key.revoked_at, key.revoked_by = effective_at, by
        session.flush()
        if self.audit is not None:
            self.audit(session, key, "revoked")

    def _find(self, session: Session, ref: KeyRef) -> ApiKeyColumns:
        """The key ``ref`` names, locked for this transaction (two revocations of one key serialize)."""
        if ref.id is not None:
            query = select(self.api_key).where(self.api_key.id == ref.id)
        else:
            assert ref.prefix is not None
            match = _PREFIX.match(ref.prefix)
            assert match is not None  # KeyRef checked it
            query = select(self.api_key).where(self.api_key.prefix == match.group(1))
        keys = list(session.scalars(query.with_for_update()))
        if not keys:
            raise LabelDPError(f"no key with {ref} in this database (list-keys shows them)", code=ErrorCode.NOT_FOUND)
        if len(keys) > 1:  # keys made before prefixes were kept unique may share one
            raise LabelDPError(f"{len(keys)} keys share {ref}: name it by its id", code=ErrorCode.USAGE)
        return keys[0]

    def _org_name(self, session: Session, key: ApiKeyColumns) -> str:
        return session.scalars(select(self.organization.name).where(self.organization.id == key.org_id)).one()

    @staticmethod
    def _info(key: ApiKeyColumns, org_name: str, now: datetime) -> KeyInfo:
        return KeyInfo(key.id, key.prefix, org_name, key.role, key.created_at, key.expires_at, key.revoked_at,
                       key.revoked_by, key.status(now))
