"""Storage estimates that read no labels (issue 40's thirty-third review): a release's estimate of what it will
store was a label version's bytes a row — the size of a compressed file of labels, which a grantee read from a free
507's figures (the owner's base rate, and often one label's change between versions). Each label version now
records the bytes of its ids (``label_versions.id_bytes``), as each source registration does since 0020; this
upgrade computes both for what is stored already (reading only the ``example_id`` column of each version's file and
source copy, a batch at a time), so no estimate falls back to a file's size. A registration's copy is counted at its
source's size when it was asked for until it is placed (``datasets.source_bytes``; none for registrations before).

Revision ID: 0021
Revises: 0020
"""

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa
from alembic import context, op

from shared.errors import ErrorCode, LabelDPError

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    _add_column("label_versions", sa.Column("id_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    _add_column("datasets", sa.Column("source_bytes", sa.BigInteger(), nullable=True))
    versions = bind.execute(sa.text("SELECT id, file FROM label_versions WHERE id_bytes = 0")).all()
    sources = bind.execute(sa.text("SELECT id, source_snapshot FROM datasets WHERE source_snapshot IS NOT NULL "
                                   "AND source_id_bytes IS NULL")).all()
    if not versions and not sources:
        return
    data_dir = context.config.attributes.get("data_dir")
    if data_dir is None or not Path(data_dir).is_dir():
        raise LabelDPError("this upgrade reads the example ids of stored label versions and source copies: give the "
                           "data directory (labeldp labels upgrade-db --data-dir DIR); the database was not changed",
                           code=ErrorCode.DATABASE_OUTDATED)
    root = Path(data_dir)
    for row_id, file in versions:
        bind.execute(sa.text("UPDATE label_versions SET id_bytes = :b WHERE id = :i"),
                     {"b": _id_bytes([root / file]), "i": row_id})
    for dataset_id, location in sources:
        files = sorted(p for p in (root / location).rglob("*") if p.is_file() and not p.name.startswith(("_", ".")))
        bind.execute(sa.text("UPDATE datasets SET source_id_bytes = :b WHERE id = :i"),
                     {"b": _id_bytes(files), "i": dataset_id})


def _add_column(table: str, column: sa.Column) -> None:
    """The column, unless a schema built at this head and stamped older already has it (the migrations' tests)."""
    if column.name not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}:
        with op.batch_alter_table(table) as batch:
            batch.add_column(column)


def _id_bytes(files: list[Path]) -> int:
    """Σ of the UTF-8 bytes of the files' example ids as strings (a release writes integer ids as strings)."""
    total = 0
    for file in files:
        if not file.is_file():  # a file lost from the data directory: its releases fail anyway, the upgrade goes on
            continue
        for batch in pq.ParquetFile(file).iter_batches(batch_size=1 << 16, columns=["example_id"]):
            ids = batch.column(0)
            if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
                ids = pc.cast(ids, pa.string())
            total += int(pc.sum(pc.binary_length(ids)).as_py() or 0)
    return total


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("source_bytes")
    with op.batch_alter_table("label_versions") as batch:
        batch.drop_column("id_bytes")
