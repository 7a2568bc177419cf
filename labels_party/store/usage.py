"""What an organization stores at the labels party, for its quota (:mod:`shared.service.storage_quota`): its
datasets' label versions (each version's file and coverage, kept for good: releases name them) and the releases it
asked for (their labels files). Counted from the files themselves, so a row cannot make them smaller."""

from __future__ import annotations

import os

from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party.store import db
from labels_party.store.storage import DataStore


def stored_bytes(session: Session, store: DataStore, org_id: int) -> int:
    versions = session.execute(select(db.LabelVersion.file, db.LabelVersion.coverage_file).join(
        db.Dataset, db.Dataset.id == db.LabelVersion.dataset_id).where(db.Dataset.owner_org_id == org_id)).all()
    releases = session.scalars(select(db.Release.file).where(db.Release.requester_org_id == org_id))
    files = {name for row in versions for name in row} | set(releases)  # a coverage file two versions share: once
    return sum(file_bytes(store, name) for name in files)


def file_bytes(store: DataStore, relative: str) -> int:
    """A file's bytes, or a directory's (a Spark job's output); none if it is missing (not written yet)."""
    path = store.path(relative)
    try:
        if path.is_dir():
            return sum(entry.stat(follow_symlinks=False).st_size for entry in os.scandir(path) if entry.is_file())
        return path.stat().st_size
    except FileNotFoundError:
        return 0
