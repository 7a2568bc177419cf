"""Source datasets' snapshots: the copy taken at registration that Spark reads, its fingerprint and the exact
label counts. Source datasets registered before have none (files cannot be copied by a migration, and a copy taken
now would not be the rows their budgets were charged for): their releases are refused until the source is
registered again.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("source_snapshot", sa.String(300), nullable=True))
        batch.add_column(sa.Column("source_sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("source_counts_file", sa.String(300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("source_counts_file")
        batch.drop_column("source_sha256")
        batch.drop_column("source_snapshot")
