"""Id lists: named lists of example ids an organization uploads once (``PUT /v1/id-lists/{name}``, CSV with one
``example_id`` column) and names in jobs (``split: {"holdout_ids": name}``) instead of sending the ids in every job
body. Stored like features tables: a Parquet file under the organization's directory and a row pointing at it;
another organization's list is the 404 of a missing one, and no view ever shows the ids.

A job's split is resolved here too (:func:`held_out`): which rows of its features table it holds out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from features_party import db, schemas
from features_party.auth import Principal
from features_party.context import TrainerContext
from features_party.features import ID, read_features, store_frame
from shared.errors import LabelDPError
from shared.splits import holdout_mask


def _view(row: db.IdList) -> schemas.IdListView:
    return schemas.IdListView(name=row.name, num_ids=row.num_ids, updated_at=row.updated_at)


def _row(session: Session, org_id: int, name: str) -> db.IdList:
    row = session.scalar(select(db.IdList).where(db.IdList.org_id == org_id, db.IdList.name == name))
    if row is None:
        raise LabelDPError("no such id list for this key", code="not_found")
    return row


def upload(ctx: TrainerContext, principal: Principal, name: str, path: Path) -> schemas.IdListView:
    """Create or replace the id list ``name`` from a CSV of one ``example_id`` column (unique ids)."""
    frame = read_features(path, "id list")  # 400 on a malformed file, before anything is stored
    if list(frame.columns) != [ID]:
        raise LabelDPError(f"an id list has one column, {ID!r}; this one has {len(frame.columns)}",
                           code="malformed_file")
    target = store_frame(ctx.org_dir(principal.org_id) / "id-lists", name, frame)
    with ctx.sessions() as session, session.begin():
        row = session.scalar(select(db.IdList).where(db.IdList.org_id == principal.org_id, db.IdList.name == name))
        if row is None:
            row = db.IdList(org_id=principal.org_id, name=name, file=str(target))
            session.add(row)
        row.num_ids, row.updated_at = len(frame), db.utcnow()
        session.flush()
        return _view(row)


def list_all(ctx: TrainerContext, principal: Principal) -> list[schemas.IdListView]:
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(db.IdList).where(db.IdList.org_id == principal.org_id).order_by(db.IdList.name))
        return [_view(r) for r in rows]


def get(ctx: TrainerContext, principal: Principal, name: str) -> schemas.IdListView:
    with ctx.sessions() as session, session.begin():
        return _view(_row(session, principal.org_id, name))


def read_ids(ctx: TrainerContext, org_id: int, name: str) -> pd.Index:
    """The ids of an id list of organization ``org_id`` (404 not_found: none of that name)."""
    with ctx.sessions() as session, session.begin():
        file = _row(session, org_id, name).file
    return pd.Index(pd.read_parquet(file, columns=[ID])[ID].astype(str))


def held_out(ctx: TrainerContext, org_id: int, split: schemas.HoldoutFraction | schemas.HoldoutIds | None,
             index: pd.Index) -> np.ndarray:
    """Which of ``index`` (a features table's ids) the job's split holds out: all False without a split."""
    if split is None:
        return np.zeros(len(index), dtype=bool)
    if isinstance(split, schemas.HoldoutFraction):
        return holdout_mask(index, split.holdout_fraction, split.seed)
    return np.asarray(index.isin(read_ids(ctx, org_id, split.holdout_ids)))
