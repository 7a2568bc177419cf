"""The audit: ledger events and budgets."""

from __future__ import annotations

from fastapi import APIRouter

from labels_party.http import audit as audit_log
from labels_party.http.routers.deps import AdminKey, Context
from shared import schemas
from shared.service.gate import GuardedRoute

router = APIRouter(tags=["audit"], route_class=GuardedRoute)


@router.get("/v1/audit", response_model=schemas.Audit)
def audit(who: AdminKey, ctx: Context, dataset: str | None = None):
    """The hash-chained ledger events and budgets of the datasets this key administers (one, with ``dataset``)."""
    return audit_log.audit(ctx, who.principal, dataset)


@router.get("/v1/audit/heads", response_model=list[schemas.SignedHead])
def heads(who: AdminKey, ctx: Context, dataset: str | None = None):
    """The chain head of each dataset this key administers (one, with ``dataset``), signed with the service's audit
    key: pin one and later check it with ``labeldp labels verify-audit --pinned FILE --public-key HEX``."""
    return audit_log.heads(ctx, who.principal, dataset)
