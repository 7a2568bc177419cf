"""Durable jobs: a ``jobs`` table leased by every replica's workers, a state on datasets, and the end of pickled job
files.

* ``jobs`` (:class:`labels_party.store.db.Job`, with the lease columns of :mod:`shared.service.leases`): a source's
  registration and a source release's Spark job are rows any replica runs, their secrets sealed;
* ``datasets.state`` (``registering`` | ``ready`` | ``failed``) and ``datasets.error_json``: existing datasets are
  ``ready``;
* source releases used to keep their job in ``jobs/{release id}.pickle`` (cloudpickle: the sampler and the
  release's 32-byte secret, in plain bytes). Nothing reads those any more: a release left ``running`` or ``failed``
  with one becomes ``failed`` with ``job_format_retired`` — it stays charged; its secret goes with the file, so it
  cannot run again with the same noise, and never runs with other noise — and a ``running`` one without one (its
  process died before writing it) becomes ``failed`` as the service fails any interrupted release. Every pickle
  under ``jobs/`` is then deleted (also those of releases that no longer need them: they hold secrets).

The pickles are in the data directory (``upgrade-db --data-dir``, or the service's own on ``serve --upgrade-db``);
if a source release is ``running`` or ``failed`` and no data directory is given, the upgrade is refused and changes
nothing. The files are deleted last, once every row was changed. Written with the standard library and SQL only,
so that later changes to the service's modules cannot change what this migration does.

Revision ID: 0013
Revises: 0012
"""

import json
from pathlib import Path

import sqlalchemy as sa
from alembic import context, op

from shared.errors import ErrorCode, LabelDPError

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

RETIRED = {"code": "job_format_retired",
           "message": "this release's Spark job was written by an earlier version in a format that is no longer run; "
                      "it stays failed and charged (its secret was deleted, so it cannot run again with the same "
                      "noise): send a new request with a new Idempotency-Key"}
INTERRUPTED = {"code": "release_failed", "message": "the release could not be completed after it was charged"}


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("org_id", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(30), nullable=False),
        sa.Column("subject_id", sa.String(32), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("sealed_secret", sa.LargeBinary, nullable=True),
        sa.Column("error_code", sa.String(50), nullable=True),
        sa.Column("error_message", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(80), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_after", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_jobs_org_id_organizations"),
        sa.UniqueConstraint("kind", "subject_id", name="uq_jobs_kind"))
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("state", sa.String(20), nullable=False, server_default="ready"))
        batch.add_column(sa.Column("error_json", sa.Text, nullable=True))
    bind = op.get_bind()
    left = bind.execute(sa.text(
        "SELECT r.id, r.state FROM releases r JOIN datasets d ON d.id = r.dataset_id "
        "WHERE d.source_uri IS NOT NULL AND r.state IN ('running', 'failed') ORDER BY r.id")).all()
    data_dir = context.config.attributes.get("data_dir")
    if left and (data_dir is None or not Path(data_dir).is_dir()):
        raise LabelDPError("this upgrade retires the job files of source releases in the data directory: give it "
                           "(labeldp labels upgrade-db --data-dir DIR); the database was not changed",
                           code=ErrorCode.DATABASE_OUTDATED)
    jobs = Path(data_dir) / "jobs" if data_dir is not None else None
    for release_id, state in left:
        assert jobs is not None
        if (jobs / f"{release_id}.pickle").exists():
            error = RETIRED
        elif state == "running":
            error = INTERRUPTED
        else:
            continue  # failed before its job file was written: nothing to retire
        bind.execute(sa.text("UPDATE releases SET state = 'failed', error_json = :e WHERE id = :i"),
                     {"e": json.dumps(error), "i": release_id})
    if jobs is not None and jobs.is_dir():
        for pickle in [*jobs.glob("*.pickle"), *jobs.glob(".*.pickle.*.tmp")]:  # and interrupted writes of one
            pickle.unlink(missing_ok=True)
        try:
            jobs.rmdir()
        except OSError:  # something else is there: not this migration's
            pass


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("error_json")
        batch.drop_column("state")
    op.drop_table("jobs")
