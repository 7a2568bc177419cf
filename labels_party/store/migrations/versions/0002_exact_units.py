"""Exact ε in integer units of 10⁻⁹, releases per organization, mechanism documents stored once.

* datasets: ``epsilon_total``/``epsilon_spent`` (floats) become ``epsilon_total_units``/``epsilon_spent_units``.
  A total is converted from the shortest decimal that prints as the float (what the owner typed: 0.3 → 300000000);
  a spent sum — a float sum of charges, e.g. 2.8559999999997965 for 2856 × 0.001 — is rounded to 10⁻³ of a unit to
  shed the float noise and then up, so a budget can only look more spent than before, never less.
* releases: ``charge_units`` (the requested ε rounded up to the unit), ``mechanism_hash`` → ``mechanism_documents``
  (the full description and noisy prior move there; the row keeps a summary without arrays), and the idempotency
  key becomes unique per (dataset, organization).
* per-example spent vectors stay in their files and are converted by the same rule when read.

Revision ID: 0002
Revises: 0001
"""

import hashlib
import json
import math
from datetime import datetime, timezone
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UNITS = 10**9


def _units(value: float, rounding) -> int:
    return int((Decimal(repr(float(value))) * UNITS).to_integral_value(rounding=rounding))


def _summary(value):
    """The document without its arrays (what a release row and response keep)."""
    if isinstance(value, dict):
        return {k: _summary(v) for k, v in value.items() if not isinstance(v, list)}
    return value


def upgrade() -> None:
    op.create_table("mechanism_documents", sa.Column("hash", sa.String(64), primary_key=True),
                    sa.Column("document", sa.Text, nullable=False),
                    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False))
    bind = op.get_bind()
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("epsilon_total_units", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("epsilon_spent_units", sa.BigInteger, nullable=True))
    for row in bind.execute(sa.text("SELECT id, epsilon_total, epsilon_spent FROM datasets")).all():
        spent = math.ceil(round((row.epsilon_spent or 0.0) * UNITS, 3))
        bind.execute(sa.text("UPDATE datasets SET epsilon_total_units = :t, epsilon_spent_units = :s WHERE id = :i"),
                     {"t": _units(row.epsilon_total, ROUND_FLOOR), "s": spent, "i": row.id})
    with op.batch_alter_table("datasets") as batch:
        batch.alter_column("epsilon_total_units", nullable=False)
        batch.alter_column("epsilon_spent_units", nullable=False)
        batch.drop_column("epsilon_total")
        batch.drop_column("epsilon_spent")

    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("charge_units", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("mechanism_hash", sa.String(64), nullable=True))
    stored = set()
    for row in bind.execute(sa.text("SELECT id, epsilon, description_json, prior_json FROM releases")).all():
        description = json.loads(row.description_json)
        prior = json.loads(row.prior_json) if row.prior_json else None
        document = json.dumps({"description": description, "noisy_prior": prior}, sort_keys=True,
                              separators=(",", ":"))
        digest = hashlib.sha256(document.encode()).hexdigest()
        if digest not in stored and bind.execute(sa.text("SELECT 1 FROM mechanism_documents WHERE hash = :h"),
                                                 {"h": digest}).first() is None:
            bind.execute(sa.text("INSERT INTO mechanism_documents (hash, document, created_at) VALUES (:h, :d, :t)"),
                         {"h": digest, "d": document, "t": datetime.now(timezone.utc)})
        stored.add(digest)
        bind.execute(sa.text("UPDATE releases SET charge_units = :c, mechanism_hash = :h, description_json = :s, "
                             "prior_json = :p WHERE id = :i"),
                     {"c": _units(row.epsilon, ROUND_CEILING), "h": digest, "s": json.dumps(_summary(description)),
                      "p": json.dumps(_summary(prior)) if prior else None, "i": row.id})
    old_unique = next(c["name"] for c in sa.inspect(bind).get_unique_constraints("releases")
                      if c["column_names"] == ["dataset_id", "idempotency_key"])
    # SQLite does not name constraints: the batch copy names it by the convention so that it can be dropped.
    with op.batch_alter_table("releases", naming_convention={"uq": "uq_%(table_name)s_%(column_0_name)s"}) as batch:
        batch.alter_column("charge_units", nullable=False)
        batch.alter_column("mechanism_hash", nullable=False)
        batch.drop_constraint(old_unique or "uq_releases_dataset_id", type_="unique")
        batch.create_unique_constraint("uq_releases_dataset_org_key",
                                       ["dataset_id", "requester_org_id", "idempotency_key"])
        batch.create_foreign_key("fk_releases_mechanism_hash_mechanism_documents", "mechanism_documents",
                                 ["mechanism_hash"], ["hash"])


def downgrade() -> None:
    raise NotImplementedError("exact budgets cannot be turned back into float sums without loss; restore a backup")
