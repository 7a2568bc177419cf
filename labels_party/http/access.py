"""Who may do what on which object: the one module that decides access.

Datasets belong to their owner organization: its admin keys see and administer them; a granted organization's
consumer keys see them (and release within their allocation). Everyone else gets the 404 of a dataset that does not
exist, so a key never learns of other organizations' datasets. Releases (and the mechanism documents they reference)
are seen by the organization they went to and by the dataset owner's admins; where a source release's Spark job
ran, by the owner's admins only.

A route declares what it needs with one of the guards below; the gatekeeper (:mod:`shared.service.gate`) calls
:func:`admitter`'s function with it before the body is read, and the route and the services below it work with the
resulting :class:`Admission` — nothing re-decides access later in the request. The console, which has its own
sessions, decides with :func:`decide`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Select, false, select
from sqlalchemy.orm import Session, sessionmaker

from labels_party.http.auth import Principal, authenticate
from labels_party.ledger import Ledger
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.errors import ErrorCode, LabelDPError
from shared.service.gate import Guard

Body = Literal["json", "columnar", "labels"]


@dataclass(frozen=True)
class Access(Guard):
    """A route's requirement: an admin key, the dataset its path names (seen, or administered), and which body limit
    applies (``labels``: label uploads; ``columnar``: per-example prior and group bodies; ``json``: the rest)."""

    admin_key: bool = False
    dataset: Literal["none", "see", "administer"] = "none"
    body: Body = "json"

    def check_route(self, path: str) -> None:
        if self.dataset != "none" and "{dataset_id}" not in path:
            raise TypeError(f"route {path} guards a dataset but names none ({{dataset_id}})")


ANY_KEY = Access()
ADMIN_KEY = Access(admin_key=True)
SEE_DATASET = Access(dataset="see")
SEE_DATASET_COLUMNAR = Access(dataset="see", body="columnar")
ADMINISTER_DATASET = Access(dataset="administer")
UPLOAD_LABELS = Access(dataset="administer", body="labels")


@dataclass(frozen=True)
class Admission:
    """A request as admitted: who sends it, the dataset its path names (checked against the guard), whether the key
    administers that dataset (its owner's admin key), and the body limit."""

    principal: Principal
    dataset_id: str | None
    owner: bool
    body_limit: int


def not_found() -> LabelDPError:
    # Same answer whether or not the dataset exists: a key must not reveal other organizations' datasets.
    return LabelDPError("no such dataset for this key", code=ErrorCode.NOT_FOUND)


def _forbidden(message: str) -> LabelDPError:
    return LabelDPError(message, code=ErrorCode.FORBIDDEN)


def decide(session: Session, principal: Principal, access: Access, dataset_id: str | None,
           settings: LabelsSettings) -> Admission:
    """The decision: the admission, or the 403 (an admin key needed) / 404 (a dataset this key may not see)."""
    if access.admin_key and principal.role != "admin":
        raise _forbidden("this operation needs an admin key")
    owner = False
    if access.dataset != "none":
        if dataset_id is None:
            raise TypeError("a guard on a dataset needs a route with {dataset_id}")
        owner = _sees(session, principal, dataset_id)
        if access.dataset == "administer" and not owner:
            raise _forbidden("this operation needs an admin key of the dataset's owner")
    else:
        dataset_id = None
    limits = {"json": settings.max_json_bytes, "columnar": settings.max_columnar_bytes,
              "labels": settings.max_upload_bytes}
    return Admission(principal, dataset_id, owner, limits[access.body])


def _sees(session: Session, principal: Principal, dataset_id: str) -> bool:
    """Whether this key owns (administers) the dataset; the 404 of a missing dataset if it may not see it."""
    dataset = session.get(db.Dataset, dataset_id)
    if dataset is None:
        raise not_found()
    if principal.role == "admin" and dataset.owner_org_id == principal.org_id:
        return True
    if principal.role == "consumer" and session.scalar(
            select(db.Grant.id).where(db.Grant.dataset_id == dataset_id, db.Grant.org_id == principal.org_id)):
        return False
    raise not_found()


def admitter(sessions: sessionmaker, settings: LabelsSettings, ledger: Ledger
             ) -> Callable[[Guard, dict[str, str], str], Admission]:
    """The gate's function (:class:`shared.service.gate.GuardedRoute`): the key (401), then the route's guard
    (403, 404) — before any body is read."""

    def admit(guard: Guard, params: dict[str, str], authorization: str) -> Admission:
        with sessions() as session, session.begin():
            principal = authenticate(session, authorization or None, ledger)
            assert isinstance(guard, Access)  # service_app refused routes guarded by anything else
            return decide(session, principal, guard, params.get("dataset_id"), settings)

    return admit


def admitted_dataset(session: Session, admission: Admission, *, lock: bool = False) -> db.Dataset:
    """The dataset the admission was decided on (locked for update with ``lock``)."""
    if admission.dataset_id is None:
        raise TypeError("this admission names no dataset")
    dataset = session.get(db.Dataset, admission.dataset_id, with_for_update=lock)
    if dataset is None:  # datasets are never deleted; kept as the 404 it would be
        raise not_found()
    return dataset


def owned_datasets(principal: Principal) -> Select:
    """The datasets a key sees: its organization's own (admin keys), or those granted to it (consumer keys)."""
    if principal.role == "admin":
        return select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id)
    return (select(db.Dataset).join(db.Grant, db.Grant.dataset_id == db.Dataset.id)
            .where(db.Grant.org_id == principal.org_id))


