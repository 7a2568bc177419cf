"""Source datasets' id bytes: the sum of their example ids' UTF-8 bytes, counted by the registration's Spark pass,
from which a release's output is estimated for its organization's storage quota (issue 40's thirty-second review:
a source whose owner compressed 4,000-character ids to 95.5 bytes a row in its copy was estimated on those bytes,
and its releases wrote ~2,760 bytes a row under Spark's own compression). Sources registered before have none:
their releases are estimated on the copy's bytes a row, and every source release is checked on its real output
before it is made available.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("datasets")}
    if "source_id_bytes" in columns:  # a schema built at this head and stamped older (the migrations' tests)
        return
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("source_id_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("source_id_bytes")
