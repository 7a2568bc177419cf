"""Mechanism documents stored packed, and group releases described in columns.

Documents were canonical JSON text; a group release's listed every group with its whole randomizer (RRWithPrior as a
|Y| x |Y| matrix of counts) and its whole noisy prior (weights and counts): 303 MB for 2000 one-example groups on
256 classes. This data migration rewrites every stored document once:

* ``mechanism_documents.document`` (JSON text) becomes ``body``, the packed form the service now stores and serves
  (:mod:`labels_party.ledger.documents`: an ``.npz`` zip of the JSON with each numeric list as ``{"$array": i}`` and
  each distinct list once as an int64 or float64 ``a{i}.npy``); its address, the SHA-256 of the canonical JSON, is
  unchanged;
* a group release's document takes the columnar shape new ones have
  (:meth:`labels_party.core.pipeline.GroupPrivatization.describe`): ``groups`` as columns (group, examples,
  certified_epsilon, mechanism — an index into ``mechanisms``, each distinct randomizer once, without the inputs
  and outputs that are the release's ``grid`` — and noisy_counts), the priors' shared fields once in
  ``noisy_prior`` (their weights are post-processing of the counts). The randomizers stay as they were sampled.
  Its content changed, so its address does: the release is pointed at the new one (ledger records do not name
  documents) and its summary recomputed.

Written with numpy and the standard library only, so that later changes to the service's modules cannot change
what this migration does; one document in memory at a time.

Revision ID: 0012
Revises: 0011
"""

import hashlib
import io
import json
import zipfile

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

WEIGHTS_RULE = "max(noisy_counts, 0) / their sum; uniform when every count is at most 0"
INT64 = (-(1 << 63), (1 << 63) - 1)


def upgrade() -> None:
    with op.batch_alter_table("mechanism_documents") as batch:
        batch.add_column(sa.Column("body", sa.LargeBinary(), nullable=True))
    bind = op.get_bind()
    hashes = [row.hash for row in bind.execute(sa.text("SELECT hash FROM mechanism_documents ORDER BY hash"))]
    for digest in hashes:
        text = bind.execute(sa.text("SELECT document FROM mechanism_documents WHERE hash = :h"), {"h": digest}).scalar()
        document = _columnar(json.loads(text))
        new = hashlib.sha256(_canonical(document).encode()).hexdigest()
        if new == digest:
            bind.execute(sa.text("UPDATE mechanism_documents SET body = :b WHERE hash = :h"),
                         {"b": _pack(document), "h": digest})
            continue
        if bind.execute(sa.text("SELECT count(*) FROM mechanism_documents WHERE hash = :h"), {"h": new}).scalar() == 0:
            bind.execute(sa.text("INSERT INTO mechanism_documents (hash, document, body, created_at) SELECT :n, '', "
                                 ":b, created_at FROM mechanism_documents WHERE hash = :h"),
                         {"n": new, "b": _pack(document), "h": digest})
        bind.execute(sa.text("UPDATE releases SET mechanism_hash = :n, description_json = :s "
                             "WHERE mechanism_hash = :h"),
                     {"n": new, "s": json.dumps(_summary(document["description"])), "h": digest})
        bind.execute(sa.text("DELETE FROM mechanism_documents WHERE hash = :h"), {"h": digest})
    with op.batch_alter_table("mechanism_documents") as batch:
        batch.alter_column("body", existing_type=sa.LargeBinary(), nullable=False)
        batch.drop_column("document")


def _columnar(document: dict) -> dict:
    """An old group release's document in the columnar shape; any other document as it is."""
    description = document.get("description") or {}
    listed = description.get("groups")
    if not (description.get("group_priors") and isinstance(listed, list) and listed):
        return document
    grid = listed[0]["mechanism"].get("input_values", [])
    index: dict[str, int] = {}
    mechanisms: list[dict] = []
    chosen = []
    for group in listed:
        mechanism = {k: v for k, v in group["mechanism"].items()
                     if not (k in ("input_values", "output_values") and v == grid)}
        key = json.dumps(mechanism, sort_keys=True)
        if key not in index:
            index[key] = len(mechanisms)
            mechanisms.append(mechanism)
        chosen.append(index[key])
    priors = [group["noisy_prior"] for group in listed if group.get("noisy_prior")]
    shared = ({**{k: v for k, v in priors[0].items() if k not in ("weights", "noisy_counts")}, "weights": WEIGHTS_RULE}
              if priors else None)
    columns = {"group": [g["group"] for g in listed], "examples": [g["examples"] for g in listed],
               "certified_epsilon": [g["certified_epsilon"] for g in listed], "mechanism": chosen,
               "noisy_counts": [p["noisy_counts"] for p in priors]}
    rest = {k: v for k, v in description.items() if k != "groups"}
    return {**document, "description": {**rest, "grid": grid, "mechanisms": mechanisms, "noisy_prior": shared,
                                        "groups": columns}}


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _summary(value):
    if isinstance(value, dict):
        return {k: _summary(v) for k, v in value.items() if not isinstance(v, list)}
    return value


def _pack(document: dict) -> bytes:
    arrays: list[np.ndarray] = []
    seen: dict[tuple, int] = {}

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            array = _numeric_array(value)
            if array is None:
                return [strip(v) for v in value]
            key = (array.dtype.str, array.shape, array.tobytes())
            if key not in seen:
                seen[key] = len(arrays)
                arrays.append(array)
            return {"$array": seen[key]}
        return value

    skeleton = _canonical(strip(document)).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("document.json", skeleton)
        for i, array in enumerate(arrays):
            with archive.open(f"a{i}.npy", "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


def _numeric_array(value: list):
    kinds = {_kind(v) for v in _leaves(value)}
    if len(kinds) != 1 or None in kinds:
        return None
    try:
        array = np.array(value, dtype=np.int64 if kinds == {int} else np.float64)
    except (ValueError, OverflowError):
        return None
    return array if array.size else None


def _kind(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int if INT64[0] <= value <= INT64[1] else None
    return float if isinstance(value, float) else None


def _leaves(value: list):
    for v in value:
        if isinstance(v, list):
            yield from _leaves(v)
        else:
            yield v
