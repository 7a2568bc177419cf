"""The audit: ledger events and budgets."""

from __future__ import annotations

from fastapi import APIRouter

from labels_party import audit as audit_log
from labels_party.routers.deps import Auth, Context
from shared import schemas

router = APIRouter(tags=["audit"])


@router.get("/v1/audit", response_model=schemas.Audit)
def audit(who: Auth, ctx: Context, dataset: str | None = None):
    """The hash-chained ledger events and budgets of the datasets this key administers (one, with ``dataset``)."""
    return audit_log.audit(ctx, who, dataset)
