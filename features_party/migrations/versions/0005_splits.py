"""Jobs by split (issue 31): named id lists of an organization (``id_lists``, a job's ``split.holdout_ids``, with the
content hash of its ids that a job pins) and the
number of rows a job's split held out (``jobs.num_holdout_examples``; 0 for every earlier job, which had no split).

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
    op.create_table("id_lists", sa.Column("id", sa.Integer(), primary_key=True),
                    sa.Column("org_id", sa.Integer(), sa.ForeignKey("organizations.id"), nullable=False),
                    sa.Column("name", sa.String(100), nullable=False),
                    sa.Column("file", sa.String(300), nullable=False),
                    sa.Column("num_ids", sa.Integer(), nullable=False),
                    sa.Column("sha256", sa.String(64), nullable=False),
                    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
                    sa.UniqueConstraint("org_id", "name"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("num_holdout_examples", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("num_holdout_examples", existing_type=sa.Integer(), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("num_holdout_examples")
    op.drop_table("id_lists")
