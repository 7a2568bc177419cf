"""Baseline: the schema the service built before migrations existed (float budgets, one idempotency key per
dataset, descriptions stored inline), as ``create_all`` built it then. Databases created then are stamped at this
revision.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _column(name: str, kind, *args, nullable: bool = False, **kwargs) -> sa.Column:
    return sa.Column(name, kind, *args, nullable=nullable, **kwargs)


def _created_at() -> sa.Column:
    return _column("created_at", sa.DateTime(timezone=True))


def _fk(name: str, target: str) -> sa.Column:
    kind = sa.Integer if target == "organizations.id" else sa.String(32)
    return _column(name, kind, sa.ForeignKey(target))


def upgrade() -> None:
    op.create_table("organizations", _column("id", sa.Integer, primary_key=True),
                    _column("name", sa.String(200), unique=True), _created_at())
    op.create_table("api_keys", _column("id", sa.Integer, primary_key=True), _fk("org_id", "organizations.id"),
                    _column("role", sa.String(20)), _column("key_hash", sa.String(64), unique=True),
                    _column("prefix", sa.String(16)), _column("revoked", sa.Boolean), _created_at())
    op.create_table("datasets", _column("id", sa.String(32), primary_key=True),
                    _fk("owner_org_id", "organizations.id"), _column("name", sa.String(200)),
                    _column("label_kind", sa.String(20)), _column("domain_json", sa.Text),
                    _column("epsilon_total", sa.Float), _column("epsilon_spent", sa.Float),
                    _column("allow_central_training", sa.Boolean), _column("label_version", sa.Integer),
                    _column("num_examples", sa.Integer), _column("registry_file", sa.String(300), nullable=True),
                    _column("registry_size", sa.Integer), _column("spent_file", sa.String(300), nullable=True),
                    _column("ledger_seq", sa.Integer), _column("ledger_head", sa.String(64)), _created_at(),
                    sa.UniqueConstraint("owner_org_id", "name"))
    op.create_table("label_versions", _column("id", sa.Integer, primary_key=True), _fk("dataset_id", "datasets.id"),
                    _column("version", sa.Integer), _column("file", sa.String(300)),
                    _column("num_examples", sa.Integer), _created_at(), sa.UniqueConstraint("dataset_id", "version"))
    op.create_table("grants", _column("id", sa.Integer, primary_key=True), _fk("dataset_id", "datasets.id"),
                    _fk("org_id", "organizations.id"), _created_at(), sa.UniqueConstraint("dataset_id", "org_id"))
    op.create_table("releases", _column("id", sa.String(32), primary_key=True), _fk("dataset_id", "datasets.id"),
                    _fk("requester_org_id", "organizations.id"), _column("idempotency_key", sa.String(200)),
                    _column("body_hash", sa.String(64)), _column("mechanism", sa.String(50)),
                    *(_column(name, sa.Float) for name in ("epsilon", "certified_epsilon", "prior_epsilon",
                                                           "randomizer_epsilon")),
                    _column("num_examples", sa.Integer), _column("label_version", sa.Integer),
                    _column("description_json", sa.Text), _column("prior_json", sa.Text, nullable=True),
                    _column("file", sa.String(300)), _created_at(),
                    sa.UniqueConstraint("dataset_id", "idempotency_key"))
    op.create_table("ledger", _column("id", sa.Integer, primary_key=True), _fk("dataset_id", "datasets.id"),
                    _column("seq", sa.Integer), _column("release_id", sa.String(32), nullable=True),
                    _column("record", sa.Text), _column("prev_hash", sa.String(64)), _column("hash", sa.String(64)),
                    _created_at(), sa.UniqueConstraint("dataset_id", "seq"))


def downgrade() -> None:
    for table in ("ledger", "releases", "grants", "label_versions", "datasets", "api_keys", "organizations"):
        op.drop_table(table)
