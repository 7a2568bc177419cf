"""Every dataset's owner is on its chain, and every key carries the audit key's certificate.

From this version an ``owner`` fact records the organization that owns a dataset, and a key or dataset row that
says otherwise is refused (``labels_party/ledger/agreement.py``: a database writer who set ``owner_org_id`` to
another organization made its admin keys the dataset's administrators). This migration appends, once, an ``owner``
fact to every dataset's chain that has none — the owner the chain itself names (the organization its creation
allocated the whole budget to; the row's where the chain is older than allocations), and the central-training
switch and source as the row now says (the chain has no earlier record of them: these two are taken on trust at
the upgrade) — and moves the dataset's anchor to the new head, as 0016-0018 do.

It also adds ``api_keys.certificate`` (``labels_party/ledger/key_certificates.py``): the service honours a key only
as its signed certificate states. An upgrade has no audit key; the process that runs it certifies every key that
exists at that moment and signs and exports the chain transitions (:func:`labels_party.runtime.context.make_context`) —
the operator's upgrade vouches for the keys it found, as it does for the facts it appended.

Written with the standard library and SQL only (as 0016), so that later changes to the service's modules cannot
change what this migration does.

Revision ID: 0019
Revises: 0018
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

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if "certificate" not in {c["name"] for c in sa.inspect(bind).get_columns("api_keys")}:
        with op.batch_alter_table("api_keys") as batch:
            batch.add_column(sa.Column("certificate", sa.Text(), nullable=True))
    datasets = bind.execute(sa.text(
        "SELECT d.id, d.ledger_seq, d.ledger_head, d.allow_central_training, d.source_uri, o.name AS owner "
        "FROM datasets d JOIN organizations o ON o.id = d.owner_org_id ORDER BY d.id")).all()
    if not datasets:
        return
    data_dir = context.config.attributes.get("data_dir")
    now = datetime.now(timezone.utc)
    for dataset in datasets:
        records = [json.loads(record) for (record,) in bind.execute(sa.text(
            "SELECT record FROM ledger WHERE dataset_id = :d ORDER BY seq"), {"d": dataset.id})]
        if any(record.get("event") == "owner" for record in records):
            continue
        if data_dir is None or not Path(data_dir).is_dir():
            raise LabelDPError("this upgrade records datasets' owners on the audit chains and moves their anchors in "
                               "the data directory: give it (labeldp labels upgrade-db --data-dir DIR); the "
                               "database was not changed", code=ErrorCode.DATABASE_OUTDATED)
        seq = int(dataset.ledger_seq) + 1
        record = json.dumps({"event": "owner", "seq": seq, "dataset_id": dataset.id, "created_at": now.isoformat(),
                             "org": _chained_owner(records) or dataset.owner,
                             "central_training": bool(dataset.allow_central_training), "source": dataset.source_uri},
                            sort_keys=True, separators=(",", ":"), allow_nan=False)
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


def _chained_owner(records: list[dict]) -> str | None:
    """The organization the chain gave the dataset's whole budget at creation: the first allocation after the
    ``created`` budget fact (None: a chain from before allocations were chained) — so that an owner row edited
    before this upgrade is not what it records (issue 40's fifth review)."""
    created = False
    for record in records:
        if record.get("event") == "dataset_budget" and record.get("change") == "created":
            created = True
        elif created and record.get("event") == "allocation":
            return str(record["org"])
    return None


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
