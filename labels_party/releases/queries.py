"""Reading releases back: a release, a dataset's releases and mechanism documents, each only for whoever may see
it (others get the answer of a release that does not exist)."""

from __future__ import annotations

from sqlalchemy import select

from labels_party.http.access import Admission, releases_possibly_seen, releases_seen, sees_execution, sees_release
from labels_party.http.auth import Principal
from labels_party.ledger import documents, tampered
from labels_party.releases.lifecycle import release_view
from labels_party.releases.privatization import recorded_execution
from labels_party.runtime.context import ServiceContext
from labels_party.store import db
from labels_party.store.storage import OpenedFile
from shared import schemas
from shared.errors import ErrorCode, LabelDPError


def get_release(ctx: ServiceContext, principal: Principal, release_id: str) -> tuple[schemas.Release, str]:
    """The release as its chain says (with where its Spark job ran, for those who see that) and its file."""
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id)
        if not sees_release(session, principal, release):
            raise LabelDPError("no such release for this key", code=ErrorCode.NOT_FOUND)
        ctx.ledger.check_shown(session, session.get(db.Dataset, release.dataset_id), [release])
        execution = recorded_execution(session, release.id) if sees_execution(session, principal, release) else None
        return release_view(release, execution), release.file


def opened_labels(ctx: ServiceContext, principal: Principal, release_id: str) -> OpenedFile:
    """The file of an available release this key sees, opened and checked against the size and SHA-256 recorded
    when it became available — on its dataset's chain (:class:`labels_party.ledger.ReleaseFact`; on its row for
    releases charged before that fact existed): 503 ``release_file_damaged`` rather than a 200 cut short — for a
    download and for a JSON page alike. What is served is read from the descriptors that were checked
    (:meth:`DataStore.open_checked`: hashed once per version of the file), and a download stops at a part written
    since."""
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id)
        if not sees_release(session, principal, release):
            raise LabelDPError("no such release for this key", code=ErrorCode.NOT_FOUND)
        if release.state != "available":
            raise LabelDPError(f"release {release_id} is {release.state}; its labels are not readable",
                               code=ErrorCode.RELEASE_NOT_READY)
        file, size, sha256 = release.file, release.file_size, release.file_sha256
        dataset = session.get(db.Dataset, release.dataset_id)
        ctx.ledger.check_actor(session, dataset, principal)  # the key as the chain made it, not revoked there
        chained = ctx.ledger.facts(session, dataset)
        if release.id not in chained.releases or release.own_file() is None:
            # a row inserted, or moved from another dataset's chain, or naming another file: never served
            raise tampered(dataset.id, [f"release {release_id} is not charged on the dataset's chain, or its file is "
                                        "not its own"])
        if principal.org_id != dataset.owner_org_id and (
                principal.org_name not in chained.grants
                or chained.charged_orgs.get(release.id, principal.org_name) != principal.org_name):
            raise tampered(dataset.id, [f"release {release_id} is read by {principal.org_name}, which the chain "
                                        "neither granted the dataset nor charged for it"])
        if release.id in chained.files_on_chain:  # served only as the chain says (a row can be edited)
            fact = chained.available.get(release.id)
            if fact is None:
                raise tampered(dataset.id, [f"release {release_id} is available but the chain says it never "
                                            "became available"])
            size, sha256 = fact.file_bytes, fact.file_sha256
    if size is None or sha256 is None:
        raise damaged(release_id)
    try:
        return ctx.store.open_checked(file, size, sha256)
    except OSError:
        raise damaged(release_id) from None


def damaged(release_id: str) -> LabelDPError:
    return LabelDPError(f"the labels file of release {release_id} is missing or damaged on the server; it is not "
                        "served (the operator restores it from a backup)", code=ErrorCode.RELEASE_FILE_DAMAGED)


def list_releases(ctx: ServiceContext, admission: Admission) -> list[schemas.Release]:
    """The releases of the admitted dataset this key sees."""
    with ctx.sessions() as session, session.begin():
        query = select(db.Release).where(db.Release.dataset_id == admission.dataset_id).order_by(db.Release.created_at)
        releases = session.scalars(releases_seen(admission, query)).all()
        ctx.ledger.check_shown(session, session.get(db.Dataset, admission.dataset_id), releases)  # as chained
        return [release_view(r) for r in releases]


def get_mechanism_document(ctx: ServiceContext, principal: Principal, mechanism_hash: str) -> tuple[bytes, dict]:
    """A mechanism document in its packed form and unpacked (:func:`labels_party.ledger.documents.unpack`, checked
    against its address), to anyone who can see a release that references it (404 otherwise)."""
    with ctx.sessions() as session, session.begin():
        query = select(db.Release).where(db.Release.mechanism_hash == mechanism_hash)
        seen = [release for release in session.scalars(releases_possibly_seen(principal, query))
                if sees_release(session, principal, release)]
        if not seen:
            raise LabelDPError("no such mechanism document for this key", code=ErrorCode.NOT_FOUND)
        packed = documents.stored(session, mechanism_hash)
    try:
        unpacked = documents.unpack(packed, ctx.settings.max_document_bytes)
    except documents.Unreadable as error:  # a body rewritten in the database, refused before it expands
        raise tampered(seen[0].dataset_id, [f"mechanism document {mechanism_hash}: {error}"]) from None
    if documents.address(unpacked) != mechanism_hash:  # a body rewritten in the database
        raise tampered(seen[0].dataset_id, [f"mechanism document {mechanism_hash} does not hash to its "
                                                      "address"])
    return packed, unpacked
