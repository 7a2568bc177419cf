"""Where a job's Spark work ran: ``jobs.result_json``, small JSON (nothing about the labels) written when a job
succeeds.

A source release's ``privatize_source`` job records the engine, the SparkContext's master URL, its application id,
the executors registered besides the driver, and the partitions and rows it wrote; a ``register_source`` job the
same without the last two. It is what shows that a release ran on a cluster's executors rather than in local mode
(``GET /v1/releases/{id}`` shows it to the dataset owner's admins). Jobs that finished before have none: nullable,
nothing is backfilled (where they ran was never recorded). Written with Alembic's operations only, so that later
changes to the service's modules cannot change what this migration does.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("result_json", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("result_json")
