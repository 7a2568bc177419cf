"""Every key a chain knows names its secret.

From this version a ``key`` fact records ``secret_digest`` — SHA-256 of ``"labeldp-key-fact:" + key_hash``, the
key's stored hash hashed again — and a key whose row holds another secret is refused (``labels_party/ledger/
agreement.py``: a database writer who set a chained key's hash to that of a secret of their own would otherwise act
as that key). Facts written before name no secret. This migration appends, once, a ``key`` fact (``created``, with
the digest) for each key not yet revoked whose latest ``created`` fact on a dataset's chain lacks one — after the
chain's existing entries — and moves the dataset's anchor to the new head, as 0016 does; the process that runs the
upgrade signs and exports the transition (:func:`labels_party.runtime.context.make_context`).

Written with the standard library and SQL only (as 0016), so that later changes to the service's modules cannot
change what this migration does.

Revision ID: 0017
Revises: 0016
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

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    datasets = bind.execute(sa.text("SELECT id, ledger_seq, ledger_head FROM datasets ORDER BY id")).all()
    if not datasets:
        return
    data_dir = context.config.attributes.get("data_dir")
    now = datetime.now(timezone.utc)
    keys = {int(k.id): k for k in bind.execute(sa.text(
        "SELECT id, org_id, role, prefix, key_hash, revoked_at FROM api_keys")).all()}
    for dataset in datasets:
        latest: dict[int, dict] = {}
        for (record,) in bind.execute(sa.text("SELECT record FROM ledger WHERE dataset_id = :d ORDER BY seq"),
                                      {"d": dataset.id}):
            parsed = json.loads(record)
            if parsed.get("event") == "key" and parsed.get("change") == "created":
                latest[int(parsed["key_id"])] = parsed
        facts = []
        for key_id, fact in sorted(latest.items()):
            key = keys.get(key_id)
            if fact.get("secret_digest") is not None or key is None or _revoked(key.revoked_at, now):
                continue
            digest = hashlib.sha256(f"labeldp-key-fact:{key.key_hash}".encode()).hexdigest()
            facts.append({"event": "key", "change": "created", "org": fact.get("org", "?"), "role": fact["role"],
                          "key_prefix": fact["key_prefix"], "key_id": key_id, "secret_digest": digest,
                          "revoked_at": None, "revoked_by": None})
        if not facts:
            continue
        if data_dir is None or not Path(data_dir).is_dir():
            raise LabelDPError("this upgrade records keys' secrets on the audit chains and moves their anchors in the "
                               "data directory: give it (labeldp labels upgrade-db --data-dir DIR); the database was "
                               "not changed", code=ErrorCode.DATABASE_OUTDATED)
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
        _write(Path(data_dir) / "anchors" / f"{dataset.id}.json", json.dumps({
            "seq": seq, "head": head, "previous_seq": int(dataset.ledger_seq),
            "previous_head": dataset.ledger_head}).encode())


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: facts once chained are not removed")


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
