"""Id lists: named lists of example ids an organization uploads once (``PUT /v1/id-lists/{name}``, CSV with one
``example_id`` column) and names in jobs (``split: {"holdout_ids": name}``) instead of sending the ids in every job
body. Each upload is a Parquet file of its own under the organization's directory and the list's row points at it
with the ids' content hash (:func:`ids_sha256`); another organization's list is the 404 of a missing one, and no
view ever shows the ids. An organization holds at most ``max_id_lists_per_org`` lists (``DELETE`` frees a name).

A job's split is resolved here too (:func:`held_out`): which rows of its features table it holds out. A job pins its
list's content hash when it is created, so every attempt holds out the same rows or none: a list replaced (or
deleted) since is 409 ``id_list_changed``, before anything is asked of the labels party."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from features_party import db, schemas
from features_party.auth import Principal
from features_party.context import TrainerContext
from features_party.features import ID, CsvLimits, store_features, table_bytes
from shared.errors import ErrorCode, LabelDPError
from shared.splits import holdout_mask

Split = schemas.HoldoutFraction | schemas.HoldoutIds | None
STORE_BYTES_PER_BYTE, STORE_BYTES_PER_ID = 6, 128  # what storing an uploaded list holds (upload)
READ_ATTEMPTS = 3  # a list replaced this many times while one job plan reads it: that plan gives up (409)


def ids_sha256(ids: Iterable[object]) -> str:
    """An id list's content hash: the SHA-256 (hex) of the JSON array of its ids as strings, sorted (by code
    point), without spaces, UTF-8 — the same for the same ids in any order, so anyone can compute it."""
    text = json.dumps(sorted(str(i) for i in ids), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


HASH_IDS, HASH_BYTES = 1 << 16, 8 << 20  # ids made Python strings at once while a stored list is hashed, at most


def stored_sha256(file: Path) -> str:
    """:func:`ids_sha256` of the ids of a stored list, a part of at most :data:`HASH_IDS` ids and
    :data:`HASH_BYTES` of them at a time (the review of the twelfth round's fixes: 63 ids of 1 MB, 65,536 at a
    time, +384 MB). Arrow sorts strings by their UTF-8 bytes, which is code point order: Python's."""
    ids = pq.read_table(file, columns=[ID]).column(ID)  # its chunks as read (combined, a copy of every id)
    order = pc.sort_indices(ids)
    ends = np.cumsum(pc.binary_length(ids).take(order).to_numpy(zero_copy_only=False).astype(np.int64) + 1)
    digest, start = hashlib.sha256(b"["), 0
    while start < len(ids):
        before = int(ends[start - 1]) if start else 0
        end = max(start + 1, min(start + HASH_IDS, int(np.searchsorted(ends, before + HASH_BYTES, side="right"))))
        part = ids.take(order[start:end]).to_pylist()
        digest.update(("," if start else "").encode() + ",".join(
            json.dumps(str(i), ensure_ascii=False) for i in part).encode())
        start = end
    digest.update(b"]")
    return digest.hexdigest()


def _view(row: db.IdList) -> schemas.IdListView:
    return schemas.IdListView(name=row.name, num_ids=row.num_ids, sha256=row.sha256, updated_at=row.updated_at)


def _find(session: Session, org_id: int, name: str) -> db.IdList | None:
    return session.scalar(select(db.IdList).where(db.IdList.org_id == org_id, db.IdList.name == name))


def _row(session: Session, org_id: int, name: str) -> db.IdList:
    row = _find(session, org_id, name)
    if row is None:
        raise LabelDPError("no such id list for this key", code=ErrorCode.NOT_FOUND)
    return row


