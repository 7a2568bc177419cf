"""Job reports (issue 39): a finished job's estimate against the constant predictor, its warnings and an auto
job's choice, as one JSON document (``jobs.report_json``; null for every earlier job, which had none). Every
earlier job's stored request gets ``estimate_fraction: 0``: it was planned without estimate rows, and an attempt or
a resume after the upgrade must ask the labels party for the same releases (a request without the field now means
the default, 0.1).

Revision ID: 0006
Revises: 0005
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("report_json", sa.Text(), nullable=True))
    bind = op.get_bind()
    for job_id, text in bind.execute(sa.text("SELECT id, request_json FROM jobs")).all():
        request = json.loads(text)
        if "estimate_fraction" not in request:
            request["estimate_fraction"] = 0
            bind.execute(sa.text("UPDATE jobs SET request_json = :r WHERE id = :i"),
                         {"r": json.dumps(request), "i": job_id})


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("report_json")
