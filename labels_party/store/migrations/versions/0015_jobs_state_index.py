"""An index on ``jobs.state``: every idle worker of every replica polls for claimable jobs (``queued``, or
``running`` with an expired lease) each ``job_poll_seconds``, and since every release of an uploaded dataset leaves
a finished ``compute_release`` row, that poll scanned the whole table — about 130 ms at 10⁶ finished rows, per job
thread per replica per poll. With the index it reads only the unfinished rows. Written with Alembic's operations
only.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state", "jobs", ["state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_state", table_name="jobs")