def upload(ctx: TrainerContext, principal: Principal, name: str, path: Path) -> schemas.IdListView:
    """Create or replace the id list ``name`` from a CSV of one ``example_id`` column (unique ids), of at most
    ``max_id_list_ids`` ids (its lines counted before it is parsed: 413 body_too_large). Stored as a features table
    is (in chunks, its duplicates found out of core) and hashed from the stored file: the twelfth review's list of
    999,999 ids, read whole by pandas, stored and hashed as Python strings, took +335 MB."""
    limits = CsvLimits.of(ctx.settings)
    records = limits.check(path, "id list", max_columns=1)  # a header of more names: 400 before it is parsed
    # lines less the header and the empty one a final line break leaves (\n, \r\n or \r: pandas reads all three)
    ids, limit = records.lines - 2, ctx.settings.max_id_list_ids
    if ids > limit:
        raise LabelDPError(f"the id list has {ids:,} lines of ids, over this trainer's limit of {limit:,} "
                           "(max_id_list_ids)", code=ErrorCode.BODY_TOO_LARGE)
    # A file of its own per upload: the row names it with the hash of its ids in one transaction, so the row and
    # the file always agree, and a reader of the previous row still finds the previous file until that commits.
    # stored within the process's table-read budget too (issue 40's twenty-first review: a 64 MiB list of long
    # ids, one character outside the BMP each, took +384 MiB while it was stored: 6 bytes a byte, as Python strings)
    need = STORE_BYTES_PER_BYTE * path.stat().st_size + STORE_BYTES_PER_ID * ids
    with ctx.storing(principal.org_id, path.stat().st_size, "storing this id list"), \
            ctx.table_reads.held(need, "storing the id list", ErrorCode.BODY_TOO_LARGE):
        stored = store_features(path, ctx.org_dir(principal.org_id) / "id-lists", f"{name}.{uuid.uuid4().hex}",
                                limits, "id list", records=records)  # 400 on a malformed file, before anything is kept
    target = stored.file
    pa.default_memory_pool().release_unused()  # what storing freed, before the ids are read again to be hashed
    try:
        if stored.columns != [ID]:
            raise LabelDPError(f"an id list has one column, {ID!r}; this one has {stored.columns[:3]}",
                               code=ErrorCode.MALFORMED_FILE)
        # hashed within the process's table-read budget, as a split's read of a list is: concurrent uploads at the
        # limit (a 64 MiB list took +293 MB each, issue 40's twentieth review) share it
        with ctx.table_reads.held(5 * table_bytes(target, []) // 2, "hashing the id list", ErrorCode.BODY_TOO_LARGE):
            sha256 = stored_sha256(target)
        view, replaced = _record(ctx, principal.org_id, name, target, stored.num_examples, sha256)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    if replaced is not None:
        Path(replaced).unlink(missing_ok=True)  # a crash before this leaves it to collect_leftovers
    return view


def _record(ctx: TrainerContext, org_id: int, name: str, target: Path, num_ids: int,
            sha256: str) -> tuple[schemas.IdListView, str | None]:
    """Points the list's row (a new one, room permitting) at ``target``; the view and the file it replaced."""
    for attempt in range(2):
        try:
            with ctx.sessions() as session, session.begin():
                _lock_organization(session, org_id)
                row, replaced = _find(session, org_id, name), None
                if row is None:
                    _check_room(session, ctx, org_id)
                    row = db.IdList(org_id=org_id, name=name)
                    session.add(row)
                else:
                    replaced = row.file
                row.file, row.num_ids, row.sha256, row.updated_at = str(target), num_ids, sha256, db.utcnow()
                session.flush()
                return _view(row), replaced
        except IntegrityError:
            # Another writer inserted this name after the lookup (one not holding the organization's lock): the
            # row exists now, and this upload replaces it like any other.
            if attempt:
                raise
    raise AssertionError("unreachable")


def _lock_organization(session: Session, org_id: int) -> None:
    """PostgreSQL: one id-list change of an organization at a time, so its count and a name's first upload are
    decided one after the other (SQLite serializes writers anyway). FOR NO KEY UPDATE: rows that merely reference
    the organization (a job being inserted) are not held up."""
    session.get(db.Organization, org_id, with_for_update={"key_share": True})


def _check_room(session: Session, ctx: TrainerContext, org_id: int) -> None:
    limit = ctx.settings.max_id_lists_per_org
    count = session.execute(select(func.count()).select_from(db.IdList).where(db.IdList.org_id == org_id)
                            ).scalar_one()
    if count >= limit:
        raise LabelDPError(f"this organization has {count} id lists, this trainer's limit (max_id_lists_per_org): "
                           "delete one (DELETE /v1/id-lists/{name}) or replace one of the same name",
                           code=ErrorCode.TOO_MANY_ID_LISTS)


def delete(ctx: TrainerContext, principal: Principal, name: str) -> None:
    """Removes the list and its file. A job created with it that runs again refuses (``id_list_changed``)."""
    with ctx.sessions() as session, session.begin():
        _lock_organization(session, principal.org_id)
        row = _row(session, principal.org_id, name)
        file = row.file
        session.delete(row)
    Path(file).unlink(missing_ok=True)


def list_all(ctx: TrainerContext, principal: Principal) -> list[schemas.IdListView]:
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(db.IdList).where(db.IdList.org_id == principal.org_id).order_by(db.IdList.name))
        return [_view(r) for r in rows]


