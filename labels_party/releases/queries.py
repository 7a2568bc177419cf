"""Reading releases back: a release, a dataset's releases and mechanism documents, each only for whoever may see
it (others get the answer of a release that does not exist)."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party import db
from labels_party.access import accessible_dataset
from labels_party.auth import Principal
from labels_party.context import ServiceContext
from labels_party.releases.transaction import release_view
from shared import schemas
from shared.errors import LabelDPError


def _visible(session: Session, principal: Principal, release: db.Release | None) -> bool:
    """A consumer sees its own organization's releases of datasets it is still granted; the owner's admins see
    every release of their datasets."""
    if release is None:
        return False
    try:
        accessible_dataset(session, principal, release.dataset_id)
    except LabelDPError:
        return False
    return principal.role == "admin" or release.requester_org_id == principal.org_id


def get_release(ctx: ServiceContext, principal: Principal, release_id: str) -> tuple[schemas.Release, str]:
    """The release and its file."""
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id)
        if not _visible(session, principal, release):
            raise LabelDPError("no such release for this key", code="not_found")
        return release_view(release), release.file


def list_releases(ctx: ServiceContext, principal: Principal, dataset_id: str) -> list[schemas.Release]:
    with ctx.sessions() as session, session.begin():
        accessible_dataset(session, principal, dataset_id)
        query = select(db.Release).where(db.Release.dataset_id == dataset_id).order_by(db.Release.created_at)
        if principal.role != "admin":
            query = query.where(db.Release.requester_org_id == principal.org_id)
        return [release_view(r) for r in session.scalars(query)]


def get_mechanism_document(ctx: ServiceContext, principal: Principal, mechanism_hash: str) -> dict:
    """A mechanism document, to anyone who can see a release that references it (404 otherwise)."""
    with ctx.sessions() as session, session.begin():
        query = select(db.Release).where(db.Release.mechanism_hash == mechanism_hash)
        if principal.role != "admin":
            query = query.where(db.Release.requester_org_id == principal.org_id)
        if not any(_visible(session, principal, release) for release in session.scalars(query)):
            raise LabelDPError("no such mechanism document for this key", code="not_found")
        return json.loads(session.get(db.MechanismDocument, mechanism_hash).document)
