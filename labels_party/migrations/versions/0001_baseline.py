"""Baseline: the schema the service built before migrations existed (float budgets, one idempotency key per
dataset, descriptions stored inline). Databases created then are stamped at this revision.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True))


def upgrade() -> None:
    op.create_table("organizations", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("name", sa.String(200), unique=True), _created_at())
    op.create_table("api_keys", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("org_id", sa.Integer, sa.ForeignKey("organizations.id")),
                    sa.Column("role", sa.String(20)), sa.Column("key_hash", sa.String(64), unique=True),
                    sa.Column("prefix", sa.String(16)), sa.Column("revoked", sa.Boolean), _created_at())
    op.create_table("datasets", sa.Column("id", sa.String(32), primary_key=True),
                    sa.Column("owner_org_id", sa.Integer, sa.ForeignKey("organizations.id")),
                    sa.Column("name", sa.String(200)), sa.Column("label_kind", sa.String(20)),
                    sa.Column("domain_json", sa.Text), sa.Column("epsilon_total", sa.Float),
                    sa.Column("epsilon_spent", sa.Float), sa.Column("allow_central_training", sa.Boolean),
                    sa.Column("label_version", sa.Integer), sa.Column("num_examples", sa.Integer),
                    sa.Column("registry_file", sa.String(300), nullable=True), sa.Column("registry_size", sa.Integer),
                    sa.Column("spent_file", sa.String(300), nullable=True), sa.Column("ledger_seq", sa.Integer),
                    sa.Column("ledger_head", sa.String(64)), _created_at(),
                    sa.UniqueConstraint("owner_org_id", "name", name="uq_datasets_owner_org_id"))
    op.create_table("label_versions", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("dataset_id", sa.String(32), sa.ForeignKey("datasets.id")),
                    sa.Column("version", sa.Integer), sa.Column("file", sa.String(300)),
                    sa.Column("num_examples", sa.Integer), _created_at(),
                    sa.UniqueConstraint("dataset_id", "version", name="uq_label_versions_dataset_id"))
    op.create_table("grants", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("dataset_id", sa.String(32), sa.ForeignKey("datasets.id")),
                    sa.Column("org_id", sa.Integer, sa.ForeignKey("organizations.id")), _created_at(),
                    sa.UniqueConstraint("dataset_id", "org_id", name="uq_grants_dataset_id"))
    op.create_table("releases", sa.Column("id", sa.String(32), primary_key=True),
                    sa.Column("dataset_id", sa.String(32), sa.ForeignKey("datasets.id")),
                    sa.Column("requester_org_id", sa.Integer, sa.ForeignKey("organizations.id")),
                    sa.Column("idempotency_key", sa.String(200)), sa.Column("body_hash", sa.String(64)),
                    sa.Column("mechanism", sa.String(50)), sa.Column("epsilon", sa.Float),
                    sa.Column("certified_epsilon", sa.Float), sa.Column("prior_epsilon", sa.Float),
                    sa.Column("randomizer_epsilon", sa.Float), sa.Column("num_examples", sa.Integer),
                    sa.Column("label_version", sa.Integer), sa.Column("description_json", sa.Text),
                    sa.Column("prior_json", sa.Text, nullable=True), sa.Column("file", sa.String(300)),
                    _created_at(), sa.UniqueConstraint("dataset_id", "idempotency_key", name="uq_releases_dataset_id"))
    op.create_table("ledger", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("dataset_id", sa.String(32), sa.ForeignKey("datasets.id")),
                    sa.Column("seq", sa.Integer), sa.Column("release_id", sa.String(32), nullable=True),
                    sa.Column("record", sa.Text), sa.Column("prev_hash", sa.String(64)),
                    sa.Column("hash", sa.String(64)), _created_at(),
                    sa.UniqueConstraint("dataset_id", "seq", name="uq_ledger_dataset_id"))


def downgrade() -> None:
    for table in ("ledger", "releases", "grants", "label_versions", "datasets", "api_keys", "organizations"):
        op.drop_table(table)
