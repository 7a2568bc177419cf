"""Features tables imported from Parquet datasets (issue 43): tables larger than memory, which jobs train on from
disk (:mod:`features_party.streamed_jobs`).

An operator imports one with ``labeldp features import-features --org ORG --name NAME PATH`` — a command on the
trainer's machine, never a request: no request names a path the service reads. The Parquet files under ``PATH``
(regular files, no link followed) are copied into a new directory of the organization's data
(``orgs/<id>/features/<name>.<uuid>/``), so that what is checked is what jobs read; DuckDB then checks the copy —
one schema, an ``example_id`` column, no id twice (its hash aggregate spills to disk: bounded memory whatever the
table's size) — and the table's row names the directory, replacing an earlier table of that name (whose files go
once the row is committed). A copy a crash left behind is collected at the next start
(:func:`features_party.context.collect_leftovers`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import select

from features_party import db, joined, schemas
from features_party.context import DATASET_SUFFIX as SUFFIX
from features_party.context import TrainerContext
from features_party.features import ID
from shared.errors import ErrorCode, LabelDPError


def is_dataset(file: str | Path) -> bool:
    """Whether a features table's file is an imported Parquet dataset (a directory), which jobs train on from disk."""
    return Path(file).name.endswith(SUFFIX)


def import_features(ctx: TrainerContext, org_name: str, name: str, source: Path) -> schemas.FeatureTableView:
    """Copy, check and record the Parquet files under ``source`` as organization ``org_name``'s table ``name``."""
    with ctx.sessions() as session:
        org_id = session.scalar(select(db.Organization.id).where(db.Organization.name == org_name))
    if org_id is None:
        raise LabelDPError(f"no organization named {org_name!r} on this trainer (create a key for it first)",
                           code=ErrorCode.NOT_FOUND)
    directory = ctx.org_dir(org_id) / "features"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.{uuid.uuid4().hex}{SUFFIX}"
    try:
        _copy(source, target)
        rows, columns = _checked(target, ctx)
        with ctx.sessions() as session, session.begin():
            row = session.scalar(select(db.FeatureTable).where(db.FeatureTable.org_id == org_id,
                                                               db.FeatureTable.name == name))
            previous = None if row is None else row.file
            if row is None:
                row = db.FeatureTable(org_id=org_id, name=name, file=str(target))
                session.add(row)
            row.file, row.num_examples, row.columns_json = str(target), rows, json.dumps(columns)
            row.updated_at = db.utcnow()
            session.flush()
            view = schemas.FeatureTableView(name=row.name, num_examples=rows, columns=columns,
                                            updated_at=row.updated_at)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    if previous is not None and previous != str(target):
        _remove(Path(previous))
    return view


def _copy(source: Path, target: Path) -> None:
    """The regular ``*.parquet`` files under ``source`` (a file, or a directory walked without following links)
    into ``target`` as ``part-NNNNN.parquet``, in their sorted order."""
    if source.is_symlink() or not source.exists():
        raise LabelDPError(f"{source} is not a Parquet file or a directory (a link is not followed)",
                           code=ErrorCode.NOT_FOUND)
    if source.is_file():
        files = [source]
    else:
        files = sorted(Path(root) / name for root, _dirs, names in os.walk(source) for name in names
                       if name.endswith(".parquet"))
    target.mkdir(mode=0o700)
    for number, file in enumerate(files):
        try:
            handle = os.open(file, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as err:
            raise LabelDPError(f"cannot read {file}: {err.strerror} (a link is not followed)",
                               code=ErrorCode.MALFORMED_FILE) from None
        with os.fdopen(handle, "rb") as reading:
            if not stat.S_ISREG(os.fstat(reading.fileno()).st_mode):
                raise LabelDPError(f"{file} is not a regular file", code=ErrorCode.MALFORMED_FILE)
            with open(target / f"part-{number:05d}.parquet", "xb") as writing:
                shutil.copyfileobj(reading, writing, 1 << 20)
    if not files:
        raise LabelDPError(f"no Parquet file under {source}", code=ErrorCode.MALFORMED_FILE)


def _checked(table: Path, ctx: TrainerContext) -> tuple[int, list[str]]:
    """The copy's rows and columns, once DuckDB read every file with one schema, an id column and no id twice."""
    import duckdb

    settings = ctx.settings
    with tempfile.TemporaryDirectory(dir=ctx.scratch.spools) as work, \
            joined.connection(Path(work), settings.table_read_budget_bytes, 1) as con:
        try:
            files = joined.files_literal(joined.parquet_files(table))
            con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files})")
            columns = [c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE t)").fetchall()]
            if ID not in columns:
                raise LabelDPError(f"the features table needs an {ID!r} column", code=ErrorCode.MALFORMED_FILE)
            rows, missing = con.execute(f'SELECT count(*), count(*) - count("{ID}") FROM t').fetchone() or (0, 0)
            # the ids' 64-bit hashes grouped first (8 bytes a row whatever the ids' length), then only the ids
            # whose hash repeats: grouping 10⁸ ids themselves ran out of DuckDB's 488 MiB (the scale bench)
            repeated = con.execute(f"""
                WITH r AS (SELECT hash("{ID}") AS h FROM t GROUP BY h HAVING count(*) > 1)
                SELECT 1 FROM t WHERE hash("{ID}") IN (SELECT h FROM r) GROUP BY "{ID}" HAVING count(*) > 1
                LIMIT 1""").fetchone()
        except duckdb.Error as err:
            raise LabelDPError(f"cannot read the Parquet files: {str(err).splitlines()[0]}",
                               code=ErrorCode.MALFORMED_FILE) from None
    if missing:
        raise LabelDPError("an example_id is missing", code=ErrorCode.MALFORMED_FILE)
    if repeated is not None:
        raise LabelDPError("an example_id appears twice", code=ErrorCode.MALFORMED_FILE)
    if len(columns) - 1 > settings.max_feature_columns:
        raise LabelDPError(f"{len(columns) - 1:,} feature columns, over this trainer's "
                           f"{settings.max_feature_columns:,} (max_feature_columns)", code=ErrorCode.MALFORMED_FILE)
    return int(rows), columns


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
