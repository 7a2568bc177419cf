"""Alembic environment of the labels party: migrations run on the connection the caller passes."""

from alembic import context

from shared.service.database import run_migrations

run_migrations(context)
