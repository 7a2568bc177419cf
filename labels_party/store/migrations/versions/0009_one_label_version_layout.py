"""One layout for label versions: every version carries its example ids, its registry range and its coverage set.

Datasets made before the registry moved into the versions kept one ``registry_file`` (example ids; the row number
is the index) and label versions of ``registry_index, label`` only, without a coverage set; the service read both
layouts. This data migration rewrites them once, in the data directory it is given (``upgrade-db --data-dir``, or
the service's own on ``serve --upgrade-db``):

* each old version is written again as ``registry_index, example_id, label`` (the ids taken from the registry
  file) under a new name, and gets the range of indices it introduced — ids were indexed in upload order, so
  version k introduced the indices from the previous versions' largest + 1 to its own largest; the migration
  refuses (and changes nothing) if the versions' ids disagree with the registry file or the ranges do not cover it;
* every version without a coverage set gets one (its sorted indices, content-addressed as the service writes
  them: ``datasets/{id}/coverage/{sha256}.npy``; a release of the whole version may already have written it);
* ``datasets.registry_file`` goes, and the versions' range and coverage columns become required.

The old files are left in place, unreferenced: the service removes them at its next start when it is alone
(``labels_party.store.housekeeping``). Written with pyarrow and numpy only, so that later changes to the service's
modules cannot change what this migration does. Old datasets are small (the registry file was read whole), and so
is this migration's memory.

Revision ID: 0009
Revises: 0008
"""

import hashlib
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from alembic import context, op

from shared.errors import ErrorCode, LabelDPError

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

VERSION_SCHEMA = pa.schema([("registry_index", pa.int64()), ("example_id", pa.string()), ("label", pa.float64())])


def upgrade() -> None:
    bind = op.get_bind()
    legacy = bind.execute(sa.text("SELECT id, registry_file FROM datasets WHERE registry_file IS NOT NULL")).all()
    uncovered = bind.execute(sa.text("SELECT dataset_id FROM label_versions WHERE coverage_file IS NULL OR "
                                     "registry_start IS NULL OR registry_end IS NULL")).all()
    if legacy or uncovered:
        data_dir = context.config.attributes.get("data_dir")
        if data_dir is None or not Path(data_dir).is_dir():
            raise _refused("this upgrade rewrites old label versions in the data directory: give it "
                               "(labeldp labels upgrade-db --data-dir DIR)")
        root = Path(data_dir)
        registries = {row.id: row.registry_file for row in legacy}
        for dataset_id in sorted(registries.keys() | {row.dataset_id for row in uncovered}):
            _rewrite(bind, root, dataset_id, registries.get(dataset_id))
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("registry_file")
    with op.batch_alter_table("label_versions") as batch:
        for column in ("registry_start", "registry_end"):
            batch.alter_column(column, existing_type=sa.BigInteger(), nullable=False)
        batch.alter_column("coverage_file", existing_type=sa.String(300), nullable=False)
        batch.alter_column("coverage_sha256", existing_type=sa.String(64), nullable=False)


def _refused(message: str) -> LabelDPError:
    return LabelDPError(f"{message}; the database was not changed", code=ErrorCode.DATABASE_OUTDATED)


def _rewrite(bind, root: Path, dataset_id: str, registry_file: str | None) -> None:
    ids = pq.read_table(root / registry_file, columns=["example_id"]).column("example_id").combine_chunks() \
        if registry_file else None
    versions = bind.execute(sa.text(
        "SELECT version, file, registry_start, registry_end, coverage_file FROM label_versions "
        "WHERE dataset_id = :d ORDER BY version"), {"d": dataset_id}).all()
    introduced = 0  # the indices of every earlier version's ids are below this
    for version in versions:
        table = pq.read_table(root / version.file)
        index = table.column("registry_index").to_numpy().astype(np.int64)
        if index.size and np.any(np.diff(index) <= 0):
            raise _refused(f"dataset {dataset_id} version {version.version}: indices are not increasing")
        changes: dict = {}
        if "example_id" not in table.column_names:
            if ids is None or (index.size and int(index[-1]) >= len(ids)):
                raise _refused(f"dataset {dataset_id} version {version.version}: an index beyond its registry")
            rewritten = pa.table({"registry_index": index, "example_id": ids.take(pa.array(index)),
                                  "label": table.column("label").cast(pa.float64())}, schema=VERSION_SCHEMA)
            changes["file"] = _write(root, f"datasets/{dataset_id}/labels_v{version.version:06d}_"
                                           f"{uuid.uuid4().hex}.parquet",
                                     lambda path, t=rewritten: pq.write_table(t, path, compression="zstd"))
        elif ids is not None:  # a version written in the new layout on an old dataset: its ids must agree
            known = index < len(ids)
            if not table.column("example_id").filter(pa.array(known)).equals(ids.take(pa.array(index[known]))):
                raise _refused(f"dataset {dataset_id} version {version.version}: ids disagree with its registry")
        if version.registry_start is None or version.registry_end is None:
            end = max(introduced, int(index[-1]) + 1 if index.size else 0)
            if np.count_nonzero(index >= introduced) != end - introduced:
                raise _refused(f"dataset {dataset_id} version {version.version}: the indices it introduced "
                                   "are not contiguous")
            changes["registry_start"], changes["registry_end"] = introduced, end
        introduced = max(introduced, changes.get("registry_end", version.registry_end or 0))
        if version.coverage_file is None:
            changes["coverage_file"], changes["coverage_sha256"] = _coverage(root, dataset_id, index)
        if changes:
            assignments = ", ".join(f"{column} = :{column}" for column in changes)
            bind.execute(sa.text(f"UPDATE label_versions SET {assignments} WHERE dataset_id = :d AND version = :v"),
                         {**changes, "d": dataset_id, "v": version.version})
    if ids is not None and introduced != len(ids):
        raise _refused(f"dataset {dataset_id}: its versions introduce {introduced} ids, its registry has "
                           f"{len(ids)}")


def _coverage(root: Path, dataset_id: str, index: np.ndarray) -> tuple[str, str]:
    data = np.ascontiguousarray(index, dtype=np.int64)
    sha = hashlib.sha256(data.tobytes()).hexdigest()
    relative = f"datasets/{dataset_id}/coverage/{sha}.npy"
    if not (root / relative).exists():  # content-addressed: a release may have written it already
        _write(root, relative, lambda path: np.save(path, data))
    return relative, sha


def _write(root: Path, relative: str, write) -> str:
    """Write through a temporary name, durably, then rename (as the service's DataStore does)."""
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(target)
    return relative
