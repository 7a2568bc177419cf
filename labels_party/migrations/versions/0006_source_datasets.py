"""Source datasets (Parquet read in place by Spark) and release states (running, available, failed).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("source_uri", sa.String(1000), nullable=True))
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("state", sa.String(20), nullable=False, server_default="available"))
        batch.add_column(sa.Column("error_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("error_json")
        batch.drop_column("state")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("source_uri")
