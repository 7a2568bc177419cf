"""Every registered source dataset's registration is on its chain.

From this version a ``source`` fact records what a source dataset's releases read — its snapshot (location and
fingerprint), its counts file (path, bytes, SHA-256) and its rows — and a release is refused when the row says
otherwise (``labels_party/ledger/agreement.py``: a database writer who pointed a dataset at another dataset's copy,
at other counts or at fewer rows would otherwise have releases read them). This migration appends, once, a
``source`` fact for every ready source dataset with a snapshot whose chain has none — its counts file's bytes and
hash read from the data directory — and moves the dataset's anchor to the new head, as 0016 and 0017 do; the
process that runs the upgrade signs and exports the transition (:func:`labels_party.runtime.context.make_context`).

Written with the standard library and SQL only (as 0016), so that later changes to the service's modules cannot
change what this migration does.

Revision ID: 0018
Revises: 0017
"""

import hashlib
import json
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa
from alembic import context, op

from shared.errors import ErrorCode, LabelDPError

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    datasets = bind.execute(sa.text(
        "SELECT id, ledger_seq, ledger_head, source_snapshot, source_sha256, source_counts_file, num_examples "
        "FROM datasets WHERE source_uri IS NOT NULL AND source_snapshot IS NOT NULL AND state = 'ready' "
        "ORDER BY id")).all()
    if not datasets:
        return
    data_dir = context.config.attributes.get("data_dir")
    now = datetime.now(timezone.utc)
    for dataset in datasets:
        chained = any(json.loads(record).get("event") == "source" for (record,) in bind.execute(sa.text(
            "SELECT record FROM ledger WHERE dataset_id = :d ORDER BY seq"), {"d": dataset.id}))
        if chained:
            continue
        if data_dir is None or not Path(data_dir).is_dir():
            raise LabelDPError("this upgrade records source registrations on the audit chains and moves their "
                               "anchors in the data directory: give it (labeldp labels upgrade-db --data-dir DIR); "
                               "the database was not changed", code=ErrorCode.DATABASE_OUTDATED)
        counts = Path(data_dir) / dataset.source_counts_file
        digest, size = hashlib.sha256(), 0
        with open(counts, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
                size += len(block)
        seq = int(dataset.ledger_seq) + 1
        record = json.dumps({
            "event": "source", "seq": seq, "dataset_id": dataset.id, "created_at": now.isoformat(),
            "snapshot": dataset.source_snapshot, "source_sha256": dataset.source_sha256,
            "counts_file": dataset.source_counts_file, "counts_bytes": size, "counts_sha256": digest.hexdigest(),
            "num_examples": int(dataset.num_examples)}, sort_keys=True, separators=(",", ":"), allow_nan=False)
        head = hashlib.sha256((dataset.ledger_head + record).encode()).hexdigest()
        bind.execute(sa.text("INSERT INTO ledger (dataset_id, seq, release_id, record, prev_hash, hash, created_at) "
                             "VALUES (:d, :seq, NULL, :record, :prev, :hash, :t)"),
                     {"d": dataset.id, "seq": seq, "record": record, "prev": dataset.ledger_head, "hash": head,
                      "t": now})
        bind.execute(sa.text("UPDATE datasets SET ledger_seq = :seq, ledger_head = :head WHERE id = :d"),
                     {"seq": seq, "head": head, "d": dataset.id})
        _write(Path(data_dir) / "anchors" / f"{dataset.id}.json", json.dumps({
            "seq": seq, "head": head, "previous_seq": int(dataset.ledger_seq),
            "previous_head": dataset.ledger_head}).encode())


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: facts once chained are not removed")


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(target)