def administered_datasets(principal: Principal) -> Select:
    """The datasets a key administers: its organization's own for an admin key, none for a consumer key."""
    query = select(db.Dataset).where(db.Dataset.owner_org_id == principal.org_id)
    return query if principal.role == "admin" else query.where(false())


def sees_release(session: Session, principal: Principal, release: db.Release | None) -> bool:
    """A consumer sees its own organization's releases of datasets it is granted; the owner's admins see every
    release of their datasets."""
    if release is None:
        return False
    try:
        owner = _sees(session, principal, release.dataset_id)
    except LabelDPError:
        return False
    return owner or release.requester_org_id == principal.org_id


def sees_execution(session: Session, principal: Principal, release: db.Release) -> bool:
    """Where a release's Spark job ran (master URL, application id, executors) is seen by the dataset owner's admins
    only: not even by the consumer that requested it, whom an application id's start time and sequence number would
    tell how many Spark applications ran for others, and when."""
    dataset = session.get(db.Dataset, release.dataset_id)
    return dataset is not None and is_owner(principal, dataset)


def releases_possibly_seen(principal: Principal, query: Select) -> Select:
    """``query`` over releases narrowed, in SQL, to those this key could see (then check each with
    :func:`sees_release`)."""
    if principal.role == "admin":
        return query.join(db.Dataset, db.Dataset.id == db.Release.dataset_id).where(
            db.Dataset.owner_org_id == principal.org_id)
    return query.where(db.Release.requester_org_id == principal.org_id)


def releases_seen(admission: Admission, query: Select) -> Select:
    """``query`` over a dataset's releases, restricted to those this admission sees."""
    if admission.owner:
        return query
    return query.where(db.Release.requester_org_id == admission.principal.org_id)


def is_owner(principal: Principal, dataset: db.Dataset) -> bool:
    """Whether the key administers the dataset (its owner's admin key): it sees every account's figures."""
    return principal.role == "admin" and dataset.owner_org_id == principal.org_id


def grantees(session: Session, dataset_ids: Sequence[str]) -> dict[str, set[str]]:
    """The organizations granted each dataset (by name)."""
    found: dict[str, set[str]] = {dataset_id: set() for dataset_id in dataset_ids}
    if dataset_ids:
        for dataset_id, org in session.execute(select(db.Grant.dataset_id, db.Organization.name).join(
                db.Organization, db.Organization.id == db.Grant.org_id).where(db.Grant.dataset_id.in_(dataset_ids))):
            found[dataset_id].add(org)
    return found
