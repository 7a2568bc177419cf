"""Declared label clipping: how many labels each upload moved to the clip's bounds.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("label_versions") as batch:
        batch.add_column(sa.Column("clipped_below", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("clipped_above", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("label_versions") as batch:
        batch.drop_column("clipped_above")
        batch.drop_column("clipped_below")
