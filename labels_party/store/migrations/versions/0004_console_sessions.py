"""Sessions of the owner's console (labels_party/http/console): a random token per signed-in admin, stored only as its
SHA-256, tied to the admin key it was opened with, with an expiry. Nothing existing changes.

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
    op.create_table("console_sessions",
                    sa.Column("id", sa.Integer, primary_key=True, nullable=False),
                    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
                    sa.Column("api_key_id", sa.Integer, sa.ForeignKey("api_keys.id"), nullable=False),
                    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
                    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False))


def downgrade() -> None:
    op.drop_table("console_sessions")