def get(ctx: TrainerContext, principal: Principal, name: str) -> schemas.IdListView:
    with ctx.sessions() as session, session.begin():
        return _view(_row(session, principal.org_id, name))


def _changed(name: str, *, stored: bool) -> LabelDPError:
    if stored:
        return LabelDPError(f"the id list {name!r} was replaced or deleted after this job was created; create a new "
                            "job", code=ErrorCode.ID_LIST_CHANGED)
    return LabelDPError(f"the id list {name!r} is not the version split.sha256 names (it was replaced): give its "
                        "current sha256 (GET /v1/id-lists/{name}), or none", code=ErrorCode.ID_LIST_CHANGED)


TABLE_ID_BYTES = 96  # holding out a list's ids: an Arrow copy of the table's ids and the mask, per table row


def pinned_file(ctx: TrainerContext, org_id: int, split: schemas.HoldoutIds, *, stored: bool) -> tuple[str, str]:
    """The file and hash of the list a split names; refused when it is not the version the split pins (a stored
    split always pins one: its job's creation did)."""
    with ctx.sessions() as session, session.begin():
        row = _find(session, org_id, split.holdout_ids)
        if row is None:  # a stored split's list was deleted since
            raise _changed(split.holdout_ids, stored=True) if stored else LabelDPError(
                "no such id list for this key", code=ErrorCode.NOT_FOUND)
        file, sha256 = row.file, row.sha256
    if sha256 != split.sha256 and (stored or split.sha256 is not None):
        raise _changed(split.holdout_ids, stored=stored)
    return file, sha256


def _pinned_mask(ctx: TrainerContext, org_id: int, split: schemas.HoldoutIds, index: pd.Index, *,
                 stored: bool) -> tuple[np.ndarray, str]:
    """Which of ``index`` the list a split names holds, and the list's hash (:func:`pinned_file`). Read within the
    process's table-read budget (the twelfth review: a 158-byte job whose split named a list of 10⁶ ids took
    +592 MB outside it)."""
    for _attempt in range(READ_ATTEMPTS):
        file, sha256 = pinned_file(ctx, org_id, split, stored=stored)
        try:  # the list's own cost counted from its file (ids of any length), and a hash set's copy of its ids
            # (measured: 63 ids of 1 MB, counted 126 MB by table_bytes, took +258 to +284 MB)
            need = 5 * table_bytes(file, []) // 2 + TABLE_ID_BYTES * len(index)
            with ctx.table_reads.held(need, "reading the id list the job's split names", ErrorCode.JOB_TOO_LARGE):
                ids = pq.read_table(file, columns=[ID]).column(ID)
                # the list's ids as read (their type: a cast would copy them), the table's in that type
                table_ids = pa.array(index.astype(str), type=ids.type)
                mask = pc.is_in(table_ids, value_set=ids).to_numpy(zero_copy_only=False)
        except FileNotFoundError:  # replaced since the row was read (its file removed): read the row again
            continue
        return mask, sha256
    raise LabelDPError(f"the id list {split.holdout_ids!r} was replaced while it was being read; try again",
                       code=ErrorCode.UPLOAD_CONFLICT)


def held_out(ctx: TrainerContext, org_id: int, split: Split, index: pd.Index, *,
             stored: bool = False) -> tuple[np.ndarray, Split]:
    """Which of ``index`` (a features table's ids) the job's split holds out (all False without a split), and the
    split as the job keeps it: an id list's with the content hash of the version read (``sha256``). ``stored``: the
    split of a job created before, which must find that version (else 409 ``id_list_changed``)."""
    if split is None:
        return np.zeros(len(index), dtype=bool), None
    if isinstance(split, schemas.HoldoutFraction):
        return holdout_mask(index, split.holdout_fraction, split.seed), split
    mask, sha256 = _pinned_mask(ctx, org_id, split, index, stored=stored)
    return mask, split.model_copy(update={"sha256": sha256})
