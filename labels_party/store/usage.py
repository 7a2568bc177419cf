"""What an organization stores at the labels party, for its quota (:mod:`shared.service.storage_quota`):

* its datasets' label versions — each version's file and coverage, kept for good (releases name them), counted from
  the files themselves (a coverage two versions share: once) — and each dataset's row (its domain);
* its datasets' chain facts (grants, allocations, budgets: the thirtieth review's 291 grants at the quota added
  ~3 KB each) and sources' copies (each registration copies its source; counted at the source's size when asked
  for until the copy is placed);
* the releases and evaluations it asked for: each one's labels file (from the file), the coverage its record
  names (8 bytes an example: the twenty-ninth review's id-subset releases and evaluations kept 6.7 times their
  counted size in coverage files), its row and its mechanism document (each document once).

Budget-state files are not counted: they grow with the releases an owner's grants allow, not with any one request.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labels_party.core.registry import FAMILIES
from labels_party.store import db
from labels_party.store.storage import DataStore
from shared.service.storage_quota import BLOCK, allocated, tree_bytes

ROW_BYTES = 4096  # a dataset's or a release's row, its indexes and its chain record (besides its texts)
FACT_BYTES = 512  # a chain fact's row besides its record: hashes, index, its line in the heads log
COVERAGE_BYTES = 8  # an example of a release's coverage (a sorted int64 registry index)


def stored_bytes(session: Session, store: DataStore, org_id: int, writing: Mapping[str, int] | None = None) -> int:
    """The bytes an organization stores (the module's list); ``writing``: release files about to be put in place
    (their location → their bytes), counted at those bytes instead of their estimate."""
    versions = session.execute(select(db.LabelVersion.file, db.LabelVersion.coverage_file).join(
        db.Dataset, db.Dataset.id == db.LabelVersion.dataset_id).where(db.Dataset.owner_org_id == org_id)).all()
    files = {name for row in versions for name in row}
    owned = db.Dataset.owner_org_id == org_id
    datasets = session.execute(select(func.count(), func.coalesce(func.sum(func.length(db.Dataset.domain_json)), 0))
                               .where(owned)).one()
    files |= {s for s in session.scalars(select(db.Dataset.source_snapshot).where(owned)) if s}  # sources' copies
    # a registration's copy until it is placed: at its source's size when it was asked for (the 33rd review's ten
    # queued registrations counted their rows only, and stored 2.58 times the quota)
    registering = session.scalar(select(func.coalesce(func.sum(db.Dataset.source_bytes), 0)).where(
        owned, db.Dataset.state == "registering")) or 0
    # its datasets' facts (grants, allocations, budgets, label versions: a release's record counts to its requester)
    facts = session.execute(select(func.count(), func.coalesce(func.sum(func.length(db.LedgerEntry.record)), 0))
                            .join(db.Dataset, db.Dataset.id == db.LedgerEntry.dataset_id)
                            .where(owned, db.LedgerEntry.release_id.is_(None))).one()
    mine = db.Release.requester_org_id == org_id
    documents = session.scalar(select(func.coalesce(func.sum(func.length(db.MechanismDocument.body)), 0)).where(
        db.MechanismDocument.hash.in_(select(db.Release.mechanism_hash).where(mine).distinct()))) or 0
    return (sum(file_bytes(store, name) for name in files) + int(registering) + ROW_BYTES * int(datasets[0])
            + int(datasets[1])
            + FACT_BYTES * int(facts[0]) + int(facts[1]) + _releases_bytes(session, store, mine, writing or {})
            + int(documents))


def _releases_bytes(session: Session, store: DataStore, mine, writing: Mapping[str, int]) -> int:
    """The releases' files — a release not written yet (a source release's Spark job, queued) at what it will
    write: the thirty-first review queued 20 source releases, each counted at its row until its job wrote the
    whole source, and stored 4.67 times its quota — their coverage, rows and summaries."""
    rows = session.execute(select(db.Release.file, db.Release.num_examples, db.Release.state, db.Release.mechanism,
                                  db.Release.dataset_id, func.length(db.Release.description_json),
                                  func.coalesce(func.length(db.Release.prior_json), 0)).where(mine)).all()
    per_row: dict[str, tuple[float, int, int]] = {}
    total = 0
    for file, examples, state, mechanism, dataset_id, described, prior in rows:
        written = writing[file] if file in writing else file_bytes(store, file)
        if not written and state not in ("failed", "available"):
            if dataset_id not in per_row:
                per_row[dataset_id] = _dataset_rows(session, store, dataset_id)
            row_bytes, classes, overhead = per_row[dataset_id]
            written = file_estimate(examples, row_bytes, classes if _column_per_class(mechanism) else 1, overhead)
        total += written + COVERAGE_BYTES * examples + ROW_BYTES + described + prior
    return total


def _dataset_rows(session: Session, store: DataStore, dataset_id: str) -> tuple[float, int, int]:
    """A dataset's bytes a row in a release (:func:`bytes_a_row`), its classes and its output files' blocks."""
    dataset = session.get(db.Dataset, dataset_id)
    if dataset is None:
        return 0.0, 1, 0
    ids = dataset.source_id_bytes if dataset.source_uri is not None else session.scalar(
        select(db.LabelVersion.id_bytes).where(db.LabelVersion.dataset_id == dataset_id,
                                               db.LabelVersion.version == dataset.label_version))
    domain = json.loads(dataset.domain_json)
    classes = int(domain.get("num_classes") or len(domain.get("values") or ()) or 1)
    return bytes_a_row(int(ids or 0), int(dataset.num_examples or 0)), classes, output_files_bytes(store, dataset)


ID_LENGTH_BYTES = 4  # a string's length before its bytes, as a Parquet page written plain stores it


def bytes_a_row(id_bytes: int, rows: int) -> float:
    """What one of ``rows`` rows takes in a release's file besides its values: its id as written plain, from the
    ids' bytes counted when they were stored (a source's by its registration's Spark pass, a label version's at its
    upload) — never from a file's size: a source's copy compresses as its owner chose (the thirty-second review:
    95.5 bytes a row in the copy, ~2,760 in each release: 23.56 times the quota), and a label version's compressed
    size is a function of its labels (the thirty-third: a grantee read the owner's base rate, and often one label's
    change, from a free 507's figures). An upper bound, up to 34 times what short sequential ids compress to."""
    return id_bytes / max(rows, 1) + ID_LENGTH_BYTES


def _column_per_class(mechanism: str) -> bool:
    family = FAMILIES.get(mechanism)
    return bool(family is not None and family.column_per_class)


def file_bytes(store: DataStore, relative: str) -> int:
    """A file's bytes, or a directory's (a Spark job's output, a source's copy); none if it is missing (not written
    yet)."""
    path = store.path(relative)
    try:
        return tree_bytes(path) if path.is_dir() else allocated(path.stat())
    except FileNotFoundError:
        return 0


VALUE_BYTES = 8  # a released value (a label, a class's indicator or log-likelihood) as its Parquet column keeps it


def release_bytes(ctx, snapshot, examples: int, priced, example_ids=None) -> int:
    """What a release of ``examples`` examples will store, from public inputs, before it is drawn (the thirtieth
    review: a release admitted 1 byte under its organization's quota wrote 14.4 MB, 4.8 times a 3 MB quota — ALIBI
    and label-set releases write a column per class): each example's id as stored (:func:`bytes_a_row`, nothing
    about its label), a value per output column (one per class when its mechanism publishes one), the coverage and
    row its record keeps, and — a source's Spark job — its output files' blocks. A release of ``example_ids``
    writes them as the request gave them: their own bytes."""
    per_row = bytes_a_row(snapshot.id_bytes, int(snapshot.num_examples))
    family = getattr(priced, "family", None)
    columns = snapshot.domain.support().size if getattr(family, "column_per_class", False) else 1
    if example_ids:  # their own bytes instead of the version's bytes a row (which count the ids once already: the
        # thirty-second review's honest subset was refused on 21 MB and writes 0.75 MB)
        ids = sum(len(str(i).encode()) for i in example_ids)
        return int(examples * (VALUE_BYTES * (columns + 1) + COVERAGE_BYTES)) + ids + ROW_BYTES
    overhead = output_files_bytes(ctx.store, snapshot.dataset)
    return file_estimate(examples, per_row, columns, overhead) + COVERAGE_BYTES * examples + ROW_BYTES


def file_estimate(examples: int, per_row: float, columns: int, overhead: int) -> int:
    """A release's file before it is written: each example's id (``per_row``) and a value per output column, and
    its files' blocks (``overhead``) — the estimate a release is admitted on and a queued one counts at."""
    return int(examples * (per_row + VALUE_BYTES * columns)) + overhead


OUTPUT_FILE_BYTES = 2 * BLOCK  # a Spark output part and its checksum file, a block each at least


def output_files_bytes(store: DataStore, dataset: db.Dataset) -> int:
    """A source release's output files' blocks beyond their bytes: a part (and its checksum) per input split, at
    least one per file of the source's copy, and a few besides (the thirty-third review: a source of 800 one-row
    files wrote 3.3 times an estimate without them, and 7 of 8 releases were charged and failed when kept)."""
    if dataset.source_uri is None or not dataset.source_snapshot:
        return 0
    files = sum(len(names) for _root, _dirs, names in os.walk(store.path(dataset.source_snapshot)))
    return OUTPUT_FILE_BYTES * (files + 8)
