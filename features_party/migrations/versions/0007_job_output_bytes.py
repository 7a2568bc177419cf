"""Jobs' output estimates (issue 40's twenty-ninth and thirty-second reviews): what a job's plan says it will store
(its model, a prediction and an id a row), counted for its organization's storage quota until the job ends — queued
jobs had counted nothing until they wrote, so up to ``max_jobs_per_org`` passed one check together. Earlier jobs get
0: they count by what their directories hold, as before.

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
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("jobs")}
    if "output_bytes" in columns:  # a schema built at this head and stamped older (the migrations' tests)
        return
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("output_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("output_bytes")
