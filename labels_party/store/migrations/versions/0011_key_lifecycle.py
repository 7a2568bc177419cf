"""Keys that expire and whose revocation says who and when: ``api_keys`` gains ``expires_at``, ``revoked_at`` and
``revoked_by``, and loses the ``revoked`` flag nothing used to set.

A key already flagged revoked (only a database writer could have done it) is revoked from the moment of this
migration — its true time was never recorded — "by" a note saying so; the service then reads one shape only.
Keys made before carry no expiry.

Revision ID: 0011
Revises: 0010
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("revoked_by", sa.String(200), nullable=True))
    revoked = sa.text("UPDATE api_keys SET revoked_at = :at, revoked_by = :by WHERE revoked").bindparams(
        sa.bindparam("at", type_=sa.DateTime(timezone=True)))
    op.get_bind().execute(revoked, {"at": datetime.now(timezone.utc),
                                    "by": "unrecorded (flagged revoked before migration 0011)"})
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("revoked")
