"""What an organization stores at the labels party, for its quota (:mod:`shared.service.storage_quota`):

* its datasets' label versions — each version's file and coverage, kept for good (releases name them), counted from
  the files themselves (a coverage two versions share: once) — and each dataset's row (its domain);
* the releases and evaluations it asked for: each one's labels file (from the file), the coverage its record
  names (8 bytes an example: the twenty-ninth review's id-subset releases and evaluations kept 6.7 times their
  counted size in coverage files), its row and its mechanism document (each document once).

Budget-state files are not counted: they grow with the releases an owner's grants allow, not with any one request.
"""

from __future__ import annotations

import os

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labels_party.store import db
from labels_party.store.storage import DataStore

ROW_BYTES = 4096  # a dataset's or a release's row, its indexes and its chain record (besides its texts)
COVERAGE_BYTES = 8  # an example of a release's coverage (a sorted int64 registry index)


def stored_bytes(session: Session, store: DataStore, org_id: int) -> int:
    versions = session.execute(select(db.LabelVersion.file, db.LabelVersion.coverage_file).join(
        db.Dataset, db.Dataset.id == db.LabelVersion.dataset_id).where(db.Dataset.owner_org_id == org_id)).all()
    files = {name for row in versions for name in row}
    datasets = session.execute(select(func.count(), func.coalesce(func.sum(func.length(db.Dataset.domain_json)), 0))
                               .where(db.Dataset.owner_org_id == org_id)).one()
    mine = db.Release.requester_org_id == org_id
    releases = session.execute(select(db.Release.file, db.Release.num_examples,
                                      func.length(db.Release.description_json),
                                      func.coalesce(func.length(db.Release.prior_json), 0)).where(mine)).all()
    documents = session.scalar(select(func.coalesce(func.sum(func.length(db.MechanismDocument.body)), 0)).where(
        db.MechanismDocument.hash.in_(select(db.Release.mechanism_hash).where(mine).distinct()))) or 0
    return (sum(file_bytes(store, name) for name in files) + ROW_BYTES * int(datasets[0]) + int(datasets[1])
            + sum(file_bytes(store, file) + COVERAGE_BYTES * examples + ROW_BYTES + described + prior
                  for file, examples, described, prior in releases) + int(documents))


def file_bytes(store: DataStore, relative: str) -> int:
    """A file's bytes, or a directory's (a Spark job's output); none if it is missing (not written yet)."""
    path = store.path(relative)
    try:
        if path.is_dir():
            return sum(entry.stat(follow_symlinks=False).st_size for entry in os.scandir(path) if entry.is_file())
        return path.stat().st_size
    except FileNotFoundError:
        return 0
