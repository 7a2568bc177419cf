"""The trainer's first schema: organizations, API keys, features tables and jobs.

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


def _time(name: str) -> sa.Column:
    return _column(name, sa.DateTime(timezone=True))


def _org() -> sa.Column:
    return _column("org_id", sa.Integer, sa.ForeignKey("organizations.id"))


def upgrade() -> None:
    op.create_table("organizations", _column("id", sa.Integer, primary_key=True),
                    _column("name", sa.String(200), unique=True), _time("created_at"))
    op.create_table("api_keys", _column("id", sa.Integer, primary_key=True), _org(), _column("role", sa.String(20)),
                    _column("key_hash", sa.String(64), unique=True), _column("prefix", sa.String(16)),
                    _column("revoked", sa.Boolean), _time("created_at"))
    op.create_table("feature_tables", _column("id", sa.Integer, primary_key=True), _org(),
                    _column("name", sa.String(100)), _column("file", sa.String(300)),
                    _column("num_examples", sa.Integer), _column("columns_json", sa.Text), _time("updated_at"),
                    sa.UniqueConstraint("org_id", "name"))
    op.create_table("jobs", _column("id", sa.String(32), primary_key=True), _org(), _column("status", sa.String(20)),
                    _column("labels_party", sa.String(40)), _column("dataset_id", sa.String(64)),
                    _column("request_json", sa.Text), _column("release_json", sa.Text, nullable=True),
                    _column("epoch", sa.Integer), _column("epochs", sa.Integer), _column("metrics_json", sa.Text),
                    _column("error", sa.Text, nullable=True), _column("model_file", sa.String(300), nullable=True),
                    _column("predictions_file", sa.String(300), nullable=True),
                    _column("num_train_examples", sa.Integer), _column("seconds", sa.Float),
                    _column("device", sa.String(200)), _time("created_at"), _time("updated_at"))


def downgrade() -> None:
    for table in ("jobs", "feature_tables", "api_keys", "organizations"):
        op.drop_table(table)
