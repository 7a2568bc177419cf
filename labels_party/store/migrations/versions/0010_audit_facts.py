"""The audit chain covers every budget-relevant fact, and release files are sealed.

* ``releases.file_size`` and ``releases.file_sha256``: the labels file as it was when the release became
  available (a download or verify-audit that finds it otherwise reports it damaged). Filled here, once, for the
  available releases whose files exist (the data directory is needed; a missing file stays unrecorded and
  verify-audit reports it).
* Every dataset's chain gets, once, the facts that until now lived only in tables: its totals
  (``dataset_budget``, change ``migrated``), each grant (``grant``, ``migrated``) and each account's allocation
  (``allocation``), appended after its existing records — which stay as they are (hash-chained and immutable) —
  and its anchor in the data directory moves to the new head.

Written with the standard library and SQL only, so that later changes to the service's modules cannot change what
this migration does; the facts' JSON is the one ``labels_party.ledger.records`` reads.

Revision ID: 0010
Revises: 0009
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

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("file_size", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("file_sha256", sa.String(64), nullable=True))
    bind = op.get_bind()
    datasets = bind.execute(sa.text("SELECT id, epsilon_total_units, delta_total, ledger_seq, ledger_head "
                                    "FROM datasets ORDER BY id")).all()
    releases = bind.execute(sa.text("SELECT id, file FROM releases WHERE state = 'available'")).all()
    if not datasets and not releases:
        return
    data_dir = context.config.attributes.get("data_dir")
    if data_dir is None or not Path(data_dir).is_dir():
        raise LabelDPError("this upgrade records release files and moves the ledger anchors in the data directory: "
                           "give it (labeldp labels upgrade-db --data-dir DIR); the database was not changed",
                           code=ErrorCode.DATABASE_OUTDATED)
    root = Path(data_dir)
    for release in releases:
        sealed = _digest(root / release.file)
        if sealed is not None:
            bind.execute(sa.text("UPDATE releases SET file_size = :size, file_sha256 = :sha WHERE id = :id"),
                         {"size": sealed[0], "sha": sealed[1], "id": release.id})
    names = dict(bind.execute(sa.text("SELECT id, name FROM organizations")).all())
    now = datetime.now(timezone.utc).isoformat()
    for dataset in datasets:
        facts: list[dict] = [{"event": "dataset_budget", "change": "migrated",
                              "epsilon_total_units": int(dataset.epsilon_total_units),
                              "delta_total": float(dataset.delta_total)}]
        for (org_id,) in bind.execute(sa.text("SELECT org_id FROM grants WHERE dataset_id = :d ORDER BY id"),
                                      {"d": dataset.id}).all():
            facts.append({"event": "grant", "change": "migrated", "org": names.get(org_id, "?")})
        for org_id, units, delta in bind.execute(sa.text(
                "SELECT org_id, epsilon_units, delta FROM budget_accounts WHERE dataset_id = :d ORDER BY id"),
                {"d": dataset.id}).all():
            facts.append({"event": "allocation", "org": names.get(org_id, "?"), "epsilon_units": int(units),
                          "delta": float(delta)})
        seq, head = int(dataset.ledger_seq), dataset.ledger_head
        for fact in facts:
            seq += 1
            record = json.dumps({**fact, "seq": seq, "dataset_id": dataset.id, "created_at": now},
                                sort_keys=True, separators=(",", ":"), allow_nan=False)
            digest = hashlib.sha256((head + record).encode()).hexdigest()
            bind.execute(sa.text("INSERT INTO ledger (dataset_id, seq, release_id, record, prev_hash, hash, "
                                 "created_at) VALUES (:d, :seq, NULL, :record, :prev, :hash, :t)"),
                         {"d": dataset.id, "seq": seq, "record": record, "prev": head, "hash": digest,
                          "t": datetime.now(timezone.utc)})
            head = digest
        bind.execute(sa.text("UPDATE datasets SET ledger_seq = :seq, ledger_head = :head WHERE id = :d"),
                     {"seq": seq, "head": head, "d": dataset.id})
        # The new head, pending (the head before it still admitted, as inside a charge): if this migration's commit
        # fails, the database is where it was; the service's next commit confirms it.
        _write(root / "anchors" / f"{dataset.id}.json", json.dumps({
            "seq": seq, "head": head, "previous_seq": int(dataset.ledger_seq),
            "previous_head": dataset.ledger_head}).encode())


def _digest(path: Path) -> tuple[int, str] | None:
    files = sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]
    digest, size = hashlib.sha256(), 0
    try:
        for file in files:
            with open(file, "rb") as handle:
                while block := handle.read(1 << 20):
                    digest.update(block)
                    size += len(block)
    except OSError:
        return None
    return size, digest.hexdigest()


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(target)


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: facts once chained are not removed")
