"""The audit: every dataset's hash-chained ledger, uploads and budgets for its owner's admins, and the full
recomputation from the stored log alone (:mod:`labels_party.ledger.verification`)."""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy import select

from labels_party import ledger
from labels_party.http.access import administered_datasets, not_found
from labels_party.http.auth import Principal
from labels_party.ledger import signing, verification
from labels_party.releases.datasets import budget_view
from labels_party.runtime.context import ServiceContext
from labels_party.store import db
from shared import schemas


def audit(ctx: ServiceContext, principal: Principal, dataset_id: str | None) -> schemas.Audit:
    """The datasets this key administers (its route admits admin keys only), or the one named (404 otherwise)."""
    with ctx.sessions() as session, session.begin():
        query = administered_datasets(principal).order_by(db.Dataset.created_at)
        if dataset_id is not None:
            query = query.where(db.Dataset.id == dataset_id)
        datasets = list(session.scalars(query))
        if dataset_id is not None and not datasets:
            raise not_found()
        events: list[schemas.AuditEvent] = []
        facts: list[schemas.AuditEvent] = []
        uploads, valid = [], True
        for dataset in datasets:
            chain = ledger.entries(session, dataset.id)
            valid &= ledger.chain_intact(chain, dataset.ledger_head)
            for e in chain:
                (events if e.is_release else facts).append(schemas.AuditEvent(
                    seq=e.seq, dataset_id=e.dataset_id, record=e.record, prev_hash=e.prev_hash, hash=e.hash))
            uploads += [schemas.UploadEvent(dataset_id=dataset.id, label_version=v.version, num_examples=v.num_examples,
                                            clipped_below=v.clipped_below, clipped_above=v.clipped_above,
                                            created_at=v.created_at)
                        for v in session.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset.id)
                                                 .order_by(db.LabelVersion.version))]
        return schemas.Audit(events=events, chain_valid=valid,
                             budgets=[budget_view(session, principal, d) for d in datasets], uploads=uploads,
                             facts=facts)


def heads(ctx: ServiceContext, principal: Principal, dataset_id: str | None) -> list[schemas.SignedHead]:
    """The current chain head of each dataset this key administers (or the one named), signed now: what an owner
    pins. Only the owner's admins see them — a head's sequence number counts every organization's releases. Every
    service has an audit key (:func:`labels_party.runtime.context.audit_signer`)."""
    signer = ctx.ledger.signer
    assert signer is not None, "a service's ledger always has its audit key"
    with ctx.sessions() as session, session.begin():
        query = administered_datasets(principal).order_by(db.Dataset.created_at)
        if dataset_id is not None:
            query = query.where(db.Dataset.id == dataset_id)
        datasets = []
        for dataset in session.scalars(query):  # signed only where the chain and its anchor end, never a row alone
            ctx.ledger.check_anchor(session, dataset)  # ledger_rollback / ledger_tampered otherwise
            ctx.ledger.facts(session, dataset)  # its links, up to the row's head
            datasets.append((dataset.id, dataset.ledger_seq, dataset.ledger_head))
    if dataset_id is not None and not datasets:
        raise not_found()
    return [schemas.SignedHead(**asdict(signer.sign(*row))) for row in datasets]


def verify_audit(ctx: ServiceContext, dataset_id: str | None = None) -> dict:
    """Recompute everything (or one dataset) from the stored log alone
    (:func:`labels_party.ledger.verification.verify`); the caller decided access (the console: the dataset's owner)."""
    signer = ctx.ledger.signer
    if signer is None:
        return verification.verify(ctx.sessions, ctx.ledger, dataset_id,
                                   max_document_bytes=ctx.settings.max_document_bytes)
    directory = signer.directory
    return verification.verify(ctx.sessions, ctx.ledger, dataset_id, public_key=signer.public,
                               heads_log=None if directory is None else lambda: signing.read_log(directory),
                               max_document_bytes=ctx.settings.max_document_bytes)
