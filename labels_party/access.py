"""Who may do what on which object: the one module that decides access.

Datasets belong to their owner organization: its admin keys see and administer them; a granted organization's
consumer keys see them (and release within their allocation). Everyone else gets the 404 of a dataset that does not
exist, so a key never learns of other organizations' datasets. Releases are seen by the organization they went to
and by the dataset owner's admins.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party import db
from labels_party.auth import Principal
from shared.errors import LabelDPError


def not_found() -> LabelDPError:
    # Same answer whether or not the dataset exists: a key must not reveal other organizations' datasets.
    return LabelDPError("no such dataset for this key", code="not_found")


def visible_dataset(session: Session, principal: Principal, dataset_id: str, *, lock: bool = False) -> db.Dataset:
    """The dataset if this key may see it (its owner's admins, granted consumers), else the 404 of a missing one."""
    dataset = session.get(db.Dataset, dataset_id, with_for_update=lock)
    if dataset is None:
        raise not_found()
    if principal.role == "admin" and dataset.owner_org_id == principal.org_id:
        return dataset
    if principal.role == "consumer" and session.scalar(
            select(db.Grant).where(db.Grant.dataset_id == dataset_id, db.Grant.org_id == principal.org_id)):
        return dataset
    raise not_found()


def accessible_dataset(session: Session, principal: Principal, dataset_id: str, *, admin: bool = False,
                       lock: bool = False) -> db.Dataset:
    """A visible dataset; with ``admin``, one this key may also administer (a granted consumer gets 403)."""
    dataset = visible_dataset(session, principal, dataset_id, lock=lock)
    if admin and principal.role != "admin":
        raise LabelDPError("this operation needs an admin key of the dataset's owner", code="forbidden")
    return dataset


def require_admin(principal: Principal) -> None:
    if principal.role != "admin":
        raise LabelDPError("this operation needs an admin key", code="forbidden")
