"""The jobs table is the trainer's queue (issue 29, replicas): workers of any process claim jobs under leases
(``attempts``, ``lease_owner``, ``lease_expires_at``, ``heartbeat_at``, ``run_after``), the labels-party API key is
kept sealed until the job ends (``sealed_api_key``), a resent ``POST /v1/jobs`` finds its job by the client's
``idempotency_key`` (unique per organization) and the ``request_sha256`` of its request, and ``started_at`` orders
claims fairly across organizations.

Jobs an older trainer left queued or running never had their key stored: they become ``interrupted`` (what that
trainer's next start did), resumable with the key.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("lease_owner", sa.String(80), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("run_after", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("idempotency_key", sa.String(200), nullable=True))
        batch.add_column(sa.Column("request_sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("sealed_api_key", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_unique_constraint("uq_jobs_org_id", ["org_id", "idempotency_key"])
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("attempts", existing_type=sa.Integer(), server_default=None)
    op.get_bind().execute(sa.text(
        "UPDATE jobs SET status = 'interrupted', error = :error WHERE status IN ('queued', 'running')"),
        {"error": "interrupted by the trainer's upgrade to durable jobs: resume it with the labels-party api_key"})


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_org_id", type_="unique")
        for column in ("started_at", "sealed_api_key", "request_sha256", "idempotency_key", "run_after",
                       "heartbeat_at", "lease_expires_at", "lease_owner", "attempts"):
            batch.drop_column(column)
