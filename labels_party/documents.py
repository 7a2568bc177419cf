"""Mechanism documents: a release's full public description, stored once and addressed by content.

A document is ``{"description": <the mechanism's describe()>, "noisy_prior": <the prior's describe() or null>}``
— everything the features party may need to use the privatized labels (output values, exact probabilities,
noisy counts, model parameters). Its address is the SHA-256 of its canonical JSON, so identical documents (two
Laplace releases at the same ε on the same domain) are stored once. A release row and response keep only a
:func:`summary` (the document without its arrays), so they stay small whatever |Y| is; ``GET
/v1/mechanisms/{hash}`` serves the document as JSON or as a compact binary (:func:`pack`: an ``.npz`` archive
whose arrays are the document's numeric lists).
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import numpy as np
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from labels_party import db
from labels_party.ledger import canonical

BINARY_MEDIA_TYPE = "application/vnd.labeldp.mechanism+npz"


def summary(value: Any) -> Any:
    """The document without lists (recursively): what a release row and its response keep."""
    if isinstance(value, dict):
        return {k: summary(v) for k, v in value.items() if not isinstance(v, list)}
    return value


def address(document: dict) -> str:
    return hashlib.sha256(canonical(document).encode()).hexdigest()


def store(session: Session, document: dict) -> str:
    """Insert the document unless it is already there (concurrent identical inserts are fine); its address."""
    digest = address(document)
    dialect = session.get_bind().dialect.name
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(db.MechanismDocument)
    session.execute(insert.values(hash=digest, document=canonical(document), created_at=db.utcnow())
                    .on_conflict_do_nothing(index_elements=["hash"]))
    return digest


def pack(document: dict) -> bytes:
    """A compact binary form: numeric lists (and lists of lists of equal length) become compressed arrays named
    by their JSON path; the rest stays JSON in ``document.json``, with ``{"$array": path}`` where an array was."""
    arrays: dict[str, np.ndarray] = {}

    def strip(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            return {k: strip(v, f"{path}/{k}") for k, v in value.items()}
        if isinstance(value, list) and value:
            array = _numeric_array(value)
            if array is not None:
                arrays[path] = array
                return {"$array": path}
            return [strip(v, f"{path}/{i}") for i, v in enumerate(value)]
        return value

    skeleton = strip(document, "")
    buffer = io.BytesIO()
    members: dict[str, Any] = {"document.json": np.frombuffer(canonical(skeleton).encode(), dtype=np.uint8),
                               **{f"array{path}": array for path, array in arrays.items()}}
    np.savez_compressed(buffer, **members)
    return buffer.getvalue()


def unpack(data: bytes) -> dict:
    with np.load(io.BytesIO(data)) as archive:
        skeleton = json.loads(archive["document.json"].tobytes())
        arrays = {name[len("array"):]: archive[name] for name in archive.files if name.startswith("array")}

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"$array"}:
                return arrays[value["$array"]].tolist()
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return fill(skeleton)


def _numeric_array(value: list) -> np.ndarray | None:
    """The list as an int64 or float64 array when it is a (possibly nested, rectangular) list of numbers."""
    if any(isinstance(v, bool | str | dict) or v is None for v in _leaves(value)):
        return None
    try:
        array = np.array(value)
    except ValueError:  # ragged
        return None
    if array.dtype == object or array.dtype.kind not in "if":
        return None
    return array.astype(np.int64 if array.dtype.kind == "i" else np.float64)


def _leaves(value):
    for v in value:
        if isinstance(v, list):
            yield from _leaves(v)
        else:
            yield v
