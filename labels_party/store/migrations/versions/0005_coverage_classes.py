"""Out-of-core labels and coverage classes: per-example budgets as a class file plus a per-class table; each label
version knows the registry range it introduced and its coverage set.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("classes_file", sa.String(300), nullable=True))
    with op.batch_alter_table("label_versions") as batch:
        batch.add_column(sa.Column("registry_start", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("registry_end", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("coverage_file", sa.String(300), nullable=True))
        batch.add_column(sa.Column("coverage_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("label_versions") as batch:
        for column in ("coverage_sha256", "coverage_file", "registry_end", "registry_start"):
            batch.drop_column(column)
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("classes_file")
