"""Every key of an organization holding an account is on that dataset's chain.

From this version a key charges or administers a dataset only once the dataset's chain knows it (a key row written
into the table outside the service is not honoured: ``labels_party/ledger/agreement.py``). The service records an
organization's keys when its account opens and every key made afterwards; keys made before their organization's
account opened were never recorded. This migration appends, once, a ``key`` fact (``created``) for each key not yet
revoked of each organization holding an account on each dataset, that the dataset's chain does not already name —
after the chain's existing entries, which stay as they are — and moves the dataset's anchor in the data directory
to the new head. The process that runs the upgrade then signs and exports the transition it made
(:func:`labels_party.runtime.context.make_context`), so that verify-audit finds every entry covered.

Written with the standard library and SQL only, so that later changes to the service's modules cannot change what
this migration does; the facts' JSON is the one ``labels_party.ledger.records.KeyFact`` reads.

Revision ID: 0016
Revises: 0015
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

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    datasets = bind.execute(sa.text("SELECT id, ledger_seq, ledger_head FROM datasets ORDER BY id")).all()
    if not datasets:
        return
    data_dir = context.config.attributes.get("data_dir")
    if data_dir is None or not Path(data_dir).is_dir():
        raise LabelDPError("this upgrade records keys on the audit chains and moves their anchors in the data "
                           "directory: give it (labeldp labels upgrade-db --data-dir DIR); the database was not "
                           "changed", code=ErrorCode.DATABASE_OUTDATED)
    now = datetime.now(timezone.utc)
    names = dict(bind.execute(sa.text("SELECT id, name FROM organizations")).all())
    for dataset in datasets:
        known = set()
        for (record,) in bind.execute(sa.text("SELECT record FROM ledger WHERE dataset_id = :d"), {"d": dataset.id}):
            parsed = json.loads(record)
            if parsed.get("event") == "key" and parsed.get("change") == "created":
                known.add(parsed.get("key_id"))
        keys = bind.execute(sa.text(
            "SELECT k.id, k.org_id, k.role, k.prefix, k.revoked_at FROM api_keys k JOIN budget_accounts a "
            "ON a.org_id = k.org_id AND a.dataset_id = :d ORDER BY k.id"), {"d": dataset.id}).all()
        facts = [{"event": "key", "change": "created", "org": names.get(key.org_id, "?"), "role": key.role,
                  "key_prefix": key.prefix, "key_id": int(key.id), "revoked_at": None, "revoked_by": None}
                 for key in keys if key.id not in known and not _revoked(key.revoked_at, now)]
        if not facts:
            continue
        seq, head = int(dataset.ledger_seq), dataset.ledger_head
        for fact in facts:
            seq += 1
            record = json.dumps({**fact, "seq": seq, "dataset_id": dataset.id, "created_at": now.isoformat()},
                                sort_keys=True, separators=(",", ":"), allow_nan=False)
            digest = hashlib.sha256((head + record).encode()).hexdigest()
            bind.execute(sa.text("INSERT INTO ledger (dataset_id, seq, release_id, record, prev_hash, hash, "
                                 "created_at) VALUES (:d, :seq, NULL, :record, :prev, :hash, :t)"),
                         {"d": dataset.id, "seq": seq, "record": record, "prev": head, "hash": digest, "t": now})
            head = digest
        bind.execute(sa.text("UPDATE datasets SET ledger_seq = :seq, ledger_head = :head WHERE id = :d"),
                     {"seq": seq, "head": head, "d": dataset.id})
        # pending (the head before still admitted, as inside a charge) until the service's next commit confirms it
        _write(Path(data_dir) / "anchors" / f"{dataset.id}.json", json.dumps({
            "seq": seq, "head": head, "previous_seq": int(dataset.ledger_seq),
            "previous_head": dataset.ledger_head}).encode())


def _revoked(revoked_at, now: datetime) -> bool:
    if revoked_at is None:
        return False
    if isinstance(revoked_at, str):
        revoked_at = datetime.fromisoformat(revoked_at)
    if revoked_at.tzinfo is None:
        revoked_at = revoked_at.replace(tzinfo=timezone.utc)
    return revoked_at <= now


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
