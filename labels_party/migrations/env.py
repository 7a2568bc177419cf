"""Alembic environment: migrations run on the connection the caller passes (labels_party.migrations)."""

from alembic import context

from labels_party.db import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
