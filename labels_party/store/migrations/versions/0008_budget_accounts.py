"""Per-organization budget accounts and (ε, δ) budgets; releases charged before they are computed.

* ``budget_accounts``: one row per (dataset, organization) that may release — the owner's and one per grant —
  with its allocation of every example's budget (ε units, δ) and its spent state (coverage classes, RDP curves).
  The per-dataset state files (``datasets.spent_file``/``classes_file``) go: a migration cannot read the data
  directory, so every account is marked ``needs_rebuild`` and the service rebuilds its state from the ledger's
  records alone when it starts (``labels_party.ledger.budgets.rebuild_migrated``), once. Allocations are set then too:
  a granted organization's is what it has already spent (it spends nothing more until the owner allocates), the
  owner's the rest of the total.
* ``datasets.delta_total``: the per-example δ budget (0 for datasets made before: δ was not budgeted).
* ``releases``: ``mechanism_hash`` and ``certified_epsilon`` become nullable (a release is charged, and visible as
  ``running``, before its mechanism exists; a failed one never gets one).

Revision ID: 0008
Revises: 0007
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budget_accounts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("dataset_id", sa.String(32),
                  sa.ForeignKey("datasets.id", name="fk_budget_accounts_dataset_id_datasets"), nullable=False),
        sa.Column("org_id", sa.Integer,
                  sa.ForeignKey("organizations.id", name="fk_budget_accounts_org_id_organizations"), nullable=False),
        sa.Column("epsilon_units", sa.BigInteger, nullable=False),
        sa.Column("delta", sa.Float, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("classes_file", sa.String(300), nullable=True),
        sa.Column("spent_file", sa.String(300), nullable=True),
        sa.Column("rdp_file", sa.String(300), nullable=True),
        sa.Column("spent_max_units", sa.BigInteger, nullable=False),
        sa.Column("needs_rebuild", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("dataset_id", "org_id", name="uq_budget_accounts_dataset_id"),
    )
    bind = op.get_bind()
    now = datetime.now(timezone.utc)
    accounts = set()
    for dataset in bind.execute(sa.text("SELECT id, owner_org_id FROM datasets")).all():
        accounts.add((dataset.id, dataset.owner_org_id))
        for grant in bind.execute(sa.text("SELECT org_id FROM grants WHERE dataset_id = :d"), {"d": dataset.id}):
            accounts.add((dataset.id, grant.org_id))
    for dataset_id, org_id in sorted(accounts):
        bind.execute(sa.text(
            "INSERT INTO budget_accounts (dataset_id, org_id, epsilon_units, delta, generation, spent_max_units, "
            "needs_rebuild, created_at) VALUES (:d, :o, 0, 0, 0, 0, :r, :t)"),
            {"d": dataset_id, "o": org_id, "r": True, "t": now})
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("delta_total", sa.Float, nullable=False, server_default="0"))
        batch.drop_column("classes_file")
        batch.drop_column("spent_file")
    with op.batch_alter_table("releases") as batch:
        batch.alter_column("mechanism_hash", existing_type=sa.String(64), nullable=True)
        batch.alter_column("certified_epsilon", existing_type=sa.Float, nullable=True)


def downgrade() -> None:
    raise NotImplementedError("per-organization accounts cannot be folded back into one state; restore a backup")
