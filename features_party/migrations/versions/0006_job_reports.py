"""Job reports (issue 39): a finished job's estimate against the constant predictor, its warnings and an auto
job's choice, as one JSON document (``jobs.report_json``; null for every earlier job, which had none).

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
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("report_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("report_json")
