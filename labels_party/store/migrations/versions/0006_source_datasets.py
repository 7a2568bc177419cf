"""Source datasets (Parquet read in place by Spark) and release states (running, available, failed); example
counts as 64-bit integers (sources beyond 2³¹ rows).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


COUNTS = {"datasets": ("num_examples", "registry_size"), "label_versions": ("num_examples",),
          "releases": ("num_examples",)}


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("source_uri", sa.String(1000), nullable=True))
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("state", sa.String(20), nullable=False, server_default="available"))
        batch.add_column(sa.Column("error_json", sa.Text(), nullable=True))
    for table, columns in COUNTS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(column, existing_type=sa.Integer(), type_=sa.BigInteger())


def downgrade() -> None:
    for table, columns in COUNTS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(column, existing_type=sa.BigInteger(), type_=sa.Integer())
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("error_json")
        batch.drop_column("state")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("source_uri")
